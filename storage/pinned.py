"""Page-locked host memory of exactly the size asked for.

torch's pinned allocator (``pin_memory=True``) rounds every allocation up to a
power of two: the 21.5 GB of staging slots of issue 13's Freebase86m buffer
took 32 GiB of locked memory, which is the 12 GiB by which that run's peak RSS
exceeded its buffer. Here large staging buffers are allocated pageable and
page-locked in place with ``cudaHostRegister``, exactly their bytes.
"""

from __future__ import annotations

import weakref

import torch

REGISTER_MIN_BYTES = 64 << 20  # smaller buffers: torch's allocator (its rounding costs little there)
_PORTABLE_MAPPED = 0x01 | 0x02  # cudaHostRegisterPortable | cudaHostRegisterMapped


def locked_empty(nbytes: int) -> torch.Tensor:
    """``nbytes`` of page-locked host memory (uint8), registered in place when large, else from torch's
    pinned allocator (also when registration is refused)."""
    if nbytes >= REGISTER_MIN_BYTES and torch.cuda.is_available():
        raw = torch.empty(nbytes, dtype=torch.uint8)
        if _register(raw):
            return raw
    return torch.empty(nbytes, dtype=torch.uint8, pin_memory=True)


def _register(raw: torch.Tensor) -> bool:
    try:
        cudart = torch.cuda.cudart()
        status = cudart.cudaHostRegister(raw.data_ptr(), raw.numel(), _PORTABLE_MAPPED)
    except (AttributeError, RuntimeError, TypeError):
        return False
    if int(status) != 0:
        return False
    weakref.finalize(raw, cudart.cudaHostUnregister, raw.data_ptr())
    return True
