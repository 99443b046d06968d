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
# The hash (a two-round multiply-xorshift) runs in int64 on 32-bit values with a 27-bit multiplier: no overflow.
# The Triton copies in pipeline/row_kernels.py (_mix32, _low32) must stay the same function.
_HASH_MULTIPLIER = 0x45D9F3B
_SALT_MULTIPLIER = 0x2545F49
_MASK32 = 0xFFFFFFFF


def _mix32_(x: torch.Tensor) -> torch.Tensor:
    """A 32-bit integer hash, in place, of an int64 tensor holding values in [0, 2^32) (in-place ops: a third
    of the time of fresh tensors on the CPU)."""
    for _ in range(2):
        x ^= x >> 16
        x.mul_(_HASH_MULTIPLIER).bitwise_and_(_MASK32)
    x ^= x >> 16
    return x


def _fold_seed(seed: int) -> int:
    return (seed ^ (seed >> 32)) & 0xFFFFFFFF


def rounding_noise(values: torch.Tensor, seed: int, salt: int) -> torch.Tensor:
    """Noise in [0, 2^16) for each value of a [rows, cols] float32 tensor: a hash of the seed, the salt, the
    column and the value's bits (uniform over seeds, so the rounding it drives is unbiased)."""
    cols = torch.arange(values.shape[-1], device=values.device, dtype=torch.int64)
    key = _mix32_((cols * _HASH_MULTIPLIER + _fold_seed(seed) + salt * _SALT_MULTIPLIER).bitwise_and_(_MASK32))
    bits = values.contiguous().view(torch.int32).to(torch.int64).bitwise_and_(_MASK32)
    bits ^= key
    return _mix32_(bits).bitwise_and_(0xFFFF)


def round_stochastic_bfloat16(values: torch.Tensor, seed: int | torch.Tensor, salt: int = 0) -> torch.Tensor:
    """float32 ``values`` ([rows, cols]) rounded at random to bfloat16: each to one of its two bfloat16
    neighbours, with probability proportional to closeness (unbiased over seeds, so small updates survive on
    average). The result is a function of (values, seed, salt) (``rounding_noise``): equal values in one
    column round alike; values that bfloat16 represents stay as they are.
    """
    if values.dtype != torch.float32:
        raise ValueError(f"round_stochastic_bfloat16: expected float32 values, got {values.dtype}")
    noise = rounding_noise(values, int(seed), salt).to(torch.int32)
    # Sign and magnitude: adding noise below the kept bits, then dropping them, rounds the magnitude up with
    # probability equal to the dropped fraction, for either sign; what remains is exactly a bfloat16 value.
    bits = (values.contiguous().view(torch.int32) + noise).bitwise_and_(-LOW_BITS)
    return bits.view(torch.float32).to(torch.bfloat16)
