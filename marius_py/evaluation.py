"""Link-prediction evaluation: filtered ranking against all nodes, and sampled.

Protocol: every test edge (h, r, t) gives two queries, (h, r, ?) ranked over
all nodes as tails and (?, r, t) ranked over all nodes as heads (through the
inverse relation). Filtered: other known true answers (train + valid + test)
are removed before ranking. Ties: the realistic rank, the mean of the
optimistic rank (1 + #scores > target) and the pessimistic rank
(1 + #other scores >= target), as PyKEEN reports. Memory is bounded by
``batch_size x num_nodes`` scores at a time.
"""

from __future__ import annotations

from typing import Iterator

import numpy as np
import torch

from marius_py.errors import MariusInputError
from marius_py.models import Decoder
from marius_py.dataset import GivenNegatives, required_given_negatives
from marius_py.pipeline.step import widened
from marius_py.storage.chunk_files import page_aligned_empty, raw_bytes, slot_rows
from marius_py.storage.embedding_store import EmbeddingStore

PROTOCOL_FILTERED = "filtered ranking vs all nodes, both directions, realistic ties"
PROTOCOL_SAMPLED = "unfiltered ranking vs {n} sampled {kind} negatives, both directions, realistic ties"
PROTOCOL_SAMPLED_ALL = ("unfiltered ranking vs all {nodes} nodes (evaluation.num_negatives={n} is not below the "
                        "{others} other nodes: sampling would repeat them), both directions, realistic ties")
PROTOCOL_UNFILTERED = "unfiltered ranking vs all nodes, both directions, realistic ties"
PROTOCOL_TOP10 = ("unfiltered ranking of tails vs all nodes, reciprocal rank 0 past the top 10 (WikiKG90Mv2's "
                  "MRR), realistic ties")
PROTOCOL_GIVEN = "unfiltered ranking vs the {k} negatives the dataset gives each edge ({directions}), realistic ties"
_GIVEN_VALUES = 1 << 26  # candidate values (rows x d) gathered per batch of the given protocol: 256 MB


class KnownAnswers:
    """All known (query node, relation) -> answers, for one direction, as CSR arrays."""

    def __init__(self, known_edges: np.ndarray, num_relations: int, inverse: bool):
        anchor, answer = (known_edges[:, 2], known_edges[:, 0]) if inverse else (known_edges[:, 0], known_edges[:, 2])
        keys = anchor.astype(np.int64) * num_relations + known_edges[:, 1]
        order = np.lexsort((answer, keys))
        self.keys = torch.from_numpy(keys[order])
        self.answers = torch.from_numpy(answer[order].astype(np.int64))
        self.num_relations = num_relations

    def lookup(self, anchors: torch.Tensor, relations: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """(query row, answer node) pairs of every known answer of each query."""
        keys = anchors.cpu() * self.num_relations + relations.cpu()
        start = torch.searchsorted(self.keys, keys, side="left")
        end = torch.searchsorted(self.keys, keys, side="right")
        counts = end - start
        rows = torch.repeat_interleave(torch.arange(len(keys)), counts)
        # Pair p of query q sits at answers[start[q] + p - first[q]], first[q] being q's first pair.
        first = torch.cumsum(counts, 0) - counts
        return rows, self.answers[torch.arange(len(rows)) + (start - first)[rows]]


def greater_and_tied_counts(scores: torch.Tensor, thresholds: torch.Tensor) -> torch.Tensor:
    """Per row, #(scores > threshold) + #(scores >= threshold): what the realistic rank needs of a row.

    One int8 pass summed in int32: two boolean sums into int64 took three times as long on a CPU, where they
    were most of an evaluation."""
    above = scores > thresholds[:, None]
    at_or_above = scores >= thresholds[:, None]
    total = torch.int32 if scores.shape[1] < 2**30 else torch.int64  # each score adds at most 2
    return (above.view(torch.int8) + at_or_above.view(torch.int8)).sum(1, dtype=total)


def realistic_ranks(scores: torch.Tensor, target_scores: torch.Tensor) -> torch.Tensor:
    """Mean of optimistic and pessimistic rank; ``scores`` excludes nothing but filtered entries.

    ``scores`` still contains the target itself, which counts once in ``>=``:
    (1 + #greater) + #greater-or-equal, halved.
    """
    return (1 + greater_and_tied_counts(scores, target_scores)).double() / 2


def summarize(ranks: torch.Tensor, protocol: str) -> dict:
    ranks = ranks.double()
    return {"mrr": float((1 / ranks).mean()), "mean_rank": float(ranks.mean()),
            "hits@1": float((ranks <= 1).double().mean()), "hits@3": float((ranks <= 3).double().mean()),
            "hits@10": float((ranks <= 10).double().mean()), "num_queries": int(len(ranks)),
            "protocol": protocol}


class NodeTable:
    """Node embeddings as evaluation reads them: whole, or streamed partition by partition."""

    num_nodes: int
    device: torch.device

    def blocks(self) -> Iterator[tuple[int, torch.Tensor]]:
        """(first node id, embeddings of a contiguous id range) covering every node once."""
        raise NotImplementedError

    def gather(self, ids: torch.Tensor) -> torch.Tensor:
        """Embeddings of the given node ids, in order."""
        raise NotImplementedError


class InMemoryNodes(NodeTable):
    """A table in memory; with another ``device`` (a host table, a GPU decoder) it moves in blocks."""

    _BLOCK_ROWS = 1 << 20

    def __init__(self, nodes: torch.Tensor, device: torch.device | None = None):
        self.nodes, self.num_nodes = nodes, nodes.shape[0]
        self.device = nodes.device if device is None else torch.device(device)

    def blocks(self):
        if self.nodes.device == self.device and self.nodes.dtype != torch.bfloat16:
            yield 0, self.nodes
            return
        for start in range(0, self.num_nodes, self._BLOCK_ROWS):
            yield start, widened(self.nodes[start:start + self._BLOCK_ROWS].to(self.device))

    def gather(self, ids):
        return widened(self.nodes[ids.to(self.nodes.device)].to(self.device))


class StoredNodes(NodeTable):
    """An ``EmbeddingStore`` read in runs of whole partitions: memory stays at one block.

    A block is one partition, or as many consecutive ones as fit in
    ``BLOCK_BYTES``: scoring many tiny partitions one by one (comet's physical
    partitions) costs far more in per-block work than in arithmetic.
    """

    BLOCK_BYTES = 64 << 20

    def __init__(self, store: EmbeddingStore, device: torch.device | str = "cpu"):
        self.store, self.num_nodes, self.device = store, store.num_nodes, torch.device(device)

    def blocks(self):
        budget_rows = self.BLOCK_BYTES // (4 * self.store.dim)  # blocks arrive as float32
        first = 0
        for last in range(self.store.num_partitions):
            start, end = self.store.bounds(first)[0], self.store.bounds(last)[1]
            if last + 1 < self.store.num_partitions and self.store.bounds(last + 1)[1] - start <= budget_rows:
                continue  # the next partition joins this block
            block = self._partition(first) if first == last else self.store.embedding_rows(start, end)
            yield start, block.to(self.device)
            first = last + 1

    def _partition(self, partition: int) -> torch.Tensor:
        """One (large) partition read whole, as the training buffer reads it (O_DIRECT, no page cache)."""
        files = self.store.chunk_files()[0]
        start, end = self.store.bounds(partition)
        out = page_aligned_empty(slot_rows(files.rows_per_chunk, files.cols, itemsize=files.itemsize), files.cols,
                                 dtype=files.dtype)
        files.read_into(partition, raw_bytes(out))
        return out[:end - start].float()

    def gather(self, ids):
        ids = ids.to(self.device)
        out = torch.empty(len(ids), self.store.dim, device=self.device)
        ascending = len(ids) < 2 or bool((ids[1:] >= ids[:-1]).all())
        for start, block in self.blocks():
            if ascending:  # (evaluation's unique ids: each block's are one run, found by bisection)
                low, high = torch.searchsorted(ids, torch.tensor([start, start + len(block)], device=ids.device))
                out[low:high] = block[ids[low:high] - start]
            else:
                inside = (ids >= start) & (ids < start + len(block))
                out[inside] = block[ids[inside] - start]
        return out


QUERY_ROWS_BYTES = 256 << 20  # filtered evaluation: the rows of a chunk of queries (heads, tails, queries)
SCORE_BYTES = 256 << 20       # filtered evaluation: a batch of queries' scores against a piece of a block


def query_chunk_edges(row_bytes: int, batch_size: int) -> int:
    """Edges filtered evaluation ranks at once: their rows (three per edge) within ``QUERY_ROWS_BYTES``."""
    return max(batch_size, QUERY_ROWS_BYTES // (3 * row_bytes) // batch_size * batch_size)


@torch.no_grad()
def filtered_ranks(decoder: Decoder, nodes: torch.Tensor | NodeTable, edges: np.ndarray,
                   known: tuple[KnownAnswers, KnownAnswers], batch_size: int, heads: bool = True) -> torch.Tensor:
    """Realistic filtered ranks of every edge, tail queries then head queries (``heads=False``: tail queries
    alone).

    Edges are ranked in chunks (``query_chunk_edges``), so that memory stays bounded whatever the split's
    size (a Freebase86m-sized split's rows would take gigabytes); out of core each chunk reads the store
    once. Within a chunk, candidates are streamed block by block (one block in memory, one partition
    out of core); every query's counts of higher and tied scores add up over
    blocks, with known answers other than the target removed. The target's own
    score comes from the block that holds it where the comparison happens
    there (exact ties), and from ``compare_pairs`` against other blocks.
    """
    table = nodes if isinstance(nodes, NodeTable) else InMemoryNodes(nodes)
    chunk = query_chunk_edges(4 * decoder.dim, batch_size)
    ranks = [_filtered_chunk_ranks(decoder, table, edges[start:start + chunk], known, batch_size, heads)
             for start in range(0, max(len(edges), 1), chunk)]  # (one chunk, empty, for no edges)
    return torch.cat([r[0] for r in ranks] + [r[1] for r in ranks if heads])  # (tail queries, then head queries)


def _filtered_chunk_ranks(decoder: Decoder, table: NodeTable, edges: np.ndarray,
                          known: tuple[KnownAnswers, KnownAnswers], batch_size: int,
                          heads: bool = True) -> list[torch.Tensor]:
    """[tail queries' ranks, head queries' ranks] of a chunk of edges (the first alone without ``heads``)."""
    device = table.device
    piece_rows = max(1, SCORE_BYTES // (4 * batch_size))  # (a table in memory is one block: 86M nodes' scores
    edges_t = torch.from_numpy(edges).to(device)           # of a batch would take hundreds of GB)
    # Heads and tails in one gather: out of core, each gather reads every partition.
    head_rows, tail_rows = table.gather(torch.cat([edges_t[:, 0], edges_t[:, 2]])).split(len(edges))
    all_ranks = []
    for inverse, answers in ((False, known[0]), (True, known[1]))[:2 if heads else 1]:
        anchor, target = (edges_t[:, 2], edges_t[:, 0]) if inverse else (edges_t[:, 0], edges_t[:, 2])
        anchor_rows, target_rows = (tail_rows, head_rows) if inverse else (head_rows, tail_rows)
        queries = decoder.query(anchor_rows, edges_t[:, 1], inverse)
        target_scores = decoder.compare_pairs(queries, target_rows)
        known_by_batch = _split_by_batch(*answers.lookup(anchor, edges_t[:, 1]), len(edges), batch_size, device)
        counts = torch.zeros(len(edges), dtype=torch.long, device=device)  # greater_and_tied_counts, summed
        for block_start, block in _pieces(table.blocks(), piece_rows):
            block_end = block_start + len(block)
            for start, (known_rows, known_cols) in zip(range(0, len(edges), batch_size), known_by_batch):
                end = min(start + batch_size, len(edges))
                scores = decoder.compare_all(queries[None, start:end], block[None])[0]
                own = (target[start:end] >= block_start) & (target[start:end] < block_end)
                local_target = (target[start:end] - block_start).clamp(0, len(block) - 1)
                exact = scores.gather(1, local_target[:, None])[:, 0]
                threshold = torch.where(own, exact, target_scores[start:end])
                picked = (known_cols >= block_start) & (known_cols < block_end)
                scores[known_rows[picked], known_cols[picked] - block_start] = float("-inf")
                # The target itself never counts against itself.
                scores[own.nonzero()[:, 0], local_target[own]] = float("-inf")
                counts[start:end] += greater_and_tied_counts(scores, threshold)
        # The target was removed from its block: (1 + #greater) + (1 + #greater-or-equal among the others).
        all_ranks.append((2 + counts).double().cpu() / 2)
    return all_ranks


def _pieces(blocks: Iterator[tuple[int, torch.Tensor]], rows: int) -> Iterator[tuple[int, torch.Tensor]]:
    """The blocks cut into pieces of at most ``rows`` rows (views)."""
    for start, block in blocks:
        for offset in range(0, len(block), rows):
            yield start + offset, block[offset:offset + rows]


def _split_by_batch(rows: torch.Tensor, cols: torch.Tensor, num_queries: int, batch_size: int,
                    device: torch.device) -> list[tuple[torch.Tensor, torch.Tensor]]:
    """Known (query row, answer) pairs cut by query batch, rows made batch-local (``rows`` is sorted)."""
    starts = torch.arange(0, num_queries, batch_size)
    cuts = torch.searchsorted(rows, torch.cat([starts, torch.tensor([num_queries])])).tolist()
    return [((rows[lo:hi] - start).to(device), cols[lo:hi].to(device))
            for start, lo, hi in zip(starts.tolist(), cuts[:-1], cuts[1:])]


@torch.no_grad()
def top_answers(decoder: Decoder, table: NodeTable, queries: torch.Tensor, k: int,
                excluded: tuple[torch.Tensor, torch.Tensor] | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """The ``k`` best (scores, node ids) of every query, [Q, k] each, best first: a running top-k over the
    table's blocks, every query scored against a piece of a block at once (``SCORE_BYTES`` of scores), so
    out of core the store is read once for all queries. ``excluded``: (query row, node id) pairs scored
    -inf (known answers filtered out), which sort last where fewer than ``k`` others remain."""
    device = table.device
    best_scores = torch.empty(len(queries), 0, device=device)
    best_ids = torch.empty(len(queries), 0, dtype=torch.long, device=device)
    piece_rows = max(k, SCORE_BYTES // (4 * max(len(queries), 1)))
    for start, block in _pieces(table.blocks(), piece_rows):
        scores = decoder.compare_all(queries[None], block[None])[0]
        if excluded is not None:
            rows, nodes = excluded
            inside = (nodes >= start) & (nodes < start + len(block))
            scores[rows[inside], nodes[inside] - start] = float("-inf")
        ids = torch.arange(start, start + len(block), device=device).expand(len(queries), -1)
        best_scores, best_ids = torch.cat([best_scores, scores], 1), torch.cat([best_ids, ids], 1)
        top = torch.topk(best_scores, min(k, best_scores.shape[1]), dim=1)
        best_scores, best_ids = top.values, best_ids.gather(1, top.indices)
    return best_scores, best_ids


def evaluate_filtered(decoder: Decoder, nodes: torch.Tensor | NodeTable, edges: np.ndarray,
                      known: tuple[KnownAnswers, KnownAnswers], batch_size: int = 1024) -> dict:
    return summarize(filtered_ranks(decoder, nodes, edges, known, batch_size), PROTOCOL_FILTERED)


def build_known_answers(known_edges: np.ndarray, num_relations: int) -> tuple[KnownAnswers, KnownAnswers]:
    return KnownAnswers(known_edges, num_relations, False), KnownAnswers(known_edges, num_relations, True)


@torch.no_grad()
def evaluate_sampled(decoder: Decoder, nodes: torch.Tensor | NodeTable, edges: np.ndarray,
                     num_negatives: int, sampling: str, degrees: np.ndarray | None, seed: int,
                     batch_size: int = 1024) -> dict:
    """Rank each answer among ``num_negatives`` sampled nodes shared by a batch (unfiltered).

    ``sampling``: ``uniform``; ``degree`` (in proportion to ``degrees``, the train degree of every node);
    ``mixed`` (half of each, as Marius evaluates Freebase86m: 1,000 + 1,000). Every needed row is
    gathered in one pass; out of core the store is read once into host memory (at most the store's
    embeddings). On a GPU the gathered rows move there whole when they fit (half its free memory), else
    each batch's rows go to it.

    Negatives are drawn with replacement, so ``num_negatives`` should stay below the other nodes' count:
    ``evaluate_split`` ranks against all nodes instead where it does not (``sampled_covers_all_nodes``).
    """
    table = nodes if isinstance(nodes, NodeTable) else InMemoryNodes(nodes)
    device = table.device
    if isinstance(table, StoredNodes):
        table = StoredNodes(table.store, "cpu")
    generator = torch.Generator().manual_seed(seed)
    edges_t = torch.from_numpy(edges)
    batches = [(inverse, start) for inverse in (False, True) for start in range(0, len(edges), batch_size)]
    negatives = _draw_negatives(len(batches), num_negatives, sampling, table.num_nodes, degrees, generator)
    needed, local = torch.unique(torch.cat([edges_t[:, 0], edges_t[:, 2], negatives.reshape(-1)]),
                                 return_inverse=True)
    rows = _on_device_if_it_fits(table.gather(needed), device)
    heads, tails = local[:len(edges)], local[len(edges):2 * len(edges)]
    negatives_local = local[2 * len(edges):].reshape(negatives.shape)
    all_ranks = []
    for index, (inverse, start) in enumerate(batches):
        end = start + batch_size
        anchor, target = (tails[start:end], heads[start:end]) if inverse else (heads[start:end], tails[start:end])
        queries = decoder.query(rows[anchor].to(device), edges_t[start:end, 1].to(device), inverse)
        drawn = negatives_local[index]
        negative_scores = decoder.compare_all(queries[None], rows[drawn].to(device)[None])[0]
        target_scores = decoder.compare_pairs(queries, rows[target].to(device))
        drawn, target = drawn.to(device), target.to(device)
        # A drawn copy of the answer is an exact tie, whatever the two kernels' rounding.
        negative_scores = torch.where(drawn[None, :] == target[:, None], target_scores[:, None], negative_scores)
        scores = torch.cat([target_scores[:, None], negative_scores], dim=1)
        all_ranks.append(realistic_ranks(scores, target_scores).cpu())
    kind = {"degree": "degree-based", "mixed": "half uniform, half degree-based"}.get(sampling, "uniform")
    return summarize(torch.cat(all_ranks), PROTOCOL_SAMPLED.format(n=num_negatives, kind=kind))


def _on_device_if_it_fits(rows: torch.Tensor, device: torch.device) -> torch.Tensor:
    """The gathered rows on the GPU when they take at most half its free memory (batches then index them
    there: at Freebase86m's 34 GB, tens of thousands of batches), else left in host memory."""
    if device.type != "cuda" or rows.device == device:
        return rows
    return rows.to(device) if rows.nbytes <= torch.cuda.mem_get_info(device)[0] // 2 else rows


def _draw_negatives(num_batches: int, num_negatives: int, sampling: str, num_nodes: int,
                    degrees: np.ndarray | None, generator: torch.Generator) -> torch.Tensor:
    """[batches, N] node ids: uniform, by degree (cumulative weights: memory O(nodes)), or half each."""
    by_degree = {"uniform": 0, "degree": num_negatives, "mixed": num_negatives // 2}[sampling]
    uniform = torch.randint(num_nodes, (num_batches, num_negatives - by_degree), generator=generator)
    if not by_degree:
        return uniform
    cumulative = torch.from_numpy(np.cumsum(degrees, dtype=np.float64))
    draws = torch.rand(num_batches, by_degree, generator=generator, dtype=torch.float64) * cumulative[-1]
    weighted = torch.searchsorted(cumulative, draws, right=True).clamp_max(len(cumulative) - 1)
    return torch.cat([uniform, weighted], dim=1)


def evaluate_split(decoder: Decoder, nodes: torch.Tensor | NodeTable, dataset, split: str, config,
                   known: tuple[KnownAnswers, KnownAnswers] | None = None, seed: int = 0,
                   filtered: bool = True) -> dict:
    """Evaluate one split of a ``Dataset`` (``evaluate_edges``); a split without edges is refused
    (``MariusInputError``): there is nothing to rank."""
    edges = dataset.split(split)
    if len(edges) == 0:
        raise _no_edges(dataset, split)
    if filtered and config.protocol == "given":
        return evaluate_given(decoder, nodes, edges, required_given_negatives(dataset.directory, split))
    return evaluate_edges(decoder, nodes, dataset, edges, config, known, seed, filtered)


def evaluate_given(decoder: Decoder, nodes: torch.Tensor | NodeTable, edges: np.ndarray,
                   negatives: GivenNegatives) -> dict:
    """Rank each edge's answer against the negatives the dataset gives it (OGB's protocol: for each direction
    the dataset names, K candidates per edge), unfiltered, ties counted realistically."""
    table = nodes if isinstance(nodes, NodeTable) else InMemoryNodes(nodes)
    device, count = table.device, negatives.ids.shape[2]
    batch = max(1, _GIVEN_VALUES // max(1, count * decoder.dim))
    ranks = []
    for direction, name in enumerate(negatives.directions):
        inverse = name == "heads"
        for start in range(0, len(edges), batch):
            rows = torch.from_numpy(edges[start:start + batch])
            drawn = torch.from_numpy(np.ascontiguousarray(negatives.ids[start:start + batch, direction])).long()
            anchor, target = (rows[:, 2], rows[:, 0]) if inverse else (rows[:, 0], rows[:, 2])
            # one gather of every node the batch names (out of core, each gather reads every partition)
            needed, local = torch.unique(torch.cat([anchor, target, drawn.reshape(-1)]), return_inverse=True)
            gathered = table.gather(needed).to(device)[local.to(device)]
            anchors, targets, candidates = gathered.split([len(rows), len(rows), len(rows) * count])
            queries = decoder.query(anchors, rows[:, 1].to(device), inverse)
            target_scores = decoder.compare_pairs(queries, targets)
            candidates = candidates.reshape(len(rows), count, -1)
            scores = decoder.compare_all(queries[:, None], candidates)[:, 0]
            # (an answer among its own negatives is an exact tie, whatever the two kernels' rounding)
            scores = torch.where(drawn.to(device) == target[:, None].to(device), target_scores[:, None], scores)
            ranks.append(realistic_ranks(torch.cat([target_scores[:, None], scores], dim=1), target_scores).cpu())
    return summarize(torch.cat(ranks), PROTOCOL_GIVEN.format(k=count, directions=" and ".join(negatives.directions)))


def evaluate_edges(decoder: Decoder, nodes: torch.Tensor | NodeTable, dataset, edges: np.ndarray, config,
                   known: tuple[KnownAnswers, KnownAnswers] | None = None, seed: int = 0,
                   filtered: bool = True) -> dict:
    """Evaluate edges (id triples) of a ``Dataset`` with an ``EvaluationConfig``'s protocol, or, when not
    ``filtered``, ranked against every node with nothing filtered.

    The sampled protocol with at least as many negatives as there are other nodes ranks against every node
    instead, unfiltered (``sampled_covers_all_nodes``), and says so in its protocol string.
    """
    if not filtered:
        return evaluate_unfiltered(decoder, nodes, edges, dataset.num_relations, config.batch_size,
                                   PROTOCOL_UNFILTERED)
    if config.protocol == "given":
        raise MariusInputError("evaluation.protocol=given ranks a dataset's own valid and test edges against the "
                               "negatives it gives them, not other edges",
                               expected="evaluation.protocol=filtered or sampled for edges of your own")
    if config.protocol == "top10":
        return evaluate_top10(decoder, nodes, edges, dataset.num_relations, config.batch_size)
    if config.protocol == "filtered":
        known = known or build_known_answers(dataset.all_known_edges(), dataset.num_relations)
        return evaluate_filtered(decoder, nodes, edges, known, config.batch_size)
    num_nodes = nodes.num_nodes if isinstance(nodes, NodeTable) else len(nodes)
    if sampled_covers_all_nodes(config.num_negatives, num_nodes):
        return evaluate_unfiltered(decoder, nodes, edges, dataset.num_relations, config.batch_size,
                                   PROTOCOL_SAMPLED_ALL.format(nodes=num_nodes, n=config.num_negatives,
                                                               others=num_nodes - 1))
    degrees = dataset.degrees() if config.negative_sampling != "uniform" else None  # streamed: O(nodes)
    return evaluate_sampled(decoder, nodes, edges, config.num_negatives, config.negative_sampling,
                            degrees, seed, config.batch_size)


def _no_edges(dataset, split: str) -> MariusInputError:
    """The error of an empty split: why it is empty (the dataset's metadata) and what a user can do."""
    dropped = getattr(dataset.metadata, f"num_dropped_{split}", 0)
    cause = (f"all {dropped} were dropped for nodes or relations unseen in train" if dropped
             else "it was preprocessed without any")
    other = "test" if split == "valid" else "valid"
    return MariusInputError(f"no {split} edges in this dataset: {cause}", path=dataset.directory,
                            expected=f"a dataset preprocessed with --{split} FILE or a --split fraction above 0 "
                                     f"for {split}; or evaluate --split {other}")


def sampled_covers_all_nodes(num_negatives: int, num_nodes: int) -> bool:
    """Whether ``num_negatives`` draws would cover the candidate set: at least one per node other than the
    answer. Sampled with replacement, they would repeat nodes, and every repeat of a node scoring above the
    answer would push its rank up again (UMLS, 135 nodes, 1,000 negatives: mean rank 100, MRR 0.04 where
    ranking against all nodes gives 0.79); ranking against every node is what such a sample approximates."""
    return num_negatives >= num_nodes - 1


def evaluate_top10(decoder: Decoder, nodes: torch.Tensor | NodeTable, edges: np.ndarray, num_relations: int,
                   batch_size: int) -> dict:
    """WikiKG90Mv2's protocol: each tail ranked against all nodes, nothing filtered; a tail outside the top 10
    counts 0 in the MRR (the rank itself is reported as it is)."""
    nothing = build_known_answers(np.zeros((0, 3), dtype=np.int64), num_relations)
    ranks = filtered_ranks(decoder, nodes, edges, nothing, batch_size, heads=False)
    metrics = summarize(ranks, PROTOCOL_TOP10)
    metrics["mrr"] = float(torch.where(ranks <= 10, 1 / ranks.double(), 0.0).mean()) if len(ranks) else 0.0
    return metrics


def evaluate_unfiltered(decoder: Decoder, nodes: torch.Tensor | NodeTable, edges: np.ndarray, num_relations: int,
                        batch_size: int, protocol: str) -> dict:
    """Every answer ranked against all nodes with nothing filtered but itself (ranks at most the node count)."""
    nothing = build_known_answers(np.zeros((0, 3), dtype=np.int64), num_relations)
    return summarize(filtered_ranks(decoder, nodes, edges, nothing, batch_size), protocol)
