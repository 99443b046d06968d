"""Export trained embeddings keyed by original names: npy, tsv or h5.

Outputs are written (and fsynced) in a staging directory and renamed into place, so a failed or
interrupted export never leaves a file that looks complete: a new output directory appears whole; into
an existing one (empty, or an earlier export replaced with --overwrite) the files move one by one,
``export.json`` (format, node count, files) last, so a directory is a complete export exactly when it has
one. A directory holding anything export does not write is refused, never emptied.

An export into an existing directory stages its files in ``.export-staging-HOST-PID`` there and holds an
exclusive ``flock`` on ``.export-lock`` there from its check to the end of the move: a second export into
the same directory meanwhile is refused naming the first's pid and host (the lock file is removed at the
end). Staging folders are removed only once their process is gone (``storage.durable.remove_abandoned``).
  npy: ``<out>/node_embeddings.npy`` + ``node_names.txt`` (and relation ones), row i <-> line i
  tsv: ``<out>/node_embeddings.tsv`` and ``relation_embeddings.tsv``, ``name<TAB>v1<TAB>v2...``
  h5:  ``<out>/embeddings.h5`` with datasets ``node_embeddings``, ``node_names``,
       ``relation_embeddings``, ``relation_names`` (as PyTorch-BigGraph users expect)
"""

from __future__ import annotations

import errno
import json
import os
import shutil
from pathlib import Path

import h5py
import numpy as np

from marius_py.dataset import write_names
from marius_py.errors import MariusInputError
from marius_py.run_lock import DirectoryLock
from marius_py.storage.durable import (fsync_directory, fsync_tree, is_disk_full, on_disk, owned_name,
                                       remove_abandoned, reporting_full_disk, staging_for)
from marius_py.storage.edge_store import new_hdf5

FORMATS = ("npy", "tsv", "h5")
MARKER = "export.json"  # marks a directory this module wrote, the only kind --overwrite replaces
FORMAT_FILES = {"npy": ("node_embeddings.npy", "relation_embeddings.npy", "node_names.txt", "relation_names.txt"),
                "tsv": ("node_embeddings.tsv", "relation_embeddings.tsv"),
                "h5": ("embeddings.h5",)}
EXPORT_FILES = frozenset(name for names in FORMAT_FILES.values() for name in names) | {MARKER}
STAGING_PREFIX = ".export-staging-"  # an export into an existing directory is staged in it: PREFIX + HOST-PID
LOCK_FILE = ".export-lock"  # flock'ed by the export into an existing directory, removed when it ends
_TSV_ROWS = 4096
_NPY_HEADER = 128  # numpy's header of a 2-D array (padded to 64-byte alignment)
_H5_NAME_BYTES = 40  # per name in HDF5: its variable-length reference and heap object header
_H5_OVERHEAD = 8 << 10  # superblock, object headers, B-trees, heap collections


def _export_lock(output: Path) -> DirectoryLock:
    """``OUTPUT/.export-lock`` while one export checks and fills an existing directory; removed at the end,
    and one left by a killed export counts for nothing."""
    return DirectoryLock(
        output / LOCK_FILE,
        busy=lambda holder: MariusInputError(f"another export into this directory is running: {holder}",
                                             path=output, expected="one export into a directory at a time: wait "
                                                                   "for it to end or stop it, or export into another -o"),
        unwritable=lambda reason: MariusInputError(f"cannot write in the output directory ({reason})", path=output,
                                                   expected="a directory this user can write, or a new path"),
        remove_on_release=True)


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
    given = Path(output)
    output = given.resolve()  # (a link to a directory: the export goes into the directory it names)
    needed = _export_bytes(fmt, node_names, dim, relation_names, relations)
    with reporting_full_disk(f"writing the export {given}", output, needed):  # (checked before even the lock)
        if check_output(given, overwrite) is None:  # a new directory: built beside it, renamed into place
            _export(given, output, None, fmt, node_names, node_blocks, dim, relation_names, relations)
        else:
            with _export_lock(output):  # one export at a time into an existing directory, check to move
                replaced = check_output(given, overwrite)  # (again, now that no other export can change it)
                if replaced is None:  # (removed meanwhile)
                    raise MariusInputError("output directory vanished while export started", path=given,
                                           expected="an output directory that nothing else removes meanwhile")
                _export(given, output, replaced, fmt, node_names, node_blocks, dim, relation_names, relations)
    return given


def _export(given: Path, output: Path, replaced: list[str] | None, fmt: str, node_names: list[str], node_blocks,
            dim: int, relation_names: list[str], relations: np.ndarray) -> None:
    """Write the export staged, then rename it into place (``replaced`` None: a new directory) or move its
    files into ``output`` (under ``_export_lock``), replacing the earlier export's files ``replaced``."""
    if replaced is None:
        tmp = staging_for(output, MARKER)
    else:
        remove_abandoned(output, [STAGING_PREFIX])  # (those of dead processes only)
        tmp = output / owned_name(STAGING_PREFIX)
    try:
        if replaced is not None:
            shutil.rmtree(tmp, ignore_errors=True)
        tmp.mkdir(parents=True)
    except OSError as error:
        if is_disk_full(error):
            raise
        raise MariusInputError(f"cannot create the output directory: {error.strerror}", path=given,
                               expected="a path in a writable directory") from None
    try:
        _write(tmp, fmt, node_names, node_blocks, dim, relation_names, relations)
        fsync_tree(tmp)
        if replaced is None:
            try:
                os.replace(tmp, output)  # a new directory appears whole (onto nothing, or an empty directory)
            except OSError as error:
                if error.errno not in (errno.ENOTEMPTY, errno.EEXIST, errno.ENOTDIR, errno.EISDIR):
                    raise
                raise MariusInputError("the output appeared while export wrote (another export or program "
                                       "created it); it is left as it is", path=given,
                                       expected="one export into a directory at a time") from None
            fsync_directory(output.parent)
    except BaseException as error:
        shutil.rmtree(tmp, ignore_errors=True)
        if is_disk_full(error) or not isinstance(error, OSError) or error.filename is None:
            raise
        raise MariusInputError(f"cannot write the export: {error.strerror}", path=error.filename,
                               expected="an output path that stays writable (and that nothing else creates "
                                        "meanwhile)") from None
    if replaced is None:
        return
    try:
        _move_into(tmp, output, replaced)  # (interrupted, it leaves its staging folder: --overwrite recovers)
    except OSError as error:  # (a full disk too: the staged export waits there, complete)
        kept = f"; the new files wait in {tmp.name} there" if tmp.is_dir() else ""
        raise MariusInputError(f"cannot move the export into place: {error.strerror or error}{kept}",
                               path=error.filename or output,
                               expected="an output directory that nothing else changes during the export; "
                                        "export again with --overwrite") from None


def check_output(output: str | Path, overwrite: bool) -> list[str] | None:
    """Refuse an output export may not write (``MariusInputError``); else the names of an earlier export's
    files there, which the new export replaces (``[]``: an empty directory), or None for a new directory.

    Only a directory holding nothing but an export's files (with its ``export.json``, or the staging folder
    of an interrupted export) is replaced, and only with ``overwrite``; anything else in it is refused,
    never removed.
    """
    output = Path(output)
    if not output.exists():
        return None
    if not output.is_dir():
        raise MariusInputError("output is a file, not a directory", path=output,
                               expected="a directory to export into (-o DIR): a new path or an empty directory")
    try:
        entries = sorted(e for e in os.listdir(output)
                         if not (e == LOCK_FILE and (output / e).is_file()))  # (an export's lock: no content)
    except OSError as error:
        raise MariusInputError(f"cannot read the output directory: {error.strerror}", path=output,
                               expected="a directory you may read and write, or a new path") from None
    staging = [e for e in entries if e.startswith(STAGING_PREFIX) and (output / e).is_dir()]
    foreign = [e for e in entries if e not in EXPORT_FILES and e not in staging]
    if foreign:
        raise MariusInputError(f"output directory holds {foreign[0]!r}, which export did not write", path=output,
                               expected="a new path or an empty directory; --overwrite replaces only an earlier "
                                        "export's own files and refuses a directory holding others")
    if not entries:
        return []
    if MARKER not in entries and not staging:
        raise MariusInputError(f"output directory holds {entries[0]!r} but no {MARKER}, so export did not "
                               "write it", path=output,
                               expected="a new path or an empty directory; --overwrite replaces only an earlier "
                                        "export")
    if not overwrite:
        raise MariusInputError("output directory holds an earlier export" if MARKER in entries else
                               "output directory holds an interrupted export", path=output,
                               expected="a new path, or --overwrite to replace it")
    return [e for e in entries if e in EXPORT_FILES]


def _move_into(staged: Path, output: Path, replaced: list[str]) -> None:
    """Put ``staged``'s files into the existing directory ``output`` (on its file system): the earlier
    export's marker goes first, so the directory is not an export while files change; the new marker
    comes last. Only the earlier export's own files are removed; ``staged`` (inside ``output``) last, then
    the staging folders of exports whose process is gone. Runs under ``_export_lock``."""
    if MARKER in replaced:
        os.unlink(output / MARKER)
        fsync_directory(output)
    new = sorted(os.listdir(staged))
    for name in replaced:
        if name not in new and name != MARKER:
            (output / name).unlink(missing_ok=True)
    for name in new:
        if name != MARKER:
            os.replace(staged / name, output / name)
    os.replace(staged / MARKER, output / MARKER)
    staged.rmdir()
    remove_abandoned(output, [STAGING_PREFIX])  # interrupted exports' (never a running one's)
    fsync_directory(output)


def _write(tmp: Path, fmt: str, node_names: list[str], node_blocks, dim: int, relation_names: list[str],
           relations: np.ndarray) -> None:
    """The export's files, written into the staging directory ``tmp``; the marker last."""
    num_nodes = len(node_names)
    if fmt == "npy":
        _write_npy(tmp / "node_embeddings.npy", np.dtype(np.float32), (num_nodes, dim), node_blocks)
        _write_npy(tmp / "relation_embeddings.npy", relations.dtype, relations.shape, [(0, relations)])
        write_names(tmp / "node_names.txt", node_names)
        write_names(tmp / "relation_names.txt", relation_names)
    elif fmt == "tsv":
        _write_tsv(tmp / "node_embeddings.tsv", node_names, node_blocks)
        _write_tsv(tmp / "relation_embeddings.tsv", relation_names, [(0, relations)])
    else:
        with new_hdf5(tmp / "embeddings.h5") as handle:
            data = handle.create_dataset("node_embeddings", shape=(num_nodes, dim), dtype="float32")
            for start, block in node_blocks:
                data[start:start + len(block)] = block
            handle.create_dataset("node_names", data=np.array(node_names, dtype=object),
                                  dtype=h5py.string_dtype())
            handle.create_dataset("relation_embeddings", data=relations)
            handle.create_dataset("relation_names", data=np.array(relation_names, dtype=object),
                                  dtype=h5py.string_dtype())
    written = sorted(os.listdir(tmp))
    assert set(written) <= set(FORMAT_FILES[fmt]), written  # check_output recognises exactly these
    (tmp / MARKER).write_text(json.dumps({"format": fmt, "num_nodes": num_nodes, "files": written}) + "\n")


def _write_npy(path: Path, dtype: np.dtype, shape: tuple[int, ...], blocks) -> None:
    """An ``.npy`` file written with plain writes, the rows of ``blocks`` ((first row, rows), in row order)
    one after another: a full disk fails a write with ENOSPC. (A memory map of the file, sparse until
    written, dies of SIGBUS instead; ``np.save`` reports a short write without its errno.)"""
    with open(path, "wb") as handle:
        np.lib.format.write_array_header_1_0(handle, {"descr": np.lib.format.dtype_to_descr(dtype),
                                                      "fortran_order": False, "shape": tuple(shape)})
        row = 0
        for start, block in blocks:
            if start != row:
                raise ValueError(f"{path.name}: a block starts at row {start}, expected {row}")
            handle.write(np.ascontiguousarray(block, dtype=dtype).data)
            row += len(block)
    if row != shape[0]:
        raise ValueError(f"{path.name}: blocks gave {row} of {shape[0]} rows")


def _export_bytes(fmt: str, node_names: list[str], dim: int, relation_names: list[str],
                  relations: np.ndarray) -> int | None:
    """About the space the export's files take; None for tsv, whose length is known only once its text is
    written."""
    nodes = len(node_names) * dim * 4
    if fmt == "npy":
        sizes = [_NPY_HEADER + nodes, _NPY_HEADER + relations.nbytes, _text_bytes(node_names),
                 _text_bytes(relation_names)]
    elif fmt == "h5":
        names = _text_bytes(node_names) + _text_bytes(relation_names)
        sizes = [nodes + relations.nbytes + names + _H5_NAME_BYTES * (len(node_names) + len(relation_names))
                 + _H5_OVERHEAD]
    else:
        return None
    return on_disk(sizes + [1])  # (+ the marker, in a block of its own)


def _text_bytes(names: list[str]) -> int:
    """About the bytes of ``names`` one a line: their characters (at C speed; exact for ASCII names)."""
    return sum(map(len, names)) + len(names)


def relation_rows(relation_table: np.ndarray, relation_names: list[str]) -> tuple[list[str], np.ndarray]:
    """Forward and inverse relation vectors, the inverse ones named ``<name>__inverse``."""
    count = len(relation_names)
    if relation_table.shape[1] == 0:
        return [], relation_table[:0]
    names = list(relation_names) + [f"{n}__inverse" for n in relation_names]
    return names, relation_table[:2 * count]
