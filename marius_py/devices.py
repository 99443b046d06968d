"""The compute devices of a run: one (``training.device``) or several sharing the tables (``training.devices``)."""

from __future__ import annotations

import torch

from marius_py.config import Config, device_list
from marius_py.errors import MariusInputError


def resolve_device(name: str) -> torch.device:
    if name == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    if name == "cuda" and not torch.cuda.is_available():
        raise MariusInputError("training.device: cuda requested but no CUDA device is available",
                               expected="training.device=cpu or auto")
    return torch.device(name)


def resolve_devices(config: Config) -> list[torch.device]:
    """``training.devices`` (several; ``cpu,cpu`` simulates them), else ``[training.device]``."""
    names = device_list(config.training.devices)
    if not names:
        return [resolve_device(config.training.device)]
    devices = [torch.device(name) for name in names]
    if devices[0].type == "cuda":
        available = torch.cuda.device_count() if torch.cuda.is_available() else 0
        missing = [name for name, device in zip(names, devices) if device.index >= available]
        if missing:
            raise MariusInputError(f"training.devices: {missing[0]} requested but {available} CUDA device(s) "
                                   "are available", expected=f"cuda:0 .. cuda:{available - 1}, or --gpus "
                                                             f"{available}" if available else "a machine with GPUs")
        for a in devices:
            for b in devices:
                if a != b and not torch.cuda.can_device_access_peer(a, b):
                    raise MariusInputError(f"training.devices: {a} cannot read {b}'s memory (no peer access); "
                                           "the GPUs exchange rows and gradients that way",
                                           expected="GPUs joined by NVLink or one PCIe switch")
    return devices
