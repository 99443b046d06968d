"""The marius-py command end to end on UMLS, and its handling of user mistakes."""

from __future__ import annotations

import json
import subprocess
import sys

import h5py
import numpy as np
import pytest

import marius_py as mp
from marius_py.cli import main

UMLS = __import__("pathlib").Path(__file__).parent / "data" / "umls"
FAST = ["training.device=cpu", "model.dim=16", "training.epochs=2", "training.num_negatives=64",
        "training.batch_size=512", "evaluation.every=1"]


@pytest.fixture
def trained_run(tmp_path, capsys):
    data = tmp_path / "umls"
    assert main(["preprocess", "--train", str(UMLS / "train.txt"), "--valid", str(UMLS / "valid.txt"),
                 "--test", str(UMLS / "test.txt"), "-o", str(data), "--quiet"]) == 0
    run = tmp_path / "run"
    assert main(["train", f"dataset.path={data}", *FAST, "--run-dir", str(run), "--quiet"]) == 0
    out = capsys.readouterr().out
    assert "test: MRR" in out and "realistic ties" in out
    return data, run


def test_eval_matches_training_report(trained_run, capsys):
    _, run = trained_run
    assert main(["eval", str(run), "--json"]) == 0
    lines = capsys.readouterr().out.strip().splitlines()
    metrics = __import__("json").loads(lines[-1])
    test_records = [r for r in mp.checkpoint.RunDirectory(run).read_metrics() if r.get("split") == "test"]
    assert metrics["mrr"] == pytest.approx(test_records[-1]["mrr"], abs=1e-9)


def test_resume_extends_a_run(trained_run, capsys):
    _, run = trained_run
    assert main(["train", "--resume", str(run), "training.epochs=3", "--quiet"]) == 0
    assert mp.checkpoint.RunDirectory(run).latest_version().name == "v000003"


@pytest.mark.parametrize("fmt", ["npy", "tsv", "h5"])
def test_export_is_keyed_by_original_names(trained_run, tmp_path, fmt):
    _, run = trained_run
    out = tmp_path / f"export-{fmt}"
    assert main(["export", str(run), "--format", fmt, "-o", str(out)]) == 0
    model = mp.load_checkpoint(run, device="cpu")
    expected = {name: model.embedding(name) for name in model.dataset.node_names[:5]}
    if fmt == "npy":
        names = (out / "node_names.txt").read_text().splitlines()
        vectors = np.load(out / "node_embeddings.npy")
    elif fmt == "tsv":
        rows = [line.split("\t") for line in (out / "node_embeddings.tsv").read_text().splitlines()]
        names, vectors = [r[0] for r in rows], np.array([[float(x) for x in r[1:]] for r in rows])
    else:
        with h5py.File(out / "embeddings.h5") as handle:
            names = [n.decode() for n in handle["node_names"][:]]
            vectors = handle["node_embeddings"][:]
            assert handle["relation_embeddings"].shape[0] == 2 * model.dataset.num_relations
    lookup = dict(zip(names, vectors))
    assert len(lookup) == model.dataset.num_nodes
    for name, vector in expected.items():
        np.testing.assert_allclose(lookup[name], vector, rtol=1e-5)
    assert main(["export", str(run), "--format", fmt, "-o", str(out)]) == 2  # refuses to overwrite


def test_predict_prints_top_k(trained_run, capsys):
    _, run = trained_run
    model = mp.load_checkpoint(run)
    head, relation = model.dataset.node_names[0], model.dataset.relation_names[0]
    assert main(["predict", str(run), "--head", head, "--relation", relation, "-k", "3"]) == 0
    rows = [line.split("\t") for line in capsys.readouterr().out.strip().splitlines()]
    assert [r[0] for r in rows] == ["1", "2", "3"] and all(r[1] == "tail" for r in rows)
    top = model.predict(head=head, relation=relation, k=3)
    assert [r[2] for r in rows] == [name for name, _ in top]
    scores = model.score([(head, relation, name) for name, _ in top])
    np.testing.assert_allclose(scores, [s for _, s in top], rtol=1e-4, atol=1e-6)


def test_info_describes_dataset_and_run(trained_run, capsys):
    data, run = trained_run
    assert main(["info", str(data)]) == 0
    assert '"num_nodes": 135' in capsys.readouterr().out
    assert main(["info", str(run)]) == 0
    info = json.loads(capsys.readouterr().out)
    assert info["latest"].endswith("v000002")
    assert info["committed"]["epoch"] == 2 and info["committed"]["states_done"] == 0


# ---- user mistakes: one message naming file, line and expectation; exit 2; nothing left behind ----

def run_cli(*args, cwd=None):
    return subprocess.run([sys.executable, "-m", "marius_py.cli", *args], capture_output=True, text=True,
                          cwd=cwd)


@pytest.mark.parametrize("yaml_text, line, needle", [
    ("model:\n  decoder: complex\ntraining:\n  lr: -0.5\n", 4, "training.lr: expected > 0"),
    ("model:\n  decoder: convkb\n", 2, "model.decoder: expected one of"),
    ("training:\n  epochs: many\n", None, "training.epochs: expected int"),
    ("training:\n  lr: [0.1\n", 3, "not valid YAML"),
])
def test_bad_config_file(tmp_path, yaml_text, line, needle):
    config = tmp_path / "bad.yaml"
    config.write_text(yaml_text)
    result = run_cli("train", str(config), "--run-dir", str(tmp_path / "run"))
    assert result.returncode == 2
    message = result.stderr.strip()
    assert "Traceback" not in message and len(message.splitlines()) == 1
    assert needle in message and str(config) in message
    if line is not None:
        assert f"{config}:{line}:" in message
    assert not (tmp_path / "run").exists()


@pytest.mark.parametrize("override, needle", [
    ("training.lr=-1", "training.lr: expected > 0, got -1"),
    ("model.decoder=transr", "model.decoder: expected one of dot, distmult, complex, transe, rotate"),
    ("training.nonsense=3", "unknown config key 'training.nonsense'"),
    ("model.dropout=1.5", "model.dropout: expected in [0, 1)"),
    ("model.norm=3", "model.norm: expected 1 or 2, got 3"),
    ("storage.direct_io=sometimes", "storage.direct_io: expected one of auto, true, false"),
])
def test_bad_override(tmp_path, override, needle):
    result = run_cli("train", override, "--run-dir", str(tmp_path / "run"))
    assert result.returncode == 2
    assert needle in result.stderr and "command line" in result.stderr
    assert "Traceback" not in result.stderr
    assert not (tmp_path / "run").exists()


def test_missing_dataset_path(tmp_path):
    result = run_cli("train", f"dataset.path={tmp_path / 'nowhere'}", "--run-dir", str(tmp_path / "run"))
    assert result.returncode == 2 and "not a dataset" in result.stderr and "expected" in result.stderr
    assert not (tmp_path / "run").exists()


def test_bad_edge_file_through_cli(tmp_path):
    bad = tmp_path / "edges.tsv"
    bad.write_text("a\tr\tb\nc\td\n")
    result = run_cli("preprocess", "--train", str(bad), "-o", str(tmp_path / "out"))
    assert result.returncode == 2
    assert f"{bad}:2" in result.stderr and "expected" in result.stderr
    assert not (tmp_path / "out").exists()


def test_eval_of_a_non_run(tmp_path):
    result = run_cli("eval", str(tmp_path))
    assert result.returncode == 2 and "not a run directory" in result.stderr


def test_eval_rejects_model_overrides(trained_run, capsys):
    _, run = trained_run
    assert main(["eval", str(run), "model.decoder=transe"]) == 2
    assert "only evaluation.* overrides" in capsys.readouterr().err


def test_export_overwrite_never_replaces_other_directories(trained_run, capsys):
    data, run = trained_run
    assert main(["export", str(run), "-o", str(data), "--overwrite"]) == 2
    assert (data / "metadata.json").exists()


def test_export_into_an_unwritable_place_is_a_clean_error(trained_run, tmp_path, capsys):
    _, run = trained_run
    blocker = tmp_path / "a-file"
    blocker.write_text("not a directory")
    assert main(["export", str(run), "-o", str(blocker / "out")]) == 2
    err = capsys.readouterr().err
    assert "cannot create the output directory" in err and "Traceback" not in err
    assert blocker.read_text() == "not a directory"


@pytest.mark.parametrize("args, needle", [
    (["--columns", "0,x,2"], "--columns: cannot read '0,x,2'"),
    (["--split", "a,b"], "--split: cannot read 'a,b'"),
    (["--split", "0.1,0.1", "--valid", "v.txt", "--test", "t.txt"], "--split applies only to a single"),
])
def test_bad_preprocess_options(tmp_path, capsys, args, needle):
    assert main(["preprocess", "--train", str(UMLS / "train.txt"), "-o", str(tmp_path / "out"), *args]) == 2
    err = capsys.readouterr().err
    assert needle in err and "expected" in err
    assert not (tmp_path / "out").exists()


@pytest.mark.parametrize("relation, extra, needle", [
    ("first", ["-k", "0"], "k must be at least 1"),
    (None, [], "a relation is required"),
    ("no-such-relation", [], "unknown relation name 'no-such-relation'"),
])
def test_bad_predict_arguments(trained_run, capsys, relation, extra, needle):
    _, run = trained_run
    names = mp.load_checkpoint(run).dataset
    args = ["predict", str(run), "--head", names.node_names[0], *extra]
    if relation is not None:
        args += ["--relation", names.relation_names[0] if relation == "first" else relation]
    assert main(args) == 2
    assert needle in capsys.readouterr().err


def test_predict_arguments_are_checked_before_the_run_is_read(tmp_path, capsys):
    assert main(["predict", str(tmp_path / "nope"), "--head", "a", "--tail", "b"]) == 2
    assert "command line: give exactly one of head and tail" in capsys.readouterr().err
    assert main(["predict", str(tmp_path / "nope"), "--head", "a", "-k", "0"]) == 2
    assert "command line: k must be at least 1, got 0" in capsys.readouterr().err


def test_resume_with_run_dir_is_refused(trained_run, capsys):
    _, run = trained_run
    assert main(["train", "--resume", str(run), "--run-dir", str(run)]) == 2
    assert "not both" in capsys.readouterr().err


def test_allocator_settings_are_taken_unless_opted_out(monkeypatch):
    import platform

    from marius_py import resources
    for name in (resources.ALLOCATOR_OPT_OUT, "GLIBC_TUNABLES", *resources.USER_MALLOC_SETTINGS):
        monkeypatch.delenv(name, raising=False)
    glibc = sys.platform.startswith("linux") and platform.libc_ver()[0] == "glibc"
    assert resources.keep_freed_memory() is glibc
    monkeypatch.setenv(resources.ALLOCATOR_OPT_OUT, "0")
    assert resources.keep_freed_memory() is glibc
    monkeypatch.setenv(resources.ALLOCATOR_OPT_OUT, "1")
    assert resources.keep_freed_memory() is False
    monkeypatch.delenv(resources.ALLOCATOR_OPT_OUT)
    monkeypatch.setenv("MALLOC_TRIM_THRESHOLD_", "1048576")  # the user's own glibc settings win
    assert resources.keep_freed_memory() is False


def test_the_command_applies_the_allocator_settings(monkeypatch, capsys):
    from marius_py import resources
    calls = []
    monkeypatch.setattr(resources, "keep_freed_memory", lambda: calls.append(True) or True)
    assert main(["ordering", "-p", "4", "-c", "2"]) == 0
    assert calls == [True]
