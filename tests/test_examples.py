"""The examples the guides quote run as written (docs/guides/own-model.md includes examples/own_model.py's
sections): a loss, a sampler and a callback of one's own, data from memory, ranking chosen triples."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import numpy as np

import marius_py as mp

EXAMPLES = Path(__file__).resolve().parent.parent / "examples"


def load_example(name: str):
    spec = importlib.util.spec_from_file_location(f"example_{name}", EXAMPLES / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_own_model_example_trains_with_its_own_loss_sampler_and_callback(capsys):
    example = load_example("own_model")
    try:
        result = example.main(epochs=6)
    finally:
        for registry, name in ((mp.LOSSES, "soft_margin"), (mp.NEGATIVE_SAMPLERS, "first_half")):
            registry.unregister(name)
    out = capsys.readouterr().out
    assert "epoch 1: loss" in out  # (the callback's epoch hook ran)
    assert result["test_mrr"] > 0.3 and result["chosen_unfiltered_mrr"] <= result["chosen_mrr"]
    assert result["answers"].shape == (4, 3) and np.all(np.diff(result["scores"], axis=1) <= 0)
