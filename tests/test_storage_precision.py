"""bench/storage_precision.py: node rows and Adagrad state emulated as stored in bfloat16."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest
import torch

import marius_py as mp
from marius_py.checkpoint import RunDirectory, load_version

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "bench"))
from storage_precision import (emulated_storage, emulation_overrides, round_to_bfloat16_,  # noqa: E402
                               share_representable)


def representable(values: torch.Tensor) -> bool:
    return bool((values.view(torch.int32) & 0xFFFF).eq(0).all())


def test_rounding_to_nearest_is_torchs_conversion():
    values = torch.randn(10_000) * 1e-3
    expected = values.to(torch.bfloat16).float()
    round_to_bfloat16_(values, stochastic=False)
    assert torch.equal(values, expected)


def test_representable_values_stay_as_they_are():
    values = torch.randn(1000).to(torch.bfloat16).float()
    rounded = values.clone()
    round_to_bfloat16_(rounded, stochastic=True)
    assert torch.equal(rounded, values)


def test_rounding_refuses_other_dtypes():
    with pytest.raises(TypeError, match="float32"):
        round_to_bfloat16_(torch.zeros(3, dtype=torch.float64), stochastic=True)


def trained_tables(umls_dataset, run_dir: Path, precision: str):
    overrides = [f"dataset.path={umls_dataset}", "training.device=cpu", "model.dim=8", "training.batch_size=256",
                 "training.num_negatives=32", "training.epochs=2", "training.seed=5", "evaluation.every=0",
                 *emulation_overrides(precision)]
    with emulated_storage(precision):
        model = mp.train(mp.make_config(None, overrides), run_dir, progress=False)
    nodes, state, _, _ = load_version(RunDirectory(run_dir).latest_version())
    return torch.as_tensor(nodes), torch.as_tensor(state), share_representable(model)


@pytest.mark.parametrize("precision", ["bfloat16", "bfloat16-nearest"])
def test_emulated_training_keeps_tables_in_bfloat16(umls_dataset, tmp_path, precision):
    """Under the emulation every node row and state value the fused step leaves is a bfloat16 value, and training
    moves away from float32 training."""
    nodes, state, share = trained_tables(umls_dataset, tmp_path / precision, precision)
    full_nodes, _, full_share = trained_tables(umls_dataset, tmp_path / "float32", "float32")
    assert representable(nodes) and representable(state) and share == 1.0
    assert not representable(full_nodes) and full_share < 0.01
    assert (nodes - full_nodes).abs().max() > 1e-4


def test_unknown_precision_is_refused():
    with pytest.raises(ValueError, match="float16"):
        with emulated_storage("float16"):
            pass
