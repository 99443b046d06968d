"""Which random draws of an epoch come from which generator, on which device.

Every draw of epoch e comes from a generator seeded by (seed, e, stream), so an
epoch's draws do not depend on earlier epochs, and a resume inside an epoch
restores the generators' states (their devices must match: ``device_names``).
Streams: 0 shuffles and negatives on the host (or negatives where the tables
are on the GPU), 1 dropout, 2 + g and 2 + devices + g each device's negatives
and dropout when several share the tables, ``DEVICE_SHUFFLE_STREAM`` the
shuffles when the tables are on the GPU.
"""

from __future__ import annotations

import numpy as np
import torch

DEVICE_SHUFFLE_STREAM = 1000


def epoch_generator(seed: int, epoch: int, device: torch.device | str = "cpu", stream: int = 0) -> torch.Generator:
    """The generator of one epoch's random draws, independent of earlier epochs; ``stream`` numbers
    independent generators of one epoch."""
    base = seed * 1_000_003 + epoch
    if stream:
        base = int(np.random.SeedSequence([seed, epoch, stream]).generate_state(1, np.uint64)[0] >> 1)
    return torch.Generator(device=device).manual_seed(base)


def epoch_generators(seed: int, epoch: int, plan_device: torch.device, device: torch.device,
                     devices: list[torch.device] | None = None) -> tuple:
    """(shuffles, negatives, dropout) generators of an epoch; with several ``devices``, the negatives and
    dropout are lists of one generator per device.

    Shuffles and negatives are drawn where batches are planned (``plan_device``):
    the GPU for tables in its memory and for zero-copy host tables, so the host
    neither permutes a span's edges nor pins each batch while the GPU waits
    (permuting a Freebase86m-shaped state's 17M edges took 0.9 s on the host,
    milliseconds on the GPU); the host for the CPU pipeline's load stage; each
    device that plans its own batches. Dropout is drawn on the compute device.
    """
    on_gpu = plan_device.type == "cuda"
    shuffling = epoch_generator(seed, epoch, plan_device, stream=DEVICE_SHUFFLE_STREAM) if on_gpu \
        else epoch_generator(seed, epoch)
    if devices:
        return (shuffling, [epoch_generator(seed, epoch, d, stream=2 + g) for g, d in enumerate(devices)],
                [epoch_generator(seed, epoch, d, stream=2 + len(devices) + g) for g, d in enumerate(devices)])
    sampling = epoch_generator(seed, epoch, plan_device) if on_gpu else shuffling
    return shuffling, sampling, epoch_generator(seed, epoch, device, stream=1)


def flat(generators) -> list[torch.Generator]:
    """Generators and lists of them (one per device), flattened in order."""
    return [leaf for item in generators for leaf in (flat(item) if isinstance(item, (list, tuple)) else [item])]


def device_names(devices) -> list[str]:
    """Devices as a resume compares them: "cuda" (a run's config) and "cuda:0" (resolved) are one GPU."""
    names = []
    for device in map(torch.device, devices):
        if device.type == "cuda" and device.index is None:
            device = torch.device("cuda", torch.cuda.current_device() if torch.cuda.is_available() else 0)
        names.append(str(device))
    return names
