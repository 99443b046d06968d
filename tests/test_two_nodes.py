"""Two machines on one: two torchrun agents (``--nnodes 2``, rendezvous on 127.0.0.1), each with a disk of its
own (issue 41, item 4).

Each agent runs in a mount namespace of its own (``unshare -m``, as root) where an
empty tmpfs covers the other node's folder (its run directory, dataset copy and
dataset cache), so a trainer that read or wrote the other node's files fails
(and the node checks that it sees nothing of the other's before it starts).
"""

from __future__ import annotations

import os
import shlex
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from test_distributed import (check_group_logs, check_hand_overs, free_port, read_jsonl, run_env,
                              shared_dataset)
from marius_py.distributed.launch import pid_file, trainer_run_dir

CODEX_S = shared_dataset("codex-s")
CODEX_S_SETTINGS = ["training.device=cpu", "model.dim=64", "training.epochs=20", "training.lr=0.01",
                    "model.dropout=0", "training.num_negatives=200", "storage.num_partitions=4",
                    "storage.buffer_capacity=2", "storage.partition_split=1", "evaluation.every=5",
                    "distributed.timeout_seconds=120", "--quiet"]


def private_mounts_work() -> bool:
    if os.geteuid() != 0 or shutil.which("unshare") is None:
        return False
    probe = subprocess.run(["unshare", "-m", "--propagation", "private", "sh", "-c",
                            "mount -t tmpfs tmpfs /mnt && umount /mnt"], capture_output=True)
    return probe.returncode == 0


pytestmark = [pytest.mark.slow,
              pytest.mark.skipif(not private_mounts_work(), reason="needs root and unshare -m (private mounts)"),
              pytest.mark.skipif(CODEX_S is None, reason="needs CoDEx-S (MARIUS_PY_DATASETS)")]


def make_nodes(root: Path) -> list[Path]:
    """node0/ and node1/, each with its own copy of the raw dataset."""
    nodes = []
    for node in range(2):
        folder = root / f"node{node}"
        shutil.copytree(CODEX_S, folder / "data" / "codex-s")
        nodes.append(folder)
    return nodes


def agent(nodes: list[Path], node: int, rendezvous: list[str], args: list[str], restarts: int = 0
          ) -> subprocess.Popen:
    """Node ``node``'s torchrun agent (one trainer), in a namespace where the other node's folder is an empty
    tmpfs; its dataset cache is in its own folder."""
    mine, other = nodes[node], nodes[1 - node]
    command = [sys.executable, "-m", "torch.distributed.run", "--nnodes", "2", "--nproc-per-node", "1",
               *rendezvous, "--max-restarts", str(restarts), "-m", "marius_py", "train", "codex-s",
               f"dataset.path={mine / 'data' / 'codex-s'}", *args, "--run-dir", str(mine / "run")]
    hide = (f"mount -t tmpfs tmpfs {shlex.quote(str(other))} && test -z \"$(ls -A {shlex.quote(str(other))})\" "
            f"&& exec {shlex.join(command)}")
    env = {**run_env(), "MARIUS_PY_CACHE": str(mine / "cache")}
    return subprocess.Popen(["unshare", "-m", "--propagation", "private", "sh", "-c", hide], env=env,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def static_rendezvous(node: int, port: int) -> list[str]:
    return ["--node-rank", str(node), "--master-addr", "127.0.0.1", "--master-port", str(port)]


def finish(agents: list[subprocess.Popen], timeout: float) -> list[tuple[int, str, str]]:
    outcomes = []
    for process in agents:
        try:
            out, err = process.communicate(timeout=timeout)
        except subprocess.TimeoutExpired:
            for other in agents:
                other.kill()
            raise
        outcomes.append((process.returncode, out, err))
    return outcomes


SEEDS = (0, 1)


def test_two_nodes_with_disks_of_their_own_train_codex_s_as_one_process(tmp_path):
    """Each node keeps its trainer's run directory and dataset cache where the other cannot see them, partitions
    move as the grants planned, and the pair reaches the test MRR of one process within 0.01 (means over two
    seeds: single runs of either vary by about 0.005)."""
    grouped, alone = [], []
    for seed in SEEDS:
        nodes = make_nodes(tmp_path / f"seed{seed}")
        port = free_port()
        settings = [*CODEX_S_SETTINGS, f"training.seed={seed}"]
        outcomes = finish([agent(nodes, node, static_rendezvous(node, port), settings) for node in range(2)],
                          timeout=1800)
        for code, _, err in outcomes:
            assert code == 0, err[-4000:]
        leader, other = nodes[0] / "run", nodes[1] / "run"
        assert sorted(p.name for p in other.iterdir()) == ["config.yaml", "distributed"]  # the run is node 0's
        assert not (leader / "distributed" / "rank1").exists()  # rank 1's run directory is on node 1 alone
        assert list((nodes[0] / "cache").iterdir()) and list((nodes[1] / "cache").iterdir())
        check_group_logs([trainer_run_dir(leader, 0), trainer_run_dir(other, 1)], 20, 4)
        check_hand_overs(leader, 2, 4)
        grouped.append(final_test_mrr(leader))

        one = tmp_path / f"seed{seed}" / "alone"
        done = subprocess.run([sys.executable, "-m", "marius_py", "train", "codex-s", f"dataset.path={CODEX_S}",
                               *settings, "--run-dir", str(one)], env=run_env(), capture_output=True, text=True,
                              timeout=1800)
        assert done.returncode == 0, done.stderr[-3000:]
        alone.append(final_test_mrr(one))
    print(f"CoDEx-S test MRR, one process {alone}, two nodes {grouped}")
    assert abs(sum(grouped) - sum(alone)) / len(SEEDS) <= 0.01, (alone, grouped)


def final_test_mrr(run_dir: Path) -> float:
    return [r for r in read_jsonl(run_dir / "metrics.jsonl") if r.get("split") == "test"][-1]["mrr"]


def test_a_trainer_killed_on_one_node_restarts_both_by_themselves(tmp_path):
    """Under ``--max-restarts`` with c10d's rendezvous (its agents restart for another machine's failure without
    counting it), a trainer killed mid-epoch makes both nodes' trainers restart from the group's last commit
    with no --resume, and the run ends with every epoch logged once."""
    nodes = make_nodes(tmp_path)
    port = free_port()
    rendezvous = ["--rdzv-backend", "c10d", "--rdzv-endpoint", f"127.0.0.1:{port}", "--rdzv-id", "two-nodes"]
    settings = [s.replace("training.epochs=20", "training.epochs=12") for s in CODEX_S_SETTINGS]
    agents = [agent(nodes, node, rendezvous, settings, restarts=2) for node in range(2)]
    leader = wait_for_the_leader(nodes, agents)
    other = nodes[1] / "run" if leader == nodes[0] / "run" else nodes[0] / "run"
    scheduler_log = leader / "distributed" / "scheduler.jsonl"
    deadline = time.monotonic() + 600
    while not (scheduler_log.exists() and any(g["epoch"] >= 4 for g in read_jsonl(scheduler_log))):
        assert time.monotonic() < deadline and all(a.poll() is None for a in agents)
        time.sleep(0.05)
    pids = [pid_file(trainer_run_dir(leader, 0)), pid_file(trainer_run_dir(other, 1))]
    before = [int(path.read_text()) for path in pids]
    os.kill(before[1], signal.SIGKILL)
    outcomes = finish(agents, timeout=1800)
    for code, _, err in outcomes:
        assert code == 0, err[-4000:]
    after = [int(path.read_text()) for path in pids]
    assert after[0] != before[0] and after[1] != before[1]  # both nodes' trainers restarted
    records = [r for r in read_jsonl(leader / "metrics.jsonl") if r.get("event") == "epoch"]
    assert [r["epoch"] for r in records] == list(range(1, 13))
    assert [r for r in read_jsonl(leader / "metrics.jsonl") if r.get("split") == "test"]
    check_group_logs([trainer_run_dir(leader, 0), trainer_run_dir(other, 1)], 12, 4)


def wait_for_the_leader(nodes: list[Path], agents: list[subprocess.Popen]) -> Path:
    """The run directory of the node whose trainer became rank 0 (c10d ranks the agents by their process ids)."""
    deadline = time.monotonic() + 600
    while True:
        for node in nodes:
            if (node / "run" / "checkpoints").is_dir() and not (node / "run" / "distributed" / "rank1").exists():
                if (node / "run" / "distributed" / "scheduler.jsonl").exists():
                    return node / "run"
        assert time.monotonic() < deadline and all(a.poll() is None for a in agents), \
            [a.communicate()[1][-3000:] for a in agents if a.poll() is not None]
        time.sleep(0.05)
