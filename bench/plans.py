"""The plan on this machine, from CoDEx-S to the Freebase86m shape: what ``marius-py train`` chooses here
when left to itself, whether that run fits (its peak RSS against the plan's host bound) and trains, and
its epoch's speed beside manual settings of the same graph, each trained in a process of its own.

    python bench/plans.py --datasets-root ../shared/datasets --workdir /tmp/plans \
        --graphs codex-s codex-m fb15k-237 freebase:0.25 --out bench/results/plans/cpu.json

A graph is a folder under --datasets-root, or ``freebase:SCALE``: bench/freebase_shape.py's graph at that
scale, written under --workdir once. Every run trains the same model (``--set``, ComplEx d=100 by
default) for ``--epochs`` epochs and stops when the last one's record is logged (its config asks for one
more, so that no validation runs: filtered ranking of a Freebase-sized split takes hours on a CPU);
edges/s is that epoch's (the first pays start-up). Manual settings (``--manual``, each a space-separated list of overrides) run after the plan's;
a manual setting that fails (out of memory, refused) is recorded with its error, not fatal.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

BENCH = Path(__file__).resolve().parent
MODEL = ["model.decoder=complex", "model.dim=100", "training.batch_size=10000", "training.num_negatives=100",
         "evaluation.every=0"]
MANUAL = ["storage.num_partitions=1",
          "storage.num_partitions=8 storage.buffer_capacity=4 storage.dtype=float32 storage.ordering=beta",
          "storage.num_partitions=16 storage.buffer_capacity=8 storage.dtype=float32 storage.ordering=beta"]


class StopAfterEpochs:
    """A trainer's callback (``marius_py.callbacks``) keeping the plan and the last epoch's record, stopping
    the run after ``epochs``: before the config's last epoch, which validates."""

    def __init__(self, epochs: int):
        self.epochs, self.records = epochs, {}

    def on_record(self, run, record: dict) -> None:
        if record.get("event") in ("plan", "epoch"):
            self.records[record["event"]] = record

    def on_epoch_end(self, run, record: dict):
        from marius_py.callbacks import Stop
        return Stop(f"{self.epochs} epochs measured") if run.epoch >= self.epochs else None


def train_one(overrides: list[str], run_dir: str, epochs: int) -> None:
    """(child process) ``epochs`` epochs of the config the overrides give (whose training.epochs is one more:
    the last epoch validates); prints the plan's record and the last epoch's."""
    import marius_py as mp
    from marius_py.resources import keep_freed_memory
    allocator_settings_taken = keep_freed_memory()  # (as `marius-py train` sets glibc's malloc)
    config = mp.make_config(None, overrides)
    measured = StopAfterEpochs(epochs)
    mp.train(config, run_dir, progress=False, test=False, callbacks=[measured])
    print(json.dumps({**measured.records, "allocator_settings_taken": allocator_settings_taken}), flush=True)


def run_child(overrides: list[str], run_dir: Path, epochs: int) -> dict:
    """Train in a child process: its records, wall seconds and peak RSS (its own, from wait4), or its error."""
    shutil.rmtree(run_dir, ignore_errors=True)
    started = time.perf_counter()
    with tempfile.TemporaryFile("w+") as errors:  # (a file, not a pipe: the child never blocks on it)
        child = subprocess.Popen([sys.executable, __file__, "--train-one", str(run_dir), str(epochs), "--",
                                  *overrides],
                                 stdout=subprocess.PIPE, stderr=errors, text=True)
        stdout = child.stdout.read()
        _, status, usage = os.wait4(child.pid, 0)  # (the child's own peak RSS, not the largest of all children)
        child.returncode = os.waitstatus_to_exitcode(status)
        errors.seek(0)
        stderr = errors.read().strip()
    shutil.rmtree(run_dir, ignore_errors=True)
    result = {"overrides": overrides, "wall_seconds": time.perf_counter() - started}
    if child.returncode != 0:
        return {**result, "error": stderr.splitlines()[-1] if stderr else f"exit {child.returncode}"}
    return {**result, **json.loads(stdout.strip().splitlines()[-1]), "peak_rss_bytes": usage.ru_maxrss * 1024}


def dataset_path(graph: str, args) -> Path:
    """The graph's dataset folder: under --datasets-root, or the Freebase86m shape generated once."""
    if not graph.startswith("freebase:"):
        return Path(args.datasets_root) / graph
    scale = graph.split(":", 1)[1]
    out = Path(args.workdir) / f"freebase-{scale}"
    if not (out / "metadata.json").exists():
        subprocess.run([sys.executable, str(BENCH / "freebase_shape.py"), "--out", str(out), "--partitions", "16",
                        "--scale", scale], check=True)
    return out


def measure(graph: str, args) -> dict:
    base = [f"dataset.path={dataset_path(graph, args)}", *MODEL, f"training.epochs={args.epochs + 1}", *args.set]
    run_dir = Path(args.workdir) / "run"
    planned = {} if args.skip_plan else run_child(base, run_dir, args.epochs)
    row = {"graph": graph, "plan": planned, "manual": []}
    if planned:
        print(line(graph, "plan", planned), flush=True)
    for setting in args.manual:
        result = run_child(base + setting.split(), run_dir, args.epochs)
        row["manual"].append(result)
        print(line(graph, setting, result), flush=True)
    rates = [r["epoch"]["edges_per_s"] for r in row["manual"] if "epoch" in r]
    if "epoch" in planned and rates:
        row["plan_over_best_manual"] = planned["epoch"]["edges_per_s"] / max(rates)
    if "plan" in planned and planned.get("peak_rss_bytes"):
        row["rss_within_bound"] = planned["peak_rss_bytes"] <= planned["plan"]["host_bytes"]
    return row


def line(graph: str, setting: str, result: dict) -> str:
    if "error" in result:
        return f"{graph:14s} {setting:90s} failed: {result['error']}"
    plan, epoch = result.get("plan", {}), result["epoch"]
    chosen = (f"{plan.get('tier')}, P={plan.get('num_partitions')} C={plan.get('buffer_capacity')} "
              f"({plan.get('physical_partitions')}:{plan.get('physical_buffer')} {plan.get('ordering')} "
              f"{plan.get('dtype')})")
    rss, bound = result.get("peak_rss_bytes") or 0, plan.get("host_bytes") or 0
    return (f"{graph:14s} {setting:90s} {chosen:42s} {epoch['edges_per_s'] / 1e6:6.2f} M edges/s, "
            f"peak RSS {rss / 2 ** 30:5.1f} GiB (bound {bound / 2 ** 30:5.1f})")


def main() -> None:
    if len(sys.argv) > 2 and sys.argv[1] == "--train-one":
        return train_one(sys.argv[5:], sys.argv[2], int(sys.argv[3]))
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--graphs", nargs="+", default=["codex-s", "codex-m", "fb15k-237"])
    parser.add_argument("--datasets-root", default="../shared/datasets")
    parser.add_argument("--workdir", required=True)
    parser.add_argument("--epochs", type=int, default=2, help="epochs each run trains (the last one timed)")
    parser.add_argument("--set", nargs="*", default=[], help="key=value for every run (the model, the device)")
    parser.add_argument("--manual", nargs="*", default=MANUAL, help="manual settings, each a quoted list")
    parser.add_argument("--skip-plan", action="store_true", help="manual settings only (a follow-up call)")
    parser.add_argument("--out", required=True)
    args = parser.parse_args()
    Path(args.workdir).mkdir(parents=True, exist_ok=True)
    import torch
    machine = (f"{torch.cuda.get_device_name(0)}, " if torch.cuda.is_available() else "") + \
        f"{os.cpu_count()} CPU cores, {os.sysconf('SC_PHYS_PAGES') * os.sysconf('SC_PAGE_SIZE') / 2 ** 30:.0f} GiB"
    report = {"date": time.strftime("%Y-%m-%d"), "machine": machine, "command": " ".join(["bench/plans.py", *sys.argv[1:]]),
              "model": MODEL + args.set, "rows": []}
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    for graph in args.graphs:  # (written after every graph: a call cut short keeps the graphs it finished)
        report["rows"].append(measure(graph, args))
        partial = Path(f"{args.out}.partial")  # (replaced whole: a kill mid-write leaves the last report)
        partial.write_text(json.dumps(report, indent=1))
        os.replace(partial, args.out)
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
