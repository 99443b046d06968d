"""Issue 36's corpus, input files and configs: every bad input gets one clean error (exit status 2, the
file and line, what was expected, no traceback, no output left behind), and every legitimate variant
(CRLF, a BOM, a missing last newline, whitespace around names...) is read with the right counts.

``CASES`` (name -> case) holds every case of this file, for the meta-test counting the corpus."""

from __future__ import annotations

import gzip
import json
import os
import shlex
import socket
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from marius_py.config_loading import load_config
from marius_py.dataset import Dataset
from test_bad_input_corpus import UMLS_RAW, run_cli

GOOD = b"a\tr\tb\nb\tr\tc\nc\ts\ta\n"  # 3 nodes, 2 relations, 3 edges


def lines(*rows: str, newline: str = "\n") -> bytes:
    return "".join(row + newline for row in rows).encode("utf-8")


# ---------------------------------------------------------------- edge files

@dataclass
class FileError:
    files: dict[str, bytes]  # name -> content in the input folder; train.txt is --train
    where: str | None  # "file:line" the message names (None: the file alone)
    fragment: str  # the problem, in the message
    args: str = ""  # more preprocess arguments ({inp}: the input folder)
    absent: str = ""  # a misleading hint the message must not give


@dataclass
class FileAccepted:
    files: dict[str, bytes]
    counts: tuple[int, int, int, int, int]  # nodes, relations, train, valid, test
    args: str = "--split 0,0"
    nodes: set[str] | None = None  # the node names, where they matter


FILE_ERRORS = {
    "latin1_bytes": FileError({"train.txt": GOOD + "café\tr\ta\n".encode("latin-1")}, "train.txt:4",
                              "invalid UTF-8 byte 0xe9", absent="skip-header"),
    "utf16_with_bom": FileError({"train.txt": "a\tr\tb\n".encode("utf-16")}, "train.txt:1",
                                "UTF-16 byte-order mark"),
    "utf16_without_bom": FileError({"train.txt": "a\tr\tb\n".encode("utf-16-le")}, "train.txt:1", "NUL byte"),
    "nul_in_a_name": FileError({"train.txt": GOOD + b"c\x00d\tr\ta\n"}, "train.txt:4", "NUL byte at byte 2"),
    "cr_only_line_endings": FileError({"train.txt": GOOD.replace(b"\n", b"\r")}, "train.txt:1",
                                      "carriage return (CR) inside the line", absent="skip-header"),
    "cr_inside_a_crlf_line": FileError({"train.txt": b"a\tr\tb\r\nx\ry\tr\tb\r\n"}, "train.txt:2",
                                       "carriage return"),
    "gzip_data_without_gz_name": FileError({"train.txt": gzip.compress(GOOD)}, "train.txt:1",
                                           "gzip-compressed but its name does not end in .gz"),
    "binary_line_over_a_mebibyte": FileError({"train.txt": GOOD + b"x" * ((1 << 20) + 10)}, "train.txt:4",
                                             "line longer than 1 MiB"),
    "whitespace_only_relation": FileError({"train.txt": GOOD + b"a\t  \tb\n"}, "train.txt:4",
                                          "empty name (relation, after stripping surrounding whitespace)"),
    "nbsp_only_head": FileError({"train.txt": GOOD + "\u00a0\tr\tb\n".encode()}, "train.txt:4",
                                "empty name (head"),
    "quoted_csv_field_on_line_1": FileError({"train.txt": b'a,"r, x",b\nb,r,c\n'}, "train.txt:1",
                                            "quotes are not interpreted", args="--delimiter ,",
                                            absent="skip-header"),
    "quoted_tsv_field_later": FileError({"train.txt": GOOD + b'"a\tb"\tr\tc\n'}, "train.txt:4",
                                        "quotes are not interpreted"),
    "two_trailing_tabs_on_line_1": FileError({"train.txt": b"a\tr\tb\t\t\n" + GOOD}, "train.txt:1",
                                             "ends with 2 empty fields", absent="skip-header"),
    "header_of_another_width": FileError({"train.txt": b"source\ttarget\n" + GOOD}, "train.txt:1",
                                         "use --skip-header 1 if the file has a header"),
    "short_line_mid_file_no_header_hint": FileError({"train.txt": GOOD + b"a\tb\n"}, "train.txt:4",
                                                    "line has 2 fields", absent="skip-header"),
    "too_many_columns": FileError({"train.txt": GOOD + b"a\tr\tb\tx\n"}, "train.txt:4", "line has 4 fields"),
    "semicolons_given_tabs": FileError({"train.txt": b"a;r;b\n"}, "train.txt:1",
                                       "looks semicolon-separated: set --delimiter"),
    "whitespace_line_between_edges": FileError({"train.txt": b"a\tr\tb\n \t \nb\tr\tc\n"}, "train.txt:2",
                                               "blank line between edges"),
    "only_a_bom": FileError({"train.txt": b"\xef\xbb\xbf"}, None, "no edges in input file"),
    "only_whitespace_lines": FileError({"train.txt": b"  \n\t\n\r\n"}, None, "no edges in input file"),
    "nul_in_valid_file": FileError({"train.txt": GOOD, "valid.txt": b"a\tr\x00\tc\n", "test.txt": GOOD},
                                   "valid.txt:1", "NUL byte",
                                   args="--valid {inp}/valid.txt --test {inp}/test.txt"),
    "unseen_with_random_split": FileError({"train.txt": GOOD}, "command line",
                                          "--unseen error applies only to given --valid/--test files",
                                          args="--unseen error"),
}

FILE_ACCEPTED = {
    "crlf": FileAccepted({"train.txt": GOOD.replace(b"\n", b"\r\n")}, (3, 2, 3, 0, 0), nodes={"a", "b", "c"}),
    "utf8_bom": FileAccepted({"train.txt": b"\xef\xbb\xbf" + GOOD}, (3, 2, 3, 0, 0), nodes={"a", "b", "c"}),
    "no_newline_at_the_end": FileAccepted({"train.txt": GOOD.rstrip(b"\n")}, (3, 2, 3, 0, 0)),
    "crlf_bom_gz_trailing_blank_lines": FileAccepted(
        {"train.txt.gz": gzip.compress(b"\xef\xbb\xbf" + GOOD.replace(b"\n", b"\r\n") + b"\r\n \r\n")},
        (3, 2, 3, 0, 0), args="--split 0,0 --train {inp}/train.txt.gz", nodes={"a", "b", "c"}),
    "doubled_cr_line_endings": FileAccepted({"train.txt": GOOD.replace(b"\n", b"\r\r\n")}, (3, 2, 3, 0, 0),
                                            nodes={"a", "b", "c"}),
    "trailing_space_is_one_node": FileAccepted({"train.txt": b"alga \tr\tb\nalga\tr\tc\n b\t r \tc\t\n"},
                                               (3, 1, 3, 0, 0), nodes={"alga", "b", "c"}),
    "unicode_whitespace_around_names": FileAccepted({"train.txt": "alga\u00a0\tr\tb\n\u3000alga\tr\tc\n".encode()},
                                                    (3, 1, 2, 0, 0), nodes={"alga", "b", "c"}),
    "spaces_around_csv_fields": FileAccepted({"train.txt": b"a , r , b\nb,r,c\n"}, (3, 1, 2, 0, 0),
                                             args="--split 0,0 --delimiter ,", nodes={"a", "b", "c"}),
    "trailing_tab_on_every_line": FileAccepted({"train.txt": GOOD.replace(b"\n", b"\t\n")}, (3, 2, 3, 0, 0)),
    "trailing_comma_on_some_lines": FileAccepted({"train.txt": b"a,r,b,\nb,r,c\n"}, (3, 1, 2, 0, 0),
                                                 args="--split 0,0 --delimiter ,"),
    "spaces_inside_names_kept": FileAccepted({"train.txt": b"new york\tr\tsan jose\nsan jose\tr\tnew york\n"},
                                             (2, 1, 2, 0, 0), nodes={"new york", "san jose"}),
    "quotes_kept_verbatim": FileAccepted({"train.txt": b'"a","r","b"\n"b","r","a"\n'}, (2, 1, 2, 0, 0),
                                         args="--split 0,0 --delimiter ,", nodes={'"a"', '"b"'}),
    "huge_and_negative_numeric_ids": FileAccepted(
        {"train.txt": b"99999999999999999999999999\t0\t-5\n-5\t-1\t00\n0\t0\t99999999999999999999999999\n"},
        (4, 2, 3, 0, 0), nodes={"99999999999999999999999999", "-5", "00", "0"}),
    "single_edge_split_lands_in_train": FileAccepted({"train.txt": b"a\tr\tb\n"}, (2, 1, 1, 0, 0),
                                                     args="--split 0.5,0.45 --seed 3"),
}


def _write_inputs(inp: Path, files: dict[str, bytes]) -> None:
    inp.mkdir()
    for name, content in files.items():
        (inp / name).write_bytes(content)


def _preprocess_args(inp: Path, out: Path, args: str) -> list[str]:
    extra = shlex.split(args.format(inp=inp))
    train = [] if "--train" in extra else ["--train", str(inp / "train.txt")]
    return ["preprocess", *train, *extra, "-o", str(out), "--quiet"]


def assert_one_clean_error(code: int, err: str, where: str, fragment: str, absent: str = "") -> None:
    assert code == 2, err
    assert "Traceback" not in err and len(err.strip().splitlines()) == 1, err
    assert f"{where}" in err and fragment in err and "expected" in err, err
    assert not absent or absent not in err, err


def assert_nothing_left(folder: Path) -> None:
    assert not (folder / "out").exists()
    assert [p.name for p in folder.iterdir() if p.name.startswith(".")] == []  # no staging


@pytest.mark.parametrize("name", sorted(FILE_ERRORS))
def test_bad_edge_file(name, tmp_path, capsys):
    case = FILE_ERRORS[name]
    _write_inputs(tmp_path / "in", case.files)
    code = run_cli(_preprocess_args(tmp_path / "in", tmp_path / "out", case.args))
    where = case.where if case.where in (None, "command line") else f"{tmp_path / 'in' / case.where}: "
    assert_one_clean_error(code, capsys.readouterr().err, where or str(tmp_path / "in"), case.fragment,
                           case.absent)
    assert_nothing_left(tmp_path)


@pytest.mark.parametrize("name", sorted(FILE_ACCEPTED))
def test_legitimate_edge_file(name, tmp_path, capsys):
    case = FILE_ACCEPTED[name]
    _write_inputs(tmp_path / "in", case.files)
    assert run_cli(_preprocess_args(tmp_path / "in", tmp_path / "out", case.args)) == 0, capsys.readouterr().err
    dataset = Dataset(tmp_path / "out")
    meta = dataset.metadata
    assert (meta.num_nodes, meta.num_relations, meta.num_train, meta.num_valid, meta.num_test) == case.counts
    assert len(dataset.train) == meta.num_train
    if case.nodes is not None:
        assert set(dataset.node_names) == case.nodes
    assert not any(name != name.strip() or not name for name in dataset.node_names + dataset.relation_names)


# ---------------------------------------------------------------- configs

@dataclass
class ConfigError:
    text: bytes
    line: int | None  # the line the message names (None: the file alone)
    fragment: str


@dataclass
class OverrideError:
    overrides: list[str]
    fragment: str


@dataclass
class ConfigAccepted:
    text: bytes
    values: dict = field(default_factory=dict)  # section.key -> value after loading


def yaml_text(text: str) -> bytes:
    return text.encode("utf-8")


CONFIG_ERRORS = {
    "duplicate_key": ConfigError(yaml_text("training:\n  lr: 0.1\n  epochs: 2\n  lr: 0.2\n"), 4,
                                 "duplicate key 'lr' (first on line 2)"),
    "duplicate_section": ConfigError(yaml_text("training:\n  lr: 0.1\nmodel:\n  dim: 8\ntraining:\n  epochs: 2\n"),
                                     5, "duplicate key 'training' (first on line 1)"),
    "duplicate_key_in_flow_mapping": ConfigError(yaml_text("model: {dim: 8, dim: 16}\n"), 1,
                                                 "duplicate key 'dim'"),
    "infinite_lr": ConfigError(yaml_text("training:\n  lr: .inf\n"), 2, "training.lr: expected a finite number"),
    "nan_margin": ConfigError(yaml_text("model:\n  loss: margin\n  margin: .nan\n"), 3,
                              "model.margin: expected a finite number"),
    "minus_infinite_reg_weight": ConfigError(yaml_text("model:\n  reg_weight: -.inf\n"), 2,
                                             "model.reg_weight: expected a finite number"),
    "inf_as_a_string": ConfigError(yaml_text("distributed:\n  timeout_seconds: inf\n"), 2,
                                   "distributed.timeout_seconds: expected a finite number"),
    "overflowing_float": ConfigError(yaml_text("training:\n  checkpoint_interval: 1e999\n"), 2,
                                     "training.checkpoint_interval: expected a finite number"),
    "infinite_int": ConfigError(yaml_text("training:\n  epochs: .inf\n"), 2, "training.epochs: expected int, got inf"),
    "bool_for_int": ConfigError(yaml_text("training:\n  epochs: true\n"), 2, "training.epochs: expected int"),
    "list_for_str": ConfigError(yaml_text("training:\n  device: [cpu]\n"), 2, "training.device: expected str"),
    "float_for_int": ConfigError(yaml_text("model:\n  dim: 8.5\n"), 2, "model.dim: expected int, got 8.5"),
    "unknown_key_named_with_line": ConfigError(yaml_text("training:\n  lr: 0.1\n  nope: 1\n"), 3,
                                               "unknown config key 'training.nope'"),
    "config_empty_file": ConfigError(b"", None, "config file is empty"),
    "config_only_comments": ConfigError(yaml_text("# training:\n#   lr: 0.1\n"), None, "config file is empty"),
    "config_is_a_list": ConfigError(yaml_text("- training\n- model\n"), 1, "config is a list, not a mapping"),
    "config_is_a_scalar": ConfigError(yaml_text("# a comment\n42\n"), 2, "config is a number, not a mapping"),
    "section_is_a_list": ConfigError(yaml_text("model:\n  dim: 8\ntraining:\n  - lr: 0.1\n"), 3,
                                     "config section 'training' is a list, not a mapping"),
    "section_is_a_scalar": ConfigError(yaml_text("training: fast\n"), 1,
                                       "config section 'training' is a string, not a mapping"),
    "dotted_key_at_the_top": ConfigError(yaml_text("training.lr: 0.1\n"), 1,
                                         "nested sections: 'training:' and under it '  lr: ...'"),
    "key_nested_too_deep": ConfigError(yaml_text("training:\n  lr:\n    value: 0.1\n"), 2,
                                       "training.lr: expected float, got {'value': 0.1}"),
    "config_latin1_bytes": ConfigError(b"training:\n  lr: 0.1\ndataset:\n  path: caf\xe9\n", 4,
                                       "not UTF-8: byte 0xe9"),
    "config_nul_byte": ConfigError(b"training:\n  lr: 0.1\x00\n", 2, "character #x0000"),
    "two_documents": ConfigError(yaml_text("training: {lr: 0.1}\n---\nmodel: {dim: 8}\n"), 2,
                                 "but found another document"),
    "nested_ten_thousand_deep": ConfigError(yaml_text("[" * 10000 + "]" * 10000), None, "nested too deeply"),
    "tab_indentation": ConfigError(yaml_text("training:\n\tlr: 0.1\n"), 2, "not valid YAML"),
}

OVERRIDE_ERRORS = {
    "override_lr_inf": OverrideError(["training.lr=inf"], "training.lr: expected a finite number, got inf"),
    "override_lr_nan": OverrideError(["training.lr=nan"], "training.lr: expected a finite number, got nan"),
    "override_timeout_overflow": OverrideError(["distributed.timeout_seconds=1e400"],
                                               "distributed.timeout_seconds: expected a finite number"),
    "override_epochs_inf": OverrideError(["training.epochs=.inf"], "training.epochs: expected int, got inf"),
    "override_init_scale_nan": OverrideError(["model.init_scale=.nan"],
                                             "model.init_scale: expected a finite number"),
    "override_removed_negative_cache": OverrideError(["storage.negative_cache=0.1"],
                                                     "storage.negative_cache=0.1: storage.negative_cache was removed"),
}

CONFIG_ACCEPTED = {
    # an earlier run's config.yaml names the removed negative-cache keys, off: it still resumes
    "config_of_an_earlier_run_with_removed_keys_off": ConfigAccepted(yaml_text(
        "storage:\n  negative_cache: 0.0\n  negative_cache_refresh: epoch\n  negative_cache_gradients: defer\n"
        "  negative_cache_draws: partitions\n  lookahead: 3\n"), {"storage.lookahead": 3}),
    "config_bom_and_crlf": ConfigAccepted(b"\xef\xbb\xbftraining:\r\n  lr: 0.3\r\n", {"training.lr": 0.3}),
    "config_utf16_with_bom": ConfigAccepted("training:\n  lr: 0.3\nmodel:\n  dim: 8\n".encode("utf-16"),
                                            {"training.lr": 0.3, "model.dim": 8}),
    "config_empty_section": ConfigAccepted(yaml_text("training:\nmodel:\n  dim: 8\n"),
                                           {"training.lr": 0.1, "model.dim": 8}),
    "config_explicit_empty_mapping": ConfigAccepted(yaml_text("{}\n"), {"model.dim": 256}),
    "config_merge_key_then_override": ConfigAccepted(  # '<<' merges defaults that keys may override
        yaml_text("training:\n  <<: {lr: 0.2, epochs: 3}\n  lr: 0.05\n"), {"training.lr": 0.05, "training.epochs": 3}),
}


@pytest.mark.parametrize("name", sorted(CONFIG_ERRORS))
def test_bad_config_file(name, tmp_path, capsys):
    case = CONFIG_ERRORS[name]
    config = tmp_path / "bad.yaml"
    config.write_bytes(case.text)
    code = run_cli(["train", str(config), "--run-dir", str(tmp_path / "out")])
    where = f"{config}:{case.line}: " if case.line is not None else f"{config}: "
    assert_one_clean_error(code, capsys.readouterr().err, where, case.fragment)
    assert not (tmp_path / "out").exists()


@pytest.mark.parametrize("name", sorted(OVERRIDE_ERRORS))
def test_bad_override(name, tmp_path, capsys):
    case = OVERRIDE_ERRORS[name]
    code = run_cli(["train", *case.overrides, "--run-dir", str(tmp_path / "out")])
    assert_one_clean_error(code, capsys.readouterr().err, "command line: ", case.fragment)
    assert not (tmp_path / "out").exists()


@pytest.mark.parametrize("name", sorted(CONFIG_ACCEPTED))
def test_legitimate_config(name, tmp_path):
    case = CONFIG_ACCEPTED[name]
    (tmp_path / "ok.yaml").write_bytes(case.text)
    config = load_config(tmp_path / "ok.yaml")
    for dotted, value in case.values.items():
        section, key = dotted.split(".")
        assert getattr(getattr(config, section), key) == value, dotted


# ---------------------------------------------------------------- places: outputs, cache, staging

def output_under_a_file(tmp_path, monkeypatch, capsys):
    """-o PATH under a regular file: one error naming the path and the file in the way."""
    (tmp_path / "in").mkdir()
    (tmp_path / "in" / "train.txt").write_bytes(GOOD)
    (tmp_path / "a-file").write_text("keep me")
    for out in (tmp_path / "a-file" / "out", tmp_path / "a-file" / "deeper" / "out"):
        code = run_cli(["preprocess", "--train", str(tmp_path / "in" / "train.txt"), "-o", str(out), "--quiet"])
        assert_one_clean_error(code, capsys.readouterr().err, f"{out}: cannot create the output directory",
                               f"{tmp_path / 'a-file'} is a file, not a directory")
    assert (tmp_path / "a-file").read_text() == "keep me"


def output_is_a_file(tmp_path, monkeypatch, capsys):
    (tmp_path / "train.txt").write_bytes(GOOD)
    (tmp_path / "out").write_text("keep me")
    code = run_cli(["preprocess", "--train", str(tmp_path / "train.txt"), "-o", str(tmp_path / "out"), "--quiet"])
    assert_one_clean_error(code, capsys.readouterr().err, f"{tmp_path / 'out'}: ",
                           "output path exists and is not a directory")
    assert (tmp_path / "out").read_text() == "keep me"


def _train_on_raw_umls(tmp_path) -> int:
    return run_cli(["train", f"dataset.path={UMLS_RAW}", "training.device=cpu", "model.dim=8",
                    "training.epochs=1", "--run-dir", str(tmp_path / "run"), "--quiet"])


def cache_under_a_file(tmp_path, monkeypatch, capsys):
    """$MARIUS_PY_CACHE under a regular file: the raw dataset cannot be preprocessed into it."""
    (tmp_path / "a-file").write_text("keep me")
    cache = tmp_path / "a-file" / "cache"
    monkeypatch.setenv("MARIUS_PY_CACHE", str(cache))
    assert_one_clean_error(_train_on_raw_umls(tmp_path), capsys.readouterr().err, f"MARIUS_PY_CACHE={cache}: ",
                           f"{tmp_path / 'a-file'} is a file, not a directory")
    assert not (tmp_path / "run").exists() and (tmp_path / "a-file").read_text() == "keep me"


def cache_is_a_file(tmp_path, monkeypatch, capsys):
    (tmp_path / "cache").write_text("keep me")
    monkeypatch.setenv("MARIUS_PY_CACHE", str(tmp_path / "cache"))
    assert_one_clean_error(_train_on_raw_umls(tmp_path), capsys.readouterr().err,
                           f"MARIUS_PY_CACHE={tmp_path / 'cache'}: cannot write", "is a file, not a directory")
    assert not (tmp_path / "run").exists()


def cache_variable_empty_or_with_tilde(tmp_path, monkeypatch, capsys):
    """An empty $MARIUS_PY_CACHE is unset (not the working directory); a leading ~ is the home."""
    from marius_py.dataset_cache import cache_dir
    monkeypatch.setenv("HOME", str(tmp_path))
    monkeypatch.setenv("MARIUS_PY_CACHE", "")
    assert cache_dir() == tmp_path / ".cache" / "marius-py"
    monkeypatch.setenv("MARIUS_PY_CACHE", "~/elsewhere")
    assert cache_dir() == tmp_path / "elsewhere"


def _dead_pid() -> int:
    child = subprocess.Popen(["true"])
    child.wait()
    return child.pid


def abandoned_staging_is_removed(tmp_path, monkeypatch, capsys):
    """A killed preprocess leaves .OUT.tmp-HOST-PID: the next preprocess to OUT removes it (and the older
    .OUT.tmp-PID form, and another host's after a week untouched), nothing that may be in use or not ours."""
    (tmp_path / "train.txt").write_bytes(GOOD)
    host, dead, alive = socket.gethostname(), _dead_pid(), os.getppid()
    week_old = time.time() - 8 * 86400
    made = {}
    for name in (f".out.tmp-{host}-{dead}", f".out.old-{host}-{dead}", f".out.tmp-{dead}",
                 f".out.tmp-{host}-{alive}", ".out.tmp-otherhost-1", ".out.tmp-oldhost-1",
                 f".other.tmp-{host}-{dead}", f".out.tmp-{host}-x{dead}"):
        made[name] = tmp_path / name
        made[name].mkdir()
        (made[name] / "edges.h5").write_bytes(b"half-written")
    for path in (made[".out.tmp-oldhost-1"], made[".out.tmp-oldhost-1"] / "edges.h5"):
        os.utime(path, (week_old, week_old))
    assert run_cli(["preprocess", "--train", str(tmp_path / "train.txt"), "-o", str(tmp_path / "out"),
                    "--quiet"]) == 0
    left = sorted(p.name for p in tmp_path.iterdir() if p.name.startswith("."))
    assert left == sorted([f".out.tmp-{host}-{alive}", ".out.tmp-otherhost-1", f".other.tmp-{host}-{dead}",
                           f".out.tmp-{host}-x{dead}"])


def split_moves_unseen_edges_into_train(tmp_path, monkeypatch, capsys):
    """UMLS as one file, --split 0.1,0.1 --seed 0: two relations occur only in edges drawn for valid/test
    (they were lost before). Those edges move into train, counted in the summary and the metadata; no
    edge, node or relation is lost, and valid/test use only train's names."""
    all_edges = b"".join((UMLS_RAW / f"{split}.txt").read_bytes() for split in ("train", "valid", "test"))
    (tmp_path / "all.txt").write_bytes(all_edges)
    assert run_cli(["preprocess", "--train", str(tmp_path / "all.txt"), "--split", "0.1,0.1", "-o",
                    str(tmp_path / "out"), "--quiet"]) == 0
    summary = capsys.readouterr().out
    meta = json.loads((tmp_path / "out" / "metadata.json").read_text())
    assert (meta["num_nodes"], meta["num_relations"]) == (135, 46)
    assert meta["num_train"] + meta["num_valid"] + meta["num_test"] == all_edges.count(b"\n") == 6529
    assert (meta["num_moved_valid"], meta["num_moved_test"]) == (1, 2) and meta["unseen_policy"] == "move"
    assert "moved 1 valid and 2 test edges" in summary
    dataset = Dataset(tmp_path / "out")
    train = dataset.train
    for split in (dataset.valid, dataset.test):
        assert set(split[:, 1]) <= set(train[:, 1])
        assert set(split[:, [0, 2]].ravel()) <= set(train[:, [0, 2]].ravel())


def given_valid_keeps_unseen_drop(tmp_path, monkeypatch, capsys):
    """Given valid/test files keep --unseen semantics: drop (counted), not move."""
    (tmp_path / "train.txt").write_bytes(GOOD)
    (tmp_path / "valid.txt").write_bytes(b"a\tr\tc\na\tr\tzz\n")
    (tmp_path / "test.txt").write_bytes(b"a\tnew\tb\n b \t r \t c \n")
    assert run_cli(["preprocess", "--train", str(tmp_path / "train.txt"), "--valid", str(tmp_path / "valid.txt"),
                    "--test", str(tmp_path / "test.txt"), "-o", str(tmp_path / "out"), "--quiet"]) == 0
    assert "dropped 1 valid and 1 test edges" in capsys.readouterr().out
    meta = Dataset(tmp_path / "out").metadata
    assert (meta.num_train, meta.num_valid, meta.num_test, meta.unseen_policy) == (3, 1, 1, "drop")
    assert meta.num_moved_valid == meta.num_moved_test == 0


def corrupt_dataset_metadata(tmp_path, monkeypatch, capsys):
    """A dataset whose metadata.json is truncated or lacks counts: one error naming the file."""
    (tmp_path / "train.txt").write_bytes(GOOD)
    assert run_cli(["preprocess", "--train", str(tmp_path / "train.txt"), "-o", str(tmp_path / "d"), "--quiet"]) == 0
    metadata = tmp_path / "d" / "metadata.json"
    for broken in (metadata.read_text()[:40], "[1, 2]", '{"num_nodes": 3}'):
        metadata.write_text(broken)
        capsys.readouterr()
        assert_one_clean_error(run_cli(["info", str(tmp_path / "d")]), capsys.readouterr().err, f"{metadata}: ",
                               "unreadable dataset metadata")


SPECIAL = {
    "corrupt_dataset_metadata": corrupt_dataset_metadata,
    "output_under_a_file": output_under_a_file,
    "output_is_a_file": output_is_a_file,
    "cache_under_a_file": cache_under_a_file,
    "cache_is_a_file": cache_is_a_file,
    "cache_variable_empty_or_with_tilde": cache_variable_empty_or_with_tilde,
    "abandoned_staging_is_removed": abandoned_staging_is_removed,
    "split_moves_unseen_edges_into_train": split_moves_unseen_edges_into_train,
    "given_valid_keeps_unseen_drop": given_valid_keeps_unseen_drop,
}


@pytest.mark.parametrize("name", sorted(SPECIAL))
def test_special_case(name, tmp_path, monkeypatch, capsys):
    SPECIAL[name](tmp_path, monkeypatch, capsys)


KILLED_PREPROCESS = """
import sys, time
import marius_py.preprocess as module

def hang(staging, *args, **kwargs):
    (staging / "nodes.txt").write_text("half-written")
    print(staging, flush=True)
    time.sleep(120)

module._build_dataset = hang
module.preprocess(sys.argv[1], sys.argv[2], progress=False)
"""


@pytest.mark.slow
def test_a_killed_preprocess_leaves_nothing_once_the_next_runs(tmp_path, capsys):
    """A real SIGKILL mid-build leaves its staging folder; the next preprocess to the same output removes it."""
    (tmp_path / "train.txt").write_bytes(GOOD)
    child = subprocess.Popen([sys.executable, "-c", KILLED_PREPROCESS, str(tmp_path / "out"),
                              str(tmp_path / "train.txt")], stdout=subprocess.PIPE, text=True)
    staging = Path(child.stdout.readline().strip())
    child.kill()
    child.wait()
    assert staging.parent == tmp_path and (staging / "nodes.txt").exists()
    assert run_cli(["preprocess", "--train", str(tmp_path / "train.txt"), "-o", str(tmp_path / "out"),
                    "--quiet"]) == 0
    assert sorted(p.name for p in tmp_path.iterdir()) == ["out", "train.txt"]


def _build_staged(out: Path, text: str, during=None) -> None:
    from marius_py.storage.durable import staged_directory, staging_for
    staging = staging_for(out)
    staging.mkdir()
    with staged_directory(out, staging):
        (staging / "data.bin").write_text(text)
        if during:
            during()
        (staging / "metadata.json").write_text("{}")


def test_staged_directory_replaces_only_an_empty_directory_or_an_earlier_result(tmp_path):
    """storage.durable.staged_directory had deleted any existing output: a folder holding something but no
    metadata.json is refused by name (before the build, and after it if one appeared meanwhile), never
    removed; an empty one or an earlier result is replaced."""
    from marius_py.errors import MariusInputError
    out = tmp_path / "out"
    out.mkdir()
    (out / "notes.txt").write_text("the user's")
    with pytest.raises(MariusInputError, match=f"{out}: output directory is not empty and holds no metadata.json"):
        _build_staged(out, "new")
    assert os.listdir(out) == ["notes.txt"] and os.listdir(tmp_path) == ["out"]
    (out / "notes.txt").unlink()
    _build_staged(out, "first")  # an empty directory
    _build_staged(out, "second")  # an earlier result
    assert (out / "data.bin").read_text() == "second" and os.listdir(tmp_path) == ["out"]

    late = tmp_path / "late"

    def user_makes_it():
        late.mkdir()
        (late / "notes.txt").write_text("the user's")
    with pytest.raises(MariusInputError, match="holds no metadata.json"):
        _build_staged(late, "new", during=user_makes_it)
    assert os.listdir(late) == ["notes.txt"] and sorted(os.listdir(tmp_path)) == ["late", "out"]


def test_a_replacement_cut_between_its_renames_is_undone(tmp_path, monkeypatch):
    """The earlier result waits in .NAME.old-HOST-PID until the new one is in place. Interrupted at the
    second rename, it goes straight back; killed there (the old folder left by a dead process, the output
    missing), the next staging_for puts it back instead of removing it as abandoned."""
    import marius_py.storage.durable as durable
    out = tmp_path / "out"
    _build_staged(out, "earlier")
    replace = os.replace

    def cut(source, target):
        if Path(target) == out and ".tmp-" in Path(source).name:
            raise KeyboardInterrupt
        return replace(source, target)
    monkeypatch.setattr(os, "replace", cut)
    with pytest.raises(KeyboardInterrupt):
        _build_staged(out, "new")
    monkeypatch.undo()
    assert (out / "data.bin").read_text() == "earlier" and os.listdir(tmp_path) == ["out"]

    dead = _dead_pid()
    os.replace(out, tmp_path / f".out.old-{socket.gethostname()}-{dead}")
    durable.staging_for(out)
    assert (out / "data.bin").read_text() == "earlier" and os.listdir(tmp_path) == ["out"]


def test_freebase_shape_replaces_only_its_own_earlier_output(tmp_path):
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "bench"))
    from freebase_shape import generate, parse_args

    from marius_py.errors import MariusInputError
    small = ["--nodes", "200", "--relations", "5", "--train", "2000", "--valid", "50", "--test", "50",
             "--partitions", "2", "--chunk", "1000", "--workers", "1"]
    (tmp_path / "train.txt").write_bytes(GOOD)
    assert run_cli(["preprocess", "--train", str(tmp_path / "train.txt"), "-o", str(tmp_path / "real"),
                    "--quiet"]) == 0
    before = {p.name: p.read_bytes() for p in (tmp_path / "real").iterdir()}
    with pytest.raises(MariusInputError, match="holds a dataset that bench/freebase_shape.py did not write"):
        generate(parse_args(["--out", str(tmp_path / "real"), *small]), log=lambda _: None)
    assert {p.name: p.read_bytes() for p in (tmp_path / "real").iterdir()} == before
    generate(parse_args(["--out", str(tmp_path / "gen"), *small]), log=lambda _: None)
    generate(parse_args(["--out", str(tmp_path / "gen"), *small, "--seed", "1"]), log=lambda _: None)
    assert json.loads((tmp_path / "gen" / "metadata.json").read_text())["seed"] == 1
    assert sorted(os.listdir(tmp_path)) == ["gen", "real", "train.txt"]


CASES = {}
for table in (FILE_ERRORS, FILE_ACCEPTED, CONFIG_ERRORS, OVERRIDE_ERRORS, CONFIG_ACCEPTED, SPECIAL):
    assert not set(table) & set(CASES), set(table) & set(CASES)
    CASES.update(table)


def test_this_file_adds_at_least_25_cases():
    assert len(CASES) >= 25
