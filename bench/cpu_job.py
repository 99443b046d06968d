"""Whole `marius-py train` runs on the CPU, alternated between code versions and allocator settings.

    python bench/cpu_job.py --json bench/results/cpu-allocator.json --allocator both          # the bundled job
    python bench/cpu_job.py --code /tmp/base --code . --repeats 3 --json out.json -- training.epochs=3 evaluation.every=0
    python bench/cpu_job.py --code /tmp/venv-base/bin/python --code /tmp/venv-new/bin/python -- training.epochs=3

Each run is `marius-py train --quiet [train arguments]` in a fresh process, from a checkout given with
``--code`` (a git worktree of another commit, say; default: this one) or a Python interpreter whose
environment has marius-py installed (a venv holding another commit's wheel). A checkout is put first on
``sys.path``; where an editable install of another checkout is present, its ``storage``, ``pipeline`` and
``orderings`` subpackages still come from that install (setuptools' editable finder maps them), so compare
commits that differ there through interpreters. Runs use the command's allocator
settings or glibc's defaults (``--allocator``: MARIUS_PY_SYSTEM_MALLOC, marius_py/resources.py; a checkout
without the settings always runs glibc's defaults, and its rows say so). Runs alternate (``--repeats``
rounds of every code x allocator) so that a drifting machine hits them alike. Each row: wall, user and
system seconds, the test MRR as printed (4 decimals), and the seconds of every epoch.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ALLOCATOR_OPT_OUT = "MARIUS_PY_SYSTEM_MALLOC"  # as marius_py/resources.py (not imported: --code picks the code)
ALLOCATORS = {"command": [False], "system": [True], "both": [True, False]}


def timed_run(code: Path, train_args: list[str], system_malloc: bool) -> dict:
    env = {key: value for key, value in os.environ.items() if key != ALLOCATOR_OPT_OUT}
    if system_malloc:
        env[ALLOCATOR_OPT_OUT] = "1"
    with tempfile.TemporaryDirectory() as scratch:
        run_dir = Path(scratch) / "run"
        interpreter = code if code.is_file() else Path(sys.executable)
        path = "" if code.is_file() else f"sys.path.insert(0, {str(code)!r}); "
        program = (f"import sys; {path}from marius_py.cli import main; "
                   f"sys.exit(main(['train', '--quiet', '--run-dir', {str(run_dir)!r}, *{train_args!r}]))")
        before = resource.getrusage(resource.RUSAGE_CHILDREN)
        start = time.perf_counter()
        done = subprocess.run([str(interpreter), "-c", program], env=env, cwd=scratch, capture_output=True,
                              text=True)
        if done.returncode:
            sys.exit(f"{code}: marius-py train failed ({done.returncode}):\n{done.stderr}")
        out = done.stdout
        wall = time.perf_counter() - start
        after = resource.getrusage(resource.RUSAGE_CHILDREN)
        records = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    mrr = re.search(r"^test: MRR ([0-9.]+)", out, re.MULTILINE)
    has_settings = code.is_file() or "keep_freed_memory" in (code / "marius_py" / "resources.py").read_text()
    allocator = "command's" if has_settings and not system_malloc else "glibc defaults"
    return {"code": str(code), "allocator": allocator, "wall_s": wall,
            "user_s": after.ru_utime - before.ru_utime, "system_s": after.ru_stime - before.ru_stime,
            "test_mrr": float(mrr.group(1)) if mrr else None,
            "epoch_s": [round(r["seconds"], 2) for r in records if r.get("event") == "epoch"]}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--code", action="append", type=Path, default=None,
                        help="a checkout, or a Python with marius-py installed, to run (repeatable; default: this "
                             "checkout)")
    parser.add_argument("--allocator", choices=sorted(ALLOCATORS), default="command")
    parser.add_argument("--repeats", type=int, default=1)
    parser.add_argument("--json", default=None)
    parser.add_argument("train_args", nargs="*", help="after --: arguments of marius-py train")
    args = parser.parse_args()
    codes = [code.absolute() for code in args.code or [Path(__file__).resolve().parent.parent]]
    rows = [timed_run(code, args.train_args, system_malloc) for _ in range(args.repeats) for code in codes
            for system_malloc in ALLOCATORS[args.allocator]]
    print(f"{'code':<24} {'allocator':<15} {'wall s':>7} {'user s':>7} {'sys s':>6} {'test MRR':>8}  epochs (s)")
    for row in rows:
        mrr = f"{row['test_mrr']:.4f}" if row["test_mrr"] is not None else "-"
        print(f"{row['code'][-24:]:<24} {row['allocator']:<15} {row['wall_s']:7.1f} {row['user_s']:7.1f} "
              f"{row['system_s']:6.1f} {mrr:>8}  {row['epoch_s']}")
    if args.json:
        Path(args.json).write_text(json.dumps({"cpus": os.cpu_count(), "train_args": args.train_args,
                                               "rows": rows}, indent=1))


if __name__ == "__main__":
    main()
