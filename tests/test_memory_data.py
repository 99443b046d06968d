"""Datasets from edges held in memory (marius_py.memory_data): the dataset a text file with the same names gives,
from a list, an array, a DataFrame or a generator; reused from the cache; trained in memory and out of core;
and the bad input, each a MariusInputError naming the split, row and column, with nothing left written."""

from __future__ import annotations

import math
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

import marius_py as mp
from marius_py import memory_data
from marius_py.preprocess import PreprocessOptions, preprocess

UMLS = Path(__file__).parent / "data" / "umls"
SPLITS = ("train", "valid", "test")


def read_triples(path: Path) -> list[tuple[str, ...]]:
    return [tuple(line.split("\t")) for line in path.read_text(encoding="utf-8").splitlines()]


TRIPLES = {split: read_triples(UMLS / f"{split}.txt") for split in SPLITS}


def as_frame(triples, columns=("head", "relation", "tail")):
    pd = pytest.importorskip("pandas")
    return pd.DataFrame(triples, columns=list(columns))


FORMS = {  # how the same triples are given
    "list": lambda triples: triples,
    "str array": np.array,
    "object array": lambda triples: np.array(triples, dtype=object),
    "frame": as_frame,
    "frame, named columns in another order": lambda triples: as_frame(
        [(t, h, r, 1.0) for h, r, t in triples], ("tail", "head", "relation", "weight")),
    "generator": lambda triples: (row for row in triples),
}


@pytest.fixture
def cache(tmp_path, monkeypatch) -> Path:
    """A cache of the test's own (the session's is shared)."""
    monkeypatch.setenv("MARIUS_PY_CACHE", str(tmp_path / "cache"))
    return tmp_path / "cache"


@pytest.fixture(scope="module")
def from_files(tmp_path_factory):
    """UMLS preprocessed from its text files: its three files, and its train file split at random."""
    root = tmp_path_factory.mktemp("from-files")
    given = root / "given"
    preprocess(given, *(UMLS / f"{split}.txt" for split in SPLITS), PreprocessOptions(), progress=False)
    split = root / "split"
    preprocess(split, UMLS / "train.txt", options=PreprocessOptions(seed=3, num_partitions=2), progress=False)
    return {"given": mp.Dataset(given), "split": mp.Dataset(split)}


def assert_same_dataset(dataset: mp.Dataset, expected: mp.Dataset) -> None:
    assert dataset.node_names == expected.node_names
    assert dataset.relation_names == expected.relation_names
    for split in SPLITS:
        np.testing.assert_array_equal(dataset.split(split), expected.split(split))
    assert dataset.identity == expected.identity
    assert dataset.edges.num_partitions == expected.edges.num_partitions
    assert {**vars(dataset.metadata), "sources": {}} == {**vars(expected.metadata), "sources": {}}


@pytest.mark.parametrize("form", FORMS)
def test_every_form_gives_the_dataset_of_the_text_files(form, from_files, tmp_path):
    make = FORMS[form]
    given = mp.Dataset.from_triples(*(make(TRIPLES[split]) for split in SPLITS), directory=tmp_path / "given")
    assert_same_dataset(given, from_files["given"])
    assert given.metadata.sources == {split: "in memory" for split in SPLITS}
    split = mp.Dataset.from_triples(make(TRIPLES["train"]), directory=tmp_path / "split", seed=3, num_partitions=2)
    assert_same_dataset(split, from_files["split"])


def test_load_dataset_takes_the_same_edges(from_files, cache):
    dataset = mp.load_dataset(np.array(TRIPLES["train"]), valid=TRIPLES["valid"], test=TRIPLES["test"])
    assert_same_dataset(dataset, from_files["given"])
    assert dataset.directory.parent == cache / "datasets"


def test_the_cache_finds_the_same_names_again_in_any_form(cache, monkeypatch):
    first = mp.Dataset.from_triples(TRIPLES["train"][:500])
    assert first.directory.parent == cache / "datasets"

    def refuse(*args, **kwargs):
        raise AssertionError("preprocessed again")
    monkeypatch.setattr(memory_data, "preprocess", refuse)
    again = mp.Dataset.from_triples(np.array(TRIPLES["train"][:500], dtype=object))
    assert again.directory == first.directory
    monkeypatch.undo()
    monkeypatch.setenv("MARIUS_PY_CACHE", str(cache))
    other_seed = mp.Dataset.from_triples(TRIPLES["train"][:500], seed=1)
    other_edges = mp.Dataset.from_triples(TRIPLES["train"][:499])
    assert len({first.directory, other_seed.directory, other_edges.directory}) == 3


def test_pairs_give_the_dataset_of_a_text_file_of_pairs(tmp_path):
    pairs = [(head, tail) for head, _, tail in TRIPLES["train"]]
    text = tmp_path / "pairs.txt"
    text.write_text("".join(f"{head}\t{tail}\n" for head, tail in pairs), encoding="utf-8")
    preprocess(tmp_path / "expected", text, options=PreprocessOptions(pairs=True), progress=False)
    expected = mp.Dataset(tmp_path / "expected")
    dataset = mp.Dataset.from_triples(np.array(pairs), directory=tmp_path / "array")
    assert_same_dataset(dataset, expected)
    assert not dataset.metadata.has_relations and dataset.relation_names == ["__edge__"]
    assert_same_dataset(mp.Dataset.from_triples(pairs, directory=tmp_path / "list", pairs=True), expected)


def test_a_frame_of_pairs_is_told_by_its_column_names(tmp_path):
    frame = as_frame([(h, t, 0.5) for h, _, t in TRIPLES["train"]], ("head", "tail", "weight"))
    dataset = mp.Dataset.from_triples(frame, directory=tmp_path / "frame")
    assert not dataset.metadata.has_relations
    counts = dataset.metadata
    assert counts.num_train + counts.num_valid + counts.num_test == len(frame)


def test_names_are_kept_as_given(tmp_path):
    """No whitespace is stripped (a text file's fields are), and NumPy's str names are str names."""
    triples = [(" a", "r", "b "), ("b ", "r", np.str_("c"))]
    dataset = mp.Dataset.from_triples(triples, triples[:1], triples[1:], directory=tmp_path / "d")
    assert sorted(dataset.node_names) == [" a", "b ", "c"]
    assert dataset.node_id(" a") != dataset.node_id("b ")


def test_a_dataset_from_memory_trains_in_memory_and_out_of_core(tmp_path, cache):
    dataset = mp.Dataset.from_triples(TRIPLES["train"], TRIPLES["valid"], TRIPLES["test"])
    common = [f"dataset.path={dataset.directory}", "training.device=cpu", "model.dim=16", "training.epochs=1",
              "training.batch_size=512", "training.num_negatives=64", "training.num_chunks=2"]
    for name, overrides in (("in-memory", []), ("out-of-core", ["storage.num_partitions=4",
                                                                "storage.buffer_capacity=2"])):
        model = mp.train(mp.make_config(None, common + overrides), tmp_path / name, progress=False)
        assert math.isfinite(model.test_metrics["mrr"]) and model.test_metrics["mrr"] > 0, name
        assert model.embedding("alga").shape == (16,)


def test_blocks_stream_a_few_rows_at_a_time():
    """Preprocessing gets the names a block at a time (never the whole array as Python strings)."""
    array = np.array([("h", "r", f"t{i}") for i in range(70_000)])
    edges = memory_data.MemoryEdges(array, "train", "train", None)
    sizes = [len(names[0]) for _, names in edges.blocks(1 << 15, "test", False)]
    assert sizes == [32768, 32768, 4464]


# ---------------------------------------------------------------- bad input

OK = [("a", "r", "b"), ("b", "r", "c")]
LONG = np.array([("h", "r", f"t{i}") for i in range(40_001)], dtype=object)
LONG_BAD = LONG.copy()
LONG_BAD[40_000, 2] = ""

CASES = {  # name -> (call, given the test's places, message fragment)
    "empty_name": (lambda p: mp.Dataset.from_triples(OK + [("a", "", "c")]),
                   "train, row 2, column 1 (relation): empty name"),
    "blank_name": (lambda p: mp.Dataset.from_triples([("a", "r", " ")]), "row 0, column 2 (tail): blank name ' '"),
    "none_name": (lambda p: mp.Dataset.from_triples(OK + [(None, "r", "b")]),
                  "train, row 2, column 0 (head): missing name (None)"),
    "nan_in_an_object_array": (lambda p: mp.Dataset.from_triples(np.array(OK + [("a", "r", math.nan)], dtype=object)),
                               "train, row 2, column 2 (tail): missing name (nan)"),
    "nan_in_a_frame": (lambda p: mp.Dataset.from_triples(as_frame(OK + [("a", None, "c")])),
                       "train, row 2, column 'relation' (relation): missing name"),
    "newline_in_a_name": (lambda p: mp.Dataset.from_triples(OK + [("a\nb", "r", "c")]),
                          "train, row 2, column 0 (head): name 'a\\nb' holds a newline"),
    "tab_in_a_valid_name": (lambda p: mp.Dataset.from_triples(OK, [("a", "r\t1", "b")], OK, directory=p["out"]),
                            "valid, row 0, column 1 (relation): name 'r\\t1' holds a tab"),
    "carriage_return": (lambda p: mp.Dataset.from_triples(OK + [("a", "r", "b\r")]), "holds a carriage return"),
    "nul": (lambda p: mp.Dataset.from_triples(OK, OK, [("a", "r", "b\0")]), "test, row 0, column 2 (tail)"),
    "lone_surrogate": (lambda p: mp.Dataset.from_triples([("a", "r", "b\udc80")]), "is not UTF-8 text"),
    "a_bad_name_in_a_later_block": (lambda p: mp.Dataset.from_triples(LONG_BAD, directory=p["out"]),
                                    "train, row 40000, column 2 (tail): empty name"),
    "int_in_a_list": (lambda p: mp.Dataset.from_triples(OK + [("a", "r", 7)]),
                      "train, row 2, column 2 (tail): name 7 is a int"),
    "int_array": (lambda p: mp.Dataset.from_triples(np.zeros((4, 3), dtype=np.int64)),
                  "train is a ndarray of int64 numbers"),
    "float_array": (lambda p: mp.Dataset.from_triples(np.zeros((4, 3))), "train is a ndarray of float64 numbers"),
    "bytes_array": (lambda p: mp.Dataset.from_triples(np.array([[b"a", b"r", b"b"]])), "train is a ndarray of |S1"),
    "one_dimensional_array": (lambda p: mp.Dataset.from_triples(np.array(["a", "r", "b"])),
                              "train is a 1-D array of shape (3,)"),
    "four_columns": (lambda p: mp.Dataset.from_triples(np.full((2, 4), "a")), "train is a 2-D array of shape (2, 4)"),
    "frame_of_four_unnamed_columns": (lambda p: mp.Dataset.from_triples(as_frame([("a", "r", "b", "c")], "wxyz")),
                                      "train is a DataFrame with 4 columns ('w', 'x', 'y', 'z')"),
    "frame_with_two_head_columns": (
        lambda p: mp.Dataset.from_triples(as_frame([("a", "r", "b", "c")], ("head", "relation", "tail", "head"))),
        "train is a DataFrame with two columns named 'head'"),
    "a_line_of_text_for_a_row": (lambda p: mp.Dataset.from_triples(["a\tr\tb"]), "train, row 0: a str"),
    "a_row_too_long": (lambda p: mp.Dataset.from_triples(OK + [("a", "r", "b", "c")]), "train, row 2: 4 items"),
    "no_edges": (lambda p: mp.Dataset.from_triples([]), "train holds no edges"),
    "a_dict": (lambda p: mp.Dataset.from_triples({"a": "b"}), "train is a dict"),
    "pairs_asked_of_triples": (lambda p: mp.Dataset.from_triples(np.array(OK), pairs=True),
                               "train has 3 columns (expected 2 columns (head, tail), as pairs=True)"),
    "valid_pairs_for_train_triples": (lambda p: mp.Dataset.from_triples(OK, [("a", "b")], OK),
                                      "valid has 2 columns (expected 3 columns (head, relation, tail), as train has)"),
    "a_split_that_leaves_no_train": (lambda p: mp.Dataset.from_triples(OK, split=(0.6, 0.5)),
                                     "split (0.6, 0.5) cannot be honoured"),
    "a_split_with_valid_and_test": (lambda p: mp.Dataset.from_triples(OK, OK, OK, split=(0.1, 0.1)),
                                    "cannot be honoured: valid and test are given"),
    "valid_without_test": (lambda p: mp.Dataset.from_triples(OK, OK), "valid given without test"),
    "test_without_valid": (lambda p: mp.Dataset.from_triples(OK, test=OK), "test given without valid"),
    "a_negative_seed": (lambda p: mp.Dataset.from_triples(OK, seed=-1), "seed: got -1"),
    "more_partitions_than_nodes": (lambda p: mp.Dataset.from_triples(OK, num_partitions=8), "num_partitions: got 8"),
    "unseen_name_with_policy_error": (
        lambda p: mp.Dataset.from_triples(OK, [("a", "r", "b"), ("zz", "r", "b")], OK, unseen_policy="error"),
        "valid, row 1: valid edge has node 'zz' (head), which no train edge has"),
    "a_directory_not_empty": (lambda p: mp.Dataset.from_triples(OK, directory=p["full"]),
                              "output directory exists, is not empty and holds no dataset"),
    "load_dataset_row_named": (lambda p: mp.load_dataset([("a", "", "b")]),
                               "load_dataset: path_or_name, row 0, column 1 (relation): empty name"),
    "load_dataset_options_with_a_path": (lambda p: mp.load_dataset(str(UMLS), seed=1),
                                         "load_dataset: seed given with a path"),
}


@pytest.mark.parametrize("name", CASES)
def test_bad_input_is_one_error_naming_where_and_leaves_nothing(name, tmp_path, cache):
    call, fragment = CASES[name]
    full = tmp_path / "full"
    full.mkdir()
    (full / "mine.txt").write_text("not a dataset\n")
    places = {"out": tmp_path / "new" / "out", "full": full}
    with pytest.raises(mp.MariusInputError) as caught:
        call(places)
    assert fragment in str(caught.value), str(caught.value)
    assert not (tmp_path / "new").exists()  # (the folders made above the directory removed too)
    assert [path.name for path in full.iterdir()] == ["mine.txt"]
    datasets = cache / "datasets"
    assert not datasets.exists() or not any(datasets.iterdir()), list(datasets.iterdir())


def test_pandas_is_imported_only_for_a_data_frame(tmp_path):
    code = ("import sys, marius_py as mp; mp.Dataset.from_triples([('a', 'r', 'b')], directory=sys.argv[1]); "
            "print('pandas' in sys.modules)")
    done = subprocess.run([sys.executable, "-c", code, str(tmp_path / "d")], capture_output=True, text=True,
                          check=True)
    assert done.stdout.strip() == "False"
