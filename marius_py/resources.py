"""Start-up checks of what a run needs: memory for the buffer, a matching partitioning; the C allocator."""

from __future__ import annotations

import ctypes
import os
import sys
from pathlib import Path

from marius_py.dataset import Dataset
from marius_py.errors import MariusInputError
from marius_py.storage.partitioning import most_partitions_filled, partition_size, partitions_filled


def _meminfo(key: str) -> int | None:
    try:
        for line in Path("/proc/meminfo").read_text().splitlines():
            if line.startswith(f"{key}:"):
                return int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        return None
    return None


def available_memory() -> int | None:
    """MemAvailable in bytes (Linux), or None where it cannot be read."""
    return _meminfo("MemAvailable")


def total_memory() -> int | None:
    """MemTotal in bytes (Linux), or None where it cannot be read: the same for every trainer of a machine."""
    return _meminfo("MemTotal")


def check_memory(needed: int, key: str) -> None:
    """Refuse a buffer that does not fit in the memory available now."""
    available = available_memory()
    if available is not None and needed > available:
        raise MariusInputError(f"{key}: the partition buffer needs {needed / 2**30:.1f} GiB but only "
                               f"{available / 2**30:.1f} GiB of memory is available",
                               expected="a smaller storage.buffer_capacity or more storage.num_partitions")


def check_partitioning(p: int, dataset: Dataset) -> None:
    """Out-of-core training reads edge buckets: the dataset must be bucketed for the same (physical) p."""
    check_partitions_filled(p, dataset)
    if p > 1 and dataset.edges.num_partitions != p:
        raise MariusInputError(f"storage.num_partitions is {p} but the dataset's train edges are bucketed "
                               f"for {dataset.edges.num_partitions} partitions", path=dataset.directory,
                               expected=f"a dataset preprocessed with --partitions {p}")


def check_partitions_filled(p: int, dataset: Dataset) -> None:
    """Every one of ``p`` partitions must hold nodes: the store and the buckets would disagree otherwise."""
    check_nodes_fill(p, dataset.num_nodes, dataset.directory)


def check_nodes_fill(p: int, n: int, path: object) -> None:
    """``check_partitions_filled`` for ``n`` nodes (``path``: what the error names)."""
    if p > 1 and partitions_filled(n, p) < p:
        valid = most_partitions_filled(n, p)
        raise MariusInputError(f"storage.num_partitions is {p} but {n} nodes in partitions of "
                               f"{partition_size(n, p)} rows fill only {partitions_filled(n, p)}: the last "
                               "would be empty", path=path,
                               expected=f"at most {valid} partitions (a smaller storage.num_partitions)")


# glibc's mallopt parameters and the values `keep_freed_memory` sets (docs/design.md).
M_TRIM_THRESHOLD, M_TOP_PAD, M_MMAP_THRESHOLD = -1, -2, -3
ALLOCATOR_SETTINGS = {M_MMAP_THRESHOLD: 32 << 20, M_TRIM_THRESHOLD: 256 << 20, M_TOP_PAD: 16 << 20}
ALLOCATOR_OPT_OUT = "MARIUS_PY_SYSTEM_MALLOC"
USER_MALLOC_SETTINGS = ("MALLOC_TRIM_THRESHOLD_", "MALLOC_MMAP_THRESHOLD_", "MALLOC_TOP_PAD_",
                        "MALLOC_ARENA_MAX")


def keep_freed_memory() -> bool:
    """Let glibc keep a training step's freed temporaries for the next step instead of returning them to the
    OS; True if it took the settings.

    With glibc's defaults every CPU step gives its tens of MB of score and gradient temporaries back (heap
    trimmed, or blocks unmapped), and the next step takes them again, page faults and zeroing included: the
    bundled job spent 96 s of its 236 s in the kernel. Kept: up to 256 MiB of free heap per malloc arena,
    blocks up to 32 MiB served from the heap. A process-wide setting, so the command line applies it and the
    library does not. Left alone where the user set glibc's malloc variables, or MARIUS_PY_SYSTEM_MALLOC to
    anything but 0."""
    if not sys.platform.startswith("linux") or os.environ.get(ALLOCATOR_OPT_OUT, "0") not in ("", "0") \
            or any(name in os.environ for name in USER_MALLOC_SETTINGS) \
            or "glibc.malloc." in os.environ.get("GLIBC_TUNABLES", ""):
        return False
    try:
        mallopt = ctypes.CDLL("libc.so.6").mallopt  # glibc only: musl has no mallopt of these parameters
    except (OSError, AttributeError):
        return False
    mallopt.argtypes, mallopt.restype = [ctypes.c_int, ctypes.c_int], ctypes.c_int
    # All three explicitly: setting any of them stops glibc from raising the mmap threshold by itself as blocks
    # are freed (with the trim threshold alone, every block over 128 KiB was mapped and unmapped: slower).
    taken = [mallopt(parameter, value) == 1 for parameter, value in ALLOCATOR_SETTINGS.items()]
    return all(taken)
