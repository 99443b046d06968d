"""marius-py plot: PNGs of a run's metrics, with the out-of-core buffer-state timeline."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

import marius_py as mp
from marius_py.cli import main
from marius_py.config_loading import load_config
from marius_py.preprocess import PreprocessOptions, preprocess
from marius_py.orderings import build_ordering

UMLS_RAW = Path(__file__).parent / "data" / "umls"


@pytest.fixture(scope="module")
def partitioned_run(tmp_path_factory):
    root = tmp_path_factory.mktemp("plot")
    preprocess(root / "umls-p4", UMLS_RAW / "train.txt", UMLS_RAW / "valid.txt", UMLS_RAW / "test.txt",
               PreprocessOptions(num_partitions=4), progress=False)
    config = load_config(None, [f"dataset.path={root / 'umls-p4'}", "training.device=cpu", "model.dim=8",
                                "training.epochs=2", "evaluation.every=1", "storage.num_partitions=4",
                                "storage.buffer_capacity=2", "storage.ordering=beta", "training.num_negatives=32"])
    mp.train(config, root / "run", progress=False)
    return root / "run"


def test_epoch_records_carry_the_buffer_states(partitioned_run):
    epochs = [json.loads(line) for line in (partitioned_run / "metrics.jsonl").read_text().splitlines()
              if json.loads(line).get("event") == "epoch"]
    for record in epochs:
        states = record["states"]
        assert len(states) == build_ordering("beta", 4, 2, seed=0, epoch=record["epoch"]).num_states
        assert sum(row["edges"] for row in states) > 0
        assert sum(row["read"] for row in states) == record["io"]["bytes_read"]
        assert all(row["wait"] >= 0 and row["train"] > 0 for row in states)


def test_metrics_log_times_the_start_up_and_each_epochs_phases(partitioned_run):
    records = [json.loads(line) for line in (partitioned_run / "metrics.jsonl").read_text().splitlines()]
    startups = [r for r in records if r.get("event") == "startup"]
    assert len(startups) == 1 and records.index(startups[0]) < records.index(
        next(r for r in records if r.get("event") == "epoch"))  # logged at the first batch, before epoch 1's record
    phases = startups[0]["phases"]
    assert set(phases) == {"imports_and_config", "dataset", "model", "bucketing", "runner", "tables",
                           "trainer_other", "first_batch"}  # (the run is partitioned)
    assert all(s >= 0 for s in phases.values())
    assert startups[0]["seconds_to_first_batch"] == pytest.approx(sum(phases.values()))
    for record in (r for r in records if r.get("event") == "epoch"):
        time = record["time"]
        assert {"wait", "prepare", "train", "sync", "validate", "commit"} <= set(time)  # (validates every epoch)
        assert time["train"] > 0 and sum(time[k] for k in ("wait", "prepare", "train", "sync")) \
            == pytest.approx(record["seconds"], rel=0.05, abs=0.01)


def test_plot_writes_the_pngs(partitioned_run, tmp_path, capsys):
    assert main(["plot", str(partitioned_run), "-o", str(tmp_path)]) == 0
    written = capsys.readouterr().out.split()
    assert sorted(Path(p).name for p in written) == ["epoch_time.png", "throughput.png", "timeline.png",
                                                     "training.png"]
    for path in written:
        assert Path(path).read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and Path(path).stat().st_size > 5000
    assert main(["plot", str(partitioned_run), "-o", str(tmp_path), "--epoch", "9"]) == 2
    assert "epoch 9 has no buffer-state timeline" in capsys.readouterr().err
    assert main(["plot", str(tmp_path / "nowhere")]) == 2
    assert "not a run directory" in capsys.readouterr().err


def test_plot_without_matplotlib_says_how_to_get_it(partitioned_run, tmp_path, monkeypatch, capsys):
    monkeypatch.setitem(sys.modules, "matplotlib", None)  # import fails as if not installed
    assert main(["plot", str(partitioned_run), "-o", str(tmp_path / "none")]) == 2
    assert "marius-py[plot]" in capsys.readouterr().err


def test_tensorboard_mirrors_the_metrics_log(tmp_path):
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator
    config = load_config(None, [f"dataset.path={UMLS_RAW}", "training.device=cpu", "model.dim=8",
                                "training.epochs=3", "evaluation.every=1", "training.tensorboard=true",
                                "training.num_negatives=32"])
    mp.train(config, tmp_path / "run", progress=False)
    events = EventAccumulator(str(tmp_path / "run" / "tensorboard"))
    events.Reload()
    records = [json.loads(line) for line in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()]
    losses = [r["loss"] for r in records if r["event"] == "epoch"]
    assert [e.value for e in events.Scalars("train/loss")] == pytest.approx(losses, rel=1e-6)
    assert [e.step for e in events.Scalars("train/loss")] == [1, 2, 3]
    valid = [r["mrr"] for r in records if r.get("split") == "valid"]
    assert [e.value for e in events.Scalars("valid/mrr")] == pytest.approx(valid, rel=1e-6)
    assert len(events.Scalars("test/hits@10")) == 1


def test_tensorboard_without_the_package_says_how_to_get_it(tmp_path, monkeypatch):
    from marius_py.errors import MariusInputError
    monkeypatch.setitem(sys.modules, "torch.utils.tensorboard", None)
    config = load_config(None, [f"dataset.path={UMLS_RAW}", "training.device=cpu", "training.tensorboard=true"])
    with pytest.raises(MariusInputError, match="tensorboard"):
        mp.train(config, tmp_path / "run", progress=False)
    assert not (tmp_path / "run").exists()  # a user error before the first commit leaves nothing behind


def test_epoch_time_draws_commits_behind_training_and_folded_points(tmp_path):
    """A commit written behind training (its record) and a folded commit point change the epoch-time plot."""
    pytest.importorskip("matplotlib")
    from marius_py.plot import plot_run
    epochs = [{"event": "epoch", "epoch": e, "loss": 1.0, "edges_per_s": 1e6, "seconds": 1.0,
               "time": {"train": 1.0, "commit": 0.05}} for e in (1, 2, 3)]
    commit = {"event": "commit", "epoch": 1, "version": "v000001", "seconds": 1.5, "folded": []}

    def drawn(records, name):
        run = tmp_path / name
        run.mkdir()
        (run / "config.yaml").write_text("{}\n")
        (run / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in records))
        plot_run(run)
        return (run / "plots" / "epoch_time.png").read_bytes()
    plain = drawn(epochs, "plain")
    with_commit = drawn([*epochs, commit], "commit")
    folded = drawn([epochs[0], {**epochs[1], "commit_folded": True}, epochs[2], commit], "folded")
    assert len({plain, with_commit, folded}) == 3
