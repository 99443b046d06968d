"""Research code on the engine without editing it: a loss, a negative sampler and a callback of your own,
edges held in memory, and the trained model ranked on triples of your choosing. Every piece is an ordinary
Python object registered by name; a config names it. (The decoder: examples/custom_decoder.py.)

    python examples/own_model.py          # UMLS from tests/data, a few seconds on 2 cores

docs/guides/own-model.md walks through it; tests/test_examples.py runs it.
"""

import sys
import tempfile
from pathlib import Path

import numpy as np
import torch
from torch.nn import functional as F

import marius_py as mp
from marius_py.callbacks import Callback, Stop

UMLS = Path(__file__).resolve().parent.parent / "tests" / "data" / "umls"


# [loss]
def soft_margin(positive, negative, valid, margin):
    """Each edge's loss from its score [B] and its negatives' scores [B, N]; ``valid`` masks true answers
    drawn as negatives (they must count for nothing)."""
    gaps = F.softplus(margin - positive[:, None] + negative)
    return (gaps * valid).sum(1) / valid.sum(1).clamp_min(1)


mp.LOSSES.register("soft_margin", soft_margin, replace=True)
# [loss end]


# [sampler]
def corrupt_among_few(num_endpoints, num_candidates, num_chunks, num_negatives, degree_fraction, generator):
    """Negatives for each chunk of a batch: positions among the candidate rows (uniform here, from the first
    half of them), and no picks among the batch's own endpoints (None)."""
    positions = torch.randint(max(1, num_candidates // 2), (num_chunks, num_negatives), generator=generator,
                              device=generator.device)
    return positions, None


mp.NEGATIVE_SAMPLERS.register("first_half", corrupt_among_few, replace=True)
# [sampler end]


# [callback]
class StopWhenFlat(Callback):
    """Stops training once the validation MRR has not improved by ``min_gain`` twice in a row."""

    def __init__(self, min_gain: float = 0.001):
        self.min_gain, self.best, self.flat = min_gain, 0.0, 0

    def on_validation(self, run, metrics):
        self.flat = 0 if metrics["mrr"] > self.best + self.min_gain else self.flat + 1
        self.best = max(self.best, metrics["mrr"])
        if self.flat >= 2:
            return Stop(f"validation MRR flat at {self.best:.4f}")

    def on_epoch_end(self, run, record):
        print(f"epoch {record['epoch']}: loss {record['loss']:.4f}")
# [callback end]


def triples_in_memory() -> dict[str, np.ndarray]:
    """UMLS's splits as arrays of names, as research code holds them (read from files here for the example)."""
    return {split: np.array([line.split("\t") for line in (UMLS / f"{split}.txt").read_text().splitlines()])
            for split in ("train", "valid", "test")}


def main(epochs: int = 12) -> dict:
    # [memory]
    splits = triples_in_memory()
    root = Path(tempfile.mkdtemp(prefix="marius-own-model-"))
    dataset = mp.Dataset.from_triples(splits["train"], splits["valid"], splits["test"], directory=root / "data")
    # [memory end]
    # [train]
    config = mp.make_config(None, [f"dataset.path={dataset.directory}", "model.decoder=distmult", "model.dim=64",
                                   "model.loss=soft_margin", "training.negative_sampler=first_half",
                                   "training.num_negatives=64", "training.batch_size=512", "training.device=cpu",
                                   f"training.epochs={epochs}", "evaluation.every=2", "training.seed=0"])
    model = mp.train(config, run_dir=root / "run", progress=False, callbacks=[StopWhenFlat()])
    # [train end]
    # [query]
    mine = [tuple(row) for row in splits["test"][:50]]
    metrics = model.evaluate(mine)                        # filtered against every known edge
    unfiltered = model.evaluate(mine, filtered=False)
    heads, relations = splits["test"][:4, 0], splits["test"][:4, 1]
    names, scores = model.predict(relation=relations, head=heads, k=3)   # a batch of queries: [4, 3] arrays
    # [query end]
    print(f"test MRR {model.test_metrics['mrr']:.4f}; 50 chosen triples: MRR {metrics['mrr']:.4f} filtered, "
          f"{unfiltered['mrr']:.4f} unfiltered")
    for head, relation, answers in zip(heads, relations, names):
        print(f"({head}, {relation}, ?) -> {', '.join(answers)}")
    return {"test_mrr": model.test_metrics["mrr"], "chosen_mrr": metrics["mrr"],
            "chosen_unfiltered_mrr": unfiltered["mrr"], "answers": names, "scores": scores}


if __name__ == "__main__":
    main(*(int(arg) for arg in sys.argv[1:]))
