"""Seeded R-MAT power-law graph generator (Chakrabarti et al. 2004), streamed to a TSV file.

    python bench/rmat.py --nodes 24000000 --edges 8000000 --seed 0 --out edges.tsv

Writes ``head<TAB>tail`` lines: ``--edges`` R-MAT edges (skewed degrees: a, b,
c, d = 0.57, 0.19, 0.19, 0.05) plus, with ``--cover`` (default on), one edge
pairing every two consecutive nodes of a random permutation, so that every
node occurs and the embedding table has exactly ``--nodes`` rows. Memory:
one chunk of edges (and one permutation of --nodes int64 when covering).
"""

from __future__ import annotations

import argparse

import numpy as np

PROBABILITIES = (0.57, 0.19, 0.19, 0.05)
CHUNK = 1 << 20


def rmat_chunk(rng: np.random.Generator, count: int, scale: int, num_nodes: int) -> np.ndarray:
    """``count`` R-MAT edges over ``2**scale`` ids folded onto ``num_nodes``."""
    heads = np.zeros(count, dtype=np.int64)
    tails = np.zeros(count, dtype=np.int64)
    cumulative = np.cumsum(PROBABILITIES)
    for bit in range(scale):
        quadrant = np.searchsorted(cumulative, rng.random(count), side="right")
        heads |= (quadrant >> 1).astype(np.int64) << bit
        tails |= (quadrant & 1).astype(np.int64) << bit
    return np.stack([heads % num_nodes, tails % num_nodes], axis=1)


def write_edges(handle, edges: np.ndarray) -> None:
    handle.write("\n".join(f"{h}\t{t}" for h, t in edges.tolist()))
    handle.write("\n")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--nodes", type=int, required=True)
    parser.add_argument("--edges", type=int, required=True, help="R-MAT edges (besides the cover)")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--no-cover", action="store_true")
    parser.add_argument("--out", required=True)
    args = parser.parse_args()
    rng = np.random.default_rng(args.seed)
    scale = max(1, int(np.ceil(np.log2(args.nodes))))
    with open(args.out, "w", encoding="utf-8") as handle:
        for start in range(0, args.edges, CHUNK):
            write_edges(handle, rmat_chunk(rng, min(CHUNK, args.edges - start), scale, args.nodes))
        if not args.no_cover:
            order = rng.permutation(args.nodes)
            if len(order) % 2:
                order = np.append(order, order[0])
            pairs = order.reshape(-1, 2)
            for start in range(0, len(pairs), CHUNK):
                write_edges(handle, pairs[start:start + CHUNK])


if __name__ == "__main__":
    main()
