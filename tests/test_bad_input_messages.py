"""Issue 51, part 5: messages that say the right thing. Ctrl-C names the command and what it leaves; a pipe
(a FIFO, ``<(command)``) is read as a file and a directory, socket or device is named for what it is; a wrong
field count hints at its likely cause (--pairs, --columns, --skip-header); a refused argument writes nothing.

``CASES`` (name -> case): each exits with status 2 (130 for an interrupt) and one message (no traceback)
naming the file or the command, and leaves every file as it was: no output, no staging folder, no change to
the run or to an output that was there before."""

from __future__ import annotations

import gzip
import json
import os
import shlex
import shutil
import socket
import threading
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

import h5py
import pytest

from test_bad_input_corpus import UMLS_RAW, run_cli

TRIPLES = b"a\tr\tb\nb\tr\tc\nc\ts\ta\n"
# a run out of core (its epochs carry buffer states, which plot --epoch draws)
TRAIN = (f"train dataset.path={UMLS_RAW} training.device=cpu model.dim=8 training.epochs=1 "
         f"storage.num_partitions=4 storage.buffer_capacity=2 --quiet")


@dataclass(frozen=True)
class Case:
    command: str  # formatted with the places, {out} (where the command would write) and {fifo}
    message: str  # in the one line on stderr (formatted the same way)
    absent: str = ""  # a misleading hint the message must not give
    interrupt: str = ""  # "module.attribute" that raises KeyboardInterrupt when called: status 130
    out_holds: str = ""  # a place copied to {out} first (it must stay as it was)
    fifo: bytes | None = None  # a writer thread writes it into the FIFO {fifo}


PREPROCESS = "preprocess --train {raw}/train.txt -o {out} --quiet"
EXPORT = "export {run} --checkpoint latest -o {out}"
INTERRUPTS = {
    "preprocess_interrupted": Case(PREPROCESS, "preprocessing interrupted: nothing was written to {out} (its "
                                   "staging folder is removed)", interrupt="marius_py.preprocess._write_edges"),
    "preprocess_interrupted_replacing_a_dataset": Case(
        PREPROCESS + " --overwrite", "preprocessing interrupted: {out} still holds its earlier dataset",
        interrupt="marius_py.preprocess._write_edges", out_holds="dataset"),
    "preprocess_interrupted_after_copying_a_pipe": Case(  # (the pipe's copy goes with the staging folder)
        "preprocess --train {fifo} -o {out} --quiet", "preprocessing interrupted: nothing was written to {out}",
        interrupt="marius_py.preprocess._build_dataset", fifo=TRIPLES),
    "export_interrupted": Case(EXPORT, "export interrupted: nothing was written to {out} (its staging folder is "
                               "removed); the run is unchanged", interrupt="marius_py.export._write"),
    "export_interrupted_replacing_an_export": Case(
        EXPORT + " --overwrite", "export interrupted: {out} still holds its earlier export",
        interrupt="marius_py.export._write", out_holds="export"),
    "eval_interrupted": Case("eval {run} --checkpoint latest --device cpu", "eval interrupted; nothing was written",
                             interrupt="marius_py.api.TrainedModel.evaluate"),
}
NOT_FILES = {
    "directory_as_train": Case("preprocess --train {raw} -o {out}", "{raw}: input is a directory, not a file"),
    "directory_as_valid": Case("preprocess --train {raw}/train.txt --valid {raw} --test {raw}/test.txt -o {out}",
                               "{raw}: input is a directory, not a file"),
    "socket_as_train": Case("preprocess --train {socket} -o {out}", "{socket}: input is a socket, not a file"),
    "device_as_test": Case("preprocess --train {raw}/train.txt --valid {raw}/valid.txt --test /dev/null -o {out}",
                           "/dev/null: input is a character device, not a file"),
    "directory_as_config": Case("train {raw} --run-dir {out}", "{raw}: config file is a directory, not a file"),
    "socket_as_config": Case("plan {socket}", "{socket}: config file is a socket, not a file"),
    "device_as_config": Case("train /dev/null --run-dir {out}", "/dev/null: config file is a character device"),
    "missing_train_file": Case("preprocess --train {raw}/nope.txt -o {out}", "nope.txt: input file not found"),
    # a pipe is read: its mistakes are named at the pipe's name and line
    "fifo_of_pairs": Case("preprocess --train {fifo} -o {out}", "{fifo}:1: line has 2 fields", fifo=b"a\tb\nb\tc\n"),
    "fifo_config_with_an_unknown_key": Case("train {fifo} --run-dir {out}", "unknown config key 'training.nope'",
                                            fifo=b"training:\n  nope: 1\n"),
}
HINTS = {
    "two_columns_need_pairs": Case("preprocess --train {pairs} -o {out}", "lines 1-3 all have 2 fields: a graph "
                                   "without relations (head, tail lines) needs --pairs", absent="--skip-header"),
    "four_columns_need_columns": Case("preprocess --train {quads} -o {out}", "lines 1-3 all have 4 fields: pick the "
                                      "head, relation and tail columns with --columns (e.g. --columns 0,1,2)",
                                      absent="--skip-header"),
    "a_header_needs_skip_header": Case("preprocess --train {header} -o {out}", "the lines after it have 3 fields: "
                                       "use --skip-header 1 if the file has a header", absent="--pairs"),
    "a_second_header_line": Case("preprocess --train {header2} --skip-header 1 -o {out}",
                                 "use --skip-header 2 if the file has a header", absent="--pairs"),
    "triples_given_pairs": Case("preprocess --train {raw}/train.txt --pairs -o {out}",
                                "3 fields: drop --pairs for head, relation, tail lines, or pick",
                                absent="--skip-header"),
}
REFUSED_BEFORE_WRITING = {
    "plot_epoch_without_a_timeline": Case("plot {run} -o {out} --epoch 9", "epoch 9 has no buffer-state timeline"),
    "plot_epoch_of_a_run_without_buffer": Case("plot {in_memory} -o {out} --epoch 1",
                                               "no epoch of this run has buffer states"),
    # the folders above a new output are made for it, and removed again when it is refused
    "preprocess_refused_into_new_folders": Case("preprocess --train {pairs} -o {out}/new/deep/dataset",
                                                "needs --pairs"),
}
CASES = {**INTERRUPTS, **NOT_FILES, **HINTS, **REFUSED_BEFORE_WRITING}


@pytest.fixture(scope="module")
def places(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("messages")
    assert run_cli(shlex.split(TRAIN) + ["--run-dir", str(tmp / "run")]) == 0
    assert run_cli(["export", str(tmp / "run"), "--checkpoint", "latest", "-o", str(tmp / "export")]) == 0
    assert run_cli(shlex.split(PREPROCESS.format(raw=UMLS_RAW, out=tmp / "dataset"))) == 0
    assert run_cli(["preprocess", "--train", f"{UMLS_RAW}/train.txt", "--valid", f"{UMLS_RAW}/valid.txt", "--test",
                    f"{UMLS_RAW}/test.txt", "-o", str(tmp / "splits"), "--quiet"]) == 0
    files = {"pairs": b"a\tb\nb\tc\nc\ta\n", "quads": b"a\tr\tb\t1\nb\tr\tc\t2\nc\ts\ta\t3\n",
             "header": b"source\ttarget\n" + TRIPLES, "header2": b"# edges\nsource\ttarget\n" + TRIPLES}
    for name, content in files.items():
        (tmp / f"{name}.txt").write_bytes(content)
    in_memory = tmp / "in_memory"  # the run's log without buffer states, as a run without a buffer writes it
    in_memory.mkdir()
    shutil.copy(tmp / "run" / "config.yaml", in_memory)
    records = [json.loads(line) for line in (tmp / "run" / "metrics.jsonl").read_text().splitlines()]
    (in_memory / "metrics.jsonl").write_text("".join(json.dumps({k: v for k, v in r.items() if k != "states"}) + "\n"
                                                     for r in records))
    listener = socket.socket(socket.AF_UNIX)
    listener.bind(str(tmp / "socket"))
    yield {"raw": UMLS_RAW, "run": tmp / "run", "export": tmp / "export", "dataset": tmp / "dataset",
           "splits": tmp / "splits", "socket": tmp / "socket", "in_memory": in_memory,
           **{name: tmp / f"{name}.txt" for name in files}}
    listener.close()


def test_this_file_holds_at_least_twelve_cases():
    assert len(CASES) >= 12


@contextmanager
def fed_fifo(path: Path, data: bytes):
    """A FIFO at ``path`` that a thread writes ``data`` into once a reader opens it; a reader that never came
    is stood in for at the end, so the thread ends."""
    os.mkfifo(path)

    def write():
        try:
            with open(path, "wb") as pipe:
                pipe.write(data)
        except BrokenPipeError:
            pass
    writer = threading.Thread(target=write, daemon=True)
    writer.start()
    try:
        yield path
    finally:
        if writer.is_alive():
            os.close(os.open(path, os.O_RDONLY | os.O_NONBLOCK))
        writer.join(timeout=10)


def snapshot(folder: Path) -> dict[str, object]:
    """Every entry under ``folder``: a file's bytes, else its kind (a FIFO is not read)."""
    return {str(path.relative_to(folder)): path.read_bytes() if path.is_file() and not path.is_symlink()
            else "fifo" if path.is_fifo() else "directory" if path.is_dir() else "other"
            for path in sorted(folder.rglob("*"))}


def interrupt(*args, **kwargs):
    raise KeyboardInterrupt


@contextmanager
def optional_fifo(path: Path, data: bytes | None):
    if data is None:
        yield
    else:
        with fed_fifo(path, data):
            yield


@pytest.mark.parametrize("name", sorted(CASES))
def test_one_message_that_says_the_right_thing(name, places, tmp_path, monkeypatch, capsys):
    case = CASES[name]
    out, fifo = tmp_path / "out", tmp_path / "edges.fifo"
    if case.out_holds:
        shutil.copytree(places[case.out_holds], out)
    if case.interrupt:
        monkeypatch.setattr(case.interrupt, interrupt)
    with optional_fifo(fifo, case.fifo):
        before, run_before = snapshot(tmp_path), snapshot(places["run"])
        code = run_cli(shlex.split(case.command.format(out=out, fifo=fifo, **places)))
        err = capsys.readouterr().err
        assert code == (130 if case.interrupt else 2), err
        assert "Traceback" not in err and len(err.strip().splitlines()) == 1, err
        assert case.message.format(out=out, fifo=fifo, **places) in err, err
        assert not case.absent or case.absent not in err, err
        assert snapshot(tmp_path) == before  # nothing written, nothing half-written, no staging folder left
        assert snapshot(places["run"]) == run_before


def test_a_socket_as_search_space_is_named(places, tmp_path, capsys):
    pytest.importorskip("optuna")  # (tune checks for it first)
    code = run_cli(["tune", "--space", str(places["socket"]), "--trials", "1", "--run-dir", str(tmp_path / "out")])
    err = capsys.readouterr().err
    assert code == 2 and f"{places['socket']}: search space is a socket, not a file" in err, err
    assert "Traceback" not in err and not (tmp_path / "out").exists()


# ---------------------------------------------------------------- what succeeds

def test_a_search_space_from_a_pipe_is_read_once(tmp_path):
    """A space given as a FIFO (or <(...)) is read once, its text kept as written (comments included)."""
    from marius_py.search_space import read_space
    text = b"# lr around the default\ntraining.lr: {low: 0.01, high: 1.0, log: true}\n"
    with fed_fifo(tmp_path / "space", text) as path:
        space = read_space(path)
    assert space.text == text.decode() and [d.key for d in space.dimensions] == ["training.lr"]


def dataset_contents(folder: Path) -> dict[str, object]:
    """A dataset's names, edges and metadata, less where its inputs came from."""
    metadata = json.loads((folder / "metadata.json").read_text())
    metadata.pop("sources")
    with h5py.File(folder / "edges.h5", "r") as edges:
        arrays = {}
        edges.visititems(lambda name, item: arrays.update({name: item[()].tolist()})
                         if isinstance(item, h5py.Dataset) else None)
    return {"files": sorted(p.name for p in folder.iterdir()), "metadata": metadata, "edges": arrays,
            **{name: (folder / name).read_bytes() for name in ("nodes.txt", "relations.txt")}}


@pytest.mark.parametrize("variant", ["split", "three_pipes", "gzip"])
def test_a_pipe_gives_the_dataset_of_its_file(variant, places, tmp_path, capsys):
    """A FIFO is read once into the staging folder (preprocess reads a single input twice), gzip data in it
    recognised by its first bytes; the dataset equals the one of the regular files, and no copy is left."""
    splits = ("train", "valid", "test") if variant == "three_pipes" else ("train",)
    pipes = {split: tmp_path / f"{split}.fifo" for split in splits}
    data = {split: (UMLS_RAW / f"{split}.txt").read_bytes() for split in splits}
    if variant == "gzip":
        data["train"] = gzip.compress(data["train"])
    with fed_fifo(pipes["train"], data["train"]):
        if variant == "three_pipes":
            with fed_fifo(pipes["valid"], data["valid"]), fed_fifo(pipes["test"], data["test"]):
                code = run_cli(["preprocess", "--train", str(pipes["train"]), "--valid", str(pipes["valid"]),
                                "--test", str(pipes["test"]), "-o", str(tmp_path / "out"), "--quiet"])
        else:
            code = run_cli(["preprocess", "--train", str(pipes["train"]), "-o", str(tmp_path / "out"), "--quiet"])
    assert code == 0, capsys.readouterr().err
    regular = places["splits"] if variant == "three_pipes" else places["dataset"]
    assert dataset_contents(tmp_path / "out") == dataset_contents(regular)
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted([*(p.name for p in pipes.values()), "out"])


def test_a_config_from_a_pipe_is_read(places, tmp_path, capsys):
    """plan <(cat config.yaml) plans the tables of that config's dim, as with the file itself."""
    config = b"model:\n  dim: 12\n"
    (tmp_path / "config.yaml").write_bytes(config)

    def table_bytes(*given: str) -> int:
        assert run_cli(["plan", *given, f"dataset.path={places['dataset']}", "training.device=cpu", "--json"]) == 0
        return json.loads(capsys.readouterr().out)["table_bytes"]
    with fed_fifo(tmp_path / "config.fifo", config):
        piped = table_bytes(str(tmp_path / "config.fifo"))
    assert piped == table_bytes(str(tmp_path / "config.yaml")) != table_bytes()


def test_an_interrupt_after_the_dataset_is_in_place_says_so(places, tmp_path, monkeypatch, capsys):
    """Ctrl-C while the replaced dataset is being removed: the new one is complete, and the message says so."""
    from marius_py.storage import durable
    removed = durable.discard_replaced

    def interrupted_removal(old, *args):
        if old.exists():  # (the one replaced, not a stale one checked before)
            raise KeyboardInterrupt
        removed(old, *args)
    shutil.copytree(places["dataset"], tmp_path / "out")
    monkeypatch.setattr(durable, "discard_replaced", interrupted_removal)
    assert run_cli(["preprocess", "--train", f"{UMLS_RAW}/train.txt", "--pairs", "--columns", "0,2", "-o",
                    str(tmp_path / "out"), "--overwrite", "--quiet"]) == 130
    assert f"{tmp_path / 'out'} holds the new dataset, complete" in capsys.readouterr().err
    assert json.loads((tmp_path / "out" / "metadata.json").read_text())["has_relations"] is False


def test_an_export_interrupted_moving_its_files_says_it_is_partial(places, tmp_path, monkeypatch, capsys):
    """Ctrl-C while an export's files move into an earlier export: no export.json, and the message says to
    export again with --overwrite, which then succeeds."""
    out = tmp_path / "out"
    shutil.copytree(places["export"], out)
    monkeypatch.setattr("marius_py.export.fsync_directory", interrupt)  # (first called once export.json is gone)
    assert run_cli(["export", str(places["run"]), "--checkpoint", "latest", "-o", str(out), "--overwrite"]) == 130
    assert (f"export interrupted: {out} holds a partial export (no export.json): run it again with --overwrite; "
            f"the run is unchanged") in capsys.readouterr().err
    monkeypatch.undo()
    assert run_cli(["export", str(places["run"]), "--checkpoint", "latest", "-o", str(out), "--overwrite"]) == 0
    assert snapshot(out).keys() == snapshot(places["export"]).keys()
