"""marius_py.preprocess: round trips, random ids, buckets, splits, formats, streaming."""

from __future__ import annotations

import gzip
import json
import random
from collections import Counter
from pathlib import Path

import numpy as np
import pytest

from marius_py.dataset import Dataset
from marius_py.errors import MariusInputError
from marius_py.preprocess import PAIRS_RELATION, PreprocessOptions, preprocess
from marius_py.storage.edge_store import EdgeStore, EdgeStoreWriter
from marius_py.storage.partitioning import partition_of

UMLS = Path(__file__).parent / "data" / "umls"  # MIT, from the PyKEEN wheel


# ---------------------------------------------------------------- helpers

def make_graph(num_edges: int, num_nodes: int = 40, num_relations: int = 5,
               seed: int = 0) -> list[tuple[str, str, str]]:
    """Distinct random triples over names with spaces and non-ASCII characters."""
    rng = random.Random(seed)
    edges: dict[tuple[str, str, str], None] = {}
    while len(edges) < num_edges:
        h, t = rng.randrange(num_nodes), rng.randrange(num_nodes)
        edges[(f"node {h}é", f"rel/{rng.randrange(num_relations)}", f"node {t}é")] = None
    return list(edges)


def write_lines(path: Path, lines: list[str], newline: str = "\n") -> Path:
    data = "".join(line + newline for line in lines).encode("utf-8")
    if path.suffix == ".gz":
        data = gzip.compress(data)
    path.write_bytes(data)
    return path


def tsv(triples, order=(0, 1, 2), sep="\t") -> list[str]:
    return [sep.join(triple[i] for i in order) for triple in triples]


def named(ds: Dataset, split: str) -> list[tuple[str, str, str]]:
    nodes, relations = ds.node_names, ds.relation_names
    return [(nodes[h], relations[r], nodes[t]) for h, r, t in ds.split(split).tolist()]


def snapshot(directory: Path) -> dict:
    """Everything a dataset holds, for equality checks (sources excluded)."""
    ds = Dataset(directory)
    try:
        metadata = json.loads((directory / "metadata.json").read_text())
        metadata.pop("sources")
        return {"metadata": metadata, "nodes": ds.node_names, "relations": ds.relation_names,
                "offsets": ds.edges.bucket_offsets().tolist(),
                **{split: ds.split(split).tolist() for split in ("train", "valid", "test")}}
    finally:
        ds.close()


@pytest.fixture
def kg(tmp_path):
    """Explicit train/valid/test files; valid/test only use train names."""
    triples = make_graph(300)
    train, valid, test = triples[:240], triples[240:270], triples[270:]
    train_names = {n for h, _, t in train for n in (h, t)} | {r for _, r, _ in train}
    keep = [e for e in valid + test if {e[0], e[1], e[2]} <= train_names]
    valid, test = [e for e in valid if e in keep], [e for e in test if e in keep]
    paths = {name: write_lines(tmp_path / f"{name}.txt", tsv(edges))
             for name, edges in (("train", train), ("valid", valid), ("test", test))}
    return {"paths": paths, "train": train, "valid": valid, "test": test}


def run(out: Path, paths: dict, progress: bool = False, **options) -> Dataset:
    preprocess(out, paths["train"], paths.get("valid"), paths.get("test"),
               PreprocessOptions(**options), progress=progress)
    return Dataset(out)


# ---------------------------------------------------------------- round trip and ids

def test_round_trip_recovers_every_triple(tmp_path, kg):
    ds = run(tmp_path / "out", kg["paths"])
    for split in ("train", "valid", "test"):
        assert named(ds, split) == kg[split]  # p = 1: input order kept
    meta = ds.metadata
    assert meta.num_train == 240
    assert (meta.num_valid, meta.num_test) == (len(kg["valid"]), len(kg["test"]))
    assert meta.has_relations and meta.num_dropped_valid == meta.num_dropped_test == 0
    assert meta.sources == {s: str(p.absolute()) for s, p in kg["paths"].items()}
    assert ds.node_id(kg["train"][0][0]) == ds.train[0, 0]


def test_ids_are_a_seeded_permutation(tmp_path, kg):
    ds = run(tmp_path / "a", kg["paths"], seed=1)
    names = {n for h, _, t in kg["train"] for n in (h, t)}
    assert sorted(ds.node_names) == sorted(names) and ds.num_nodes == len(names)
    assert sorted(set(ds.train[:, [0, 2]].ravel().tolist())) == list(range(ds.num_nodes))
    assert sorted(set(ds.train[:, 1].tolist())) == list(range(ds.num_relations))

    first_appearance = list(dict.fromkeys(n for h, _, t in kg["train"] for n in (h, t)))
    assert ds.node_names != first_appearance  # random order, not input order
    other = run(tmp_path / "b", kg["paths"], seed=2)
    assert other.node_names != ds.node_names
    run(tmp_path / "c", kg["paths"], seed=1)
    assert snapshot(tmp_path / "c") == snapshot(tmp_path / "a")


# ---------------------------------------------------------------- buckets

@pytest.mark.parametrize("num_partitions", [3, 4])
def test_bucket_offsets(tmp_path, kg, num_partitions):
    ds = run(tmp_path / "out", kg["paths"], num_partitions=num_partitions, chunk_lines=50)
    p, n = num_partitions, ds.num_nodes
    offsets = ds.edges.bucket_offsets()
    assert len(offsets) == p * p + 1 and offsets[0] == 0 and offsets[-1] == ds.metadata.num_train
    assert np.all(np.diff(offsets) >= 0)
    for i in range(p):
        for j in range(p):
            bucket = ds.edges.bucket(i, j)
            assert np.all(partition_of(bucket[:, 0], n, p) == i)
            assert np.all(partition_of(bucket[:, 2], n, p) == j)
    train = named(ds, "train")
    assert Counter(train) == Counter(kg["train"])
    position = {edge: k for k, edge in enumerate(kg["train"])}
    for k in range(p * p):  # input order inside each bucket
        rows = [position[e] for e in train[offsets[k]:offsets[k + 1]]]
        assert rows == sorted(rows)
    assert named(ds, "valid") == kg["valid"] and named(ds, "test") == kg["test"]


def test_buckets_read_together_are_their_offset_ranges(tmp_path):
    """Near buckets share a read and far ones (over an HDF5 chunk apart) do not; both give each bucket exactly."""
    sizes = [5, 0, 70_000, 3, 0, 2, 80_000, 1, 4]  # p = 3; two buckets larger than a chunk
    offsets = np.concatenate([[0], np.cumsum(sizes)])
    writer = EdgeStoreWriter(tmp_path / "edges.h5", 3)
    train = np.arange(offsets[-1] * 3, dtype=np.int64).reshape(-1, 3)
    writer.append("train", train)
    writer.set_bucket_offsets(offsets)
    writer.close()
    rng = random.Random(0)
    with EdgeStore(tmp_path / "edges.h5") as store:
        every = [(i, j) for i in range(3) for j in range(3)]
        for pairs in [every, [(0, 0), (2, 2)], [(2, 1), (0, 1), (1, 0)]] + [rng.sample(every, 4) for _ in range(5)]:
            got = store.buckets(pairs)
            expected = [train[offsets[3 * i + j]:offsets[3 * i + j + 1]] for i, j in sorted(pairs)]
            assert len(got) == len(expected)
            for a, b in zip(got, expected):
                np.testing.assert_array_equal(a, b)
        assert [len(b) for b in store.buckets(every)] == sizes
        staging = np.full((store.count(every) + 2, 3), -1, dtype=np.int64)
        for pairs in [every, [(0, 1), (1, 1)], [(2, 0), (0, 2), (1, 2)]] + [rng.sample(every, 4) for _ in range(5)]:
            expected = np.concatenate([train[offsets[3 * i + j]:offsets[3 * i + j + 1]] for i, j in sorted(pairs)])
            joined = store.read_buckets(pairs, staging)  # into the staging array's first rows
            assert store.count(pairs) == len(expected) and (np.shares_memory(joined, staging) or not len(expected))
            np.testing.assert_array_equal(joined, expected)
            np.testing.assert_array_equal(store.read_buckets(pairs, staging[:1]), expected)  # no room: a new array
            np.testing.assert_array_equal(store.read_buckets(pairs), expected)
        assert (staging[-2:] == -1).all()


# ---------------------------------------------------------------- random split

def test_random_split_from_one_file(tmp_path):
    triples = make_graph(3000, num_nodes=60)
    path = write_lines(tmp_path / "all.txt", tsv(triples))
    ds = run(tmp_path / "a", {"train": path}, split_fractions=(0.1, 0.2), seed=5)
    meta = ds.metadata
    dropped = meta.num_dropped_valid + meta.num_dropped_test
    assert meta.num_train + meta.num_valid + meta.num_test + dropped == 3000
    assert abs(meta.num_valid + meta.num_dropped_valid - 300) < 60  # ~3.5 sigma
    assert abs(meta.num_test + meta.num_dropped_test - 600) < 80
    splits = {s: named(ds, s) for s in ("train", "valid", "test")}
    union = splits["train"] + splits["valid"] + splits["test"]
    assert len(set(union)) == len(union) == 3000 - dropped  # disjoint
    assert set(union) <= set(triples)
    assert meta.sources == {"train": str(path.absolute())}

    run(tmp_path / "b", {"train": path}, split_fractions=(0.1, 0.2), seed=5)
    assert snapshot(tmp_path / "b") == snapshot(tmp_path / "a")
    other = run(tmp_path / "c", {"train": path}, split_fractions=(0.1, 0.2), seed=6)
    assert set(named(other, "valid")) != set(splits["valid"])


def test_random_split_zero_fractions_keeps_everything_in_train(tmp_path):
    triples = make_graph(50)
    path = write_lines(tmp_path / "all.txt", tsv(triples))
    ds = run(tmp_path / "out", {"train": path}, split_fractions=(0.0, 0.0))
    assert named(ds, "train") == triples and len(ds.valid) == len(ds.test) == 0


# ---------------------------------------------------------------- input formats

def _variant_files(tmp_path: Path, kg: dict, variant: str) -> tuple[dict, dict]:
    """The kg's files rewritten in another format, and the options that read them."""
    options, paths = {}, {}
    for split in ("train", "valid", "test"):
        lines, newline, suffix = tsv(kg[split]), "\n", ".txt"
        if variant == "gz":
            suffix = ".txt.gz"
        elif variant == "crlf":
            newline = "\r\n"
        elif variant == "comma_columns":
            lines, options = tsv(kg[split], order=(1, 2, 0), sep=","), {"delimiter": ",",
                                                                        "columns": (2, 0, 1)}
        elif variant == "extra_column":
            lines = [f"{line}\t0.5" for line in tsv(kg[split], order=(0, 2, 1))]
            options = {"columns": (0, 2, 1)}
        elif variant == "skip_header":
            lines = ["head\trelation\ttail", "# second header line"] + lines
            options = {"skip_header": 2}
        elif variant == "bom_and_trailing_blanks":
            lines = ["\ufeff" + lines[0]] + lines[1:] + ["", "  ", ""]
        paths[split] = write_lines(tmp_path / f"{variant}-{split}{suffix}", lines, newline)
    return paths, options


@pytest.mark.parametrize("variant", ["gz", "crlf", "comma_columns", "extra_column", "skip_header",
                                     "bom_and_trailing_blanks"])
def test_input_formats_give_the_same_dataset(tmp_path, kg, variant):
    run(tmp_path / "reference", kg["paths"], num_partitions=2)
    paths, options = _variant_files(tmp_path, kg, variant)
    run(tmp_path / variant, paths, num_partitions=2, **options)
    assert snapshot(tmp_path / variant) == snapshot(tmp_path / "reference")


def test_pairs_mode(tmp_path):
    pairs = list(dict.fromkeys((h, t) for h, _, t in make_graph(200)))
    path = write_lines(tmp_path / "edges.csv", [f"{h},{t}" for h, t in pairs])
    ds = run(tmp_path / "out", {"train": path}, pairs=True, delimiter=",", split_fractions=(0, 0))
    assert ds.num_relations == 1 and ds.relation_names == [PAIRS_RELATION]
    assert not ds.metadata.has_relations
    assert np.all(ds.train[:, 1] == 0)
    assert [(h, t) for h, _, t in named(ds, "train")] == pairs


def test_pairs_mode_with_columns(tmp_path):
    path = write_lines(tmp_path / "edges.tsv", ["x\tb\ta", "y\tc\tb"])
    ds = run(tmp_path / "out", {"train": path}, pairs=True, columns=(2, 1),
             split_fractions=(0, 0))
    assert named(ds, "train") == [("a", PAIRS_RELATION, "b"), ("b", PAIRS_RELATION, "c")]


# ---------------------------------------------------------------- streaming

@pytest.mark.parametrize("single_file", [False, True])
def test_chunk_size_does_not_change_the_output(tmp_path, kg, single_file):
    paths = {"train": kg["paths"]["train"]} if single_file else kg["paths"]
    run(tmp_path / "small", paths, num_partitions=3, chunk_lines=7, split_fractions=(0.2, 0.1))
    run(tmp_path / "large", paths, num_partitions=3, chunk_lines=10**6, split_fractions=(0.2, 0.1))
    assert snapshot(tmp_path / "small") == snapshot(tmp_path / "large")


def test_many_blocks(tmp_path, monkeypatch):
    """More lines than one parse block: line numbers and ids stay right across blocks."""
    import marius_py.preprocess as module
    monkeypatch.setattr(module, "_BLOCK_LINES", 16)
    triples = make_graph(200)
    lines = tsv(triples)
    path = write_lines(tmp_path / "train.txt", lines)
    ds = run(tmp_path / "out", {"train": path}, split_fractions=(0, 0))
    assert named(ds, "train") == triples
    write_lines(path, lines[:100] + ["bad line"] + lines[100:])
    with pytest.raises(MariusInputError, match=r"train\.txt:101: "):
        run(tmp_path / "bad", {"train": path}, split_fractions=(0, 0))


def _line_by_line(path: Path, first_line: int, block_lines: int):
    """The reader that edge_text._read_rows replaced: readline(_MAX_LINE_BYTES + 1) per line, each block of
    lines decoded (and checked) by _decode_block. (That reader went on after the start of a too-long line,
    so a line of up to twice the limit was taken whole when the rest of it ended inside the same block;
    here the block ends with that start, which _decode_block refuses.)"""
    from functools import partial

    from marius_py import edge_text
    limit = edge_text._MAX_LINE_BYTES
    with open(path, "rb") as handle:
        for _ in range(first_line - 1):
            handle.readline(limit + 1)
        lines = iter(partial(handle.readline, limit + 1), b"")
        lineno = first_line - 1
        while True:
            block = []
            for line in lines:
                block.append(line)
                if len(line) > limit and not line.endswith(b"\n") or len(block) == block_lines:
                    break
            if not block:
                return
            yield lineno + 1, edge_text._decode_block(block, path, lineno + 1)
            lineno += len(block)


def _in_chunks(path: Path, first_line: int, block_lines: int):
    from marius_py import edge_text
    with open(path, "rb") as handle:
        for _ in range(first_line - 1):  # (as _iter_blocks skips a header)
            handle.readline(edge_text._MAX_LINE_BYTES + 1)
        yield from edge_text._read_rows(handle, path, first_line, block_lines)


def _outcome(blocks) -> tuple[list, str | None]:
    """The blocks read, and the error that ended the reading (None: the file's end)."""
    seen = []
    try:
        for first_line, rows in blocks:
            seen.append((first_line, list(rows)))
    except MariusInputError as error:
        return seen, str(error)
    return seen, None


GOOD3 = b"a\tr\tb\nb\tr\tc\nc\ts\ta\n"
READ_CASES = {  # lines of at most 16 bytes here (_MAX_LINE_BYTES patched)
    "good": GOOD3 * 5, "no_final_newline": GOOD3 * 3 + b"d\tr\ta", "crlf_bom": b"\xef\xbb\xbf" +
    (GOOD3 * 4).replace(b"\n", b"\r\n"), "cr_at_the_end": GOOD3 + b"a\tr\tb\r", "multibyte": "é\tr\tñ€\n".encode() * 9,
    "nul": GOOD3 * 2 + b"c\x00\tr\ta\n" + GOOD3, "not_utf8": GOOD3 * 3 + b"caf\xe9\tr\ta\n" + GOOD3,
    "cr_inside": GOOD3 + b"a\rb\tr\tc\n" + GOOD3, "long_line": GOOD3 + b"x" * 40 + b"\tr\ta\n" + GOOD3,
    "long_last_line": GOOD3 + b"y" * 17, "sixteen_bytes": GOOD3 + b"abcdefghij\tr\tbc\n" + GOOD3,
    "sixteen_bytes_crlf": GOOD3 + b"abcdefghij\tr\tbc\r\n", "only_a_long_line": b"z" * 100,
    "utf16": "a\tr\tb\n".encode("utf-16"), "gzip_magic": b"\x1f\x8b\x08\x00" + GOOD3, "empty": b"",
    "blank": b"\n\n", "bad_utf8_then_long": b"a\tr\tb\n\xff\tr\ta\na\tr\tb\n" + b"w" * 30 + b"\n",
    "nul_then_bad_utf8": GOOD3 + b"\x00\tr\ta\n\xfe\tr\ta\n" + GOOD3,
}


def test_reading_in_chunks_gives_the_lines_and_errors_of_a_line_by_line_reader(tmp_path, monkeypatch):
    """Chunks cut anywhere (inside a line, a CRLF, a UTF-8 character) and blocks of any size: the same blocks,
    and the same first error at the same line, as reading line by line."""
    from marius_py import edge_text
    monkeypatch.setattr(edge_text, "_MAX_LINE_BYTES", 16)
    for name, data in READ_CASES.items():
        path = tmp_path / f"{name}.txt"
        path.write_bytes(data)
        for first_line in (1, 2):
            for block_lines in (1, 2, 3, 4, 1000):
                expected = _outcome(_line_by_line(path, first_line, block_lines))
                for chunk in (1, 2, 3, 5, 8, 17, 64, 1 << 20):
                    monkeypatch.setattr(edge_text, "_CHUNK_BYTES", chunk)
                    assert _outcome(_in_chunks(path, first_line, block_lines)) == expected, \
                        (name, first_line, block_lines, chunk)


def test_a_line_just_over_the_limit_is_refused_among_others(tmp_path):
    """The line-by-line reader took a line of up to 2 MiB whole when its rest ended in the same block."""
    path = tmp_path / "train.txt"
    path.write_bytes(b"a\tr\tb\n" + b"n" * (1 << 20) + b"\tr\tb\n" + b"b\tr\tc\n")
    with pytest.raises(MariusInputError, match=r"train\.txt:2: line longer than 1 MiB"):
        preprocess(tmp_path / "out", path, progress=False)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["train.txt"]


def test_small_chunks_give_the_same_dataset(tmp_path, kg, monkeypatch):
    from marius_py import edge_text
    run(tmp_path / "whole", kg["paths"], num_partitions=2)
    monkeypatch.setattr(edge_text, "_CHUNK_BYTES", 7)
    run(tmp_path / "chunks", kg["paths"], num_partitions=2)
    assert snapshot(tmp_path / "chunks") == snapshot(tmp_path / "whole")


# ---------------------------------------------------------------- unseen names

def test_unseen_policy_drop_counts(tmp_path, capsys):
    train = [("a", "r", "b"), ("b", "s", "c")]
    valid = [("a", "r", "c"), ("a", "r", "zz"), ("c", "new", "a"), ("b", "s", "a")]
    test = [("yy", "r", "a"), ("c", "s", "b")]
    paths = {name: write_lines(tmp_path / f"{name}.txt", tsv(edges))
             for name, edges in (("train", train), ("valid", valid), ("test", test))}
    ds = run(tmp_path / "out", paths, progress=True)
    meta = ds.metadata
    assert (meta.num_valid, meta.num_dropped_valid) == (2, 2)
    assert (meta.num_test, meta.num_dropped_test) == (1, 1)
    assert named(ds, "valid") == [valid[0], valid[3]] and named(ds, "test") == [test[1]]
    assert "dropped 2 of 4 valid edges" in capsys.readouterr().err


@pytest.mark.skipif(not UMLS.exists(), reason="umls dataset not available")
def test_umls(tmp_path):
    paths = {s: UMLS / f"{s}.txt" for s in ("train", "valid", "test")}
    ds = run(tmp_path / "umls", paths, num_partitions=2)
    meta = ds.metadata
    assert meta.num_train == 5216 and meta.num_nodes == 135 and meta.num_relations == 46
    assert meta.num_valid + meta.num_dropped_valid == 652
    assert meta.num_test + meta.num_dropped_test == 661
    assert Counter(named(ds, "train")) == Counter(
        tuple(line.split("\t")) for line in paths["train"].read_text().splitlines())


# ---------------------------------------------------------------- output directory

def test_existing_output_directory(tmp_path, kg):
    out = tmp_path / "out"
    out.mkdir()  # an empty directory is fine
    run(out, kg["paths"], seed=1)
    before = snapshot(out)
    with pytest.raises(MariusInputError, match="already holds a dataset"):
        run(out, kg["paths"], seed=2)
    assert snapshot(out) == before
    preprocess(out, **kg["paths"], options=PreprocessOptions(seed=2), progress=False,
               overwrite=True)
    assert snapshot(out)["nodes"] != before["nodes"]

    other = tmp_path / "not-a-dataset"
    other.mkdir()
    (other / "precious.txt").write_text("keep me")
    with pytest.raises(MariusInputError, match="holds no dataset"):
        preprocess(other, **kg["paths"], progress=False, overwrite=True)
    assert (other / "precious.txt").read_text() == "keep me"
    assert sorted(p.name for p in tmp_path.iterdir() if p.name.startswith(".")) == []


def test_interrupt_leaves_nothing(tmp_path, kg, monkeypatch):
    import marius_py.preprocess as module

    def interrupted(*args, **kwargs):
        raise KeyboardInterrupt

    monkeypatch.setattr(module._BucketRuns, "copy_to", interrupted)
    with pytest.raises(KeyboardInterrupt):
        run(tmp_path / "out", kg["paths"], num_partitions=2)
    assert not (tmp_path / "out").exists()
    assert [p for p in tmp_path.iterdir() if p.name.startswith(".")] == []


def _dead_pid() -> int:
    import subprocess
    child = subprocess.Popen(["true"])
    child.wait()
    return child.pid


def test_a_kill_between_the_renames_of_an_overwrite_puts_the_earlier_dataset_back(tmp_path, kg, capsys):
    """--overwrite moves the dataset to .NAME.old-HOST-PID, then renames the new one in: killed between the
    two, the output is missing and the old folder is the only complete copy. The next preprocess puts it
    back before anything else (it had removed it as abandoned staging), so without overwrite it refuses."""
    import os
    import shutil
    import socket
    out = tmp_path / "out"
    run(out, kg["paths"], seed=1)
    before = snapshot(out)
    host, dead = socket.gethostname(), _dead_pid()
    shutil.copytree(out, tmp_path / f".out.tmp-{host}-{dead}")  # the killed run's new dataset, never published
    os.replace(out, tmp_path / f".out.old-{host}-{dead}")
    capsys.readouterr()
    with pytest.raises(MariusInputError, match="already holds a dataset"):
        run(out, kg["paths"], seed=2)
    assert snapshot(out) == before
    assert f"put back the dataset that a killed run replacing it had moved to .out.old-{host}-{dead}" in \
        capsys.readouterr().err
    preprocess(out, **kg["paths"], options=PreprocessOptions(seed=2), progress=False, overwrite=True)
    assert snapshot(out)["metadata"]["seed"] == 2
    assert sorted(p.name for p in tmp_path.iterdir() if p.name.startswith(".")) == []  # both leftovers gone


def test_several_killed_overwrites_are_refused_by_name_and_kept(tmp_path, kg):
    """Output missing, two dead runs' .NAME.old-* each holding a complete dataset: which is the latest cannot
    be told, so both are kept and named; an old folder without metadata.json is only half-removed: removed."""
    import os
    import shutil
    import socket
    out = tmp_path / "out"
    run(out, kg["paths"], seed=1)
    host, dead = socket.gethostname(), _dead_pid()
    olds = [tmp_path / f".out.old-{host}-{dead}", tmp_path / f".out.old-{dead}"]
    shutil.copytree(out, olds[1])
    os.replace(out, olds[0])
    with pytest.raises(MariusInputError, match=f"2 runs that were replacing it were killed.*{olds[0].name}"):
        run(out, kg["paths"], seed=2, split_fractions=(0.1, 0.1))
    assert all((old / "metadata.json").is_file() for old in olds) and not out.exists()
    shutil.rmtree(olds[1])
    (olds[0] / "metadata.json").unlink()  # (a replaced copy is removed marker first: this one was being removed)
    run(out, kg["paths"], seed=2)
    assert sorted(p.name for p in tmp_path.iterdir() if p.name.startswith(".")) == []


def test_unseen_policy_error_with_a_random_split_is_refused(tmp_path, kg):
    """The random split moves unseen edges into train: 'error' would be silently ignored, so it is refused
    (as the CLI refuses --unseen with --split); with given valid/test files it applies."""
    with pytest.raises(MariusInputError, match="unseen_policy 'error' .* applies only to given valid/test files"):
        preprocess(tmp_path / "out", kg["paths"]["train"], options=PreprocessOptions(unseen_policy="error"),
                   progress=False)
    assert not (tmp_path / "out").exists()
    assert run(tmp_path / "given", kg["paths"], unseen_policy="error").metadata.unseen_policy == "error"


def test_progress_output(tmp_path, kg, capsys):
    run(tmp_path / "out", kg["paths"], progress=True, num_partitions=2)
    assert capsys.readouterr().out == ""  # bars go to stderr; the caller prints the summary


def test_degrees_are_counted_chunk_by_chunk(tmp_path):
    from marius_py.dataset import Dataset
    from marius_py.preprocess import PreprocessOptions, preprocess
    umls = Path(__file__).parent / "data" / "umls"
    preprocess(tmp_path / "d", umls / "train.txt", umls / "valid.txt", umls / "test.txt",
               PreprocessOptions(num_partitions=4), progress=False)
    dataset = Dataset.load(tmp_path / "d")
    train = dataset.train
    expected = np.bincount(train[:, 0], minlength=dataset.num_nodes) + np.bincount(train[:, 2],
                                                                                  minlength=dataset.num_nodes)
    assert sum(len(chunk) for chunk in dataset.edges.chunks("train", rows=1000)) == len(train) > 3000
    np.testing.assert_array_equal(dataset.degrees(chunk_rows=1000), expected)  # several chunks added up


@pytest.mark.parametrize("published_at", ["check", "rename"])
def test_a_raw_dataset_preprocessed_by_two_runs_at_once_is_shared(tmp_path, monkeypatch, published_at):
    """Runs of a sweep started together each preprocess the same raw directory into the cache; one
    publishes first (seen by the final check, or failing the rename onto its non-empty directory), and
    the other uses that dataset instead of failing. Its own staging files are removed."""
    import errno
    import os

    import marius_py.preprocess as module
    from marius_py.bundled import resolve_dataset
    monkeypatch.setenv("MARIUS_PY_CACHE", str(tmp_path / "cache"))
    raw = tmp_path / "raw"
    raw.mkdir()
    for split in ("train", "valid", "test"):
        (raw / f"{split}.txt").write_text((UMLS / f"{split}.txt").read_text())
    preprocess(tmp_path / "other", raw / "train.txt", raw / "valid.txt", raw / "test.txt", progress=False)
    build, publish = module._build_dataset, module._publish
    published = []

    def another_run_publishes_meanwhile(staging, *args, **kwargs):
        metadata = build(staging, *args, **kwargs)
        output = staging.parent / staging.name.split(".tmp-")[0][1:]
        os.replace(tmp_path / "other", output)  # the other run's, finished first
        published.append(output)
        return metadata

    def rename_onto_it(staging, output_dir, overwrite):  # both passed the final check before either renamed
        raise OSError(errno.ENOTEMPTY, "Directory not empty", str(output_dir))
    monkeypatch.setattr(module, "_build_dataset", another_run_publishes_meanwhile)
    if published_at == "rename":
        monkeypatch.setattr(module, "_publish", rename_onto_it)
    resolved = resolve_dataset(str(raw), progress=False)
    assert published == [resolved]
    assert Dataset(resolved).metadata.num_train > 0
    assert [p.name for p in resolved.parent.iterdir()] == [resolved.name]  # no staging left behind
    monkeypatch.setattr(module, "_publish", publish)
    monkeypatch.setattr(module, "_build_dataset", build)
    with pytest.raises(MariusInputError, match="already holds a dataset"):  # a user's own call still refuses
        preprocess(resolved, raw / "train.txt", raw / "valid.txt", raw / "test.txt", progress=False)


def test_rebucket_keeps_every_edge_and_id_and_sorts_train_by_the_new_buckets(tmp_path):
    from marius_py.preprocess import rebucket
    paths = {s: UMLS / f"{s}.txt" for s in ("train", "valid", "test")}
    preprocess(tmp_path / "p2", paths["train"], paths["valid"], paths["test"], PreprocessOptions(num_partitions=2),
               progress=False)
    metadata = rebucket(tmp_path / "p2", tmp_path / "p6", 6, progress=False)
    source, copy = Dataset(tmp_path / "p2"), Dataset(tmp_path / "p6")
    assert metadata.num_partitions == copy.edges.num_partitions == 6
    assert copy.node_names == source.node_names and copy.relation_names == source.relation_names
    for split in ("valid", "test"):
        assert np.array_equal(copy.split(split), source.split(split))
    train = copy.train
    assert Counter(map(tuple, train.tolist())) == Counter(map(tuple, source.train.tolist()))
    offsets = copy.edges.bucket_offsets()
    heads, tails = (partition_of(train[:, c], copy.num_nodes, 6) for c in (0, 2))
    for bucket in range(36):
        rows = slice(offsets[bucket], offsets[bucket + 1])
        assert np.all(heads[rows] * 6 + tails[rows] == bucket)


def test_rebucket_for_more_partitions_than_nodes_fill_leaves_nothing(tmp_path):
    from marius_py.preprocess import rebucket
    paths = {s: UMLS / f"{s}.txt" for s in ("train", "valid", "test")}
    preprocess(tmp_path / "p2", paths["train"], paths["valid"], paths["test"], PreprocessOptions(num_partitions=2),
               progress=False)
    with pytest.raises(MariusInputError, match="at most 27 partitions"):
        rebucket(tmp_path / "p2", tmp_path / "p32", 32, progress=False)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["p2"]


def test_known_names_give_ids_to_nodes_and_relations_no_train_edge_has(tmp_path):
    """``known_nodes``/``known_relations``: the graph's every name gets an id (an isolated node too), and a
    test edge whose node or relation only the names file has is kept rather than dropped."""
    (tmp_path / "train.txt").write_text("a\tr\tb\nb\tr\tc\n")
    (tmp_path / "valid.txt").write_text("a\tr\tc\n")
    (tmp_path / "test.txt").write_text("a\ts\td\n")  # (d and s: in no train edge)
    (tmp_path / "nodes.txt").write_text("a\nb\nc\nd\nisolated\n")
    (tmp_path / "relations.txt").write_text("r\ns\n")
    files = [tmp_path / f"{split}.txt" for split in ("train", "valid", "test")]
    dropped = preprocess(tmp_path / "plain", *files, progress=False)
    assert (dropped.num_nodes, dropped.num_test, dropped.num_dropped_test) == (3, 0, 1)
    kept = preprocess(tmp_path / "known", *files, PreprocessOptions(known_nodes=str(tmp_path / "nodes.txt"),
                      known_relations=str(tmp_path / "relations.txt")), progress=False)
    assert (kept.num_nodes, kept.num_relations, kept.num_test, kept.num_dropped_test) == (5, 2, 1, 0)
    dataset = Dataset(tmp_path / "known")
    assert sorted(dataset.node_names) == ["a", "b", "c", "d", "isolated"]
    head, relation, tail = dataset.test[0]
    assert (dataset.node_names[head], dataset.relation_names[relation], dataset.node_names[tail]) == ("a", "s", "d")
    with pytest.raises(MariusInputError, match="known_nodes"):
        preprocess(tmp_path / "bad", *files, PreprocessOptions(known_nodes=str(tmp_path / "missing.txt")),
                   progress=False)
