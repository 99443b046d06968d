"""Growing a trained model (issue 55), its building blocks: rows for new nodes estimated from their trained
neighbours, and a relation table grown by new relations with every old edge's score unchanged.

New node rows. A new node's row is the mean, over its edges to trained nodes, of the query the trained model
would rank it against: ``query(u, r)`` where it is the tail of (u, r, v), ``query(u, r, inverse)`` where it is
the head of (v, r, u). That is h∘r for DistMult and ComplEx, h + r for TransE, a rotation for RotatE, with
no code per decoder. A dot comparator scores a candidate by its direction and length alike, so its mean is
rescaled to the median norm of the trained rows; a distance comparator's mean is the point itself. A node
with no trained neighbour, or a decoder whose query is no node row (a plug-in defining ``score_hrt`` alone),
keeps the row it is given.

Relation tables hold forward rows then inverse rows, ``[2R, k]``. Grown by ``n`` relations the table is
``[old forward, new forward, old inverse, new inverse]``: the old inverse rows move up by ``n``, which only
shifts the offset the decoder adds for inverse queries, so every old edge scores as before.
"""

from __future__ import annotations

import numpy as np
import torch

from marius_py.models import Decoder


def neighbour_rows(decoder: Decoder, nodes: torch.Tensor, edges: np.ndarray, first_new: int,
                   initial: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """(rows, estimated) for the nodes ``first_new ..`` (``initial``: their rows where nothing is estimated):
    ``edges`` are id triples over old and new nodes; ``nodes`` holds the trained rows of ids below
    ``first_new``. ``estimated[i]``: whether new node ``first_new + i`` had a trained neighbour."""
    num_new, dim = initial.shape
    rows, counts = torch.zeros(num_new, dim, dtype=torch.float64), torch.zeros(num_new, dtype=torch.float64)
    edges_t = torch.from_numpy(np.asarray(edges, dtype=np.int64)).reshape(-1, 3)
    with torch.no_grad():
        for inverse, (anchor_column, new_column) in ((False, (0, 2)), (True, (2, 0))):
            anchor, new = edges_t[:, anchor_column], edges_t[:, new_column]
            picked = (anchor < first_new) & (new >= first_new)
            if not picked.any():
                continue
            queries = decoder.query(nodes[anchor[picked]].float(), edges_t[picked, 1], inverse)
            if queries.shape[-1] != dim:  # (a query that is no node row: nothing to estimate from)
                return initial.clone(), torch.zeros(num_new, dtype=torch.bool)
            rows.index_add_(0, new[picked] - first_new, queries.double())
            counts.index_add_(0, new[picked] - first_new, torch.ones(int(picked.sum()), dtype=torch.float64))
    estimated = counts > 0
    rows[estimated] /= counts[estimated, None]
    if decoder.comparator == "dot" and estimated.any():  # (what the decoder declares, not its class)
        typical = torch.linalg.vector_norm(nodes.double(), dim=1).median()
        lengths = torch.linalg.vector_norm(rows[estimated], dim=1, keepdim=True).clamp_min(1e-12)
        rows[estimated] *= typical / lengths
    out = initial.clone()
    out[estimated] = rows[estimated].to(initial.dtype)
    return out, estimated


def grown_relation_rows(table: torch.Tensor, num_old: int, new_forward: torch.Tensor,
                        new_inverse: torch.Tensor) -> torch.Tensor:
    """``[2R, k]`` forward-then-inverse rows grown by the ``n`` new relations' rows: ``[2(R + n), k]``."""
    if table.shape[0] != 2 * num_old or new_forward.shape != new_inverse.shape:
        raise ValueError(f"a relation table of {table.shape[0]} rows for {num_old} relations, new rows "
                         f"{tuple(new_forward.shape)} and {tuple(new_inverse.shape)}")
    forward, inverse = table[:num_old], table[num_old:]
    return torch.cat([forward, new_forward.to(table), inverse, new_inverse.to(table)])


def grown_relation_state(state: torch.Tensor, num_old: int, num_new: int) -> torch.Tensor:
    """An optimizer's per-row state of a relation table (Adagrad's sums, Adam's moments) grown as its rows:
    old rows keep theirs, new rows start at zero."""
    zeros = state.new_zeros((num_new, *state.shape[1:]))
    return grown_relation_rows(state, num_old, zeros, zeros)
