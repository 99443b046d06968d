"""Start-up: what `import torch` and then `import marius_py` take in a fresh interpreter, and a small run's
start-up record (its phases up to the first batch), each the median of ``--repeats`` fresh processes.

    python bench/startup.py --python /path/to/venv/bin/python --json bench/results/startup/cpu.json

``--python``: the interpreter of an installed marius-py (as users have it: its modules byte-compiled by pip;
a source checkout on PYTHONPATH under PYTHONDONTWRITEBYTECODE compiles every module at every start). The run
is UMLS (tests/data/umls, in this checkout) for one epoch on ``--device``, without evaluation.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

UMLS = Path(__file__).resolve().parent.parent / "tests" / "data" / "umls"

IMPORTS = """
import json, sys, time
started = time.perf_counter()
import torch
torch_done = time.perf_counter()
import marius_py
print(json.dumps({"torch": torch_done - started, "marius_py": time.perf_counter() - torch_done,
                  "compiler_imported": any(m in sys.modules for m in ("torch._dynamo", "torch._inductor"))}))
"""

RUN = """
import json, sys
import marius_py as mp
from marius_py.config_loading import load_config
config = load_config(None, [f"dataset.path={sys.argv[1]}", f"training.device={sys.argv[3]}", "training.epochs=1",
                            "evaluation.every=0", "model.dim=100"])
mp.train(config, sys.argv[2], progress=False, test=False)
startup = [r for r in mp.checkpoint.RunDirectory(sys.argv[2]).read_metrics() if r["event"] == "startup"][-1]
print(json.dumps({**startup, "compiler_imported": any(m in sys.modules for m in ("torch._dynamo", "torch._inductor"))}))
"""


def fresh(python: str, code: str, *args: str) -> dict:
    environment = {key: value for key, value in os.environ.items() if key != "PYTHONDONTWRITEBYTECODE"}
    result = subprocess.run([python, "-c", code, *args], capture_output=True, text=True, check=True,
                            env=environment, cwd=tempfile.gettempdir())
    return json.loads(result.stdout.strip().splitlines()[-1])


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--python", default=sys.executable, help="an interpreter with marius-py installed")
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--json")
    args = parser.parse_args(argv)
    fresh(args.python, IMPORTS)  # (a first start byte-compiles what is not yet)
    imports = [fresh(args.python, IMPORTS) for _ in range(args.repeats)]
    runs = []
    for _ in range(args.repeats):
        with tempfile.TemporaryDirectory() as root:
            runs.append(fresh(args.python, RUN, str(UMLS), str(Path(root) / "run"), args.device))
    phases = sorted({phase for run in runs for phase in run["phases"]})
    result = {
        "bench": "startup", "date": time.strftime("%Y-%m-%d"), "command": " ".join(["python", *sys.argv]),
        "machine": f"{platform.machine()}, {os.cpu_count()} CPU cores", "python": args.python,
        "device": args.device, "repeats": args.repeats,
        "import_torch_s": statistics.median(r["torch"] for r in imports),
        "import_marius_py_after_torch_s": statistics.median(r["marius_py"] for r in imports),
        "seconds_to_first_batch": statistics.median(r["seconds_to_first_batch"] for r in runs),
        "phases_s": {phase: statistics.median(r["phases"].get(phase, 0.0) for r in runs) for phase in phases},
        "compiler_imported": any(r["compiler_imported"] for r in imports + runs)}
    print(f"import torch {result['import_torch_s']:.2f} s, then import marius_py "
          f"{result['import_marius_py_after_torch_s']:.2f} s; a UMLS run ({args.device}) reaches its first batch "
          f"in {result['seconds_to_first_batch']:.2f} s: "
          + ", ".join(f"{phase} {seconds:.2f}" for phase, seconds in result["phases_s"].items())
          + f"; torch's compiler imported: {result['compiler_imported']}")
    if args.json:
        Path(args.json).parent.mkdir(parents=True, exist_ok=True)
        Path(args.json).write_text(json.dumps(result, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
