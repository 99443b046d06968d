"""PyKEEN's SimplE on CoDEx-S on the CPU, at the settings of marius-py's SimplE row in ``bench/plugins.py``, its
filtered test MRR printed beside marius-py's (read from that bench's JSON).

PyKEEN is never a dependency of marius-py: run this with the Python of a throwaway venv that has it.

    python3 -m venv /tmp/pykeen-venv && /tmp/pykeen-venv/bin/pip install -q torch==2.13.0 pykeen
    /tmp/pykeen-venv/bin/python bench/peer_simple.py --data ../shared/datasets/codex-s \\
        --marius bench/results/plugins/cpu-codex-s.json --json bench/results/plugins/cpu-codex-s-pykeen-simple.json

marius-py's row: ``marius-py train codex-s`` with model.dim=128, 256 sampled negatives, no relation prediction,
no dropout, seed 0, 30 epochs; from the shipped codex-s config: batch 1000, node Adagrad lr 0.03, softmax
cross-entropy, N3 weight 0.01; from the defaults: relation Adagrad lr 0.1, normal(0, 1e-3) initialisation.
Its step scores every edge in both directions (op(h, r) against 256 tails, op(t, r') against 256 heads, the
256 drawn once per batch and shared by its 1000 edges; the loss is the sum of the two softmaxes, averaged over
the edges) and adds 0.01 * N3 of the batch's h and t rows and its relation rows ([r | r'] and [r' | r]) / 1000.

PyKEEN's side, as near as PyKEEN allows:

* ``SimplE(embedding_dim=64)``: PyKEEN keeps two embeddings of embedding_dim per entity (head role, tail role)
  and two per relation (r, r'); marius-py's d=128 holds both halves of 64, so 64 is the same model size and
  the same score, 1/2 (<h_H, r, t_T> + <t_H, r', h_T>). No score clamp (PyKEEN's default, and marius-py has none).
* sLCWA, ``BasicNegativeSampler(num_negs_per_pos=256)``, ``CrossEntropyLoss`` (the softmax of the positive among
  itself and its negatives: marius-py's loss; PyKEEN's InfoNCE is the same with a margin and a temperature).
  PyKEEN draws its negatives per positive, not shared, and corrupts one side of each positive: the basic
  sampler corrupts the heads of the first half of a batch and the tails of the second, so an edge is trained
  in one direction per epoch against 256 negatives where marius-py trains it in both.
* Adagrad (torch's: eps 1e-10, no initial accumulator, as marius-py's) with lr 0.03 on the entity embeddings
  and 0.1 on the relation embeddings (one optimizer, two parameter groups); batch 1000, the last batch kept.
* N3 as marius-py computes it (the positives' h and t rows, both roles, and their relation rows counted twice,
  summed over the batch and divided by its size), added to each batch's loss by a subclass of PyKEEN's sLCWA
  loop. PyKEEN's own regularisers would also penalise every negative's rows. Its weight is ``--reg-weight``,
  0.005 by default: marius-py's 0.01 weighs a loss of two softmaxes per edge, PyKEEN's loss has one, and
  halving the weight keeps the penalty's share of the objective (Adagrad's steps ignore the loss's scale).
* normal(0, 1e-3) initialisation of every embedding; seed 0 (``set_random_seed`` and the model's random_seed).
* Evaluation: PyKEEN's ``RankBasedEvaluator(filtered=True)`` on the test split, filtered on train+valid+test,
  ``both.realistic`` MRR and Hits@10 (marius-py: filtered, both directions, realistic ties).

Time: the first epoch is timed; where ``--epochs`` would run past ``--budget-seconds`` of training at its pace,
the run stops at the epochs that fit, and the JSON's ``epochs_run``/``equal_epochs`` say so. The size is fixed
from that first epoch: on two cores shared with another job the recorded runs' later epochs went at half its pace
(first epoch 16 s, 30 epochs 965 s and 1269 s), so ``train_seconds`` is no speed figure beside marius-py's.

Results (``bench/results/plugins/``): ``cpu-codex-s-pykeen-simple.json`` (N3 weight 0.005, the default) and
``cpu-codex-s-pykeen-simple-reg0.01.json`` (``--reg-weight 0.01``, marius-py's number taken as it is).
"""

from __future__ import annotations

import argparse
import json
import math
import os
import platform
import sys
import time
from functools import partial
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from peers import SPLITS, Dataset, _distribution_version  # noqa: E402  (bench/ is no package)


def n3_of_positives(model, positives: torch.Tensor) -> torch.Tensor:
    """marius-py's N3 of a batch: sum |x|^3 over both role rows of h and t and the relation rows counted twice
    (its [r | r'] and [r' | r]), divided by the batch's size."""
    heads, relations, tails = positives[:, 0], positives[:, 1], positives[:, 2]
    total = positives.new_zeros((), dtype=torch.float)
    for representation in model.entity_representations:
        for ids in (heads, tails):
            total = total + representation(indices=ids).abs().pow(3).sum()
    for representation in model.relation_representations:
        total = total + 2 * representation(indices=relations).abs().pow(3).sum()
    return total / len(positives)


def make_loop_class(reg_weight: float):
    from pykeen.training import SLCWATrainingLoop

    class N3SLCWATrainingLoop(SLCWATrainingLoop):
        """sLCWA whose batch loss adds ``reg_weight`` * N3 of the positives' rows (``n3_of_positives``)."""

        @staticmethod
        def _process_batch_static(model, loss, mode, batch, start, stop, label_smoothing=0.0, slice_size=None):
            value = SLCWATrainingLoop._process_batch_static(model=model, loss=loss, mode=mode, batch=batch,
                                                            start=start, stop=stop, label_smoothing=label_smoothing,
                                                            slice_size=slice_size)
            if reg_weight <= 0:
                return value
            positives = batch["positives"][start:stop].to(model.device)
            return value + reg_weight * n3_of_positives(model, positives)

    return N3SLCWATrainingLoop


def run(args) -> dict:
    from pykeen.evaluation import RankBasedEvaluator
    from pykeen.losses import CrossEntropyLoss
    from pykeen.models import SimplE
    from pykeen.triples import TriplesFactory
    from pykeen.utils import set_random_seed

    dataset = Dataset(Path(args.data))
    factories = {split: TriplesFactory(mapped_triples=torch.as_tensor(dataset.triples[split]),
                                       entity_to_id=dataset.entity_to_id, relation_to_id=dataset.relation_to_id)
                 for split in SPLITS}
    train = factories["train"]
    set_random_seed(args.seed)
    init = partial(torch.nn.init.normal_, std=args.init_std)
    model = SimplE(triples_factory=train, embedding_dim=args.dim, loss=CrossEntropyLoss(), regularizer=None,
                   entity_initializer=init, relation_initializer=init, random_seed=args.seed)
    optimizer = torch.optim.Adagrad([
        {"params": list(model.entity_representations.parameters()), "lr": args.lr},
        {"params": list(model.relation_representations.parameters()), "lr": args.relation_lr}])
    loop = make_loop_class(args.reg_weight)(
        model=model, triples_factory=train, optimizer=optimizer, negative_sampler="basic",
        negative_sampler_kwargs={"num_negs_per_pos": args.negatives}, automatic_memory_optimization=False)

    def train_to(total: int, first: bool) -> list[float]:
        losses = loop.train(triples_factory=train, num_epochs=total, batch_size=args.batch_size, drop_last=False,
                            continue_training=not first, use_tqdm=False, use_tqdm_batch=False)
        return losses or []

    started = time.perf_counter()
    losses = train_to(1, True)
    first_epoch = time.perf_counter() - started
    fit = max(1, math.floor(args.budget_seconds / first_epoch)) if args.budget_seconds else args.epochs
    target = min(args.epochs, fit)
    print(f"epoch 1: {first_epoch:.1f} s; training to epoch {target} of {args.epochs}", flush=True)
    if target > 1:
        losses = train_to(target, False)
    train_seconds = time.perf_counter() - started

    evaluated = time.perf_counter()
    results = RankBasedEvaluator(filtered=True).evaluate(
        model, factories["test"].mapped_triples, batch_size=256,
        additional_filter_triples=[factories["train"].mapped_triples, factories["valid"].mapped_triples],
        use_tqdm=False)
    return {"epochs_run": target, "equal_epochs": target == args.epochs,
            "first_epoch_seconds": round(first_epoch, 2), "train_seconds": round(train_seconds, 2),
            "eval_seconds": round(time.perf_counter() - evaluated, 2),
            "test_mrr": results.get_metric("both.realistic.inverse_harmonic_mean_rank"),
            "test_hits@10": results.get_metric("both.realistic.hits_at_10"),
            "final_epoch_loss": losses[-1] if losses else None,
            "entities": dataset.num_entities, "relations": dataset.num_relations, "train_edges": dataset.num_train}


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--data", required=True, help="CoDEx-S: train/valid/test.txt, tab-separated")
    parser.add_argument("--marius", help="bench/plugins.py's JSON, for marius-py's SimplE row beside PyKEEN's")
    parser.add_argument("--epochs", type=int, default=30)
    parser.add_argument("--dim", type=int, default=64, help="PyKEEN's embedding_dim: each of an entity's two "
                                                            "embeddings (marius-py's model.dim=128 holds both)")
    parser.add_argument("--negatives", type=int, default=256, help="num_negs_per_pos")
    parser.add_argument("--batch-size", type=int, default=1000)
    parser.add_argument("--lr", type=float, default=0.03, help="Adagrad lr of the entity embeddings")
    parser.add_argument("--relation-lr", type=float, default=0.1, help="Adagrad lr of the relation embeddings")
    parser.add_argument("--reg-weight", type=float, default=0.005, help="N3 weight (marius-py's 0.01 over its "
                                                                        "two directions)")
    parser.add_argument("--init-std", type=float, default=1e-3)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--budget-seconds", type=float, default=840,
                        help="stop at the epochs that fit this much training (0: no limit)")
    parser.add_argument("--json", help="write the results here")
    args = parser.parse_args(argv)
    torch.set_num_threads(os.cpu_count() or 1)
    row = run(args)
    settings = {"model": f"SimplE embedding_dim={args.dim} (two per entity, two per relation; marius-py d=128)",
                "training": "sLCWA, BasicNegativeSampler (head or tail, half the batch each)",
                "num_negs_per_pos": args.negatives, "loss": "CrossEntropyLoss", "batch_size": args.batch_size,
                "optimizer": f"Adagrad, entity lr {args.lr}, relation lr {args.relation_lr}",
                "regularizer": f"N3 of the positives' rows (relations twice) / batch, weight {args.reg_weight}",
                "init": f"normal(0, {args.init_std})", "seed": args.seed, "epochs_requested": args.epochs,
                "device": "cpu", "evaluation": "RankBasedEvaluator(filtered=True), test, filtered on "
                                              "train+valid+test, both.realistic"}
    marius = None
    if args.marius:
        bench = json.loads(Path(args.marius).read_text())
        marius = {**bench["rows"]["simple"], "epochs": bench["epochs"], "settings": bench["settings"],
                  "command": bench["command"], "commit": bench.get("commit"), "date": bench.get("date")}
    print(f"CoDEx-S on the CPU ({os.cpu_count()} cores), SimplE, test split, filtered, both directions")
    print(f"{'run':<34}{'epochs':>7}{'test MRR':>10}{'Hits@10':>9}{'train s':>9}")
    if marius:
        print(f"{'marius-py simple (d=128)':<34}{marius['epochs']:>7}{marius['test_mrr']:>10.4f}"
              f"{marius['test_hits@10']:>9.4f}{marius['wall_seconds']:>9.1f}  (wall s of the whole run)")
    print(f"{f'PyKEEN SimplE (embedding_dim={args.dim})':<34}{row['epochs_run']:>7}{row['test_mrr']:>10.4f}"
          f"{row['test_hits@10']:>9.4f}{row['train_seconds']:>9.1f}")
    if not row["equal_epochs"]:
        print(f"PyKEEN ran {row['epochs_run']} of {args.epochs} epochs (epoch 1: {row['first_epoch_seconds']} s): "
              "not an equal run")
    if args.json:
        result = {"bench": "peer_simple", "date": time.strftime("%Y-%m-%d"),
                  "command": " ".join([sys.executable, *sys.argv]),
                  "cpus": os.cpu_count(), "machine": platform.machine(), "dataset": str(Path(args.data).resolve()),
                  "versions": {"pykeen": _distribution_version("pykeen"), "torch": torch.__version__,
                               "python": platform.python_version()},
                  "settings": settings, "pykeen": row, "marius_py": marius}
        Path(args.json).parent.mkdir(parents=True, exist_ok=True)
        Path(args.json).write_text(json.dumps(result, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
