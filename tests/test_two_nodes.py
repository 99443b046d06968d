"""Two machines on one: two torchrun agents (``--nnodes 2``, rendezvous on 127.0.0.1), each with a disk of its
own (issue 41, item 4).

Each agent runs in a mount namespace of its own (``unshare -m``, as root) where an
empty tmpfs covers the other node's folder (its run directory, dataset copy and
dataset cache), so a trainer that read or wrote the other node's files fails
(and the node checks that it sees nothing of the other's before it starts).
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from test_distributed import check_group_logs, check_hand_overs, read_jsonl, run_env, shared_dataset
from marius_py.distributed.launch import pid_file, trainer_run_dir

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "bench"))
from two_nodes import (SETTINGS, agent, c10d_rendezvous, final_test_mrr, finish, free_port, leader_run_dir,  # noqa: E402
                       make_nodes, private_mounts_work, static_rendezvous)

CODEX_S = shared_dataset("codex-s")

pytestmark = [pytest.mark.slow,
              pytest.mark.skipif(not private_mounts_work(), reason="needs root and unshare -m (private mounts)"),
              pytest.mark.skipif(CODEX_S is None, reason="needs CoDEx-S (MARIUS_PY_DATASETS)")]


SEEDS = (0, 1)


def test_two_nodes_with_disks_of_their_own_train_codex_s_as_one_process(tmp_path):
    """Each node keeps its trainer's run directory and dataset cache where the other cannot see them, partitions
    move as the grants planned, and the pair reaches the test MRR of one process within 0.01 (means over two
    seeds: single runs of either vary by about 0.005)."""
    grouped, alone = [], []
    for seed in SEEDS:
        nodes = make_nodes(tmp_path / f"seed{seed}", CODEX_S)
        port = free_port()
        settings = [*SETTINGS, f"training.seed={seed}"]
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


def test_a_trainer_killed_on_one_node_restarts_both_by_themselves(tmp_path):
    """Under ``--max-restarts`` with c10d's rendezvous (its agents restart for another machine's failure without
    counting it), a trainer killed mid-epoch makes both nodes' trainers restart from the group's last commit
    with no --resume, and the run ends with every epoch logged once."""
    nodes = make_nodes(tmp_path, CODEX_S)
    settings = [s.replace("training.epochs=20", "training.epochs=12") for s in SETTINGS]
    rendezvous = c10d_rendezvous(free_port())
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
    deadline = time.monotonic() + 600
    while (leader := leader_run_dir(nodes)) is None:
        assert time.monotonic() < deadline and all(a.poll() is None for a in agents), \
            [a.communicate()[1][-3000:] for a in agents if a.poll() is not None]
        time.sleep(0.05)
    return leader


def test_a_resume_on_every_node_restores_the_group(tmp_path):
    """Without restarts a killed trainer stops both nodes; the same ``train --resume RUN_DIR`` on each node (its
    own run directory, its config.yaml) continues from the group's last commit to the end."""
    nodes = make_nodes(tmp_path, CODEX_S)
    port = free_port()
    settings = [s.replace("training.epochs=20", "training.epochs=10") for s in SETTINGS]
    agents = [agent(nodes, node, static_rendezvous(node, port), settings) for node in range(2)]
    leader = wait_for_the_leader(nodes, agents)
    assert leader == nodes[0] / "run"  # (static rendezvous: node 0's trainer is rank 0)
    scheduler_log = leader / "distributed" / "scheduler.jsonl"
    deadline = time.monotonic() + 600
    while not (scheduler_log.exists() and any(g["epoch"] >= 4 for g in read_jsonl(scheduler_log))):
        assert time.monotonic() < deadline and all(a.poll() is None for a in agents)
        time.sleep(0.05)
    os.kill(int(pid_file(trainer_run_dir(nodes[1] / "run", 1)).read_text()), signal.SIGKILL)
    assert all(code != 0 for code, _, _ in finish(agents, timeout=600))
    port = free_port()
    outcomes = finish([agent(nodes, node, static_rendezvous(node, port), ["--resume"]) for node in range(2)],
                      timeout=1800)
    for code, _, err in outcomes:
        assert code == 0, err[-4000:]
    records = [r for r in read_jsonl(leader / "metrics.jsonl") if r.get("event") == "epoch"]
    assert [r["epoch"] for r in records] == list(range(1, 11))
    assert "test: MRR" in outcomes[0][1]

