"""Row kernels of the data path: gather rows, add gradient rows, Adagrad rows in place.

The tables may be in GPU memory or in pinned host memory: under unified
addressing a GPU kernel reads and writes pinned host rows in place over PCIe,
with no staging copy and no host work (the zero-copy path). A ``RowCache``
(``pipeline/device_cache.py``) keeps some rows of a host table in GPU memory:
the kernels then read and update the cached copy of those rows and touch the
host only for the others.

Each function has a Triton kernel for CUDA tables and a torch version (CPU,
float64, and CUDA without Triton) that the tests use as reference. Tables are
float32, or bfloat16 (``storage.dtype=bfloat16``: half the memory and IO) with
all arithmetic in float32: gathers widen the rows, and the Adagrad update writes
its rows back with stochastic rounding (``round_stochastic_bfloat16``), since
rounding to nearest loses the small steps. A ``RowCache`` serves float32 tables
only.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import torch
from torch.nn import functional as F

from marius_py.storage.rounding import round_stochastic_bfloat16

if TYPE_CHECKING:
    from marius_py.pipeline.device_cache import RowCache

try:  # Triton ships with CUDA builds of torch; CPU builds use the torch versions.
    import triton
    import triton.language as tl
except ImportError:  # pragma: no cover - depends on the torch build
    triton = None

TILE = 4096  # elements of one [edges or rows, d] tile per Triton program
# The gather and the Adagrad read-modify-write of pinned host rows (zero copy) wait on PCIe, where more,
# smaller programs keep more reads in flight: on two H200s the two-GPU host step with dedup ran 7.6-7.8%
# faster with these than with TILE, without dedup 3%, one GPU's -2% to +3% (bench/multi_gpu.py --parts rows
# step). Tables in GPU memory keep TILE.
ZERO_COPY_GATHER_TILE = 1024
ZERO_COPY_ADAGRAD_TILE = 2048
_STATE_SALT = 1  # the Adagrad state's salt (the embeddings' is 0): noise independent of the embeddings'


def triton_available() -> bool:
    return triton is not None


def zero_copy_available() -> bool:
    """Whether GPU kernels can read and write pinned host tables in place (CUDA with Triton)."""
    return triton is not None and torch.cuda.is_available()


def use_triton(tensor: torch.Tensor) -> bool:
    """Whether the Triton kernels serve this (output or gradient) tensor: float32 on CUDA."""
    return tensor.is_cuda and triton is not None and tensor.dtype == torch.float32


def tile_shape(dim: int, tile: int | None = None) -> tuple[int, int]:
    """(rows per program, padded d) of a [rows, d] tile of about ``tile`` (default TILE) elements."""
    block_d = triton.next_power_of_2(dim)
    return max(1, (tile or TILE) // block_d), block_d


def _host_count(count: torch.Tensor | int | None, default: int) -> int:
    return default if count is None else int(count)


def gather_rows(table: torch.Tensor, rows: torch.Tensor, out: torch.Tensor, count: torch.Tensor | int | None = None,
                cache: RowCache | None = None) -> torch.Tensor:
    """``out[u] = table[rows[u]]`` (cast to out's dtype, zeros past d) for u < count (an int or a device tensor).

    ``table`` (float32 or bfloat16) may be pinned host memory: the GPU reads it
    over PCIe in place. Rows held by ``cache`` are read from its GPU copy
    instead (float32 tables only).
    """
    if cache is not None and table.dtype == torch.bfloat16:
        raise ValueError("gather_rows: a RowCache serves float32 tables only, not bfloat16")
    dim, width = table.shape[1], out.shape[1]
    if count is not None and not isinstance(count, torch.Tensor):
        rows, count = rows[:count], None
    if not _gathers_by_kernel(table, out):
        limit = _host_count(count, len(rows))
        wanted = rows[:limit]
        values = table[wanted.to(table.device)].to(out.device)
        if cache is not None:
            slots = cache.slot_of[wanted]
            hit = slots >= 0
            values[hit] = cache.embeddings[slots[hit]]
        out[:limit] = F.pad(values.to(out.dtype), (0, width - dim))
        return out
    block_r, block_d = tile_shape(width, TILE if table.is_cuda else ZERO_COPY_GATHER_TILE)
    cached = cache is not None
    _gather_rows_kernel[(triton.cdiv(len(rows), block_r),)](
        table, rows, rows if count is None else count, out, len(rows), dim, width,
        cache.slot_of if cached else rows, cache.embeddings if cached else table,
        COUNT_ON_DEVICE=count is not None, CACHED=cached, BLOCK_R=block_r, BLOCK_D=block_d)
    return out


def _gathers_by_kernel(table: torch.Tensor, out: torch.Tensor) -> bool:
    """float32 or bfloat16 tables into float32 or bfloat16 rows (bfloat16 score blocks gather their candidates
    cast; bfloat16 tables widen to float32 rows)."""
    return (out.is_cuda and triton is not None and table.dtype in (torch.float32, torch.bfloat16)
            and out.dtype in (torch.float32, torch.bfloat16))


def move_rows(source: torch.Tensor, target: torch.Tensor, count: torch.Tensor | int,
              source_rows: torch.Tensor | None = None, target_rows: torch.Tensor | None = None,
              source_start: torch.Tensor | None = None, target_start: torch.Tensor | None = None) -> None:
    """``target[t(i)] = source[s(i)]`` for i < count, where s(i) is ``source_rows[i]`` or ``source_start + i``
    (0 without either) and t(i) likewise.

    ``count`` and the starts may be one-element tensors on any device, and
    ``source`` may live on another GPU or in pinned host memory: the kernel runs
    on ``target``'s device (the source's, for a pinned host target) and reads
    the rest where it lives (peer access over
    NVLink, or PCIe), so moving a step's rows between devices needs no host read
    of their counts (the routed step is capturable as a CUDA graph).
    Rows are 1-D (ids) or 2-D of the same width.
    """
    src, dst = (t if t.dim() == 2 else t.reshape(-1, 1) for t in (source, target))
    if not _moves_by_kernel(src, dst):
        _move_rows_torch(src, dst, count, source_rows, target_rows, source_start, target_start)
        return
    with torch.cuda.device(dst.device if dst.is_cuda else src.device):  # a pinned target: the source's GPU
        _launch_move(src, dst, count, source_rows, target_rows, source_start, target_start)


def _launch_move(src, dst, count, source_rows, target_rows, source_start, target_start) -> None:
    width = dst.shape[1]
    block_r, block_d = tile_shape(width)
    on_device = isinstance(count, torch.Tensor)
    bound = len(source_rows) if source_rows is not None else len(target_rows) if target_rows is not None \
        else min(len(src), len(dst))
    if not on_device:
        bound = min(bound, count)
    _move_rows_kernel[(triton.cdiv(max(bound, 1), block_r),)](
        src, dst, count if on_device else dst, bound,
        dst if source_rows is None else source_rows, dst if target_rows is None else target_rows,
        dst if source_start is None else source_start, dst if target_start is None else target_start, width,
        COUNT_ON_DEVICE=on_device, SOURCE_INDEXED=source_rows is not None,
        TARGET_INDEXED=target_rows is not None, SOURCE_OFFSET=source_start is not None,
        TARGET_OFFSET=target_start is not None, BLOCK_R=block_r, BLOCK_D=block_d)


def _moves_by_kernel(source: torch.Tensor, target: torch.Tensor) -> bool:
    """A GPU kernel moves the rows into GPU memory, or from a GPU into pinned host memory."""
    return triton is not None and (target.is_cuda or source.is_cuda and target.is_pinned())


def _wait_for(*values) -> None:
    """Before the host reads device counts or offsets made on some stream of their device (maybe another GPU)."""
    for value in values:
        if isinstance(value, torch.Tensor) and value.is_cuda:
            torch.cuda.synchronize(value.device)


def _move_rows_torch(src, dst, count, source_rows, target_rows, source_start, target_start) -> None:
    _wait_for(count, source_start, target_start)
    count = int(count)
    if count == 0:
        return
    positions = torch.arange(count)
    at = (source_rows[:count].cpu() if source_rows is not None
          else positions + (int(source_start) if source_start is not None else 0))
    to = (target_rows[:count].cpu() if target_rows is not None
          else positions + (int(target_start) if target_start is not None else 0))
    dst[to.to(dst.device)] = src[at.to(src.device)].to(dst.device, dst.dtype)


def scatter_add_rows_(target: torch.Tensor, positions: torch.Tensor, source: torch.Tensor) -> None:
    """``target[positions[i]] += source[i, :d]`` (repeated positions add up); ``source`` may be wider, any dtype."""
    dim = target.shape[1]
    if not use_triton(target):
        target.index_add_(0, positions, source[:, :dim].to(target.dtype))
        return
    block_r, block_d = tile_shape(dim)
    _scatter_add_rows_kernel[(triton.cdiv(len(positions), block_r),)](
        target, positions, source, len(positions), dim, source.stride(0), BLOCK_R=block_r, BLOCK_D=block_d)


def sparse_adagrad_(nodes: torch.Tensor, state: torch.Tensor, rows: torch.Tensor, grad: torch.Tensor,
                    count: torch.Tensor | int | None, lr: float, eps: float, cache: RowCache | None = None,
                    present: torch.Tensor | None = None, start: torch.Tensor | None = None,
                    seed: torch.Tensor | int | None = None) -> None:
    """Adagrad on table rows ``rows[:count]`` (unique) with gradients ``grad``, in place.

    ``grad`` is [rows, d], or [G, rows, d]: G gradients of each row applied
    one after the other, as G separate Adagrad steps (a step of G devices'
    batches, in device order); a zero gradient leaves a row unchanged.
    ``state`` has one column (row-wise Adagrad) or d. ``count`` may be a
    one-element device tensor (a plan's padded rows), read by the kernel.
    Rows held by ``cache`` are updated in its GPU copy, the others in the
    tables (which may be pinned host memory: written over PCIe).
    ``present`` ([G, rows] bool): which gradients a row has; the others are
    never read (they may be uninitialised) and count as zero. ``start`` (a
    one-element tensor, with ``count`` a tensor and no ``present``): update
    ``rows[start:start + count]`` with the same positions of ``grad`` (an
    owner's share of another device's rows). ``rows``, ``grad``, ``count`` and
    ``start`` may be on another GPU (peer access).
    bfloat16 tables (``nodes`` and ``state`` alike; no ``cache``): the rows are
    read as float32, updated in float32 as float32 tables are, and written back
    rounded stochastically with noise drawn from ``seed`` (required: an int, or
    a one-element int64 tensor on the kernel's device, read there, so a caller
    can draw a fresh seed per call without a host sync). ``grad`` stays float32.
    """
    if start is not None and (not isinstance(count, torch.Tensor) or present is not None):
        raise ValueError("sparse_adagrad_: start needs count as a tensor and no present")
    stochastic = _check_bfloat16_tables(nodes, state, cache, seed)
    grads = grad if grad.dim() == 3 else grad[None]
    if use_triton(grads):
        dim = nodes.shape[1]
        block_r, block_d = tile_shape(dim, TILE if nodes.is_cuda else ZERO_COPY_ADAGRAD_TILE)
        on_device, cached = isinstance(count, torch.Tensor), cache is not None
        if stochastic and not isinstance(seed, torch.Tensor):
            seed = torch.tensor([seed], dtype=torch.int64, device=grads.device)
        _sparse_adagrad_kernel[(triton.cdiv(len(rows), block_r),)](
            nodes, state, rows, grads, count if on_device else rows,
            _host_count(count, len(rows)) if not on_device else 0, lr, eps, dim, len(grads), grads.stride(0),
            cache.slot_of if cached else rows, cache.embeddings if cached else nodes,
            cache.state if cached else state, rows if present is None else present.view(torch.uint8),
            0 if present is None else present.stride(0), rows if start is None else start,
            seed if stochastic else rows, _STATE_SALT,
            COUNT_ON_DEVICE=on_device, ROWWISE=state.shape[1] == 1, CACHED=cached, PRESENT=present is not None,
            OFFSET=start is not None, STOCHASTIC=stochastic, BLOCK_R=block_r, BLOCK_D=block_d)
        return
    if start is not None:
        _wait_for(start, count)
        first = int(start)
        rows, grads = rows[first:], grads[:, first:]
    limit = _host_count(count, len(rows))
    rows = rows[:limit]
    if present is not None:
        grads = torch.where(present[..., None], grads, 0)
    if cache is None:
        _adagrad_rows_torch(nodes, state, rows.to(nodes.device), grads[:, :limit].to(nodes.device), lr, eps, seed)
        return
    slots = cache.slot_of[rows]
    hit = slots >= 0
    _adagrad_rows_torch(cache.embeddings, cache.state, slots[hit], grads[:, :limit][:, hit], lr, eps)
    missed = rows[~hit].to(nodes.device)
    _adagrad_rows_torch(nodes, state, missed, grads[:, :limit][:, ~hit].to(nodes.device), lr, eps)


def _check_bfloat16_tables(nodes, state, cache, seed) -> bool:
    """Whether the tables are bfloat16 (then rounded stochastically), after checking what that needs."""
    if torch.bfloat16 not in (nodes.dtype, state.dtype):
        return False
    if nodes.dtype != state.dtype:
        raise ValueError(f"sparse_adagrad_: nodes ({nodes.dtype}) and state ({state.dtype}) must share a dtype")
    if cache is not None:
        raise ValueError("sparse_adagrad_: a RowCache serves float32 tables only, not bfloat16")
    if seed is None:
        raise ValueError("sparse_adagrad_: bfloat16 tables need a seed for their stochastic rounding")
    return True


def _adagrad_rows_torch(nodes, state, rows, grads, lr: float, eps: float, seed=None) -> None:
    if nodes.dtype == torch.bfloat16:
        _adagrad_rows_bfloat16(nodes, state, rows, grads, lr, eps, seed)
        return
    for grad in grads:
        squared = grad * grad
        if state.shape[1] == 1:
            squared = squared.mean(dim=1, keepdim=True)
        accumulated = state[rows] + squared
        nodes.index_add_(0, rows, grad * (-lr / (torch.sqrt(accumulated) + eps)))
        state[rows] = accumulated


def _adagrad_rows_bfloat16(nodes, state, rows, grads, lr: float, eps: float, seed) -> None:
    """The float32 steps above on the (unique) rows widened to float32, then one stochastic rounding of each
    table's rows."""
    embedding, accumulated = nodes.index_select(0, rows).float(), state.index_select(0, rows).float()
    for grad in grads:
        squared = grad * grad
        if state.shape[1] == 1:
            squared = squared.mean(dim=1, keepdim=True)
        accumulated = accumulated + squared
        embedding = embedding + grad * (-lr / (torch.sqrt(accumulated) + eps))
    nodes.index_copy_(0, rows, round_stochastic_bfloat16(embedding, seed, 0))
    state.index_copy_(0, rows, round_stochastic_bfloat16(accumulated, seed, _STATE_SALT))


if triton is not None:
    @triton.jit
    def row_block(rows, count, num_rows, BLOCK_R: tl.constexpr, COUNT_ON_DEVICE: tl.constexpr):
        """This program's block of positions: (positions as int64, inside the first num_rows, rows[position])."""
        if COUNT_ON_DEVICE:
            num_rows = tl.load(count)
        r = tl.program_id(0) * BLOCK_R + tl.arange(0, BLOCK_R)
        inside = r < num_rows
        r = r.to(tl.int64)
        return r, inside, tl.load(rows + r, mask=inside, other=0)

    @triton.jit
    def load_rows(table, ids, cols, mask, stride):
        return tl.load(table + ids[:, None] * stride + cols[None, :], mask=mask, other=0.0)

    @triton.jit
    def _cache_slots(slot_of, table_rows, inside):
        """(slot as int64, whether the row is cached) of each row; -1 / False for rows the cache lacks."""
        slots = tl.load(slot_of + table_rows, mask=inside, other=-1).to(tl.int64)
        return slots, slots >= 0

    @triton.jit
    def _gather_rows_kernel(table, rows, count, out, num_rows, dim, width, slot_of, cache,
                            COUNT_ON_DEVICE: tl.constexpr, CACHED: tl.constexpr, BLOCK_R: tl.constexpr,
                            BLOCK_D: tl.constexpr):
        r, inside, table_rows = row_block(rows, count, num_rows, BLOCK_R, COUNT_ON_DEVICE)
        cols = tl.arange(0, BLOCK_D)
        mask = inside[:, None] & (cols < dim)[None, :]
        if CACHED:  # masked-off lanes move no bytes: a cached row never crosses PCIe
            slots, hit = _cache_slots(slot_of, table_rows, inside)
            values = tl.where(hit[:, None], load_rows(cache, slots, cols, mask & hit[:, None], dim),
                              load_rows(table, table_rows, cols, mask & ~hit[:, None], dim))
        else:
            values = load_rows(table, table_rows, cols, mask, dim)
        tl.store(out + r[:, None] * width + cols[None, :], values.to(out.dtype.element_ty),
                 mask=inside[:, None] & (cols < width)[None, :])

    @triton.jit
    def _row_index(rows, start, i, inside, INDEXED: tl.constexpr, OFFSET: tl.constexpr):
        """Row i of a move: rows[i], start + i, or i."""
        if INDEXED:
            return tl.load(rows + i, mask=inside, other=0).to(tl.int64)
        if OFFSET:
            return i + tl.load(start).to(tl.int64)
        return i

    @triton.jit
    def _move_rows_kernel(source, target, count, bound, source_rows, target_rows, source_start, target_start,
                          width, COUNT_ON_DEVICE: tl.constexpr, SOURCE_INDEXED: tl.constexpr,
                          TARGET_INDEXED: tl.constexpr, SOURCE_OFFSET: tl.constexpr, TARGET_OFFSET: tl.constexpr,
                          BLOCK_R: tl.constexpr, BLOCK_D: tl.constexpr):
        num_rows = tl.minimum(tl.load(count), bound) if COUNT_ON_DEVICE else bound
        i = tl.program_id(0) * BLOCK_R + tl.arange(0, BLOCK_R)
        inside = i < num_rows
        i = i.to(tl.int64)
        at = _row_index(source_rows, source_start, i, inside, SOURCE_INDEXED, SOURCE_OFFSET)
        to = _row_index(target_rows, target_start, i, inside, TARGET_INDEXED, TARGET_OFFSET)
        cols = tl.arange(0, BLOCK_D)
        mask = inside[:, None] & (cols < width)[None, :]
        values = tl.load(source + at[:, None] * width + cols[None, :], mask=mask)
        tl.store(target + to[:, None] * width + cols[None, :], values.to(target.dtype.element_ty), mask=mask)

    @triton.jit
    def _scatter_add_rows_kernel(target, positions, source, num_rows, dim, source_stride,
                                 BLOCK_R: tl.constexpr, BLOCK_D: tl.constexpr):
        r, inside, at = row_block(positions, positions, num_rows, BLOCK_R, False)
        cols = tl.arange(0, BLOCK_D)
        mask = inside[:, None] & (cols < dim)[None, :]
        values = load_rows(source, r, cols, mask, source_stride).to(tl.float32)
        tl.atomic_add(target + at[:, None] * dim + cols[None, :], values, mask=mask, sem="relaxed")

    @triton.jit
    def _sparse_adagrad_kernel(nodes, state, rows, grad, count, num_rows, lr, eps, dim, num_grads, grad_stride,
                               slot_of, cache_nodes, cache_state, present, present_stride, start, seed, state_salt,
                               COUNT_ON_DEVICE: tl.constexpr, ROWWISE: tl.constexpr, CACHED: tl.constexpr,
                               PRESENT: tl.constexpr, OFFSET: tl.constexpr, STOCHASTIC: tl.constexpr,
                               BLOCK_R: tl.constexpr, BLOCK_D: tl.constexpr):
        if OFFSET:  # rows[start:] and grad[start:] (an owner's share of another device's rows)
            first = tl.load(start).to(tl.int64)
            rows += first
            grad += first * dim
        r, inside, table_rows = row_block(rows, count, num_rows, BLOCK_R, COUNT_ON_DEVICE)
        cols = tl.arange(0, BLOCK_D)
        mask = inside[:, None] & (cols < dim)[None, :]
        state_cols = 1 if ROWWISE else dim
        if CACHED:
            slots, hit = _cache_slots(slot_of, table_rows, inside)
            in_cache, in_table = mask & hit[:, None], mask & ~hit[:, None]
            embedding = tl.where(hit[:, None], load_rows(cache_nodes, slots, cols, in_cache, dim),
                                 load_rows(nodes, table_rows, cols, in_table, dim))
            if ROWWISE:
                accumulated = tl.where(hit, tl.load(cache_state + slots, mask=inside & hit, other=0.0),
                                       tl.load(state + table_rows, mask=inside & ~hit, other=0.0))
            else:
                accumulated = tl.where(hit[:, None], load_rows(cache_state, slots, cols, in_cache, dim),
                                       load_rows(state, table_rows, cols, in_table, dim))
        else:
            embedding = load_rows(nodes, table_rows, cols, mask, dim)
            if ROWWISE:
                accumulated = tl.load(state + table_rows, mask=inside, other=0.0)
            else:
                accumulated = load_rows(state, table_rows, cols, mask, dim)
        # bfloat16 tables compute in float32 (a no-op for float32 tables)
        embedding, accumulated = embedding.to(tl.float32), accumulated.to(tl.float32)
        for g in range(num_grads):  # the devices' gradients as consecutive Adagrad steps
            if PRESENT:  # absent gradients may be uninitialised: masked off, they load as zero
                has = tl.load(present + g * present_stride + r, mask=inside, other=0) != 0
                gradient = load_rows(grad + g * grad_stride, r, cols, mask & has[:, None], dim)
            else:
                gradient = load_rows(grad + g * grad_stride, r, cols, mask, dim)
            squared = gradient * gradient
            if ROWWISE:
                accumulated = accumulated + tl.sum(squared, 1) / dim
                step = -lr / (tl.sqrt_rn(accumulated) + eps)[:, None]
            else:
                accumulated = accumulated + squared
                step = -lr / (tl.sqrt_rn(accumulated) + eps)
            embedding = embedding + gradient * step
        if CACHED:
            _store_rows(cache_nodes, slots, cols, embedding, in_cache, dim)
            _store_rows(nodes, table_rows, cols, embedding, in_table, dim)
            if ROWWISE:
                tl.store(cache_state + slots, accumulated, mask=inside & hit)
                tl.store(state + table_rows, accumulated, mask=inside & ~hit)
            else:
                _store_rows(cache_state, slots, cols, accumulated, in_cache, state_cols)
                _store_rows(state, table_rows, cols, accumulated, in_table, state_cols)
        else:
            if STOCHASTIC:  # bfloat16 tables: values rounded at random to a neighbour, still float32 but exact in
                # bfloat16, so the stores' cast is exact (the noise: storage/rounding.py's hash, bit for bit)
                seed32 = tl.load(seed)
                seed32 = _low32((seed32 ^ (seed32 >> 32)))
                embedding = _round_bfloat16(embedding, cols.to(tl.int64)[None, :], seed32, 0)
                if ROWWISE:  # one value per row: column 0, as the torch version's [rows, 1] state
                    accumulated = _round_bfloat16(accumulated, table_rows * 0, seed32, state_salt)
                else:
                    accumulated = _round_bfloat16(accumulated, cols.to(tl.int64)[None, :], seed32, state_salt)
            _store_rows(nodes, table_rows, cols, embedding, mask, dim)
            if ROWWISE:
                tl.store(state + table_rows, accumulated, mask=inside)
            else:
                _store_rows(state, table_rows, cols, accumulated, mask, state_cols)

    @triton.jit
    def _store_rows(table, ids, cols, values, mask, stride):
        tl.store(table + ids[:, None] * stride + cols[None, :], values, mask=mask)

    @triton.jit
    def _low32(x):
        return x - ((x >> 32) << 32)

    @triton.jit
    def _mix32(x):
        """``_mix32_`` of the torch version (storage/rounding.py), on int64 tensors holding 32-bit values."""
        x = _low32(((x >> 16) ^ x) * 0x45D9F3B)
        x = _low32(((x >> 16) ^ x) * 0x45D9F3B)
        return (x >> 16) ^ x

    @triton.jit
    def _round_bfloat16(values, cols, seed32, salt):
        """float32 values rounded at random to one of their two bfloat16 neighbours, as round_stochastic_bfloat16
        does (the same noise: a hash of seed, salt, column and the value's bits), as float32."""
        key = _mix32(_low32(cols * 0x45D9F3B + seed32 + salt * 0x2545F49))
        bits = values.to(tl.int32, bitcast=True)
        noise = _mix32(_low32(bits.to(tl.int64)) ^ key) & 0xFFFF
        return ((bits + noise.to(tl.int32)) & -65536).to(tl.float32, bitcast=True)
