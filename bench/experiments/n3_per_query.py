r"""bench/quality.py with N3 weighted per query, as Chen et al. (2021) count it, on the autograd step.

    python bench/experiments/n3_per_query.py 2.0 -- --datasets-root <dir> --runs codex-s:codex-s \
        --set training.fused_step=false --set training.seed=0 --out /tmp/n3.json

Their N3 term is taken per query: an edge's two queries penalise each of its entities twice and each
relation row once. Ours penalises the four rows of an edge once under ``model.reg_weight``. FACTOR
multiplies the entity rows' share (2.0: theirs, with reg_weight = their lambda); 1.0 is ours. An
experiment on the autograd step (the fused kernels take one weight), not a config option.
"""

from __future__ import annotations

import runpy
import sys
from pathlib import Path

import marius_py.step.model as step_model


def main() -> None:
    if len(sys.argv) < 3 or sys.argv[2] != "--":
        sys.exit(__doc__)
    factor = float(sys.argv[1])
    own = step_model.regularization

    def per_query(kind, tensors, complex_valued, batch_size):
        entities = own(kind, tensors[:2], complex_valued, batch_size)
        relations = own(kind, tensors[2:], complex_valued, batch_size) if len(tensors) > 2 else 0
        return factor * entities + relations
    step_model.regularization = per_query
    sys.argv = ["bench/quality.py", *sys.argv[3:]]
    runpy.run_path(str(Path(__file__).resolve().parent.parent / "quality.py"), run_name="__main__")


if __name__ == "__main__":
    main()
