"""Chunked shared negative sampling.

A batch of B edges is split into C chunks; every query of a chunk is scored
against the same N candidate nodes, one batched matmul per direction. A
configurable fraction of the N is taken from the batch's own endpoints (so
frequent nodes appear in proportion to their degree in the batch); the rest is
uniform over all nodes. Candidates equal to a query's true answer are masked.

How a batch's negatives are drawn is a plug-in (``NEGATIVE_SAMPLERS``, ``mp.NEGATIVE_SAMPLERS``; the config's
training.negative_sampler): for each corruption direction,

    sampler(num_endpoints, num_candidates, num_chunks, num_negatives, degree_fraction, generator)
        -> (positions [C, U], picks [C, D] or None)

positions index the candidate rows (every node in memory; out of core, the rows of the resident partitions),
picks the batch's own endpoints (its heads, then its tails), U + D = num_negatives; both int64 on the
generator's device, every random number from ``generator`` (so a run repeats, and several devices can share
draws). The step turns them into rows (``negatives_from_draws``) and masks the true answers. A sampler that
also takes ``out`` (two tensors to fill, for CUDA graphs) is handed them; another's draws are copied there.
"""

from __future__ import annotations

import functools
import inspect

import torch

from marius_py.registry import Registry, check_function


class CandidateRows:
    """Rows uniform negatives are drawn from: a union of contiguous ranges of a node table.

    In memory that is ``[0, num_nodes)``; in a partition buffer, the valid rows
    of each resident partition's slot: ranges ``(start, count)``.
    """

    def __init__(self, ranges: list[tuple[int, int]], device: torch.device | str = "cpu"):
        self.total = sum(count for _, count in ranges)  # draw positions, on the host: no device synchronisation
        self._identity = len(ranges) == 1 and ranges[0][0] == 0
        if not self._identity:
            as_tensor = lambda values: torch.tensor(values, dtype=torch.long, device=device)  # noqa: E731
            counts = as_tensor([count for _, count in ranges])
            self._ends = torch.cumsum(counts, 0)
            # row = position + the offset of its range
            self._offsets = as_tensor([start for start, _ in ranges]) - (self._ends - counts)

    def to(self, device: torch.device | str) -> CandidateRows:
        """The same rows, their lookup tensors on ``device``."""
        if self._identity:
            return self
        moved = CandidateRows.__new__(CandidateRows)
        moved.__dict__.update({key: value.to(device) if isinstance(value, torch.Tensor) else value
                               for key, value in self.__dict__.items()})
        return moved

    @property
    def is_identity(self) -> bool:
        """Whether position i is row i (an in-memory table)."""
        return self._identity

    @classmethod
    def contiguous(cls, num_nodes: int, device: torch.device | str = "cpu") -> "CandidateRows":
        return cls([(0, num_nodes)], device)

    def rows(self, positions: torch.Tensor) -> torch.Tensor:
        """The table row of each position in [0, total)."""
        if self._identity:
            return positions
        device = positions.device
        ranges = torch.searchsorted(self._ends.to(device), positions, right=True)
        return positions + self._offsets.to(device)[ranges]

    def all(self, device: torch.device) -> torch.Tensor:
        """Every row once (1-vs-all scoring)."""
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
    draws = negative_draws(len(endpoints), candidates.total, num_chunks, num_negatives, degree_fraction, generator)
    return negatives_from_draws(draws, endpoints, candidates)


def negative_draws(num_endpoints: int, num_candidates: int, num_chunks: int, num_negatives: int,
                   degree_fraction: float, generator: torch.Generator,
                   out: tuple[torch.Tensor, torch.Tensor | None] | None = None,
                   ) -> tuple[torch.Tensor, torch.Tensor | None]:
    """The random draws of ``sample_negatives``: (uniform positions among the candidates, endpoint picks or None).

    ``out`` receives them in place (a CUDA graph reads the same buffers every batch).
    """
    num_degree = round(num_negatives * degree_fraction)
    uniform = torch.randint(num_candidates, (num_chunks, num_negatives - num_degree), generator=generator,
                            device=generator.device, out=None if out is None else out[0])
    if num_degree == 0:
        return uniform, None
    picks = torch.randint(num_endpoints, (num_chunks, num_degree), generator=generator, device=generator.device,
                          out=None if out is None else out[1])
    return uniform, picks


def _check_sampler(name: str, sampler) -> None:
    def fits(draws) -> bool:
        if not (isinstance(draws, tuple) and len(draws) == 2 and _ints_below(draws[0], 7)):
            return False
        positions, picks = draws
        uniform = positions.shape[1] if positions.dim() == 2 and positions.shape[0] == 2 else -1
        if picks is None:
            return uniform == 4
        return _ints_below(picks, 5) and picks.dim() == 2 and picks.shape[0] == 2 and uniform + picks.shape[1] == 4
    check_function("negative sampler", name, sampler, SAMPLER_PARAMETERS, (5, 7, 2, 4, 0.5, torch.Generator()), fits,
                   "(positions [C, U] in [0, num_candidates), picks [C, D] in [0, num_endpoints) or None), int64, "
                   "U + D = num_negatives")


def _ints_below(values, bound: int) -> bool:
    return isinstance(values, torch.Tensor) and values.dtype == torch.int64 and \
        (values.numel() == 0 or 0 <= int(values.min()) and int(values.max()) < bound)


SAMPLER_PARAMETERS = ("num_endpoints", "num_candidates", "num_chunks", "num_negatives", "degree_fraction", "generator")
NEGATIVE_SAMPLERS: Registry = Registry("negative sampler", "mp.NEGATIVE_SAMPLERS", check=_check_sampler,
                                       loaded_by="model.plugins")
NEGATIVE_SAMPLERS.register("uniform", negative_draws)


def takes_out(sampler) -> bool:
    """Whether a sampler fills ``out`` itself (the built-in one does)."""
    try:
        return "out" in inspect.signature(sampler).parameters
    except (TypeError, ValueError):
        return False


def negatives_from_draws(draws: tuple[torch.Tensor, torch.Tensor | None], endpoints: torch.Tensor,
                         candidates: CandidateRows) -> torch.Tensor:
    """[C, N] rows: uniform candidates, then the picked endpoints (frequent nodes in proportion to degree)."""
    uniform, picks = draws
    uniform = candidates.rows(uniform)
    return uniform if picks is None else torch.cat([uniform, endpoints[picks]], dim=1)


def chunk(tensor: torch.Tensor, num_chunks: int) -> torch.Tensor:
    """Reshape [B, ...] to [C, B/C, ...]; B is padded up by repeating the last rows' indices."""
    batch = tensor.shape[0]
    per_chunk = -(-batch // num_chunks)
    padding = per_chunk * num_chunks - batch
    if padding:
        tensor = torch.cat([tensor, tensor[-1:].expand(padding, *tensor.shape[1:])])
    return tensor.reshape(num_chunks, per_chunk, *tensor.shape[1:])


def by_chunk(rows: torch.Tensor, batch: int, num_chunks: int) -> torch.Tensor:
    """[2 * batch, ...] (tail then head direction) -> [2C, M, ...] chunks; a view unless C does not divide batch."""
    if batch % num_chunks == 0:
        return rows.reshape(2 * num_chunks, batch // num_chunks, *rows.shape[1:])
    return torch.cat([chunk(rows[:batch], num_chunks), chunk(rows[batch:], num_chunks)])


@functools.lru_cache(maxsize=16)
def chunk_row_weights(batch: int, per_chunk: int, num_chunks: int, dtype: torch.dtype, device) -> torch.Tensor:
    """[2C, M] weights of chunk rows in the batch mean: 1 / batch, 0 for padding (cached: same every batch)."""
    weights = (torch.arange(num_chunks * per_chunk, device=device) < batch).to(dtype) / batch
    return weights.reshape(num_chunks, per_chunk).repeat(2, 1)
