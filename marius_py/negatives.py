"""Chunked shared negative sampling.

A batch of B edges is split into C chunks; every query of a chunk is scored
against the same N candidate nodes, one batched matmul per direction. A
configurable fraction of the N is taken from the batch's own endpoints (so
frequent nodes appear in proportion to their degree in the batch); the rest is
uniform over all nodes. Candidates equal to a query's true answer are masked.
"""

from __future__ import annotations

import torch


class CandidateRows:
    """Rows uniform negatives are drawn from: a union of contiguous ranges of a node table.

    In memory that is ``[0, num_nodes)``; in a partition buffer, the valid rows
    of each resident partition's slot.
    """

    def __init__(self, ranges: list[tuple[int, int]], device: torch.device | str = "cpu"):
        self.total = sum(count for _, count in ranges)  # on the host: no device synchronisation
        self._identity = len(ranges) == 1 and ranges[0][0] == 0
        if not self._identity:
            starts = torch.tensor([start for start, _ in ranges], dtype=torch.long, device=device)
            counts = torch.tensor([count for _, count in ranges], dtype=torch.long, device=device)
            self._ends = torch.cumsum(counts, 0)
            self._offsets = starts - (self._ends - counts)  # local row = position + offset of its range

    @classmethod
    def contiguous(cls, num_nodes: int, device: torch.device | str = "cpu") -> "CandidateRows":
        return cls([(0, num_nodes)], device)

    def rows(self, positions: torch.Tensor) -> torch.Tensor:
        """The table row of each position in [0, total)."""
        if self._identity:
            return positions
        ranges = torch.searchsorted(self._ends.to(positions.device), positions, right=True)
        return positions + self._offsets.to(positions.device)[ranges]

    def uniform(self, shape: tuple[int, ...], generator: torch.Generator) -> torch.Tensor:
        return self.rows(torch.randint(self.total, shape, generator=generator, device=generator.device))

    def all(self, device: torch.device) -> torch.Tensor:
        return self.rows(torch.arange(self.total, device=device))


def sample_negatives(endpoints: torch.Tensor, candidates: CandidateRows | int, num_chunks: int,
                     num_negatives: int, degree_fraction: float, generator: torch.Generator) -> torch.Tensor:
    """Candidate node rows [C, N] on the generator's device.

    ``candidates`` is a ``CandidateRows`` or a node count; ``num_negatives == -1``
    means every candidate row, shared by all chunks.
    """
    device = generator.device
    if isinstance(candidates, int):
        candidates = CandidateRows.contiguous(candidates, device)
    if num_negatives == -1:
        return candidates.all(device)[None, :]
    num_degree = int(round(num_negatives * degree_fraction))
    uniform = candidates.uniform((num_chunks, num_negatives - num_degree), generator)
    if num_degree == 0:
        return uniform
    picks = torch.randint(len(endpoints), (num_chunks, num_degree), generator=generator, device=device)
    return torch.cat([uniform, endpoints[picks]], dim=1)


def chunk(tensor: torch.Tensor, num_chunks: int) -> torch.Tensor:
    """Reshape [B, ...] to [C, B/C, ...]; B is padded up by repeating the last rows' indices."""
    batch = tensor.shape[0]
    per_chunk = -(-batch // num_chunks)
    padding = per_chunk * num_chunks - batch
    if padding:
        tensor = torch.cat([tensor, tensor[-1:].expand(padding, *tensor.shape[1:])])
    return tensor.reshape(num_chunks, per_chunk, *tensor.shape[1:])
