"""Export trained embeddings keyed by original names: npy, tsv or h5.

Outputs are written under a temporary name and renamed into place, so an
interrupted export never leaves a file that looks complete.
  npy: ``<out>/node_embeddings.npy`` + ``node_names.txt`` (and relation ones), row i <-> line i
  tsv: ``<out>/node_embeddings.tsv`` and ``relation_embeddings.tsv``, ``name<TAB>v1<TAB>v2...``
  h5:  ``<out>/embeddings.h5`` with datasets ``node_embeddings``, ``node_names``,
       ``relation_embeddings``, ``relation_names`` (as PyTorch-BigGraph users expect)
"""

from __future__ import annotations

import json
from pathlib import Path

import h5py
import numpy as np

from marius_py.dataset import write_names
from marius_py.errors import MariusInputError
from marius_py.storage.durable import staged_directory, staging_for

FORMATS = ("npy", "tsv", "h5")
MARKER = "export.json"  # marks a directory this module wrote, the only kind --overwrite replaces
_TSV_ROWS = 4096


def _write_tsv(path: Path, names: list[str], blocks) -> None:
    with open(path, "w", encoding="utf-8") as handle:
        for start, block in blocks:
            for name, row in zip(names[start:start + len(block)], block):
                handle.write(name + "\t" + "\t".join(f"{x:.7g}" for x in row) + "\n")


def export_embeddings(output: str | Path, fmt: str, node_names: list[str], node_blocks, dim: int,
                      relation_names: list[str], relations: np.ndarray, overwrite: bool = False) -> Path:
    """Write node (and relation) embeddings in ``fmt`` into directory ``output``.

    ``node_blocks`` yields (first node id, rows) in id order, one partition at a
    time, so exporting needs memory for one partition only.
    """
    if fmt not in FORMATS:
        raise MariusInputError(f"unknown export format {fmt!r}", expected=" | ".join(FORMATS))
    output = Path(output)
    if output.exists() and not (overwrite and (output / MARKER).exists()):
        raise MariusInputError("output already exists", path=output,
                               expected="a new path, or --overwrite to replace an earlier export")
    tmp = staging_for(output)
    try:
        tmp.mkdir(parents=True)
    except OSError as error:
        raise MariusInputError(f"cannot create the output directory: {error.strerror}", path=output,
                               expected="a path in a writable directory") from None
    num_nodes = len(node_names)
    with staged_directory(output, tmp):
        if fmt == "npy":
            array = np.lib.format.open_memmap(tmp / "node_embeddings.npy", mode="w+", dtype=np.float32,
                                              shape=(num_nodes, dim))
            for start, block in node_blocks:
                array[start:start + len(block)] = block
            array.flush()
            del array
            np.save(tmp / "relation_embeddings.npy", relations)
            write_names(tmp / "node_names.txt", node_names)
            write_names(tmp / "relation_names.txt", relation_names)
        elif fmt == "tsv":
            _write_tsv(tmp / "node_embeddings.tsv", node_names, node_blocks)
            _write_tsv(tmp / "relation_embeddings.tsv", relation_names, [(0, relations)])
        else:
            with h5py.File(tmp / "embeddings.h5", "w") as handle:
                data = handle.create_dataset("node_embeddings", shape=(num_nodes, dim), dtype="float32")
                for start, block in node_blocks:
                    data[start:start + len(block)] = block
                handle.create_dataset("node_names", data=np.array(node_names, dtype=object),
                                      dtype=h5py.string_dtype())
                handle.create_dataset("relation_embeddings", data=relations)
                handle.create_dataset("relation_names", data=np.array(relation_names, dtype=object),
                                      dtype=h5py.string_dtype())
        (tmp / MARKER).write_text(json.dumps({"format": fmt, "num_nodes": len(node_names)}) + "\n")
    return output


def relation_rows(relation_table: np.ndarray, relation_names: list[str]) -> tuple[list[str], np.ndarray]:
    """Forward and inverse relation vectors, the inverse ones named ``<name>__inverse``."""
    count = len(relation_names)
    if relation_table.shape[1] == 0:
        return [], relation_table[:0]
    names = list(relation_names) + [f"{n}__inverse" for n in relation_names]
    return names, relation_table[:2 * count]
