"""Issue 36's bad-input corpus, family "eval/export/predict arguments": mistakes in the commands that read a
trained run. Each must exit with status 2 and one message (no traceback) naming what was wrong, write nothing
that looks like an output, and leave every file of the reference runs, datasets and the user's directories
as it was. Below the corpus: the behaviours these errors guard (sampled evaluation on a small graph, export
that never removes a user's files and never leaves half an output)."""

from __future__ import annotations

import hashlib
import json
import os
import shlex
import shutil
from pathlib import Path

import numpy as np
import pytest
import torch

import marius_py as mp
from marius_py import export as export_module
from marius_py.cli import main
from test_bad_input_corpus import UMLS_RAW, run_cli

NODE, RELATION = "acquired_abnormality", "location_of"  # the first edge of UMLS's train.txt
FAST = ["training.device=cpu", "model.dim=8", "training.epochs=1", "training.num_negatives=64",
        "evaluation.every=1"]
PREDICT = f"predict {{run}} --head {NODE} --relation {RELATION}"

CASES = {
    # eval: splits without edges, the run and its dataset, overrides, devices
    "eval_no_test_edges": ("eval {run00}", "no test edges in this dataset"),
    "eval_no_valid_edges": ("eval {run00} --split valid", "no valid edges in this dataset"),
    "eval_sampled_no_test_edges": ("eval {run00} evaluation.protocol=sampled", "no test edges in this dataset"),
    "eval_dataset_moved": ("eval {moved}", "the run's dataset is missing: dataset.path"),
    "eval_no_committed_checkpoint": ("eval {uncommitted}", "no committed checkpoint"),
    "eval_a_dataset_not_a_run": ("eval {data}", "not a run directory"),
    "eval_training_override": ("eval {run} training.lr=0.1", "eval takes only evaluation.* overrides"),
    "eval_dataset_override": ("eval {run} dataset.path={data}", "eval takes only evaluation.* overrides"),
    "eval_unknown_evaluation_key": ("eval {run} evaluation.nope=1", "unknown config key 'evaluation.nope'"),
    "eval_override_without_value": ("eval {run} evaluation.protocol", "'evaluation.protocol'"),
    "eval_zero_negatives": ("eval {run} evaluation.protocol=sampled evaluation.num_negatives=0",
                            "evaluation.num_negatives: expected > 0"),
    "eval_negative_batch": ("eval {run} evaluation.batch_size=-5", "evaluation.batch_size: expected > 0"),
    "eval_unknown_protocol": ("eval {run} evaluation.protocol=exact", "evaluation.protocol"),
    "eval_unknown_sampling": ("eval {run} evaluation.protocol=sampled evaluation.negative_sampling=popular",
                              "evaluation.negative_sampling"),
    "eval_train_split": ("eval {run} --split train", "invalid choice: 'train'"),
    "eval_missing_gpu": ("eval {run} --device cuda:99", "CUDA device(s)"),
    "eval_not_a_device": ("eval {run} --device tpu", "--device tpu: not a device"),
    # export: output places, the run
    "export_overwrite_user_directory": ("export {run} -o {user_dir} --overwrite", "holds 'notes.txt', which export"),
    "export_into_user_directory": ("export {run} -o {user_dir}", "holds 'notes.txt', which export did not write"),
    "export_overwrite_run_directory": ("export {run} -o {run} --overwrite", "which export did not write"),
    "export_overwrite_dataset": ("export {run} -o {data} --overwrite", "which export did not write"),
    "export_onto_a_file": ("export {run} -o {file}", "output is a file, not a directory"),
    "export_over_earlier_export": ("export {run} -o {earlier}", "holds an earlier export"),
    "export_overwrite_export_with_user_file": ("export {run} -o {earlier_plus} --overwrite",
                                               "holds 'mine.txt', which export did not write"),
    "export_overwrite_unmarked": ("export {run} -o {unmarked} --overwrite", "but no export.json"),
    "export_dataset_moved": ("export {moved} -o {out}", "the run's dataset is missing"),
    "export_no_committed_checkpoint": ("export {uncommitted} -o {out}", "no committed checkpoint"),
    "export_missing_run": ("export {tmp}/nope -o {out}", "not a run directory"),
    "export_checkpoint_choice": ("export {run} --checkpoint first -o {out}", "invalid choice: 'first'"),
    # predict: k, names, relations, the run
    "predict_k_zero": (f"{PREDICT} -k 0", "k must be at least 1"),
    "predict_k_negative": (f"{PREDICT} -k -5", "k must be at least 1"),
    "predict_k_not_a_number": (f"{PREDICT} -k ten", "invalid int value: 'ten'"),
    "predict_unknown_relation": (f"predict {{run}} --head {NODE} --relation nope", "unknown relation name 'nope'"),
    "predict_relation_other_case": (f"predict {{run}} --head {NODE} --relation {RELATION.upper()}",
                                    f"did you mean '{RELATION}'"),
    "predict_node_other_case": (f"predict {{run}} --head {NODE.upper()} --relation {RELATION}",
                                f"did you mean '{NODE}'"),
    "predict_node_with_spaces": (f"predict {{run}} --tail ' {NODE} ' --relation {RELATION}",
                                 f"did you mean '{NODE}'"),
    "predict_unknown_tail": (f"predict {{run}} --tail nobody --relation {RELATION}", "unknown node name 'nobody'"),
    "predict_missing_relation": (f"predict {{run}} --head {NODE}", "a relation is required"),
    "predict_relation_on_plain_graph": (f"predict {{pairs_run}} --head {NODE} --relation {RELATION}",
                                        "plain graph"),
    "predict_dataset_moved": (PREDICT.replace("{run}", "{moved}"), "the run's dataset is missing"),
    "predict_no_committed_checkpoint": (PREDICT.replace("{run}", "{uncommitted}"), "no committed checkpoint"),
    "predict_missing_run": (PREDICT.replace("{run}", "{tmp}/nope"), "not a run directory"),
    "predict_missing_gpu": (f"{PREDICT} --device cuda:99", "CUDA device(s)"),
    "predict_head_and_tail": (f"{PREDICT} --tail {NODE}", "give exactly one of head and tail"),
}


def _train(data: Path, run: Path, *extra: str) -> None:
    assert main(["train", f"dataset.path={data}", *FAST, *extra, "--run-dir", str(run), "--quiet"]) == 0


def _preprocess(out: Path, *extra: str) -> None:
    assert main(["preprocess", "--train", str(UMLS_RAW / "train.txt"), "-o", str(out), "--quiet", *extra]) == 0


@pytest.fixture(scope="module")
def places(tmp_path_factory):
    """Runs and directories the cases point at: a UMLS run, a run on a dataset without valid or test edges,
    a plain-graph run, a run whose dataset is gone, one that never committed, and output directories."""
    tmp = tmp_path_factory.mktemp("commands")
    data = tmp / "umls"
    _preprocess(data, "--valid", str(UMLS_RAW / "valid.txt"), "--test", str(UMLS_RAW / "test.txt"))
    _train(data, tmp / "run")
    _preprocess(tmp / "umls00", "--split", "0,0")
    _train(tmp / "umls00", tmp / "run00")
    _preprocess(tmp / "pairs", "--pairs", "--columns", "0,2")
    _train(tmp / "pairs", tmp / "pairs_run")
    gone = tmp / "gone"  # the moved run's dataset: trained on, then deleted
    shutil.copytree(data, gone)
    _train(gone, tmp / "moved")
    shutil.rmtree(gone)
    uncommitted = tmp / "uncommitted"  # a run directory from before its first commit
    (uncommitted / "checkpoints").mkdir(parents=True)
    shutil.copy(tmp / "run" / "config.yaml", uncommitted / "config.yaml")
    user_dir = tmp / "user_dir"
    user_dir.mkdir()
    (user_dir / "notes.txt").write_text("the user's own notes\n")
    (user_dir / "node_names.txt").write_text("a file export also writes: still the user's\n")
    assert main(["export", str(tmp / "run"), "-o", str(tmp / "earlier")]) == 0
    shutil.copytree(tmp / "earlier", tmp / "earlier_plus")  # an export the user then added a file to
    (tmp / "earlier_plus" / "mine.txt").write_text("added by the user\n")
    unmarked = tmp / "unmarked"
    unmarked.mkdir()
    np.save(unmarked / "node_embeddings.npy", np.ones((2, 2)))
    (tmp / "a-file").write_text("not a directory\n")
    return {"tmp": tmp, "data": data, "run": tmp / "run", "run00": tmp / "run00", "pairs_run": tmp / "pairs_run",
            "moved": tmp / "moved", "uncommitted": uncommitted, "user_dir": user_dir, "earlier": tmp / "earlier",
            "earlier_plus": tmp / "earlier_plus",
            "unmarked": unmarked, "file": tmp / "a-file"}


def snapshot(root: Path) -> dict[str, str]:
    """Every file under ``root`` (hidden ones included) with a hash of its bytes."""
    return {str(path.relative_to(root)): hashlib.blake2b(path.read_bytes(), digest_size=16).hexdigest()
            for path in sorted(root.rglob("*")) if path.is_file()}


def test_corpus_has_twenty_cases():
    assert len(CASES) >= 20


@pytest.mark.parametrize("name", sorted(CASES))
def test_bad_command_is_one_clean_error(name, places, tmp_path, capsys):
    command, fragment = CASES[name]
    out = tmp_path / "out"
    before = snapshot(places["tmp"])
    code = run_cli(shlex.split(command.format(out=out, **places)))
    err = capsys.readouterr().err
    assert code == 2, err
    assert fragment in err and "Traceback" not in err, err
    assert len([line for line in err.splitlines() if "error" in line]) == 1, err  # one message
    assert not out.exists()  # nothing half-written
    assert snapshot(places["tmp"]) == before  # runs, datasets and the user's files untouched


def test_errors_name_where_and_what(places, capsys):
    """The messages point at the file to fix and say what to do, not only what failed."""
    assert run_cli(["eval", str(places["run00"])]) == 2
    err = capsys.readouterr().err
    assert str(places["tmp"] / "umls00") in err and "--split valid" in err
    assert run_cli(["eval", str(places["moved"])]) == 2
    err = capsys.readouterr().err
    assert str(places["tmp"] / "gone") in err and str(places["moved"] / "config.yaml") in err
    assert run_cli(["export", str(places["run"]), "-o", str(places["user_dir"]), "--overwrite"]) == 2
    assert str(places["user_dir"]) in capsys.readouterr().err


# ---------------------------------------------------------------------------
# sampled evaluation with more negatives than nodes
# ---------------------------------------------------------------------------

def _unfiltered_ranks_brute_force(model) -> torch.Tensor:
    """Realistic rank of every test answer among all nodes, nothing filtered, one query at a time."""
    nodes = torch.from_numpy(model.embeddings())
    ranks = []
    for inverse in (False, True):
        for h, r, t in model.dataset.test.tolist():
            anchor, target = (t, h) if inverse else (h, t)
            query = model.decoder.query(nodes[[anchor]], torch.tensor([r]), inverse)
            scores = model.decoder.compare_all(query[None], nodes[None])[0, 0]
            others = torch.cat([scores[:target], scores[target + 1:]])
            greater, at_least = int((others > scores[target]).sum()), int((others >= scores[target]).sum())
            ranks.append((2 + greater + at_least) / 2)
    return torch.tensor(ranks, dtype=torch.float64)


def _eval_json(run: Path, capsys, *overrides: str) -> dict:
    assert main(["eval", str(run), "--json", *overrides]) == 0
    return json.loads(capsys.readouterr().out.strip().splitlines()[-1])


def test_sampled_with_more_negatives_than_nodes_ranks_against_all_nodes(places, capsys):
    """UMLS has 135 nodes; the default 1,000 negatives drawn with replacement repeated every node about 7
    times, and each repeat of a better-scoring node pushed the answer down again: mean rank 100, MRR 0.04
    (0.79 filtered). Such a sample stands for all nodes: ranking against them, unfiltered, is what it gives."""
    model = mp.load_checkpoint(places["run"], device="cpu")
    ranks = _unfiltered_ranks_brute_force(model)
    for negatives in (1000, 134):  # at least the 134 other nodes
        metrics = _eval_json(places["run"], capsys, "evaluation.protocol=sampled",
                             f"evaluation.num_negatives={negatives}")
        assert "all 135 nodes" in metrics["protocol"] and f"num_negatives={negatives}" in metrics["protocol"]
        assert metrics["mean_rank"] <= 135
        assert metrics["mean_rank"] == pytest.approx(float(ranks.mean()), rel=1e-6)
        assert metrics["mrr"] == pytest.approx(float((1 / ranks).mean()), rel=1e-6)
        assert metrics["num_queries"] == len(ranks)
    degree = _eval_json(places["run"], capsys, "evaluation.protocol=sampled", "evaluation.negative_sampling=mixed")
    assert degree["mrr"] == pytest.approx(float((1 / ranks).mean()), rel=1e-6)


def test_sampled_covering_all_nodes_out_of_core(places, tmp_path, capsys):
    """A partitioned run's table is streamed partition by partition: the same ranking against all nodes."""
    run = tmp_path / "partitioned"
    _train(places["data"], run, "storage.num_partitions=4", "storage.buffer_capacity=2")
    model = mp.load_checkpoint(run, device="cpu")
    assert isinstance(model.table, mp.evaluation.StoredNodes)
    ranks = _unfiltered_ranks_brute_force(model)
    metrics = _eval_json(run, capsys, "evaluation.protocol=sampled")
    assert "all 135 nodes" in metrics["protocol"]
    assert metrics["mrr"] == pytest.approx(float((1 / ranks).mean()), rel=1e-6)
    assert metrics["mean_rank"] == pytest.approx(float(ranks.mean()), rel=1e-6)


def test_sampled_below_the_node_count_stays_sampled_and_close(places, capsys):
    """Fewer negatives than other nodes: still a sample (ranks at most negatives + 1), and its MRR near
    full unfiltered ranking's (a sample of 100 of 134 others: a little higher, never several times lower)."""
    model = mp.load_checkpoint(places["run"], device="cpu")
    full_mrr = float((1 / _unfiltered_ranks_brute_force(model)).mean())
    metrics = _eval_json(places["run"], capsys, "evaluation.protocol=sampled", "evaluation.num_negatives=100")
    assert "100 sampled uniform negatives" in metrics["protocol"]
    assert metrics["mean_rank"] <= 101
    assert full_mrr <= metrics["mrr"] <= full_mrr + 0.1


# ---------------------------------------------------------------------------
# export: only its own files, never half an output
# ---------------------------------------------------------------------------

def test_overwrite_replaces_only_an_earlier_export(places, tmp_path, capsys):
    out = tmp_path / "emb"
    assert main(["export", str(places["run"]), "-o", str(out)]) == 0
    inode = out.stat().st_ino
    assert main(["export", str(places["run"]), "-o", str(out), "--format", "tsv", "--overwrite"]) == 0
    assert out.stat().st_ino == inode  # the same directory, its files replaced
    assert sorted(os.listdir(out)) == ["export.json", "node_embeddings.tsv", "relation_embeddings.tsv"]
    marker = json.loads((out / "export.json").read_text())
    assert marker["format"] == "tsv" and marker["files"] == ["node_embeddings.tsv", "relation_embeddings.tsv"]
    assert len((out / "node_embeddings.tsv").read_text().splitlines()) == 135
    (out / "mine.txt").write_text("added by the user\n")
    assert main(["export", str(places["run"]), "-o", str(out), "--overwrite"]) == 2
    assert "'mine.txt'" in capsys.readouterr().err
    assert (out / "mine.txt").read_text() == "added by the user\n" and marker == json.loads(
        (out / "export.json").read_text())


def test_export_into_an_empty_directory(places, tmp_path, monkeypatch):
    """An existing empty directory is filled in place (it may be the current directory)."""
    monkeypatch.chdir(tmp_path)
    assert main(["export", str(places["run"]), "-o", "."]) == 0
    assert Path.cwd() == tmp_path and (tmp_path / "export.json").exists()
    assert len(np.load(tmp_path / "node_embeddings.npy")) == 135
    assert not [name for name in os.listdir(tmp_path) if name.startswith(".")]


def _failing_blocks(monkeypatch):
    """Make the model's block stream fail after its first block, as a disk or a bug might mid-export."""
    original = mp.api.TrainedModel.blocks

    def blocks(self):
        for index, item in enumerate(original(self)):
            if index:
                raise OSError(5, "Input/output error (injected)")
            yield item
        raise OSError(5, "Input/output error (injected)")

    monkeypatch.setattr(mp.api.TrainedModel, "blocks", blocks)


@pytest.mark.parametrize("fmt", ["npy", "tsv", "h5"])
def test_failed_export_leaves_nothing(places, tmp_path, monkeypatch, fmt):
    _failing_blocks(monkeypatch)
    out = tmp_path / "new"
    with pytest.raises(OSError):
        main(["export", str(places["run"]), "-o", str(out), "--format", fmt])
    assert os.listdir(tmp_path) == []  # neither the output nor its staging directory


def test_failed_overwrite_keeps_the_earlier_export(places, tmp_path, monkeypatch):
    out = tmp_path / "emb"
    assert main(["export", str(places["run"]), "-o", str(out)]) == 0
    before = snapshot(out)
    _failing_blocks(monkeypatch)
    with pytest.raises(OSError):
        main(["export", str(places["run"]), "-o", str(out), "--format", "h5", "--overwrite"])
    assert snapshot(out) == before and sorted(os.listdir(out)) == sorted(before)


def test_interrupted_overwrite_is_recovered(places, tmp_path):
    """A kill while files move in leaves the staging folder and no export.json: not an export, but one
    --overwrite replaces (and removes the leftover)."""
    out = tmp_path / "emb"
    assert main(["export", str(places["run"]), "-o", str(out)]) == 0
    (out / "export.json").unlink()
    (out / f"{export_module.STAGING_PREFIX}12345").mkdir()
    assert main(["export", str(places["run"]), "-o", str(out)]) == 2
    assert main(["export", str(places["run"]), "-o", str(out), "--overwrite"]) == 0
    assert sorted(os.listdir(out)) == sorted(["export.json", *export_module.FORMAT_FILES["npy"]])


def test_a_second_export_into_a_directory_in_use_is_refused(places, tmp_path, capsys):
    """Two `export --overwrite -o DIR` at once: the second (here: while the test holds the first's lock) is
    refused naming the holder, and the finished export stays whole; once the lock is free it goes ahead."""
    import fcntl
    out = tmp_path / "emb"
    assert main(["export", str(places["run"]), "-o", str(out)]) == 0
    before = snapshot(out)
    descriptor = os.open(out / export_module.LOCK_FILE, os.O_RDWR | os.O_CREAT)
    try:
        fcntl.flock(descriptor, fcntl.LOCK_EX)
        os.write(descriptor, b'{"pid": 4242, "host": "elsewhere", "since": "2024-01-01 00:00:00"}\n')
        capsys.readouterr()
        assert main(["export", str(places["run"]), "-o", str(out), "--format", "tsv", "--overwrite"]) == 2
        err = capsys.readouterr().err
        assert f"{out}: another export into this directory is running: pid 4242 on elsewhere" in err
        assert "Traceback" not in err
        assert {k: v for k, v in snapshot(out).items() if k != export_module.LOCK_FILE} == before
    finally:
        os.close(descriptor)
    assert main(["export", str(places["run"]), "-o", str(out), "--format", "tsv", "--overwrite"]) == 0
    assert sorted(os.listdir(out)) == ["export.json", "node_embeddings.tsv", "relation_embeddings.tsv"]


def test_overwrite_removes_only_staging_of_exports_whose_process_is_gone(places, tmp_path):
    """Staging folders are named for their process (HOST-PID); an export removes those of dead processes
    (and the older PID-only form), never a running export's."""
    import socket
    import subprocess
    out = tmp_path / "emb"
    assert main(["export", str(places["run"]), "-o", str(out)]) == 0
    child = subprocess.Popen(["true"])
    child.wait()
    host = socket.gethostname()
    running = out / f"{export_module.STAGING_PREFIX}{host}-{os.getppid()}"
    for folder in (running, out / f"{export_module.STAGING_PREFIX}{host}-{child.pid}",
                   out / f"{export_module.STAGING_PREFIX}{child.pid}"):
        folder.mkdir()
        (folder / "node_embeddings.npy").write_bytes(b"being written")
    assert main(["export", str(places["run"]), "-o", str(out), "--overwrite"]) == 0
    assert sorted(os.listdir(out)) == sorted(["export.json", running.name, *export_module.FORMAT_FILES["npy"]])
    assert (running / "node_embeddings.npy").read_bytes() == b"being written"


def test_a_failed_move_is_a_clean_error_and_overwrite_recovers(places, tmp_path, monkeypatch, capsys):
    """A file vanishing while the export moves in (as another export removing it once did) is one error
    naming the file, not a raw FileNotFoundError; the next --overwrite completes the directory."""
    out = tmp_path / "emb"
    assert main(["export", str(places["run"]), "-o", str(out)]) == 0
    replace = os.replace

    def vanishing(source, target, *args, **kwargs):
        if Path(source).name == "node_names.txt" and Path(source).parent.name.startswith(
                export_module.STAGING_PREFIX):
            raise FileNotFoundError(2, "No such file or directory", str(source))
        return replace(source, target, *args, **kwargs)
    monkeypatch.setattr(os, "replace", vanishing)
    capsys.readouterr()
    assert main(["export", str(places["run"]), "-o", str(out), "--overwrite"]) == 2
    err = capsys.readouterr().err
    assert "node_names.txt: cannot move the export into place: No such file or directory" in err
    assert "Traceback" not in err and not (out / "export.json").exists()  # not an export meanwhile
    monkeypatch.setattr(os, "replace", replace)
    assert main(["export", str(places["run"]), "-o", str(out), "--overwrite"]) == 0
    assert sorted(os.listdir(out)) == sorted(["export.json", *export_module.FORMAT_FILES["npy"]])


# ---------------------------------------------------------------------------
# predict and the best checkpoint
# ---------------------------------------------------------------------------

def test_predict_filter_known_lists_no_filtered_answers(places, capsys):
    """k above the answers left after filtering: only real answers, no -inf placeholders."""
    assert main(["predict", str(places["run"]), "--head", NODE, "--relation", RELATION, "-k", "1000",
                 "--filter-known"]) == 0
    rows = [line.split("\t") for line in capsys.readouterr().out.strip().splitlines()]
    model = mp.load_checkpoint(places["run"], device="cpu")
    known = {t for h, r, t in model.dataset.all_known_edges().tolist()
             if h == model.dataset.node_id(NODE) and r == model.dataset.relation_id(RELATION)}
    assert len(rows) == 135 - len(known) and all(row[3] != "-inf" for row in rows)
    assert not {model.dataset.node_id(row[2]) for row in rows} & known


def test_best_without_validation_says_it_loads_the_latest(places, tmp_path, capsys):
    assert main(["export", str(places["run00"]), "-o", str(tmp_path / "emb")]) == 0
    err = capsys.readouterr().err
    assert "no best checkpoint" in err and "v000001" in err
    assert main(["export", str(places["run"]), "-o", str(tmp_path / "emb2")]) == 0
    assert "no best checkpoint" not in capsys.readouterr().err
