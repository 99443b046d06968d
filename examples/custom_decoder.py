"""A decoder of your own, in plain PyTorch: SimplE (Kazemi & Poole 2018) as a plug-in, trained, reopened and
queried through the API, beside the built-in SimplE.

    python examples/custom_decoder.py                    # UMLS from tests/data (a few seconds on 2 cores)
    python examples/custom_decoder.py DATASET_DIR        # any raw (train/valid/test.txt) or preprocessed one

A plug-in decoder subclasses ``mp.Decoder`` and gives its score over broadcast vectors, ``score_hrt(h, r, t)``
(or, for speed, an operator and a comparator: see ``marius_py.models``). It registers under a name, which a
config then names; a run made with it reopens in any process that registers it again (with the command
line: ``model.plugins=examples/custom_decoder.py``, or a module of yours). It trains on the autograd step on
every placement (the fused step has kernels for the built-in decoders only; the plan says so).
"""

import sys
import tempfile
from pathlib import Path

import torch

import marius_py as mp


class PlainSimplE(mp.Decoder):
    """score = 1/2 (<h_head, r, t_tail> + <t_head, r_inv, h_tail>): each node's vector holds its head-role and
    tail-role embeddings as halves, each relation a forward and an inverse vector."""

    dim_multiple = 2  # (validation refuses an odd model.dim, naming this class)

    def relation_dim(self, dim):
        return dim // 2  # r in the relation's row, r_inv in its inverse row (exported as NAME__inverse)

    def relation_vectors(self, relation_ids, inverse):
        # Both directions score the same triple: a head query (t, ?) gets the relation's two vectors swapped.
        forward = self.relations[relation_ids]
        backward = self.relations[relation_ids + self.num_relations]
        return torch.cat([backward, forward] if inverse else [forward, backward], dim=-1)

    def score_hrt(self, h, r, t):
        h_head, h_tail = h.chunk(2, dim=-1)
        t_head, t_tail = t.chunk(2, dim=-1)
        r_own, r_other = r.chunk(2, dim=-1)
        return 0.5 * ((h_head * r_own * t_tail).sum(-1) + (t_head * r_other * h_tail).sum(-1))


if "plain_simple" not in mp.DECODERS:  # (a process that imports this module twice registers it once)
    mp.DECODERS.register("plain_simple", PlainSimplE)


def train(dataset: str, decoder: str, run_dir: str, epochs: int) -> mp.TrainedModel:
    config = mp.make_config(None, [f"dataset.path={dataset}", f"model.decoder={decoder}", "model.dim=64",
                                   "training.device=cpu", f"training.epochs={epochs}", "training.batch_size=512",
                                   "training.num_negatives=64", "training.lr=0.1", "evaluation.every=0",
                                   "model.reg_weight=0.0001", "training.seed=0"])
    return mp.train(config, run_dir=run_dir, progress=False)


def main(argv: list[str], epochs: int = 10) -> dict:
    """Test MRR of the plug-in and of the built-in SimplE, trained alike."""
    dataset = argv[0] if argv else str(Path(__file__).resolve().parent.parent / "tests" / "data" / "umls")
    root = tempfile.mkdtemp(prefix="marius-custom-decoder-")
    mrr = {}
    for decoder in ("plain_simple", "simple"):
        model = train(dataset, decoder, f"{root}/{decoder}", epochs)
        mrr[decoder] = model.test_metrics["mrr"]
        print(f"{decoder:<14} test MRR {mrr[decoder]:.4f}")
    model = mp.load_checkpoint(f"{root}/plain_simple")  # reopens: this process has registered plain_simple
    head, relation = model.dataset.node_names[0], model.dataset.relation_names[0]
    for name, score in model.predict(head=head, relation=relation, k=3):
        print(f"({head}, {relation}, ?) -> {name}  {score:.3f}")
    print("runs in", root)
    return mrr


if __name__ == "__main__":
    main(sys.argv[1:])
