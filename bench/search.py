"""A hyperparameter search around a shipped config (``marius-py tune``), then its best config trained again
and tested: the search's time and trials, the best trial's values, validation MRR and time to train, and
the test metrics of best.yaml.

    python bench/search.py --dataset fb15k-237 --config fb15k-237 --space fb15k-237 --trials 30 \
        --datasets-root ../shared/datasets --run-dir runs/tune-fb15k-237 \
        --out bench/results/search-fb15k-237.json

The search selects on validation alone; the test split is read once, by the retrain of best.yaml. A
--run-dir that holds a search already is resumed (``--trials`` sets its total), so a bench that was
stopped loses no finished trial.
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
from pathlib import Path

import marius_py as mp
from quality import machine, run_one


def search(args) -> object:
    """The search of --run-dir: resumed where it holds one, else started."""
    devices = args.devices.split(",") if args.devices else None
    if (Path(args.run_dir) / "study.db").exists():
        return mp.resume_tune(args.run_dir, args.trials, devices)
    config = mp.make_config(args.config, [f"dataset.path={Path(args.datasets_root) / args.dataset}", *args.set])
    return mp.tune(config, args.space, args.trials, args.run_dir, args.pruner, devices)


def search_record(result) -> dict:
    study, best = result.study, result.study.best_trial
    return {"run_dir": str(result.run_dir), "wall_seconds": study.user_attrs.get("wall_seconds"),
            "pruner": study.user_attrs.get("pruner"), "trials": result.outcomes(),
            "best": {"trial": best.number, "valid_mrr": best.value, "params": best.params,
                     "seconds": best.user_attrs.get("seconds")},
            "space": (result.run_dir / "space.yaml").read_text()}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--dataset", required=True, help="a folder under --datasets-root")
    parser.add_argument("--config", required=True, help="a bundled config name or YAML path")
    parser.add_argument("--space", required=True, help="a space file or a bundled space's name")
    parser.add_argument("--trials", type=int, required=True)
    parser.add_argument("--pruner", default="median")
    parser.add_argument("--devices", help="one trial on each at once: cuda:0,cuda:1")
    parser.add_argument("--set", action="append", default=[], help="key=value on the config, fixed")
    parser.add_argument("--datasets-root", default="../shared/datasets")
    parser.add_argument("--run-dir", required=True, help="the search directory (resumed when it holds one)")
    parser.add_argument("--out", required=True)
    args = parser.parse_args()
    result = search(args)
    for line in result.summary():
        print(line)
    with tempfile.TemporaryDirectory() as workdir:
        retrained = run_one(Path(args.datasets_root) / args.dataset, str(result.best_yaml), [], Path(workdir))
    payload = {"machine": machine(), "date": time.strftime("%Y-%m-%d"), "command": " ".join(sys.argv),
               "dataset": args.dataset, "config": args.config, "search": search_record(result),
               "retrained": retrained}
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(payload, indent=2))
    print(f"best.yaml trained again: test MRR {retrained['test']['mrr']:.4f} in {retrained['train_seconds']:.0f} s; "
          f"wrote {args.out}")


if __name__ == "__main__":
    main()
