"""The compute devices of a run: one (``training.device``) or several sharing the tables (``training.devices``)."""

from __future__ import annotations

import torch

from marius_py.config import Config, device_list
from marius_py.errors import MariusInputError


def resolve_device(name: str, setting: str = "training.device", path: object = None) -> torch.device:
    """The device ``name`` (``auto``: cuda where there is one, else cpu), where this machine has it; else a
    MariusInputError naming ``setting`` (and ``path``, where it was set) and the devices there are."""
    if name == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    try:
        device = torch.device(name)
    except (RuntimeError, TypeError, ValueError):
        device = None
    if device is None or device.type not in ("cpu", "cuda"):
        raise MariusInputError(f"{setting} {name}: not a device", path=path, expected="cpu, cuda or cuda:N")
    available = torch.cuda.device_count() if device.type == "cuda" and torch.cuda.is_available() else 0
    if device.type == "cuda" and (device.index or 0) >= available:
        raise MariusInputError(f"{setting} {name}: this machine has {available} CUDA device(s)", path=path,
                               expected="cpu" + (f", cuda or cuda:0 .. cuda:{available - 1}" if available else ""))
    return device


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


def gpus_overrides(count: int) -> list[str]:
    """The config overrides of ``--gpus COUNT``: one GPU (``training.device``), or the first COUNT sharing
    the tables (``training.devices``)."""
    if count == 1:
        return ["training.device=cuda", "training.devices="]
    return ["training.devices=" + ",".join(f"cuda:{i}" for i in range(count))]
