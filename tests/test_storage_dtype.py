"""storage.dtype=bfloat16: node embeddings and Adagrad state stored in bfloat16 on disk, in the buffer and in memory."""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch
import zarr

import marius_py as mp
from marius_py.checkpoint import NODES, RunDirectory
from marius_py.cli import main
from marius_py.config_loading import load_config
from marius_py.errors import MariusInputError
from marius_py.storage.chunk_files import ChunkFiles
from marius_py.storage.embedding_store import EMBEDDINGS, STATE, EmbeddingStore


def umls_config(dataset, *overrides: str):
    return load_config(None, [f"dataset.path={dataset}", "training.device=cpu", "model.dim=16",
                              "training.batch_size=512", "training.num_negatives=64", "training.num_chunks=2",
                              "training.epochs=3", "training.seed=3", "evaluation.every=0", *overrides])


def stored(run_dir) -> EmbeddingStore:
    return EmbeddingStore(RunDirectory(run_dir).latest_version() / NODES, mode="r")


def epoch_io(run_dir) -> list[int]:
    return [r["io"]["bytes_read"] for r in RunDirectory(run_dir).read_metrics() if r["event"] == "epoch"]


def test_a_bfloat16_store_is_uint16_zarr_marked_bfloat16_and_reads_back(tmp_path):
    rows = torch.randn(50, 6)
    store = EmbeddingStore.create(tmp_path / "bf16", 50, 6, 6, 4, init=lambda s, e: rows[s:e].numpy(),
                                  dtype=torch.bfloat16)
    wide = EmbeddingStore.create(tmp_path / "f32", 50, 6, 6, 4, init=lambda s, e: rows[s:e].numpy())
    array = zarr.open_array(str(tmp_path / "bf16" / EMBEDDINGS), mode="r")
    assert str(array.dtype) == "uint16" and array.attrs["element_type"] == "bfloat16"
    reopened = EmbeddingStore(tmp_path / "bf16")
    assert reopened.dtype == torch.bfloat16 and wide.dtype == torch.float32
    embeddings, state = reopened.read_tables()
    assert embeddings.dtype == torch.bfloat16 and torch.equal(embeddings, rows.to(torch.bfloat16))
    assert not state.any()
    assert np.array_equal(reopened.read_all()[0], rows.to(torch.bfloat16).float().numpy())
    assert ChunkFiles(tmp_path / "bf16" / EMBEDDINGS).chunk_bytes * 2 == ChunkFiles(tmp_path / "f32" / EMBEDDINGS).chunk_bytes
    new = torch.randn(13, 6)  # partition 1 holds rows 13-25
    store.write_partition(1, new, torch.ones(13, 6))
    embeddings, state = EmbeddingStore(tmp_path / "bf16").read_tables()
    assert torch.equal(embeddings[13:26], new.to(torch.bfloat16)) and torch.equal(embeddings[:13], rows[:13].bfloat16())
    assert state[13:26].eq(1).all() and not state[:13].any()
    assert torch.equal(store.embedding_rows(13, 26), new.to(torch.bfloat16).float())


@pytest.mark.parametrize("layout", [(), ("storage.num_partitions=4", "storage.buffer_capacity=2")],
                         ids=["in-memory", "buffer-4-2"])
def test_training_in_bfloat16_stores_bfloat16_learns_and_halves_io(umls_dataset, tmp_path, layout):
    """A bfloat16 run commits bfloat16 tables, tests within 0.05 MRR of the same float32 run, and reads half the
    bytes per epoch through the buffer."""
    wide = mp.train(umls_config(umls_dataset, *layout, "storage.dtype=float32"), tmp_path / "f32", progress=False)
    narrow = mp.train(umls_config(umls_dataset, *layout, "storage.dtype=bfloat16"), tmp_path / "bf16",
                      progress=False)
    assert stored(tmp_path / "bf16").dtype == torch.bfloat16 and stored(tmp_path / "f32").dtype == torch.float32
    assert narrow.embeddings().dtype == np.float32
    assert narrow.test_metrics["mrr"] > wide.test_metrics["mrr"] - 0.05
    assert narrow.test_metrics["mrr"] > 0.3  # far above chance on UMLS's 135 nodes
    if layout:
        assert [2 * b for b in epoch_io(tmp_path / "bf16")] == epoch_io(tmp_path / "f32") != [0, 0, 0]


def test_resume_in_bfloat16_equals_uninterrupted(umls_dataset, tmp_path):
    """The rounding's random draws come from the epoch's checkpointed streams: a resumed run ends bitwise where
    the uninterrupted one does."""
    overrides = ("storage.dtype=bfloat16", "model.dropout=0.1")
    mp.train(umls_config(umls_dataset, *overrides, "training.epochs=4"), tmp_path / "full", progress=False)
    mp.train(umls_config(umls_dataset, *overrides, "training.epochs=2"), tmp_path / "split", progress=False)
    mp.train(mp.api.load_run_config(tmp_path / "split", ["training.epochs=4"]), tmp_path / "split",
             progress=False, resume=True)
    for full, split in zip(stored(tmp_path / "full").read_tables(), stored(tmp_path / "split").read_tables()):
        assert torch.equal(full, split)


def test_resuming_with_another_dtype_is_refused_by_name(umls_dataset, tmp_path, capsys):
    mp.train(umls_config(umls_dataset, "training.epochs=1"), tmp_path / "run", progress=False)
    resumed = mp.api.load_run_config(tmp_path / "run", ["training.epochs=2", "storage.dtype=bfloat16"])
    with pytest.raises(MariusInputError, match="stores float32 embeddings; this config has storage.dtype=bfloat16"):
        mp.train(resumed, tmp_path / "run", progress=False, resume=True)
    assert main(["train", "--resume", str(tmp_path / "run"), "training.epochs=2", "storage.dtype=bfloat16"]) == 2
    assert "expected storage.dtype=float32" in capsys.readouterr().err


@pytest.mark.parametrize("overrides, message", [
    (["storage.dtype=float16"], "expected one of auto, float32, bfloat16"),
    (["storage.dtype=bfloat16", "training.devices=cpu,cpu"], "several devices"),
])
def test_bad_dtype_settings_are_refused(umls_dataset, overrides, message):
    with pytest.raises(MariusInputError, match="storage.dtype") as error:
        umls_config(umls_dataset, *overrides)
    assert message in str(error.value)


@pytest.mark.parametrize("layout, devices, stored_as", [
    (["storage.num_partitions=4", "storage.buffer_capacity=2"], "", torch.bfloat16),
    ([], "", torch.float32),
    ([], "cpu,cpu", torch.float32),
])
def test_auto_stores_bfloat16_out_of_core_and_float32_in_memory(umls_dataset, tmp_path, layout, devices,
                                                                 stored_as):
    """storage.dtype=auto (the default): partitions on disk in bfloat16, tables in memory (and several devices'
    tables) in float32; the run's config.yaml pins what it chose, so a resume keeps it."""
    config = umls_config(umls_dataset, *layout, f"training.devices={devices}")
    assert config.storage.dtype == "auto"
    mp.train(config, tmp_path / "run", progress=False)
    assert stored(tmp_path / "run").dtype == stored_as
    saved = mp.api.load_run_config(tmp_path / "run")
    assert saved.storage.dtype == str(stored_as).removeprefix("torch.")


def test_a_run_saved_before_storage_dtype_existed_stays_float32(umls_dataset, tmp_path):
    """A config.yaml without storage.dtype (every such run stored float32) loads as float32, not auto."""
    import yaml
    run = tmp_path / "old-run"
    run.mkdir()
    raw = umls_config(umls_dataset, "storage.num_partitions=4", "storage.buffer_capacity=2").to_dict()
    del raw["storage"]["dtype"]
    (run / "config.yaml").write_text(yaml.safe_dump(raw))
    assert mp.api.load_run_config(run).storage.dtype == "float32"
    raw["storage"]["dtype"] = "auto"
    (run / "config.yaml").write_text(yaml.safe_dump(raw))
    assert mp.api.load_run_config(run).storage.dtype == "auto"


def test_cli_ordering_sizes_bfloat16_partitions(capsys):
    args = ["ordering", "-p", "8", "-c", "2", "--nodes", "80000", "--dim", "100"]
    assert main(args + ["--dtype", "float32"]) == 0
    wide = capsys.readouterr().out
    assert main(args) == 0  # (auto: bfloat16, as a one-process run stores partitions)
    narrow = capsys.readouterr().out
    assert "x 4 B (float32)" in wide and "x 2 B (bfloat16)" in narrow


def test_a_float32_store_is_plain_float32_zarr(tmp_path):
    """float32 stores carry no element_type attribute: the layout stores had before bfloat16 existed."""
    EmbeddingStore.create(tmp_path / "s", 10, 4, 4, 2)
    meta = json.loads((tmp_path / "s" / STATE / "zarr.json").read_text())
    assert meta["data_type"] == "float32" and not meta.get("attributes")
    assert EmbeddingStore(tmp_path / "s").dtype == torch.float32


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
@pytest.mark.parametrize("layout", [("pipeline.placement=device",), ("pipeline.placement=host",),
                                    ("storage.num_partitions=4", "storage.buffer_capacity=2")],
                         ids=["gpu-memory", "zero-copy", "buffer-4-2"])
def test_bfloat16_training_on_the_gpu(umls_dataset, tmp_path, layout):
    """On the GPU, bfloat16 tables train through the gathered fused step in every placement, and test within 0.05
    MRR of float32."""
    base = ("training.device=cuda", "training.num_negatives=-1", "model.decoder=complex", "model.dim=32")
    wide = mp.train(umls_config(umls_dataset, *base, *layout), tmp_path / "f32", progress=False)
    narrow = mp.train(umls_config(umls_dataset, *base, *layout, "storage.dtype=bfloat16"), tmp_path / "bf16",
                      progress=False)
    assert stored(tmp_path / "bf16").dtype == torch.bfloat16
    assert narrow.test_metrics["mrr"] > wide.test_metrics["mrr"] - 0.05 and narrow.test_metrics["mrr"] > 0.3


class SimulatedCrash(Exception):
    pass


def test_partitioned_bfloat16_run_resumed_between_states_equals_uninterrupted(umls_dataset, tmp_path, monkeypatch):
    """A bfloat16 run crashed after its fourth commit between buffer states and resumed ends bitwise where the
    uninterrupted run does, though the resumed buffer places partitions in other slots: the rounding noise
    follows the values, not their slots."""
    from marius_py.trainer import Trainer
    overrides = ("storage.dtype=bfloat16", "storage.num_partitions=8", "storage.buffer_capacity=3",
                 "storage.ordering=beta_random", "training.epochs=2", "training.seed=5")
    mp.train(umls_config(umls_dataset, *overrides), tmp_path / "full", progress=False)
    original, commits = Trainer._commit_between_states, []

    def commit_then_crash(self, *args):
        original(self, *args)
        commits.append(self.state.states_done)
        if len(commits) == 4:
            raise SimulatedCrash
    monkeypatch.setattr(Trainer, "_commit_between_states", commit_then_crash)
    with pytest.raises(SimulatedCrash):
        mp.train(umls_config(umls_dataset, *overrides, "training.checkpoint_interval=1e-9"), tmp_path / "split",
                 progress=False)
    monkeypatch.setattr(Trainer, "_commit_between_states", original)
    assert RunDirectory(tmp_path / "split").latest_version().name == "v000000.s000004"
    mp.train(mp.api.load_run_config(tmp_path / "split"), tmp_path / "split", progress=False, resume=True)
    for full, split in zip(stored(tmp_path / "full").read_tables(), stored(tmp_path / "split").read_tables()):
        assert torch.equal(full, split)


def test_float32_tables_draw_no_rounding_seed():
    """float32 runs take no seed from the dropout stream, so their random draws are as before bfloat16 existed."""
    from marius_py.pipeline.step import rounding_seed
    generator = torch.Generator().manual_seed(7)
    before = generator.get_state()
    assert rounding_seed(torch.zeros(2, 2), generator) is None
    assert torch.equal(generator.get_state(), before)
    assert rounding_seed(torch.zeros(2, 2, dtype=torch.bfloat16), generator) is not None
    assert not torch.equal(generator.get_state(), before)
