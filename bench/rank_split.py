"""Where a model's filtered ranking errors lie, by node group.

For every test edge (tail and head queries), counts the nodes scored above the
target (filtered, ties half) inside the target's own group and in the other
groups. The groups are the logical partitions of one epoch of a P:C ordering
(``partition_accuracy.py --rank-split default:P:C`` uses its last epoch, whichever
checkpoint the run tests). If
out-of-core training let the groups' score levels drift apart, other groups'
nodes would outrank the target more often than its own group's
(``other_over_same`` above 1); an in-memory model has no reason to.
"""

from __future__ import annotations

import numpy as np
import torch

from marius_py.api import TrainedModel
from marius_py.storage.partitioning import partition_of


def group_of_nodes(partitioned, epoch: int, num_nodes: int) -> np.ndarray:
    """Logical partition of every node in ``epoch`` of a partitioned run's ordering (``OrderedRun``)."""
    ordering = partitioned.ordering(epoch)
    physical_group = np.full(ordering.num_physical_partitions, -1, dtype=np.int64)
    for group in range(ordering.num_partitions):
        physical_group[list(ordering.partitions_of(group))] = group
    assert (physical_group >= 0).all(), "a physical partition in no group"
    return physical_group[partition_of(np.arange(num_nodes), num_nodes, ordering.num_physical_partitions)]


@torch.no_grad()
def rank_split(model: TrainedModel, groups: np.ndarray, batch_size: int = 1024) -> dict:
    """Nodes above each test target, in its group and outside it: rates per candidate and MRRs of each part.
    ``groups``: each node's group, 0..G-1, G >= 2 groups of >= 2 nodes (so both rates have candidates)."""
    sizes = np.bincount(groups)
    if len(sizes) < 2 or sizes.min() < 2:
        raise ValueError(f"rank_split needs at least 2 groups of at least 2 nodes, got sizes {sizes.tolist()}")
    device = model.device
    nodes = torch.from_numpy(model.embeddings()).to(device)
    group = torch.from_numpy(groups).to(device)
    sizes = torch.from_numpy(sizes).to(device).double()
    one_hot = torch.nn.functional.one_hot(group).float()  # [nodes, groups]
    edges = torch.from_numpy(model.dataset.test).to(device)
    same, other = [], []
    for inverse in (False, True):
        anchor, target = (edges[:, 2], edges[:, 0]) if inverse else (edges[:, 0], edges[:, 2])
        rows, answers = model.known_answers(inverse).lookup(anchor, edges[:, 1])
        rows, answers = rows.to(device), answers.to(device)
        for start in range(0, len(edges), batch_size):
            end = min(start + batch_size, len(edges))
            queries = model.decoder.query(nodes[anchor[start:end]], edges[start:end, 1], inverse)
            scores = model.decoder.compare_all(queries[None], nodes[None])[0].float()
            own = scores.gather(1, target[start:end, None])
            inside = (rows >= start) & (rows < end)
            scores[rows[inside] - start, answers[inside]] = float("-inf")  # known answers, the target among them
            above = (scores > own).float() + 0.5 * (scores == own).float()
            by_group = above @ one_hot  # [queries, groups]
            in_group = by_group.gather(1, group[target[start:end], None])[:, 0]
            same.append(in_group)
            other.append(by_group.sum(1) - in_group)
    same, other = torch.cat(same).double(), torch.cat(other).double()
    target_groups = group[torch.cat([edges[:, 2], edges[:, 0]])]
    same_rate = (same / (sizes[target_groups] - 1)).mean()
    other_rate = (other / (len(nodes) - sizes[target_groups])).mean()
    return {"groups": int(len(sizes)), "queries": int(len(same)),
            "mrr": float((1 / (1 + same + other)).mean()),
            "mrr_in_group": float((1 / (1 + same)).mean()), "mrr_other_groups": float((1 / (1 + other)).mean()),
            "above_rate_in_group": float(same_rate), "above_rate_other_groups": float(other_rate),
            "other_over_same": float(other_rate / same_rate)}
