"""Chunked shared negative sampling.

A batch of B edges is split into C chunks; every query of a chunk is scored
against the same N candidate nodes, one batched matmul per direction. A
configurable fraction of the N is taken from the batch's own endpoints (so
frequent nodes appear in proportion to their degree in the batch); the rest is
uniform over all nodes. Candidates equal to a query's true answer are masked.
"""

from __future__ import annotations

import torch


def sample_negatives(endpoints: torch.Tensor, num_nodes: int, num_chunks: int, num_negatives: int,
                     degree_fraction: float, generator: torch.Generator) -> torch.Tensor:
    """Candidate node ids [C, N] on the generator's device.

    ``num_negatives == -1`` means every node, shared by all chunks.
    """
    device = generator.device
    if num_negatives == -1:
        return torch.arange(num_nodes, device=device)[None, :]
    num_degree = int(round(num_negatives * degree_fraction))
    uniform = torch.randint(num_nodes, (num_chunks, num_negatives - num_degree), generator=generator,
                            device=device)
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
