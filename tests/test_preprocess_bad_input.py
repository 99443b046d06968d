"""A corpus of bad inputs: each one gets a MariusInputError naming the file, the line
and what was expected, and leaves no output directory (nor a staging one) behind."""

from __future__ import annotations

import gzip
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from marius_py.dataset import Dataset
from marius_py.errors import MariusInputError
from marius_py.preprocess import PreprocessOptions, preprocess

GOOD = ["a\tr\tb", "b\tr\tc", "c\ts\ta", "a\ts\tc"]


@dataclass
class Case:
    files: dict[str, bytes]  # split name -> file content; the file is "<split>.txt"
    bad_file: str | None  # file name the message must contain
    line: int | None  # 1-based line the message must name
    options: dict = field(default_factory=dict)
    contains: str = ""  # another fragment the message must contain
    suffix: str = ".txt"


def text(*lines: str, newline: str = "\n") -> bytes:
    return "".join(line + newline for line in lines).encode("utf-8")


def splits(train: bytes = text(*GOOD), valid: bytes = text("a\tr\tc"),
           test: bytes = text("b\ts\ta")) -> dict[str, bytes]:
    return {"train": train, "valid": valid, "test": test}


CASES = {
    "too_few_fields": Case(splits(train=text("a\tr\tb", "b\tr\tc", "c\ta")), "train.txt", 3,
                           contains="expected 3 tab-separated fields (head, relation, tail)"),
    "too_many_fields": Case(splits(train=text("a\tr\tb\tx")), "train.txt", 1,
                            contains="line has 4 fields"),
    "bad_valid_line": Case(splits(valid=text("a\tr\tb", "a r c")), "valid.txt", 2),
    "wrong_delimiter": Case(splits(), "train.txt", 1, options={"delimiter": ","},
                            contains="comma-separated fields (head, relation, tail); the line "
                                     "looks tab-separated"),
    "pairs_given_triples": Case(splits(), "train.txt", 1, options={"pairs": True},
                                contains="2 tab-separated fields (head, tail)"),
    "too_few_for_columns": Case(splits(train=text("a\tr\tb\tw", "a\tb")), "train.txt", 2,
                                options={"columns": (0, 3, 1)}, contains="at least 4"),
    "empty_name": Case(splits(train=text("a\tr\tb", "a\t\tb")), "train.txt", 2,
                       contains="empty name"),
    "empty_file": Case(splits(train=b""), "train.txt", None, contains="no edges"),
    "empty_test_file": Case(splits(test=b""), "test.txt", None, contains="no edges"),
    "only_blank_lines": Case(splits(train=b"\n\n\r\n"), "train.txt", None, contains="no edges"),
    "only_a_header": Case(splits(train=text("head\trelation\ttail")), "train.txt", None,
                          options={"skip_header": 1}, contains="no edges"),
    "not_utf8": Case(splits(train=text(*GOOD[:3]) + b"caf\xe9\tr\tb\n"), "train.txt", 4,
                     contains="UTF-8"),
    "not_utf8_gz": Case(splits(train=gzip.compress(text(*GOOD) + b"\xff\tr\ta\n"),
                               valid=gzip.compress(text("a\tr\tc")),
                               test=gzip.compress(text("b\ts\ta"))),
                        "train.txt.gz", 5, suffix=".txt.gz", contains="UTF-8"),
    "corrupt_gz": Case(splits(train=gzip.compress(text(*GOOD) * 50)[:-30],
                              valid=gzip.compress(text("a\tr\tc")),
                              test=gzip.compress(text("b\ts\ta"))),
                       "train.txt.gz", None, suffix=".txt.gz", contains="gzip"),
    "header_not_expected": Case(splits(train=text("# head relation tail comment", *GOOD)),
                                "train.txt", 1, contains="--skip-header 1"),
    "blank_line_in_middle": Case(splits(train=text("a\tr\tb", "", "b\tr\tc")), "train.txt", 2,
                                 contains="blank line"),
    "unseen_node_in_valid": Case(splits(valid=text("a\tr\tc", "a\tr\tnowhere")), "valid.txt", 2,
                                 options={"unseen_policy": "error"}, contains="'nowhere'"),
    "unseen_relation_in_test": Case(splits(test=text("a\tr\tc", "b\tr\ta", "a\tnew\tb")),
                                    "test.txt", 3, options={"unseen_policy": "error"},
                                    contains="relation 'new'"),
}


def _write(tmp_path: Path, case: Case) -> dict[str, Path]:
    paths = {}
    for split, content in case.files.items():
        paths[split] = tmp_path / f"{split}{case.suffix}"
        paths[split].write_bytes(content)
    return paths


def assert_clean_failure(tmp_path: Path, error: MariusInputError, file_name: str | None,
                         line: int | None) -> None:
    message = str(error)
    assert "expected" in message
    if file_name is not None:
        assert file_name in message
    if line is not None:
        assert f"{file_name}:{line}: " in message and error.line == line
    assert not (tmp_path / "out").exists()
    assert [p.name for p in tmp_path.iterdir() if p.name.startswith(".")] == []  # no staging


@pytest.mark.parametrize("name", sorted(CASES))
def test_bad_input(tmp_path, name):
    case = CASES[name]
    paths = _write(tmp_path, case)
    with pytest.raises(MariusInputError) as caught:
        preprocess(tmp_path / "out", paths["train"], paths["valid"], paths["test"],
                   PreprocessOptions(**case.options), progress=False)
    assert case.contains in str(caught.value)
    assert_clean_failure(tmp_path, caught.value, case.bad_file, case.line)


def test_crlf_is_accepted(tmp_path):
    """CRLF line endings are not an error: the dataset equals the LF one."""
    crlf = {split: content.replace(b"\n", b"\r\n") for split, content in splits().items()}
    datasets = []
    for name, files in (("lf", splits()), ("crlf", crlf)):
        (tmp_path / name).mkdir()
        paths = _write(tmp_path / name, Case(files, None, None))
        preprocess(tmp_path / f"{name}-out", paths["train"], paths["valid"], paths["test"],
                   progress=False)
        datasets.append(Dataset(tmp_path / f"{name}-out"))
    lf_ds, crlf_ds = datasets
    assert crlf_ds.node_names == lf_ds.node_names
    assert crlf_ds.relation_names == lf_ds.relation_names
    assert sorted(crlf_ds.relation_names) == ["r", "s"]
    assert "\r" not in "".join(crlf_ds.node_names + crlf_ds.relation_names)
    for split in ("train", "valid", "test"):
        assert (crlf_ds.split(split) == lf_ds.split(split)).all()


BAD_OPTIONS = {
    "num_partitions": {"num_partitions": 0},
    "more_partitions_than_nodes": {"num_partitions": 100_000},  # 3 nodes; p x p counts would need 75 GiB
    "fractions_sum": {"split_fractions": (0.6, 0.5)},
    "negative_fraction": {"split_fractions": (-0.1, 0.1)},
    "unseen_policy": {"unseen_policy": "keep"},
    "delimiter": {"delimiter": ""},
    "columns": {"columns": (0, 1)},
    "duplicate_columns": {"columns": (0, 1, 1)},
    "chunk_lines": {"chunk_lines": 0},
    "skip_header": {"skip_header": -1},
}


@pytest.mark.parametrize("name", sorted(BAD_OPTIONS))
def test_bad_options(tmp_path, name):
    paths = _write(tmp_path, Case(splits(), None, None))
    options = BAD_OPTIONS[name]
    with pytest.raises(MariusInputError) as caught:
        preprocess(tmp_path / "out", paths["train"], paths["valid"], paths["test"],
                   PreprocessOptions(**options), progress=False)
    assert next(iter(options)) in str(caught.value)
    assert_clean_failure(tmp_path, caught.value, None, None)


def test_missing_input_file(tmp_path):
    paths = _write(tmp_path, Case(splits(), None, None))
    with pytest.raises(MariusInputError) as caught:
        preprocess(tmp_path / "out", paths["train"], tmp_path / "nope.txt", paths["test"],
                   progress=False)
    assert_clean_failure(tmp_path, caught.value, "nope.txt", None)


def test_valid_without_test(tmp_path):
    paths = _write(tmp_path, Case(splits(), None, None))
    with pytest.raises(MariusInputError) as caught:
        preprocess(tmp_path / "out", paths["train"], paths["valid"], progress=False)
    assert_clean_failure(tmp_path, caught.value, None, None)


def test_bucket_counts_larger_than_memory_are_refused(tmp_path, monkeypatch):
    """Refused before the p x p bucket counts are allocated, with the memory they need."""
    from marius_py import preprocess as module
    monkeypatch.setattr(module, "available_memory", lambda: 100)  # 3 x 3 counts: 216 B
    paths = _write(tmp_path, Case(splits(), None, None))
    with pytest.raises(MariusInputError) as caught:
        preprocess(tmp_path / "out", paths["train"], paths["valid"], paths["test"],
                   PreprocessOptions(num_partitions=3), progress=False)
    assert "3 x 3 bucket counts need" in str(caught.value)
    assert_clean_failure(tmp_path, caught.value, None, None)
