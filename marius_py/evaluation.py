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

import numpy as np
import torch

from marius_py.models import Decoder

PROTOCOL_FILTERED = "filtered ranking vs all nodes, both directions, realistic ties"
PROTOCOL_SAMPLED = "unfiltered ranking vs {n} sampled {kind} negatives, both directions, realistic ties"


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
        offsets = torch.arange(int(counts.sum())) - torch.repeat_interleave(torch.cumsum(counts, 0) - counts, counts)
        return rows, self.answers[torch.repeat_interleave(start, counts) + offsets]


def realistic_ranks(scores: torch.Tensor, target_scores: torch.Tensor) -> torch.Tensor:
    """Mean of optimistic and pessimistic rank; ``scores`` excludes nothing but filtered entries.

    ``scores`` still contains the target itself, which counts once in ``>=``.
    """
    greater = (scores > target_scores[:, None]).sum(1)
    greater_equal = (scores >= target_scores[:, None]).sum(1)
    optimistic = 1 + greater
    pessimistic = greater_equal  # the target counts itself once
    return (optimistic + pessimistic).double() / 2


def summarize(ranks: torch.Tensor, protocol: str) -> dict:
    ranks = ranks.double()
    return {"mrr": float((1 / ranks).mean()), "mean_rank": float(ranks.mean()),
            "hits@1": float((ranks <= 1).double().mean()), "hits@3": float((ranks <= 3).double().mean()),
            "hits@10": float((ranks <= 10).double().mean()), "num_queries": int(len(ranks)),
            "protocol": protocol}


@torch.no_grad()
def filtered_ranks(decoder: Decoder, nodes: torch.Tensor, edges: np.ndarray,
                   known: tuple[KnownAnswers, KnownAnswers], batch_size: int) -> torch.Tensor:
    """Realistic filtered ranks of every edge, tail queries then head queries."""
    device = nodes.device
    all_ranks = []
    for inverse, answers in ((False, known[0]), (True, known[1])):
        for start in range(0, len(edges), batch_size):
            batch = torch.from_numpy(edges[start:start + batch_size]).to(device)
            anchor, target = (batch[:, 2], batch[:, 0]) if inverse else (batch[:, 0], batch[:, 2])
            queries = decoder.query(nodes[anchor], batch[:, 1], inverse)
            scores = decoder.compare_all(queries[None], nodes[None])[0]
            target_scores = scores.gather(1, target[:, None])[:, 0]
            rows, cols = answers.lookup(anchor, batch[:, 1])
            scores[rows.to(device), cols.to(device)] = float("-inf")
            scores.scatter_(1, target[:, None], target_scores[:, None])
            all_ranks.append(realistic_ranks(scores, target_scores).cpu())
    return torch.cat(all_ranks)


def evaluate_filtered(decoder: Decoder, nodes: torch.Tensor, edges: np.ndarray,
                      known: tuple[KnownAnswers, KnownAnswers], batch_size: int = 1024) -> dict:
    return summarize(filtered_ranks(decoder, nodes, edges, known, batch_size), PROTOCOL_FILTERED)


def build_known_answers(known_edges: np.ndarray, num_relations: int) -> tuple[KnownAnswers, KnownAnswers]:
    return KnownAnswers(known_edges, num_relations, False), KnownAnswers(known_edges, num_relations, True)


@torch.no_grad()
def evaluate_sampled(decoder: Decoder, nodes: torch.Tensor, edges: np.ndarray, num_negatives: int,
                     sampling: str, degree_pool: np.ndarray | None, seed: int,
                     batch_size: int = 1024) -> dict:
    """Rank each answer among ``num_negatives`` sampled nodes shared by a batch (unfiltered).

    ``sampling='degree'`` draws negatives from ``degree_pool`` (the train edges'
    endpoints), i.e. proportionally to train degree.
    """
    device = nodes.device
    generator = torch.Generator().manual_seed(seed)
    pool = torch.from_numpy(degree_pool) if sampling == "degree" else None
    all_ranks = []
    for inverse in (False, True):
        for start in range(0, len(edges), batch_size):
            batch = torch.from_numpy(edges[start:start + batch_size]).to(device)
            anchor, target = (batch[:, 2], batch[:, 0]) if inverse else (batch[:, 0], batch[:, 2])
            if pool is None:
                negatives = torch.randint(len(nodes), (num_negatives,), generator=generator)
            else:
                negatives = pool[torch.randint(len(pool), (num_negatives,), generator=generator)]
            negatives = negatives.to(device)
            queries = decoder.query(nodes[anchor], batch[:, 1], inverse)
            negative_scores = decoder.compare_all(queries[None], nodes[negatives][None])[0]
            target_scores = decoder.compare_pairs(queries, nodes[target])
            # A drawn copy of the answer is an exact tie, whatever the two kernels' rounding.
            negative_scores = torch.where(negatives[None, :] == target[:, None], target_scores[:, None],
                                          negative_scores)
            scores = torch.cat([target_scores[:, None], negative_scores], dim=1)
            all_ranks.append(realistic_ranks(scores, target_scores).cpu())
    kind = "degree-based" if sampling == "degree" else "uniform"
    return summarize(torch.cat(all_ranks), PROTOCOL_SAMPLED.format(n=num_negatives, kind=kind))


def evaluate_split(decoder: Decoder, nodes: torch.Tensor, dataset, split: str, config,
                   known: tuple[KnownAnswers, KnownAnswers] | None = None, seed: int = 0) -> dict:
    """Evaluate one split of a ``Dataset`` with an ``EvaluationConfig``'s protocol."""
    edges = dataset.split(split)
    if config.protocol == "filtered":
        known = known or build_known_answers(dataset.all_known_edges(), dataset.num_relations)
        return evaluate_filtered(decoder, nodes, edges, known, config.batch_size)
    pool = dataset.train[:, [0, 2]].reshape(-1)
    return evaluate_sampled(decoder, nodes, edges, config.num_negatives, config.negative_sampling,
                            pool, seed, config.batch_size)
