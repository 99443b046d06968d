"""The command's glibc allocator settings (marius_py/resources.py, keep_freed_memory) against the defaults.

    python bench/allocator.py --json bench/results/cpu-allocator.json [-- marius-py train arguments]

Runs `marius-py train` (by default with no arguments: the bundled CoDEx-M job) once with
MARIUS_PY_SYSTEM_MALLOC=1 (glibc's defaults) and once without, alternating ``--repeats`` times, and
prints wall, user and system seconds and the test MRR of each run.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import resource
import subprocess
import sys
import time
from pathlib import Path

from marius_py.resources import ALLOCATOR_OPT_OUT


def timed_run(train_args: list[str], system_malloc: bool) -> dict:
    env = dict(os.environ)
    env.pop(ALLOCATOR_OPT_OUT, None)
    if system_malloc:
        env[ALLOCATOR_OPT_OUT] = "1"
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    start = time.perf_counter()
    out = subprocess.run([sys.executable, "-m", "marius_py", "train", "--quiet", *train_args], env=env,
                         capture_output=True, text=True, check=True).stdout
    wall = time.perf_counter() - start
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    mrr = re.search(r"^test: MRR ([0-9.]+)", out, re.MULTILINE)
    return {"allocator": "glibc defaults" if system_malloc else "keep_freed_memory", "wall_s": wall,
            "user_s": after.ru_utime - before.ru_utime, "system_s": after.ru_stime - before.ru_stime,
            "test_mrr": float(mrr.group(1)) if mrr else None}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=1)
    parser.add_argument("--json", default=None)
    parser.add_argument("train_args", nargs="*", help="after --: arguments of marius-py train")
    args = parser.parse_args()
    rows = [timed_run(args.train_args, system_malloc) for _ in range(args.repeats) for system_malloc in (True, False)]
    print(f"{'allocator':<18} {'wall s':>8} {'user s':>8} {'system s':>9} {'test MRR':>9}")
    for row in rows:
        print(f"{row['allocator']:<18} {row['wall_s']:8.1f} {row['user_s']:8.1f} {row['system_s']:9.1f} "
              f"{row['test_mrr'] if row['test_mrr'] is not None else float('nan'):9.4f}")
    if args.json:
        Path(args.json).write_text(json.dumps({"cpus": os.cpu_count(), "train_args": args.train_args,
                                               "rows": rows}, indent=1))


if __name__ == "__main__":
    main()
