"""bfloat16 storage of float32 arithmetic: stochastic rounding that keeps small updates on average.

Tables stored in bfloat16 (``storage.dtype=bfloat16``) are updated in float32 and written back rounded at
random to one of the two neighbouring bfloat16 values (``round_stochastic_bfloat16``): rounding to nearest
would lose every step smaller than half a bfloat16 ulp. The storage layer owns it; the pipeline's Triton
Adagrad kernel (``pipeline/row_kernels.py``) computes the same noise bit for bit.
"""

from __future__ import annotations

import torch

LOW_BITS = 1 << 16  # float32 bits below bfloat16's mantissa
# Rounding noise is a hash of (seed, column, the value's own bits): it follows the value, not where its row sits
# (a resumed partition buffer puts partitions in other slots), and the Triton and torch versions agree bit for bit.
# The hash is a two-round multiply-xorshift of 32-bit words. Here the words sit in int32 tensors (half the bytes of
# int64): products wrap modulo 2^32 (vector multiplies and PTX's mul.lo keep the low 32 bits), and a logical shift
# is an arithmetic one masked to the bits shifted in. The Triton copies in pipeline/row_kernels.py (_mix32,
# _low32) compute the same function on int64 words; the GPU tests compare them bit for bit.
_HASH_MULTIPLIER = 0x45D9F3B
_SALT_MULTIPLIER = 0x2545F49
_MASK32 = 0xFFFFFFFF
# A CPU rounds this many values at a time: the dozen passes over a block's words then stay in the core's cache
# instead of streaming the whole update through memory each time. A GPU rounds a tensor in one block.
CPU_BLOCK_VALUES = 1 << 18


def _mix32_(x: torch.Tensor) -> torch.Tensor:
    """The 32-bit hash, in place, of an int32 tensor's words."""
    for _ in range(2):
        x ^= (x >> 16).bitwise_and_(0xFFFF)
        x.mul_(_HASH_MULTIPLIER)
    x ^= (x >> 16).bitwise_and_(0xFFFF)
    return x


def _fold_seed(seed: int) -> int:
    return (seed ^ (seed >> 32)) & _MASK32


def _column_keys(cols: int, seed: int, salt: int, device: torch.device) -> torch.Tensor:
    """The hash of (seed, salt, column) of each column, as int32 words."""
    words = (torch.arange(cols, device=device, dtype=torch.int64) * _HASH_MULTIPLIER
             + (_fold_seed(seed) + salt * _SALT_MULTIPLIER)).bitwise_and_(_MASK32)
    return _mix32_(torch.where(words >= 1 << 31, words - (1 << 32), words).to(torch.int32))


def _noise_(words: torch.Tensor, key: torch.Tensor) -> torch.Tensor:
    """Rounding noise in [0, 2^16) for each word of a [rows, cols] int32 block of float32 bits, in place: the hash
    of its bits and its column's key (``_column_keys``), uniform over seeds, so the rounding it drives is
    unbiased."""
    words ^= key
    return _mix32_(words).bitwise_and_(0xFFFF)


def round_stochastic_bfloat16(values: torch.Tensor, seed: int | torch.Tensor, salt: int = 0) -> torch.Tensor:
    """float32 ``values`` ([rows, cols], or [cols]) rounded at random to bfloat16: each to one of its two
    bfloat16 neighbours, with probability proportional to closeness (unbiased over seeds, so small updates
    survive on average). The result is a function of (values, seed, salt) (``_noise_``): equal values in one
    column round alike; values that bfloat16 represents stay as they are.
    """
    if values.dtype != torch.float32:
        raise ValueError(f"round_stochastic_bfloat16: expected float32 values, got {values.dtype}")
    if values.dim() == 1:
        return round_stochastic_bfloat16(values[None], seed, salt)[0]
    words = values.contiguous().view(torch.int32)
    key = _column_keys(values.shape[-1], int(seed), salt, values.device)
    rounded = torch.empty(values.shape, dtype=torch.bfloat16, device=values.device)
    step = max(1, CPU_BLOCK_VALUES // max(values.shape[-1], 1)) if values.device.type == "cpu" else \
        max(len(values), 1)
    for start in range(0, len(values), step):
        block = words[start:start + step]
        # Sign and magnitude: adding noise below the kept bits, then dropping them, rounds the magnitude up with
        # probability equal to the dropped fraction, for either sign; what remains is exactly a bfloat16 value.
        bits = _noise_(block.clone(), key).add_(block).bitwise_and_(-LOW_BITS)
        rounded[start:start + step].copy_(bits.view(torch.float32))
    return rounded
