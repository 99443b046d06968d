"""Process-wide torch settings a run changes, put back when it ends (``api.train``), so that a notebook or
a research script that trains goes on with its own: its thread count, matmul precision, determinism flags,
random numbers and current GPU.

What the engine sets, and where: ``training.num_threads`` and the seed of the global generators
(``Trainer.__init__``), TF32 matmuls (``trainer.tf32_matmuls``) and deterministic algorithms
(``Trainer.train``; both already restore themselves, kept here for a run that fails between the two), the
current CUDA device (a replica group's leader, ``step/replica_workers``).
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass

import torch


def set_deterministic_algorithms(enabled: bool, warn_only: bool) -> None:
    """``torch.use_deterministic_algorithms`` without what it imports first: ``torch._inductor.config``, whose
    import pulls in ``torch._dynamo`` (two seconds and more of a run's start-up), to set a flag of
    ``torch.compile``, which the engine never uses. Where a torch lacks the flag's setter, its own call."""
    setter = getattr(torch._C, "_set_deterministic_algorithms", None)
    if setter is None:
        torch.use_deterministic_algorithms(enabled, warn_only=warn_only)
    else:
        setter(enabled, warn_only=warn_only)


@contextmanager
def restored_process_settings() -> Iterator[None]:
    """The settings as they were on entry, restored however the block ends."""
    saved = ProcessSettings.capture()
    try:
        yield
    finally:
        saved.restore()


@dataclass
class ProcessSettings:
    num_threads: int
    matmul_precision: str
    deterministic: tuple[bool, bool]  # (enabled, warn only)
    cpu_rng: torch.Tensor
    initial_seed: int
    cuda_rng: list[torch.Tensor] | None  # None: CUDA not started (reading it would start it)
    cuda_device: int | None

    @classmethod
    def capture(cls) -> ProcessSettings:
        cuda = torch.cuda.is_initialized()
        return cls(torch.get_num_threads(), torch.get_float32_matmul_precision(),
                   (torch.are_deterministic_algorithms_enabled(),
                    torch.is_deterministic_algorithms_warn_only_enabled()),
                   torch.get_rng_state(), torch.initial_seed(),
                   torch.cuda.get_rng_state_all() if cuda else None,
                   torch.cuda.current_device() if cuda else None)

    def restore(self) -> None:
        """Each setting set back where it changed (setting the matmul precision anew where the user chose it
        through the newer per-backend API would be refused as a mix of the two)."""
        if torch.get_num_threads() != self.num_threads:
            torch.set_num_threads(self.num_threads)
        if torch.get_float32_matmul_precision() != self.matmul_precision:
            torch.set_float32_matmul_precision(self.matmul_precision)
        if (torch.are_deterministic_algorithms_enabled(),
                torch.is_deterministic_algorithms_warn_only_enabled()) != self.deterministic:
            set_deterministic_algorithms(*self.deterministic)
        reseeded = torch.initial_seed() != self.initial_seed  # (before the CPU state, which holds the seed)
        torch.set_rng_state(self.cpu_rng)
        self._restore_cuda(reseeded)

    def _restore_cuda(self, reseeded: bool) -> None:
        if self.cuda_rng is not None:
            torch.cuda.set_rng_state_all(self.cuda_rng)
            torch.cuda.set_device(self.cuda_device)
            return
        if reseeded:
            # CUDA's generators were not started: seeded as torch.manual_seed last seeded them (a pending seed
            # where CUDA has not started since).
            torch.cuda.manual_seed_all(self.initial_seed)
        if torch.cuda.is_initialized():
            torch.cuda.set_device(0)  # (the device CUDA starts on)
