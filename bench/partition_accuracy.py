"""Accuracy of out-of-core training against the in-memory baseline.

For one dataset and config, trains p = 1 and each (ordering, p, c) variant with
everything else equal, and prints test MRR and its difference to p = 1.

    python bench/partition_accuracy.py --dataset ../shared/datasets/codex-m --config codex-m \
        --variants beta:8:2 beta:16:4 beta_random:8:2 comet:8:2 --out bench/results/partitions.json

``memory:P:C`` trains as a user gets it from the plan with ``--partitions P`` in the memory a float32
``default:P:C`` buffer takes (``storage.memory_limit_gib``): bfloat16 rows, the default ordering, the
buffer the plan chooses. A variant ``ORDERING:P:C`` trains with P partitions and a buffer of C (for
``comet`` and ``affine``, P and C count logical partitions of ``--group-size`` physical ones,
or of K with ``comet:P:C:K``; ``default:P:C`` is the default ordering over P
physical partitions, its group size chosen as training does); ``+key=value``
suffixes override that variant's config only, e.g.
``beta:16:4+storage.dtype=bfloat16``.

``order:P:C`` trains in memory (every node a candidate, no buffer) but takes an
epoch's edges state by state, in the order the default P:C ordering would train
them (shuffled within each state). ``+key=value`` suffixes apply to that run. On
FB15k-237 it costs 0.022 at 16:4 and at 16:8 alike, where the buffer costs
0.010 and 0.0007: scoring the nodes outside a state is what costs there, so it
does not isolate the order's share of the buffer's gap (RESULTS, fifteenth
session). ``resident:P:C`` is the same with each state's candidates limited to
its resident nodes, as in the buffer: the buffer's training without its tables,
IO or swaps (tests/test_partition_accuracy.py checks it trains as the buffer).
``shuffled:P:C`` keeps those states' candidates and edge counts but draws each
state's edges from the whole epoch's: the buffer's candidates without its
correlated edges. On FB15k-237 at 60 epochs (RESULTS, seventeenth session):
``resident:16:4`` -0.0108 beside the buffer's -0.0097; ``shuffled:`` -0.026 at
16:4 and 16:8.

``--storage-precision bfloat16`` (or ``bfloat16-nearest``) emulates node rows
and Adagrad state stored in bfloat16 (bench/storage_precision.py): half the
bytes, so a float32 16:4 buffer's memory would hold 16:8.

``--rank-split default:P:C`` adds to each run bench/rank_split.py's split of its
test ranking errors by that ordering's last-epoch logical partitions.
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import json
import sys
import tempfile
import time
from collections.abc import Collection
from pathlib import Path

import numpy as np
import torch

sys.path.insert(0, str(Path(__file__).parent))
from quality import machine, run_one  # noqa: E402
from rank_split import group_of_nodes, rank_split  # noqa: E402
from storage_precision import PRECISIONS, emulated_storage, emulation_overrides, share_representable  # noqa: E402

import marius_py as mp  # noqa: E402
from marius_py.layout import StorageLayout, epoch_ordering, run_layout, storage_layout  # noqa: E402
from marius_py.negatives import CandidateRows  # noqa: E402
from marius_py.plan import GiB, GraphSize, buffer_bytes  # noqa: E402
import marius_py.trainer as trainer_module  # noqa: E402
from marius_py.spans import TrainingSpan, WholeTables  # noqa: E402
from marius_py.orderings import is_two_level  # noqa: E402
from marius_py.orderings.simulator import walk_io  # noqa: E402
from marius_py.orderings.simulator import format_bytes  # noqa: E402
from marius_py.storage.partitioning import partition_bounds, partition_of, partition_size  # noqa: E402


# In memory, in a P:C ordering's states (module docstring): prefix -> state_ordered_spans' options.
IN_MEMORY_VARIANTS = {"order:": {}, "resident:": {"resident_candidates": True},
                      "shuffled:": {"resident_candidates": True, "shuffled_edges": True}}


def variant_overrides(spec: str, group_size: int) -> list[str]:
    """``ORDERING:P:C`` or ``comet:P:C:K`` (K physical partitions per logical one), then any ``+key=value``.
    ``default:P:C``: the default ordering as a user gets it, P physical partitions and a buffer of C."""
    layout, *extra = spec.split("+")
    ordering, p, c, *k = layout.split(":")
    if ordering == "default":
        return [f"storage.num_partitions={p}", f"storage.buffer_capacity={c}", "storage.group_size=0",
                *extra]
    k = int(k[0]) if k else (group_size if is_two_level(ordering) else 1)
    return [f"storage.ordering={ordering}", f"storage.num_partitions={int(p) * k}",
            f"storage.buffer_capacity={int(c) * k}", f"storage.group_size={k}", *extra]


def state_ordered_spans(partitioned, resident_candidates: bool = False, shuffled_edges: bool = False):
    """A span source for an in-memory run (``marius_py.spans``): each state of ``partitioned``'s ordering in turn,
    with the edges of the buckets it trains in the order a buffer reads them (bucket after bucket; the trainer
    shuffles each span, so the order only makes a ``resident:`` run bitwise equal to the buffer's). Candidates: every node, or
    with ``resident_candidates`` the nodes of the state's resident partitions, as in the buffer.
    ``shuffled_edges``: each state trains as many edges, drawn from the whole epoch's instead of its buckets'."""
    class StateOrderedSpans(WholeTables):
        def spans(self, epoch, first_state=0, ordering=None):
            return _state_spans(self.inputs, partitioned, epoch, resident_candidates, shuffled_edges)
    return StateOrderedSpans


def _state_spans(inputs, partitioned, epoch: int, resident_candidates: bool, shuffled_edges: bool):
    ordering = partitioned.ordering(epoch)
    p = ordering.num_physical_partitions
    state_of_bucket = np.full((p, p), -1)
    for k, buckets in enumerate(ordering.buckets):
        for i, j in buckets:
            state_of_bucket[i, j] = k
    train, num_nodes = inputs.dataset.train, inputs.dataset.num_nodes
    ends = partition_of(train[:, [0, 2]], num_nodes, p)
    states = state_of_bucket[ends[:, 0], ends[:, 1]]
    assert (states >= 0).all(), "a bucket without a state"
    order = np.lexsort((ends[:, 0] * p + ends[:, 1], states))  # stable: file order inside a bucket
    bounds = np.searchsorted(states[order], np.arange(ordering.num_states + 1))
    if shuffled_edges:
        order = np.random.default_rng([partitioned.config.training.seed, epoch]).permutation(len(train))
    for k in range(ordering.num_states):
        edges = torch.from_numpy(train[order[bounds[k]:bounds[k + 1]]])
        candidates = None
        if resident_candidates:
            ranges = [partition_bounds(num_nodes, p, q) for q in ordering.resident(k)]
            candidates = CandidateRows([(start, end - start) for start, end in ranges], inputs.table_device)
        yield TrainingSpan(edges, candidates), inputs.tables.nodes, inputs.tables.node_state


@dataclasses.dataclass(frozen=True)
class OrderedRun:
    """A partitioned run's config and its store as training resolves it: whose epoch orderings to follow."""

    config: object
    layout: StorageLayout

    def ordering(self, epoch: int):
        return epoch_ordering(self.layout, self.config.training.seed, epoch, self.config.storage.continue_epochs)


def order_config(spec: str, dataset: Path, config_name: str, overrides: list[str], group_size: int) -> OrderedRun:
    """The partitioned run whose ordering an in-memory run (``order:``, ``resident:`` or ``shuffled:P:C``, with
    any ``+key=value``) follows, or ``--rank-split`` groups by: the default P:C with the run's overrides and
    suffixes, and its store fitted to the nodes as ``Trainer`` resolves it."""
    layout, *suffixes = spec.split("+")
    layout = "default:" + layout.split(":", 1)[1]
    config = mp.make_config(config_name, [f"dataset.path={dataset}", *overrides, *suffixes,
                                          *variant_overrides(layout, group_size)])
    opened = mp.api.open_dataset(config, progress=False)
    num_nodes = opened.num_nodes
    opened.close()
    if config.storage.edge_assignment != "bucket":
        raise ValueError(f"{spec}: in-memory runs follow whole-bucket assignment, not storage.edge_assignment="
                         f"{config.storage.edge_assignment}")
    return OrderedRun(config, storage_layout(config.storage, num_nodes))


@contextlib.contextmanager
def ordered_in_memory(spec: str, dataset: Path, config_name: str, overrides: list[str], group_size: int):
    """For an ``order:``, ``resident:`` or ``shuffled:P:C`` variant: in-memory training whose epochs follow the
    default P:C ordering's states."""
    prefix = spec.split(":", 1)[0] + ":"
    if prefix not in IN_MEMORY_VARIANTS:
        yield
        return
    original = trainer_module.WholeTables  # (the span source a trainer of tables in memory builds)
    trainer_module.WholeTables = state_ordered_spans(order_config(spec, dataset, config_name, overrides, group_size),
                                                     **IN_MEMORY_VARIANTS[prefix])
    try:
        yield
    finally:
        trainer_module.WholeTables = original


def memory_overrides(spec: str, dataset: Path, config_name: str, overrides: list[str]) -> list[str]:
    """``memory:P:C[+key=value...]``: P partitions with everything else the plan's (dtype, ordering, buffer) in
    the memory a float32 ``default:P:C`` buffer takes, its lookahead included (the memory reading of P:C)."""
    layout, *suffixes = spec.split("+")
    _, p, c = layout.split(":")
    float32 = mp.make_config(config_name, [f"dataset.path={dataset}", *overrides, *suffixes,
                                           f"storage.num_partitions={p}", f"storage.buffer_capacity={c}",
                                           "storage.dtype=float32"])
    opened = mp.api.open_dataset(float32, progress=False)
    graph = GraphSize.of(float32, opened.num_nodes, opened.metadata.num_train)
    opened.close()
    limit = buffer_bytes(run_layout(float32, graph.num_nodes), graph, float32.storage.lookahead) + 1
    return [f"storage.num_partitions={p}", "storage.buffer_capacity=0", f"storage.memory_limit_gib={limit / GiB!r}",
            *suffixes]


def run_overrides(spec: str, group_size: int) -> list[str]:
    """The overrides a variant's run trains with (in-memory variants, ``IN_MEMORY_VARIANTS``, with only their
    suffixes)."""
    if not spec.startswith(tuple(IN_MEMORY_VARIANTS)):
        return variant_overrides(spec, group_size)
    suffixes = spec.split("+")[1:]
    if any(s.startswith(("storage.num_partitions", "storage.buffer_capacity")) for s in suffixes):
        raise ValueError(f"{spec}: an in-memory run has no buffer; its layout is P:C")
    return suffixes


def predicted_io(config: dict, num_nodes: int, validates: bool = True, folded: Collection[int] = ()) -> dict:
    """The simulator's partition IO summed over the run's epochs, as a buffer that stays filled between epochs
    performs it: an epoch starts holding the last one's last state, clean where a commit or a validation after
    that epoch wrote it back (a commit every epoch with training.checkpoint_interval 0, but for the epochs in
    ``folded``, whose commit point came while the last commit was still written behind training; else at the
    validations, where the dataset has validation edges (``validates``); a timed commit that falls elsewhere
    saves write-backs the simulator counts)."""
    resolved = mp.make_config(None, [f"{section}.{key}={value}" for section, values in config.items()
                                     for key, value in values.items()])
    layout, dim = run_layout(resolved, num_nodes), resolved.model.dim
    state_dim = 1 if resolved.training.adagrad_variant == "rowwise" else dim
    itemsize = getattr(torch, layout.dtype).itemsize
    chunk_bytes = partition_size(num_nodes, layout.num_partitions) * (dim + state_dim) * itemsize
    every = resolved.evaluation.every
    totals = {"partitions_read": 0, "partitions_written": 0, "bytes_read": 0, "bytes_written": 0}
    carried: tuple[int, ...] = ()
    for epoch in range(1, resolved.training.epochs + 1):
        ordering = epoch_ordering(layout, resolved.training.seed, epoch, resolved.storage.continue_epochs)
        committed = resolved.training.checkpoint_interval == 0 and epoch - 1 not in folded
        written_back = committed or (validates and every > 0 and (epoch - 1) % every == 0)
        stats = walk_io(ordering, chunk_bytes, carried, carried_dirty=not written_back)
        for key in totals:
            totals[key] += stats[key]
        carried = tuple(ordering.resident(ordering.num_states - 1))
    return totals


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--dataset", required=True, help="raw (train/valid/test.txt) or preprocessed directory")
    parser.add_argument("--config", required=True)
    parser.add_argument("--variants", nargs="*", default=[], help="ORDERING:P:C[:K][+key=value...]")
    parser.add_argument("--skip-p1", action="store_true",
                        help="leave out the p = 1 row (another process of the same call trains it; diffs are then "
                             "to the first variant)")
    parser.add_argument("--group-size", type=int, default=8)
    parser.add_argument("--set", nargs="*", action="extend", default=[],
                        help="extra key=value overrides for every run (repeatable)")
    parser.add_argument("--rank-split", metavar="default:P:C",
                        help="also split each run's test ranking errors by the logical partitions of this "
                             "ordering's last epoch (bench/rank_split.py)")
    parser.add_argument("--storage-precision", choices=PRECISIONS, default="float32",
                        help="emulate node rows and Adagrad state stored at this precision, in every run "
                             "(bench/storage_precision.py)")
    parser.add_argument("--out", default="bench/results/partition_accuracy.json")
    args = parser.parse_args()
    args.set += emulation_overrides(args.storage_precision)
    split_ranks = None
    if args.rank_split:
        if not args.rank_split.startswith("default:"):
            parser.error(f"--rank-split {args.rank_split}: expected default:P:C")
        split_config = order_config(args.rank_split, Path(args.dataset), args.config, args.set, args.group_size)

        def split_ranks(model):
            groups = group_of_nodes(split_config, split_config.config.training.epochs, model.dataset.num_nodes)
            return {"rank_split": rank_split(model, groups)}

    def inspect(model):
        return {"share_bfloat16_values": share_representable(model), **(split_ranks(model) if split_ranks else {})}

    results = []
    with tempfile.TemporaryDirectory() as workdir:
        runs = [] if args.skip_p1 else [("p=1", [])]
        for label, extra in runs + [(v, memory_overrides(v, Path(args.dataset), args.config, args.set) if v.startswith("memory:")
                                 else run_overrides(v, args.group_size)) for v in args.variants]:
            with (ordered_in_memory(label, Path(args.dataset), args.config, args.set, args.group_size),
                  emulated_storage(args.storage_precision)):
                result = run_one(Path(args.dataset), args.config, args.set + extra, Path(workdir), inspect)
            result["variant"] = label
            result["storage_precision"] = args.storage_precision
            io_match = ""
            if result["io"] is not None:
                io = result["io"]
                result["io_predicted"] = predicted_io(result["resolved_config"], result["num_nodes"],
                                                       validates=result["best_valid"] is not None,
                                                       folded=result["folded_commits"])
                io_match = (f"read {format_bytes(io['bytes_read'])}, "
                            + ("IO = simulator" if all(io[k] == v for k, v in result["io_predicted"].items())
                               else "IO MISMATCH"))
            results.append(result)
            baseline = results[0]["test"]["mrr"]
            t = result["test"]
            split = result.get("rank_split")
            split = (f" | split: in-group MRR {split['mrr_in_group']:.4f}, other groups {split['mrr_other_groups']:.4f}, "
                     f"above-rate other/in {split['other_over_same']:.3f}") if split else ""
            precision = (f" | {args.storage_precision}: {result['share_bfloat16_values']:.4%} of the embeddings bfloat16"
                         if args.storage_precision != "float32" else "")
            print(f"{label:16s} MRR {t['mrr']:.4f} (diff {t['mrr'] - baseline:+.4f}) H@10 {t['hits@10']:.3f} "
                  f"train {result['train_seconds']:6.1f}s {result['edges_per_s']:10,.0f} edges/s {io_match}{split}{precision}",
                  flush=True)
            write(args.out, results)  # after every run: a cut-off command keeps what finished


def write(path: str, results: list[dict]) -> None:
    out = Path(path)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps({"machine": machine(), "date": time.strftime("%Y-%m-%d"),
                               "command": " ".join(sys.argv), "results": results}, indent=2))


if __name__ == "__main__":
    main()
