"""Shared fixtures: the bundled UMLS test graph, preprocessed once per session."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from marius_py.config_loading import load_config
from marius_py.preprocess import PreprocessOptions, preprocess

UMLS_RAW = Path(__file__).parent / "data" / "umls"


@pytest.fixture(scope="session", autouse=True)
def private_cache(tmp_path_factory):
    """Datasets the tests preprocess or re-bucket go to a cache of the session's own, not the user's."""
    saved = os.environ.get("MARIUS_PY_CACHE")
    os.environ["MARIUS_PY_CACHE"] = str(tmp_path_factory.mktemp("cache"))
    yield
    if saved is None:
        os.environ.pop("MARIUS_PY_CACHE", None)
    else:
        os.environ["MARIUS_PY_CACHE"] = saved


@pytest.fixture(scope="session")
def umls_dataset(tmp_path_factory) -> Path:
    """UMLS (135 nodes, 46 relations) as a preprocessed dataset directory."""
    out = tmp_path_factory.mktemp("datasets") / "umls"
    preprocess(out, UMLS_RAW / "train.txt", UMLS_RAW / "valid.txt", UMLS_RAW / "test.txt",
               PreprocessOptions(), progress=False)
    return out


@pytest.fixture
def small_config(umls_dataset):
    """A fast CPU config on UMLS; tests add their own overrides."""
    def make(*overrides: str):
        return load_config(None, [f"dataset.path={umls_dataset}", "training.device=cpu",
                                  "model.dim=16", "training.batch_size=512", "training.num_negatives=64",
                                  "training.num_chunks=2", "training.epochs=2", "evaluation.every=1",
                                  *overrides])
    return make
