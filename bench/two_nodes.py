"""Two machines on one, and trainers killed under torchrun's elastic restarts (issue 41).

    sudo python bench/two_nodes.py --dataset ../shared/datasets/codex-s --kills 20 \
        --json bench/results/cpu-two-nodes-kills.json

Two torchrun agents (``--nnodes 2``, c10d rendezvous on 127.0.0.1, one trainer each), each in a mount
namespace of its own (``unshare -m``, as root) where an empty tmpfs covers the other node's folder: its run
directory, dataset copy and dataset cache. ``--references`` uninterrupted runs give the reference test MRR
(their mean: a group's runs differ, as grants follow timing) and wall time; then each of ``--kills`` runs
SIGKILLs a random trainer at a uniform random instant within 80% of the reference's wall time (once both
trainers have started), and the agents' ``--max-restarts`` alone must finish the run. Reported per run:
both agents' exit codes and the test MRR against the reference. ``tests/test_two_nodes.py`` uses the same
launch.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import shlex
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
SETTINGS = ["training.device=cpu", "model.dim=64", "training.epochs=20", "training.lr=0.01", "model.dropout=0",
            "training.num_negatives=200", "storage.num_partitions=4", "storage.buffer_capacity=2",
            "storage.partition_split=1", "evaluation.every=5", "distributed.timeout_seconds=120", "--quiet"]


def private_mounts_work() -> bool:
    """Whether this process may give a child a mount namespace of its own (root, ``unshare -m``)."""
    if os.geteuid() != 0 or shutil.which("unshare") is None:
        return False
    probe = subprocess.run(["unshare", "-m", "--propagation", "private", "sh", "-c",
                            "mount -t tmpfs tmpfs /mnt && umount /mnt"], capture_output=True)
    return probe.returncode == 0


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def make_nodes(root: Path, dataset: Path) -> list[Path]:
    """node0/ and node1/, each with its own copy of the raw dataset."""
    nodes = []
    for node in range(2):
        folder = root / f"node{node}"
        shutil.copytree(dataset, folder / "data" / dataset.name)
        nodes.append(folder)
    return nodes


def static_rendezvous(node: int, port: int) -> list[str]:
    return ["--node-rank", str(node), "--master-addr", "127.0.0.1", "--master-port", str(port)]


def c10d_rendezvous(port: int) -> list[str]:
    return ["--rdzv-backend", "c10d", "--rdzv-endpoint", f"127.0.0.1:{port}", "--rdzv-id", "two-nodes"]


def agent(nodes: list[Path], node: int, rendezvous: list[str], args: list[str], restarts: int = 0,
          config: str = "codex-s") -> subprocess.Popen:
    """Node ``node``'s torchrun agent (one trainer), in a namespace where the other node's folder is an empty
    tmpfs (checked before the agent starts); its dataset cache is in its own folder. ``args`` ["--resume"]:
    the node resumes its run directory."""
    mine, other = nodes[node], nodes[1 - node]
    dataset = next((mine / "data").iterdir())
    run = ["--resume", str(mine / "run"), "--quiet"] if args == ["--resume"] else \
        [config, f"dataset.path={dataset}", *args, "--run-dir", str(mine / "run")]
    command = [sys.executable, "-m", "torch.distributed.run", "--nnodes", "2", "--nproc-per-node", "1",
               *rendezvous, "--max-restarts", str(restarts), "-m", "marius_py", "train", *run]
    hidden = shlex.quote(str(other))
    script = f"mount -t tmpfs tmpfs {hidden} && test -z \"$(ls -A {hidden})\" && exec {shlex.join(command)}"
    env = {**os.environ, "OMP_NUM_THREADS": "1", "MARIUS_PY_CACHE": str(mine / "cache")}
    return subprocess.Popen(["unshare", "-m", "--propagation", "private", "sh", "-c", script], env=env,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def finish(agents: list[subprocess.Popen], timeout: float) -> list[tuple[int, str, str]]:
    """Each agent's (exit code, stdout, stderr); all are killed if one outlasts ``timeout``."""
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


def leader_run_dir(nodes: list[Path]) -> Path | None:
    """The run directory of the node whose trainer is rank 0 (c10d ranks agents by host, then process id)."""
    for node in nodes:
        if (node / "run" / "distributed" / "scheduler.jsonl").exists():
            return node / "run"
    return None


def final_test_mrr(run_dir: Path) -> float:
    records = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines() if line]
    return [r for r in records if r.get("split") == "test"][-1]["mrr"]


def trainer_pids(nodes: list[Path]) -> list[Path]:
    """The pid files of the two trainers (rank 0's in its --run-dir, rank 1's in RUN_DIR/distributed/rank1)."""
    return [path for node in nodes for path in (node / "run" / "distributed" / "trainer.pid",
                                                node / "run" / "distributed" / "rank1" / "distributed" / "trainer.pid")
            if path.exists()]


def run_two_nodes(root: Path, dataset: Path, kill_after: float | None, rng: random.Random,
                  restarts: int = 2) -> dict:
    """One two-node run; with ``kill_after``, a random trainer is SIGKILLed that many seconds in."""
    nodes = make_nodes(root, dataset)
    port = free_port()
    started = time.perf_counter()
    agents = [agent(nodes, node, c10d_rendezvous(port), SETTINGS, restarts) for node in range(2)]
    killed = None
    if kill_after is not None:  # (not before both trainers have started)
        while (time.perf_counter() - started < kill_after or len(trainer_pids(nodes)) < 2) \
                and all(a.poll() is None for a in agents):
            time.sleep(0.01)
        pids = trainer_pids(nodes)
        if pids and all(a.poll() is None for a in agents):
            target = rng.choice(pids)
            try:
                os.kill(int(target.read_text()), signal.SIGKILL)
                killed = str(target.relative_to(root))
            except (ProcessLookupError, ValueError):
                pass  # (between a trainer's exit and its restart)
    outcomes = finish(agents, timeout=1800)
    leader = leader_run_dir(nodes)
    ok = all(code == 0 for code, _, _ in outcomes) and leader is not None
    return {"exit_codes": [code for code, _, _ in outcomes], "killed": killed,
            "seconds": time.perf_counter() - started, "test_mrr": final_test_mrr(leader) if ok else None,
            "stderr_tail": None if ok else outcomes[0][2][-2000:] + outcomes[1][2][-2000:]}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--dataset", required=True, help="a raw dataset directory (train/valid/test.txt)")
    parser.add_argument("--kills", type=int, default=20)
    parser.add_argument("--references", type=int, default=3, help="uninterrupted runs the kills are compared with")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--json", default="bench/results/cpu-two-nodes-kills.json")
    args = parser.parse_args()
    if not private_mounts_work():
        sys.exit("needs root and unshare -m (private mounts)")
    rng = random.Random(args.seed)
    with tempfile.TemporaryDirectory() as work:
        references = [run_two_nodes(Path(work) / f"reference{index}", Path(args.dataset), None, rng)
                      for index in range(args.references)]
        reference = {"test_mrr": sum(r["test_mrr"] for r in references) / len(references),
                     "seconds": sum(r["seconds"] for r in references) / len(references),
                     "test_mrrs": [r["test_mrr"] for r in references]}
        print(f"reference: test MRR {reference['test_mrr']:.4f} (runs: "
              f"{', '.join(f'{m:.4f}' for m in reference['test_mrrs'])}) in {reference['seconds']:.1f} s", flush=True)
        runs = []
        for index in range(args.kills):
            delay = rng.uniform(0, 0.8 * reference["seconds"])
            runs.append(run_two_nodes(Path(work) / f"kill{index}", Path(args.dataset), delay, rng))
            r = runs[-1]
            mrr = "failed" if r["test_mrr"] is None else \
                f"{r['test_mrr']:.4f} ({r['test_mrr'] - reference['test_mrr']:+.4f})"
            print(f"run {index}: killed {r['killed']} at {delay:.1f} s, exit {r['exit_codes']}, test MRR {mrr}",
                  flush=True)
    finished = [r for r in runs if r["test_mrr"] is not None]
    worst = max((abs(r["test_mrr"] - reference["test_mrr"]) for r in finished), default=None)
    print(f"{len(finished)} of {len(runs)} runs finished by restarts alone ({sum(1 for r in runs if r['killed'])} "
          f"killed a trainer); largest MRR difference {worst if worst is None else round(worst, 4)}")
    out = Path(args.json)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps({"date": time.strftime("%Y-%m-%d"), "command": " ".join(sys.argv),
                               "cpu_count": os.cpu_count(), "settings": SETTINGS, "reference": reference,
                               "runs": runs, "finished": len(finished), "largest_mrr_difference": worst},
                              indent=2))
    print(f"wrote {out}")


if __name__ == "__main__":
    main()
