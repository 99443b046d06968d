"""Bad-input corpus, family "run directories and the API": run directories that are missing, damaged,
foreign, locked or unwritable, two commands at once, resumes with changed settings or partial state, and
misuse of the Python API. Each case is one clear error (``MariusInputError``; through the command line
exit status 2 and one message line, no traceback) naming what was wrong, and changes nothing: not the
run it was given (its files byte for byte, the lock file aside), not the reference run, and no new
directory is left behind.

``CASES``: name -> ("cli", command, message fragment, setup) or ("api", call, message fragment[, setup]).
Commands and fragments are formatted with the places of ``places`` ({copy}: a fresh copy of the reference
run, two epochs: best and latest are committed; {pid}: this process, which holds the lock in the locked
cases). Every file and folder of the test's directory and of the reference's is compared before and after.
"""

from __future__ import annotations

import hashlib
import json
import os
import shlex
import shutil
import signal
import subprocess
import sys
from pathlib import Path

import pytest

import marius_py as mp
from marius_py.run_lock import RunLock
from marius_py.run_setup import claim_run_dir
from marius_py.preprocess import PreprocessOptions, preprocess
from test_bad_input_corpus import TRAIN, UMLS_RAW, run_cli

REFERENCE = f"{TRAIN} training.epochs=2 evaluation.every=1"  # (the last value of a key wins)
NEW_RUN = f"{TRAIN} --quiet"


def chunk(version: Path) -> Path:
    return next(p for p in sorted((version / "nodes").rglob("*")) if p.is_file() and p.stat().st_size > 100)


def flip(path: Path, offset: int = 10) -> None:
    data = bytearray(path.read_bytes())
    data[min(offset, len(data) - 1)] ^= 0xFF
    path.write_bytes(bytes(data))


def latest(places) -> Path:
    return places["copy"] / "checkpoints" / "v000002"


def hold_lock(key: str):
    """Setup: this process holds the run directory's lock while the command runs (a second command)."""
    def setup(places):
        return RunLock(places[key]).acquire().release
    return setup


def first_epoch_run(places):
    """Setup: a new run in its first epoch (config.yaml and its live store, nothing committed), running."""
    fresh = places["fresh"]
    (fresh / "checkpoints").mkdir(parents=True)
    shutil.copy(places["copy"] / "config.yaml", fresh / "config.yaml")
    return RunLock(fresh).acquire().release


def foreign_folder(*names: str):
    """Setup: an existing folder of the user's holding files with the names a run writes."""
    def setup(places):
        fresh = places["fresh"]
        fresh.mkdir()
        (fresh / "notes.txt").write_text("mine\n")
        for name in names:
            if "." in name:
                (fresh / name).write_text("name: my project\n")
            else:
                (fresh / name).mkdir()
                (fresh / name / "figure.png").write_bytes(b"\x89PNG")
    return setup


def _api_model(places):
    return mp.load_checkpoint(places["copy"], device="cpu")


def _resume_config(places):
    return mp.api.load_run_config(places["copy"])


def _train_while_locked(places):
    release = RunLock(places["copy"]).acquire().release
    try:
        mp.train(_resume_config(places), places["copy"], progress=False, resume=True)
    finally:
        release()


CASES = {
    # ---- damaged committed state: the resume names the file and changes nothing ----
    "resume_pointers_lost_and_newest_damaged": (
        "cli", "train --resume {copy} training.epochs=3",
        "POINTERS.json: missing, and the newest version, v000002, is damaged",
        lambda p: ((p["copy"] / "checkpoints" / "POINTERS.json").unlink(), flip(chunk(latest(p)), 50))),
    "resume_pointers_to_nothing": (
        "cli", "train --resume {copy} training.epochs=3", "holds no version to recover from",
        lambda p: [shutil.rmtree(v) for v in (p["copy"] / "checkpoints").glob("v*")]),
    "resume_latest_state_missing": ("cli", "train --resume {copy} training.epochs=3",
                                    "v000002/state.json: missing", lambda p: (latest(p) / "state.json").unlink()),
    "resume_latest_model_flipped": ("cli", "train --resume {copy} training.epochs=3",
                                    "v000002/model.pt: checksum mismatch", lambda p: flip(latest(p) / "model.pt")),
    "resume_latest_manifest_missing": ("cli", "train --resume {copy} training.epochs=3",
                                       "v000002/MANIFEST.json: missing (the version was committed with one)",
                                       lambda p: (latest(p) / "MANIFEST.json").unlink()),
    "resume_latest_manifest_garbage": ("cli", "train --resume {copy} training.epochs=3", "unreadable manifest",
                                       lambda p: (latest(p) / "MANIFEST.json").write_text("[]")),
    "resume_latest_chunk_truncated": ("cli", "train --resume {copy} training.epochs=3",
                                      "4 bytes, the manifest says", lambda p: chunk(latest(p)).write_bytes(b"\0" * 4)),
    "resume_config_missing": ("cli", "train --resume {copy}", "config.yaml: missing (the run's checkpoints/ is there)",
                              lambda p: (p["copy"] / "config.yaml").unlink()),
    "resume_config_not_yaml": ("cli", "train --resume {copy}", "config.yaml:2: not valid YAML",
                               lambda p: (p["copy"] / "config.yaml").write_text("model:\n\tdim: 8\n")),
    "resume_config_foreign": ("cli", "train --resume {copy}", "config.yaml:1: config is a list",
                              lambda p: (p["copy"] / "config.yaml").write_text("- a\n- b\n")),
    "resume_metrics_garbage_line": ("cli", "train --resume {copy} training.epochs=3",
                                    "metrics.jsonl:1: not a JSON line",
                                    lambda p: (p["copy"] / "metrics.jsonl").write_text(
                                        "x" + (p["copy"] / "metrics.jsonl").read_text())),
    "resume_metrics_not_an_object": ("cli", "train --resume {copy} training.epochs=3",
                                     "metrics.jsonl:1: a JSON list, not an object",
                                     lambda p: (p["copy"] / "metrics.jsonl").write_text(
                                         "[1, 2]\n" + (p["copy"] / "metrics.jsonl").read_text())),
    "resume_partial_state_of_a_killed_first_commit": (
        "cli", "train --resume {copy}", "names v000001, which is missing, and",
        lambda p: [shutil.rmtree(v) for v in (p["copy"] / "checkpoints").glob("v*")]
        + [(p["copy"] / "checkpoints" / ".v000001.tmp").mkdir(),
           (p["copy"] / "checkpoints" / "POINTERS.json").write_text('{"latest": "v000001"}\n')]),
    "info_metrics_garbage_line": ("cli", "info {copy}", "metrics.jsonl:2: not a JSON line",
                                  lambda p: (p["copy"] / "metrics.jsonl").write_text(
                                      '{"epoch": 1}\n{"epoch": 2, "lo\n{"epoch": 3}\n')),
    "info_state_unreadable": ("cli", "info {copy}", "v000002/state.json: unreadable",
                              lambda p: (latest(p) / "state.json").write_text("nope")),
    "plot_metrics_garbage_line": ("cli", "plot {copy} -o {out}", "metrics.jsonl:1: not a JSON line",
                                  lambda p: (p["copy"] / "metrics.jsonl").write_text("\x00\x01\n{}\n")),
    "plot_record_without_loss": ("cli", "plot {copy} -o {out}", "metrics.jsonl:1: a record without a number for loss",
                                 lambda p: (p["copy"] / "metrics.jsonl").write_text(
                                     '{"event": "epoch", "epoch": 1, "edges_per_s": 5}\n')),
    "verify_pointers_lost_and_newest_damaged": (
        "cli", "verify {copy}", "the newest version, v000002, is damaged",
        lambda p: ((p["copy"] / "checkpoints" / "POINTERS.json").unlink(), flip(latest(p) / "model.pt"))),
    "eval_best_version_missing": (
        "cli", "eval {copy}", "v000001: checkpoint version is missing",
        lambda p: (shutil.rmtree(p["copy"] / "checkpoints" / "v000001", ignore_errors=True),
                   (p["copy"] / "checkpoints" / "POINTERS.json").write_text(
                       '{"latest": "v000002", "best": "v000001"}\n'))),
    # ---- two commands at once ----
    "resume_while_another_trains": ("cli", "train --resume {copy} training.epochs=3",
                                    "run directory {copy} is in use by pid {pid}", hold_lock("copy")),
    "new_run_into_a_run_in_its_first_epoch": ("cli", f"{NEW_RUN} --run-dir {{fresh}}",
                                              "run directory {fresh} is in use by pid {pid}", first_epoch_run),
    "resume_a_run_in_its_first_epoch_while_it_runs": ("cli", "train --resume {fresh}",
                                                      "run directory {fresh} is in use by pid {pid}", first_epoch_run),
    # ---- foreign, missing and unwritable run directories ----
    "new_run_over_a_damaged_pointer_file": ("cli", f"{NEW_RUN} --run-dir {{copy}}", "already holds a run",
                                            lambda p: (p["copy"] / "checkpoints" / "POINTERS.json").write_text("{")),
    "new_run_over_versions_without_pointers": ("cli", f"{NEW_RUN} --run-dir {{copy}}", "already holds a run",
                                               lambda p: (p["copy"] / "checkpoints" / "POINTERS.json").unlink()),
    "new_run_into_a_file": ("cli", f"{NEW_RUN} --run-dir {{file}}", "exists and is not a directory", None),
    "new_run_under_a_file": ("cli", f"{NEW_RUN} --run-dir {{file}}/run",
                             "cannot create the run directory (Not a directory)", None),
    "new_run_into_a_dataset": ("cli", f"{NEW_RUN} --run-dir {{dataset}}", "is a preprocessed dataset directory", None),
    "new_run_into_a_project_folder": ("cli", f"{NEW_RUN} --run-dir {{fresh}}",
                                      "holds config.yaml, plots, which a new run would overwrite",
                                      foreign_folder("config.yaml", "plots")),
    "new_run_into_a_folder_with_a_store": ("cli", f"{NEW_RUN} --run-dir {{fresh}}", "holds store, which a new run",
                                           foreign_folder("store")),
    "resume_a_dataset": ("cli", "train --resume {dataset}", "not a run directory (no config.yaml)", None),
    "resume_a_file": ("cli", "train --resume {file}", "not a run directory", None),
    # ---- resume with changed settings ----
    "resume_with_another_dtype": ("cli", "train --resume {copy} storage.dtype=bfloat16",
                                  "a run keeps the dtype it started with", None),
    "resume_with_another_decoder": ("cli", "train --resume {copy} model.decoder=transe",
                                    "different model or dataset", None),
    "resume_with_another_relation_optimizer": ("cli", "train --resume {copy} training.relation_optimizer=adam",
                                               "different model or dataset", None),
    "resume_with_another_dataset": ("cli", "train --resume {copy} dataset.path={dataset}",
                                    "different model or dataset", None),
    # ---- the Python API ----
    "api_score_pairs_on_a_knowledge_graph": (
        "api", lambda p: _api_model(p).score([("animal", "bacterium")]), "(head, relation, tail) name triples"),
    "api_score_one_triple_not_in_a_list": (
        "api", lambda p: _api_model(p).score(("animal", "practices", "bacterium")), "is not a list of tuples"),
    "api_evaluate_unknown_split": ("api", lambda p: _api_model(p).evaluate("bogus"), "expected 'valid' or 'test'"),
    "api_predict_k_not_a_number": ("api", lambda p: _api_model(p).predict(head="animal", relation="practices",
                                                                          k="5"), "k must be a whole number, got '5'"),
    "api_predict_head_and_tail": ("api", lambda p: _api_model(p).predict(head="animal", tail="animal",
                                                                         relation="practices"),
                                  "give exactly one of head and tail"),
    "api_predict_without_a_relation": ("api", lambda p: _api_model(p).predict(head="animal"),
                                       "a relation is required on a graph with relations"),
    "api_load_onto_a_missing_gpu": ("api", lambda p: mp.load_checkpoint(p["copy"], device="cuda:99"),
                                    "load_checkpoint: device cuda:99: this machine has"),
    "api_load_onto_not_a_device": ("api", lambda p: mp.load_checkpoint(p["copy"], device="tpu"),
                                   "load_checkpoint: device tpu: not a device"),
    "api_load_a_run_whose_dataset_moved": ("api", lambda p: mp.load_checkpoint(p["copy"], device="cpu"),
                                           "the run's dataset is missing: dataset.path {tmp}/gone does not exist",
                                           lambda p: (p["copy"] / "config.yaml").write_text(
                                               (p["copy"] / "config.yaml").read_text().replace(
                                                   f"path: {UMLS_RAW}", f"path: {p['tmp'] / 'gone'}"))),
    "api_override_without_value": ("api", lambda p: mp.make_config(None, ["training.epochs"]),
                                   "overrides: override 'training.epochs' has no value"),
    "api_config_file_named_like_a_key": ("api", lambda p: mp.make_config("training.yaml"),
                                         "training.yaml: config file not found"),
    "api_one_override_string": ("api", lambda p: mp.make_config(None, "training.nope=1"),
                                "overrides: unknown config key 'training.nope'"),
    "api_override_errors_name_the_overrides": ("api", lambda p: mp.make_config(None, ["training.lr=-1"]),
                                               "overrides: training.lr: expected > 0"),
    "api_overrides_as_a_dict": ("api", lambda p: mp.make_config(None, {"training.epochs": 3}), "overrides: a dict"),
    "api_config_not_a_path": ("api", lambda p: mp.make_config(3), "make_config: config 3 is a int"),
    "api_run_config_override": ("api", lambda p: mp.api.load_run_config(p["copy"], ["training.epochs"]),
                                "overrides: override 'training.epochs' has no value"),
    "api_run_config_bad_override": ("api", lambda p: mp.api.load_run_config(p["copy"], ["epochs"]),
                                    "overrides: bad override 'epochs'"),
    "api_load_unknown_checkpoint": ("api", lambda p: mp.load_checkpoint(p["copy"], "newest"),
                                    "expected 'best' or 'latest'"),
    "api_train_a_config_name": ("api", lambda p: mp.train("codex-s", p["out"]), "train: config is a str"),
    "api_resume_a_missing_run": ("api", lambda p: mp.train(mp.make_config(None), p["out"], resume=True),
                                 "not a run directory"),
    "api_train_while_locked": ("api", _train_while_locked, "is in use by pid {pid}"),
}


def snapshot(root: Path) -> dict[str, str]:
    """Every file and folder below ``root`` and each file's content (the lock file's: only that it is there;
    the holder's pid is written in it)."""
    if root.is_file():
        return {".": hashlib.blake2b(root.read_bytes(), digest_size=8).hexdigest()}
    return {p.relative_to(root).as_posix(): "folder" if p.is_dir() else "lock" if p.name == "LOCK" else
            hashlib.blake2b(p.read_bytes(), digest_size=8).hexdigest() for p in sorted(root.rglob("*"))}


def fixture_directories(places) -> dict[str, dict[str, str]]:
    """Snapshots of everything the cases can reach: the test's own directory (the copy, {fresh}, {out}) and
    the reference's (its run, the other dataset, the file)."""
    return {"test": snapshot(places["tmp"]), "reference": snapshot(places["run"].parent)}


@pytest.fixture(scope="module")
def reference(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("runs-corpus")
    assert run_cli(shlex.split(REFERENCE.format(raw=UMLS_RAW)) + ["--run-dir", str(tmp / "run"), "--quiet"]) == 0
    dataset = tmp / "umls-seed1"  # UMLS preprocessed with another seed: another dataset for a run
    preprocess(dataset, UMLS_RAW / "train.txt", UMLS_RAW / "valid.txt", UMLS_RAW / "test.txt",
               PreprocessOptions(seed=1), progress=False)
    (tmp / "a-file").write_text("not a directory\n")
    return {"run": tmp / "run", "dataset": dataset, "file": tmp / "a-file", "raw": UMLS_RAW}


@pytest.fixture
def places(reference, tmp_path):
    copy = tmp_path / "copy"
    shutil.copytree(reference["run"], copy)
    return {**reference, "copy": copy, "fresh": tmp_path / "fresh", "out": tmp_path / "out", "tmp": tmp_path,
            "pid": os.getpid()}


def test_the_family_has_at_least_twenty_cases():
    assert len(CASES) >= 20


@pytest.mark.parametrize("name", sorted(name for name, case in CASES.items() if case[0] == "cli"))
def test_run_directory_mistake_is_one_clean_error(name, places, capsys):
    _, command, fragment, setup = CASES[name]
    release = setup(places) if setup else None
    before = fixture_directories(places)
    try:
        code = run_cli(shlex.split(command.format(**places)))
    finally:
        if callable(release):
            release()
    err = capsys.readouterr().err
    assert code == 2, err
    assert fragment.format(**places) in err, err
    assert "Traceback" not in err and err.count("marius-py: error:") == 1, err
    assert fixture_directories(places) == before  # nothing changed, nothing half-written


@pytest.mark.parametrize("name", sorted(name for name, case in CASES.items() if case[0] == "api"))
def test_api_misuse_is_one_clear_error(name, places):
    _, call, fragment, *setup = CASES[name]
    for step in setup:
        step(places)
    before = fixture_directories(places)
    with pytest.raises(mp.MariusInputError) as caught:
        call(places)
    message = str(caught.value)
    assert fragment.format(**places) in message and "command line" not in message, message
    assert fixture_directories(places) == before


# ---- what is not an error ----

def test_one_override_string_is_one_override():
    assert mp.make_config(None, "training.epochs=3").training.epochs == 3
    assert mp.make_config(None, ("training.epochs=4", "model.dim=8")).model.dim == 8


def test_score_takes_pairs_on_a_graph_without_relations(tmp_path):
    raw = tmp_path / "pairs.tsv"
    raw.write_text("".join(f"n{i}\tn{(i * 7 + 1) % 40}\n" for i in range(40)))
    dataset = tmp_path / "pairs"
    preprocess(dataset, raw, None, None, PreprocessOptions(pairs=True, split_fractions=(0.0, 0.0)), progress=False)
    config = mp.make_config(None, [f"dataset.path={dataset}", "training.device=cpu", "model.dim=4",
                                   "model.decoder=dot", "training.epochs=1", "training.num_negatives=4",
                                   "evaluation.every=0"])
    model = mp.train(config, tmp_path / "run", progress=False)
    pairs, triples = model.score([("n0", "n1"), ("n2", "n15")]), model.score([("n0", None, "n1")])
    assert pairs.shape == (2,) and triples[0] == pytest.approx(pairs[0])
    with pytest.raises(mp.MariusInputError, match="item 0 is"):
        model.score([("n0",)])


def test_a_run_that_failed_before_committing_does_not_block_a_rerun(places, capsys):
    """A run that diverged in its first epoch left its config, log and live store: the same command with a
    sane learning rate reuses the directory cleanly; once it has committed, a new run there is refused."""
    fresh = places["fresh"]
    diverging = shlex.split(NEW_RUN.format(raw=UMLS_RAW)) + ["training.lr=1e30", "--run-dir", str(fresh)]
    assert run_cli(diverging) == 2
    assert "training diverged" in capsys.readouterr().err
    assert (fresh / "config.yaml").exists() and not (fresh / "checkpoints" / "POINTERS.json").exists()
    (fresh / "metrics.jsonl").write_text('{"event": "leftover", "epoch": 0}\n')
    sane = shlex.split(NEW_RUN.format(raw=UMLS_RAW)) + ["--run-dir", str(fresh)]
    assert run_cli(sane) == 0, capsys.readouterr().err
    records = mp.checkpoint.RunDirectory(fresh).read_metrics()
    assert [r["event"] for r in records if r.get("event") not in ("eval", "startup", "plan")] == ["epoch"]  # (no leftover)
    assert mp.api.load_run_config(fresh).training.lr < 1  # the config of the run that trained
    assert run_cli(sane) == 2
    assert "already holds a run" in capsys.readouterr().err


def test_a_user_error_in_an_existing_directory_leaves_it_as_it_was(places, capsys):
    """A new run into an existing (empty) directory that fails while it is set up removes what it wrote."""
    places["fresh"].mkdir()
    (places["fresh"] / "notes.txt").write_text("mine\n")
    command = shlex.split(NEW_RUN.format(raw=UMLS_RAW)) + [f"dataset.path={places['tmp'] / 'nope'}",
                                                           "--run-dir", str(places["fresh"])]
    assert run_cli(command) == 2
    assert "not a dataset" in capsys.readouterr().err
    assert sorted(p.name for p in places["fresh"].iterdir()) == ["notes.txt"]


def test_a_run_directory_that_cannot_be_created_is_named(places, monkeypatch, capsys):
    """(Permissions as a non-root user would meet them; root passes every permission check.)"""
    def refused(self, *args, **kwargs):
        raise PermissionError(13, "Permission denied", str(self))
    monkeypatch.setattr(Path, "mkdir", refused)
    command = shlex.split(NEW_RUN.format(raw=UMLS_RAW)) + ["--run-dir", str(places["out"])]
    assert run_cli(command) == 2
    err = capsys.readouterr().err
    assert f"{places['out']}: cannot create the run directory (Permission denied)" in err and "Traceback" not in err


def test_a_read_only_run_directory_is_refused_before_training(places, monkeypatch, capsys):
    """What a non-root user meets with a read-only checkpoints/ (os.access answers as it would for them)."""
    read_only = places["copy"] / "checkpoints"
    real_access = os.access
    monkeypatch.setattr(os, "access", lambda path, mode, **kw: Path(path) != read_only and real_access(path, mode))
    before = snapshot(places["copy"])
    assert run_cli(["train", "--resume", str(places["copy"]), "training.epochs=3", "--quiet"]) == 2
    err = capsys.readouterr().err
    assert f"{read_only}: not writable" in err and "Traceback" not in err
    assert snapshot(places["copy"]) == before


def test_a_file_training_may_not_write_is_named_and_the_committed_state_kept(places, monkeypatch, capsys):
    """Permission refused in the middle of a commit (a file system turned read-only, say): one error naming the
    file, and the last committed version still the latest."""
    def refused(self, epoch, states_done=0):
        raise PermissionError(13, "Permission denied", str(self.checkpoints / ".v000003.tmp"))
    monkeypatch.setattr(mp.checkpoint.RunDirectory, "begin_version", refused)
    assert run_cli(["train", "--resume", str(places["copy"]), "training.epochs=3", "--quiet"]) == 2
    err = capsys.readouterr().err
    assert ".v000003.tmp: cannot write (Permission denied)" in err and "Traceback" not in err
    monkeypatch.undo()
    assert mp.checkpoint.RunDirectory(places["copy"]).latest_version().name == "v000002"
    assert run_cli(["verify", str(places["copy"])]) == 0


def test_a_claimed_run_directory_names_an_unwritable_file_and_is_freed(places):
    """claim_run_dir, which api.train and rank 0 of a torchrun group train under: permission refused at any
    point of the training (its with-block) is one error naming the file, and the directory is free after."""
    refused = places["copy"] / "store" / "nodes"
    with pytest.raises(mp.MariusInputError, match=f"{refused}: cannot write \\(Permission denied\\)"):
        with claim_run_dir(places["copy"], True, lambda: "set up") as started:
            assert started == "set up"
            with pytest.raises(mp.MariusInputError, match="is in use by pid"):
                RunLock(places["copy"]).acquire()
            raise PermissionError(13, "Permission denied", str(refused))
    RunLock(places["copy"]).acquire().release()


def test_a_user_error_in_a_new_runs_setup_removes_what_it_wrote(places):
    def set_up():
        (places["fresh"] / "config.yaml").write_text("dataset: {}\nmodel: {}\ntraining: {}\n")
        raise mp.MariusInputError("dataset.path: not a dataset")
    with pytest.raises(mp.MariusInputError, match="not a dataset"):
        with claim_run_dir(places["fresh"], False, set_up):
            pass
    assert not places["fresh"].exists()


@pytest.mark.skipif(os.geteuid() == 0, reason="root writes into read-only directories")
def test_read_only_directories_are_named(places, capsys):
    locked = places["tmp"] / "read-only"
    locked.mkdir()
    os.chmod(locked, 0o555)
    os.chmod(places["copy"] / "checkpoints", 0o555)
    try:
        assert run_cli(shlex.split(NEW_RUN.format(raw=UMLS_RAW)) + ["--run-dir", str(locked / "run")]) == 2
        assert f"{locked / 'run'}: cannot create the run directory (Permission denied)" in capsys.readouterr().err
        assert run_cli(["train", "--resume", str(places["copy"]), "training.epochs=3"]) == 2
        assert f"{places['copy'] / 'checkpoints'}: not writable" in capsys.readouterr().err
    finally:
        os.chmod(locked, 0o755)
        os.chmod(places["copy"] / "checkpoints", 0o755)


def test_a_second_process_is_refused_while_one_trains_and_a_killed_one_frees_the_run(places, capsys):
    """Two processes: the second resume names the first (pid, host); a SIGKILLed holder frees the directory,
    and the committed state it left resumes."""
    holder = subprocess.Popen([sys.executable, "-c", "import sys; from marius_py.run_lock import RunLock; "
                               "RunLock(sys.argv[1]).acquire(); print('held', flush=True); sys.stdin.read()",
                               str(places["copy"])], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout.readline().strip() == "held"
        assert run_cli(["train", "--resume", str(places["copy"]), "training.epochs=3", "--quiet"]) == 2
        assert f"is in use by pid {holder.pid} on " in capsys.readouterr().err
    finally:
        holder.send_signal(signal.SIGKILL)
        holder.wait()
    assert run_cli(["train", "--resume", str(places["copy"]), "training.epochs=3", "--quiet"]) == 0, \
        capsys.readouterr().err
    assert json.loads((places["copy"] / "checkpoints" / "POINTERS.json").read_text())["latest"] == "v000003"
