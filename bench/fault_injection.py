"""Fault injection: SIGKILL `marius-py train` at random instants, resume after each kill, compare the end.

    python bench/fault_injection.py --dataset ../shared/datasets/codex-s --kills 100 \
        --partitions 8 --buffer 3 --json bench/results/cpu-fault-injection-codex-s-p8.json

An uninterrupted run gives the reference test MRR and wall time. The killed
series then starts the same run (in its own dataset cache, so preprocessing
is killed too) and sends SIGKILL after a uniform random delay within the
reference's wall time, again and again; after each kill it continues with
`--resume` (or starts over when the kill came before the run directory
existed). Kills land wherever the process is: preprocessing, batches,
prefetch and write-back threads, checkpoint commits. Reported: kills,
resumes that started from a checkpoint, refused (unreadable) checkpoints,
and the final test MRR against the reference.

``--commit-kills F`` aims a fraction F of the kills at commits being written (behind training, where the
plan writes them so): the series watches the run's checkpoints/ and kills once a version is being written
there (its hidden ``.NAME.tmp`` directory, made by this attempt), after a further random delay of up to 20
ms. Every kill, aimed or not, counts as landing in a commit when such a directory was there the instant
before the signal.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

COMMIT_POLL_SECONDS = 0.001


from marius_py.checkpoint import RunDirectory  # noqa: E402


def train_command(run_dir: Path, settings: list[str], resume: bool) -> list[str]:
    base = [sys.executable, "-m", "marius_py.cli", "train", "--quiet"]
    if resume:
        return base + ["--resume", str(run_dir)]
    return base + ["codex-s", *settings, "--run-dir", str(run_dir)]


def test_mrr(run_dir: Path) -> float:
    return [r for r in RunDirectory(run_dir).read_metrics() if r.get("split") == "test"][-1]["mrr"]


def commit_being_written(run_dir: Path, since: float) -> bool:
    """Whether a version is being written in the run directory now: a hidden temporary version made since
    ``since`` (time.time() when the attempt started; one a killed attempt left stays until the next commit)."""
    try:
        return any(entry.name.startswith(".v") and entry.name.endswith(".tmp") and entry.stat().st_mtime >= since
                   for entry in os.scandir(run_dir / "checkpoints"))
    except OSError:
        return False


def run_with_kills(settings: list[str], kills: int, workdir: Path, seed: int = 0, log=print,
                   commit_kills: float = 0.0) -> dict:
    """The reference run, then a run killed ``kills`` times and resumed until it completes."""
    environment = {**os.environ, "MARIUS_PY_CACHE": str(workdir / "cache-reference")}
    reference_dir = workdir / "reference"
    started = time.perf_counter()
    subprocess.run(train_command(reference_dir, settings, False), env=environment, check=True,
                   stdout=subprocess.DEVNULL)
    reference_seconds = time.perf_counter() - started
    reference = test_mrr(reference_dir)
    log(f"reference: test MRR {reference:.4f} in {reference_seconds:.1f} s")

    rng = random.Random(seed)
    counts = {"kills": 0, "kills_during_commit": 0, "aimed_at_commits": 0, "resumes": 0, "resumes_mid_epoch": 0,
              "fresh_starts": 0, "refused": 0, "refusals": [], "final_mrrs": []}
    series = 0
    while counts["kills"] < kills:  # a series: one run killed until an attempt survives to the end
        series += 1
        environment["MARIUS_PY_CACHE"] = str(workdir / f"cache-{series}")  # preprocessing is killed too
        final = _killed_series(settings, workdir / f"killed-{series}", environment, rng, reference_seconds,
                               kills, counts, commit_kills)
        counts["final_mrrs"].append(final)
        log(f"series {series}: {counts['kills']} kills so far; final test MRR {final}")
    mrrs = [m for m in counts["final_mrrs"] if m is not None]
    worst = max((abs(m - reference) for m in mrrs), default=None)
    log(f"{counts['kills']} kills ({counts['kills_during_commit']} while a commit was written), "
        f"{counts['resumes']} resumes from a run directory "
        f"({counts['resumes_mid_epoch']} from a mid-epoch checkpoint), {counts['fresh_starts']} "
        f"fresh starts, {counts['refused']} refused checkpoints; {len(mrrs)} runs completed, largest test MRR "
        f"difference from the reference {worst}")
    return {**counts, "series": series, "reference_mrr": reference, "largest_mrr_difference": worst,
            "reference_seconds": reference_seconds, "settings": settings}


def _killed_series(settings, run_dir: Path, environment, rng, reference_seconds: float, kills: int,
                   counts: dict, commit_kills: float = 0.0) -> float | None:
    """Start the run, SIGKILL it at a random instant, resume, ... until an attempt completes; its test MRR."""
    while True:
        resume = (run_dir / "config.yaml").exists()
        if not resume:
            shutil.rmtree(run_dir, ignore_errors=True)  # killed before the directory was made: start over
        counts["resumes" if resume else "fresh_starts"] += 1
        if resume and RunDirectory(run_dir).has_checkpoint() and ".s" in RunDirectory(run_dir).latest_version().name:
            counts["resumes_mid_epoch"] += 1  # from a version committed between two buffer states
        started = time.time()
        process = subprocess.Popen(train_command(run_dir, settings, resume), env=environment,
                                   stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
        if counts["kills"] < kills:
            aimed = rng.random() < commit_kills
            if _wait_for_kill(process, run_dir, rng, reference_seconds, aimed, started):
                counts["kills_during_commit"] += commit_being_written(run_dir, started)
                process.send_signal(signal.SIGKILL)
                process.wait()
                counts["kills"] += 1
                counts["aimed_at_commits"] += aimed
                continue
        process.wait()
        error = process.stderr.read().strip()
        if process.returncode == 0:
            return test_mrr(run_dir)
        counts["refused"] += 1
        counts["refusals"].append(error.splitlines()[-1] if error else f"exit {process.returncode}")
        return None


def _wait_for_kill(process: subprocess.Popen, run_dir: Path, rng, reference_seconds: float, aimed: bool,
                   started: float) -> bool:
    """Let the run go on until its kill instant (False: it ended first): a uniform random delay, or (``aimed``)
    the moment a commit is being written, then up to 20 ms more."""
    deadline = time.monotonic() + rng.uniform(0.05, 0.6 * reference_seconds)
    while aimed and process.poll() is None and time.monotonic() < deadline + reference_seconds:
        if commit_being_written(run_dir, started):
            time.sleep(rng.uniform(0.0, 0.02))
            return process.poll() is None
        time.sleep(COMMIT_POLL_SECONDS)
    if aimed:
        return process.poll() is None
    try:
        process.wait(timeout=max(0.0, deadline - time.monotonic()))
        return False
    except subprocess.TimeoutExpired:
        return True


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--dataset", required=True, help="CoDEx-S: a raw directory with train/valid/test.txt")
    parser.add_argument("--kills", type=int, default=100)
    parser.add_argument("--partitions", type=int, default=8, help="1: in memory")
    parser.add_argument("--buffer", type=int, default=3)
    parser.add_argument("--epochs", type=int, default=6)
    parser.add_argument("--dim", type=int, default=64)
    parser.add_argument("--seed", type=int, default=0, help="of the kill instants")
    parser.add_argument("--checkpoint-interval", type=float, default=0.0,
                        help="training.checkpoint_interval (> 0: commits between buffer states too)")
    parser.add_argument("--commit-kills", type=float, default=0.0,
                        help="the fraction of kills aimed at commits being written")
    parser.add_argument("--json", default=None)
    args = parser.parse_args()
    settings = [f"dataset.path={Path(args.dataset).resolve()}", "training.device=cpu", f"model.dim={args.dim}",
                f"training.epochs={args.epochs}", "training.num_negatives=200", "evaluation.every=2",
                "training.lr=0.01", "model.dropout=0",  # as recorded in RESULTS, whatever codex-s ships
                f"training.checkpoint_interval={args.checkpoint_interval}", f"storage.num_partitions={args.partitions}"]
    if args.partitions > 1:
        settings.append(f"storage.buffer_capacity={args.buffer}")
    with tempfile.TemporaryDirectory() as workdir:
        result = run_with_kills(settings, args.kills, Path(workdir), args.seed, commit_kills=args.commit_kills)
    result.update(date=time.strftime("%Y-%m-%d"), command=" ".join(sys.argv), cpus=os.cpu_count())
    if args.json:
        Path(args.json).write_text(json.dumps(result, indent=2) + "\n")
        print(f"wrote {args.json}")


if __name__ == "__main__":
    main()
