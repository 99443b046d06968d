"""Bad-input corpus, family "a run knows its data by content" (issue 51): a dataset preprocessed again in place
(renumbered, another seed, edges changed), names files edited after preprocessing, a raw directory whose
files were replaced, damaged or missing dataset files, and resumes with changed settings. Every command that
opens a run (eval, predict, export, train --resume) refuses, naming what changed, with exit status 2, one
message and no traceback, and leaves every committed file of the run as it was.

``CASES``: name -> (mutation, command, message fragment). Each case gets its own copy of a reference dataset
and of two runs trained on it (``{run}`` on the preprocessed dataset ``{data}``, ``{raw_run}`` on the raw
directory ``{raw}``); the mutation (a function of those places) changes the data, then the command runs.
"""

from __future__ import annotations

import hashlib
import random
import shlex
import shutil
from pathlib import Path

import numpy as np
import pytest

import marius_py as mp
from marius_py.dataset import Dataset, read_metadata, write_metadata
from marius_py.errors import MariusInputError
from marius_py.identity import OrderFreeDigest
from marius_py.preprocess import PreprocessOptions, preprocess, rebucket
from test_bad_input_corpus import UMLS_RAW, run_cli

RUN_SETTINGS = "training.device=cpu model.dim=8 training.epochs=1 --quiet"


def _preprocess_into(places, train: Path, *, seed: int = 0, valid: Path | None = None) -> None:
    """The dataset ``{data}`` preprocessed again in place (``--overwrite``) from ``train``."""
    raw = places["raw"]
    preprocess(places["data"], train, valid or raw / "valid.txt", raw / "test.txt", PreprocessOptions(seed=seed),
               progress=False, overwrite=True)


def _lines(path: Path) -> list[str]:
    return path.read_text(encoding="utf-8").splitlines()


def _write_lines(path: Path, lines: list[str]) -> Path:
    path.write_text("".join(f"{line}\n" for line in lines), encoding="utf-8")
    return path


def renumbered(places) -> None:
    """The same edges in another line order, preprocessed again: every count equal, other ids."""
    lines = _lines(places["raw"] / "train.txt")
    random.Random(1).shuffle(lines)
    _preprocess_into(places, _write_lines(places["tmp"] / "shuffled.txt", lines))


def other_seed(places) -> None:
    _preprocess_into(places, places["raw"] / "train.txt", seed=7)


def one_train_edge_replaced(places) -> None:
    """Two train edges exchange their tails: the same counts, names and numbering (every name appeared
    earlier in the file), other edges."""
    lines = _lines(places["raw"] / "train.txt")
    first, second = (line.split("\t") for line in lines[-2:])
    assert first[2] != second[2] and {first[2], second[2]} <= {line.split("\t")[2] for line in lines[:-2]}
    lines[-2:] = ["\t".join(first[:2] + second[2:]), "\t".join(second[:2] + first[2:])]
    _preprocess_into(places, _write_lines(places["tmp"] / "edited.txt", lines))


def valid_edge_dropped(places) -> None:
    lines = _lines(places["raw"] / "valid.txt")[1:]
    _preprocess_into(places, places["raw"] / "train.txt", valid=_write_lines(places["tmp"] / "valid.txt", lines))


def edit_names(file_name: str, edit):
    def mutate(places) -> None:
        path = places["data"] / file_name
        _write_lines(path, edit(_lines(path)))
    return mutate


def line_deleted(lines):
    return lines[:2] + lines[3:]


def lines_swapped(lines):
    return [lines[1], lines[0], *lines[2:]]


def name_renamed(lines):
    return [lines[0] + "_renamed", *lines[1:]]


def crlf_line_endings(places) -> None:
    path = places["data"] / "nodes.txt"
    path.write_bytes(path.read_bytes().replace(b"\n", b"\r\n"))


def truncated_edges(places) -> None:
    path = places["data"] / "edges.h5"
    path.write_bytes(path.read_bytes()[: path.stat().st_size // 2])


def damaged_train_chunk(places) -> None:
    """One byte of the train edges' chunk flipped in place: the file opens, its size unchanged."""
    import h5py
    path = places["data"] / "edges.h5"
    with h5py.File(path, "r") as file:
        offset = file["train"].id.get_chunk_info(0).byte_offset
    data = bytearray(path.read_bytes())
    data[offset + 100] ^= 0xFF
    path.write_bytes(bytes(data))


def garbage_edges(places) -> None:
    (places["data"] / "edges.h5").write_bytes(b"not an HDF5 file\n" * 100)


def removed(file_name: str):
    def mutate(places) -> None:
        (places["data"] / file_name).unlink()
    return mutate


def raw_files_replaced(places) -> None:
    """The raw directory a run trained on now holds another graph: 14 nodes, 3 relations, 300/20/20 edges."""
    rng = random.Random(0)
    edges = [f"n{rng.randrange(14)}\tr{rng.randrange(3)}\tn{rng.randrange(14)}" for _ in range(340)]
    edges[:14] = [f"n{i}\tr{i % 3}\tn{(i + 1) % 14}" for i in range(14)]  # (every name in train)
    for split, lines in (("train", edges[:300]), ("valid", edges[300:320]), ("test", edges[320:])):
        _write_lines(places["raw"] / f"{split}.txt", lines)


def raw_train_edge_dropped(places) -> None:
    path = places["raw"] / "train.txt"
    _write_lines(path, _lines(path)[:-1])


def nothing(places) -> None:
    pass


RENUMBERED = "nodes and relations are numbered differently"
NAMES_CHANGED = "names differ from those preprocessing wrote"
DAMAGED = "edge file is damaged or truncated"
CASES = {
    # the dataset preprocessed again in place
    "renumbered_eval": (renumbered, "eval {run}", RENUMBERED),
    "renumbered_predict": (renumbered, "predict {run} --head {head} --relation {relation}", RENUMBERED),
    "renumbered_export": (renumbered, "export {run} -o {out}", RENUMBERED),
    "renumbered_resume": (renumbered, "train --resume {run} training.epochs=2 --quiet", RENUMBERED),
    "renumbered_latest_eval": (renumbered, "eval {run} --checkpoint latest", RENUMBERED),
    "other_seed_eval": (other_seed, "eval {run}", "preprocessing seed: 0 when trained, 7 now"),
    "other_seed_resume": (other_seed, "train --resume {run} training.epochs=2 --quiet",
                          "preprocessing seed: 0 when trained, 7 now"),
    "train_edge_replaced_eval": (one_train_edge_replaced, "eval {run}", "its train edges changed"),
    "train_edge_replaced_resume": (one_train_edge_replaced, "train --resume {run} training.epochs=2 --quiet",
                                   "its train edges changed"),
    "valid_edge_dropped_eval": (valid_edge_dropped, "eval {run}", "its valid edges changed"),
    # names files edited after preprocessing
    "node_line_deleted_eval": (edit_names("nodes.txt", line_deleted), "eval {run}", "134 names for the dataset's 135 nodes"),
    "node_line_deleted_predict": (edit_names("nodes.txt", line_deleted),
                                  "predict {run} --head {head} --relation {relation}", "134 names"),
    "node_line_deleted_export": (edit_names("nodes.txt", line_deleted), "export {run} -o {out}", "134 names"),
    "node_line_deleted_resume": (edit_names("nodes.txt", line_deleted), "train --resume {run} training.epochs=2",
                                 "nodes.txt: 134 names"),
    "node_lines_swapped_eval": (edit_names("nodes.txt", lines_swapped), "eval {run}", NAMES_CHANGED),
    "node_lines_swapped_predict": (edit_names("nodes.txt", lines_swapped),
                                   "predict {run} --head {head} --relation {relation}", NAMES_CHANGED),
    "node_lines_swapped_export": (edit_names("nodes.txt", lines_swapped), "export {run} -o {out} --format tsv",
                                  NAMES_CHANGED),
    "node_renamed_export": (edit_names("nodes.txt", name_renamed), "export {run} -o {out} --format h5", NAMES_CHANGED),
    "node_crlf_predict": (crlf_line_endings, "predict {run} --head {head} --relation {relation}", NAMES_CHANGED),
    "relation_line_deleted_export": (edit_names("relations.txt", line_deleted), "export {run} -o {out}",
                                     "45 names for the dataset's 46 relations"),
    "relation_renamed_predict": (edit_names("relations.txt", name_renamed),
                                 "predict {run} --head {head} --relation {relation}", "relation names differ"),
    "node_line_added_info": (edit_names("nodes.txt", lambda lines: [*lines, "extra"]), "info {data}",
                             "136 names for the dataset's 135 nodes"),
    "nodes_file_removed_eval": (removed("nodes.txt"), "eval {run}", "nodes.txt: cannot read"),
    # damaged dataset files
    "truncated_edges_eval": (truncated_edges, "eval {run}", DAMAGED),
    "truncated_edges_resume": (truncated_edges, "train --resume {run} training.epochs=2", DAMAGED),
    "truncated_edges_new_run": (truncated_edges, f"train dataset.path={{data}} {RUN_SETTINGS} --run-dir {{out}}",
                                DAMAGED),
    "truncated_edges_info": (truncated_edges, "info {data}", DAMAGED),
    "damaged_chunk_eval": (damaged_train_chunk, "eval {run}", DAMAGED),
    "damaged_chunk_resume": (damaged_train_chunk, "train --resume {run} training.epochs=2 --quiet", DAMAGED),
    "garbage_edges_predict": (garbage_edges, "predict {run} --head {head} --relation {relation}", DAMAGED),
    "edges_removed_export": (removed("edges.h5"), "export {run} -o {out}", "edge file is missing"),
    # a raw directory whose files changed after a run trained on it
    "raw_replaced_eval": (raw_files_replaced, "eval {raw_run}", "the dataset's nodes: 135 when trained, 14 now"),
    "raw_replaced_resume": (raw_files_replaced, "train --resume {raw_run} training.epochs=2 --quiet",
                            "the dataset's nodes: 135 when trained, 14 now"),
    "raw_edge_dropped_eval": (raw_train_edge_dropped, "eval {raw_run}", "train edges: 5216 when trained, 5215 now"),
    # settings changed on resume: the refusal names them
    "resume_other_dim": (nothing, "train --resume {run} model.dim=16", "model.dim: 8 when trained, 16 now"),
    "resume_other_decoder": (nothing, "train --resume {run} model.decoder=complex",
                             "model.decoder: distmult when trained, complex now"),
    "resume_other_adagrad": (nothing, "train --resume {run} training.adagrad_variant=rowwise",
                             "training.adagrad_variant: full when trained, rowwise now"),
}


@pytest.fixture(scope="module")
def reference(tmp_path_factory):
    """A preprocessed UMLS and a raw copy of its files, each with a run of one epoch trained on it."""
    tmp = tmp_path_factory.mktemp("identity")
    raw = tmp / "raw"
    shutil.copytree(UMLS_RAW, raw)
    data = tmp / "data"
    preprocess(data, raw / "train.txt", raw / "valid.txt", raw / "test.txt", PreprocessOptions(), progress=False)
    for name, dataset in (("run", data), ("raw_run", raw)):
        assert run_cli(shlex.split(f"train dataset.path={dataset} {RUN_SETTINGS} model.decoder=distmult "
                                   f"--run-dir {tmp / name}")) == 0
    return tmp


def _copy_places(reference: Path, tmp: Path) -> dict:
    """A private copy of the reference's dataset, raw files and runs, each run's config naming the copies."""
    for name in ("raw", "data", "run", "raw_run"):
        shutil.copytree(reference / name, tmp / name)
    for run in ("run", "raw_run"):
        config = tmp / run / "config.yaml"
        config.write_text(config.read_text().replace(str(reference), str(tmp)))
    head, relation, _ = _lines(UMLS_RAW / "train.txt")[0].split("\t")
    return {"tmp": tmp, "raw": tmp / "raw", "data": tmp / "data", "run": tmp / "run", "raw_run": tmp / "raw_run",
            "out": tmp / "out", "head": head, "relation": relation}


def _committed(places) -> dict[str, str]:
    """Every file of both runs' checkpoints, by path: its SHA-256."""
    return {str(path.relative_to(places["tmp"])): hashlib.sha256(path.read_bytes()).hexdigest()
            for run in ("run", "raw_run") for path in sorted((places[run] / "checkpoints").rglob("*"))
            if path.is_file()}


def test_corpus_has_thirty_cases():
    assert len(CASES) >= 30


@pytest.mark.parametrize("name", sorted(CASES))
def test_changed_data_is_one_clean_refusal(name, reference, tmp_path, capsys):
    mutate, command, fragment = CASES[name]
    places = _copy_places(reference, tmp_path)
    mutate(places)
    committed = _committed(places)
    code = run_cli(shlex.split(command.format(**places)))
    err = capsys.readouterr().err
    assert code == 2, err
    assert fragment in err and "Traceback" not in err, err
    assert err.count("marius-py: error:") == 1, err  # (one message; eval may say first which checkpoint it took)
    assert all(line.startswith("marius-py: ") for line in err.strip().splitlines()), err
    assert not places["out"].exists()
    assert _committed(places) == committed


def test_the_api_refuses_a_renumbered_dataset(reference, tmp_path):
    places = _copy_places(reference, tmp_path)
    renumbered(places)
    with pytest.raises(MariusInputError, match=RENUMBERED):
        mp.load_checkpoint(places["run"])


def test_an_edited_raw_directory_is_preprocessed_anew(reference, tmp_path, capsys):
    """A run on a raw directory whose files were replaced trains and ranks the new files, not the old cache."""
    places = _copy_places(reference, tmp_path)
    raw_files_replaced(places)
    assert run_cli(shlex.split(f"train dataset.path={places['raw']} {RUN_SETTINGS} --run-dir {tmp_path / 'new'}")) == 0
    model = mp.load_checkpoint(tmp_path / "new")
    assert model.dataset.num_nodes == 14 and model.dataset.node_id("n3") >= 0
    assert model.evaluate("test")["num_queries"] == 40


def test_identity_is_the_content(reference, tmp_path):
    """The same files give the same identity whatever valid's line order and the partitions; a re-bucketed
    copy keeps it; a dataset from before identities gets one computed once, and its runs still open."""
    places = _copy_places(reference, tmp_path)
    identity = read_metadata(places["data"]).identity
    assert set(identity) == {"nodes", "node_set", "relations", "relation_set", "train", "valid", "test"}
    shuffled_valid = _lines(UMLS_RAW / "valid.txt")
    random.Random(3).shuffle(shuffled_valid)
    again = tmp_path / "again"
    preprocess(again, UMLS_RAW / "train.txt", _write_lines(tmp_path / "valid.txt", shuffled_valid),
               UMLS_RAW / "test.txt", PreprocessOptions(num_partitions=4), progress=False)
    assert read_metadata(again).identity == identity
    rebucket(places["data"], tmp_path / "p2", 2, progress=False)
    assert read_metadata(tmp_path / "p2").identity == identity

    metadata = read_metadata(places["data"])
    metadata.identity = {}
    write_metadata(places["data"], metadata)
    Dataset(places["data"]).close()
    assert read_metadata(places["data"]).identity == identity  # computed once, and recorded
    assert mp.load_checkpoint(places["run"]).evaluate("test")["mrr"] > 0


def test_a_version_from_before_identities_still_opens(reference, tmp_path):
    """A version whose state.json has neither the fingerprint's fields nor the identity (written before them)
    loads, and a resume records both in its next version."""
    import json
    places = _copy_places(reference, tmp_path)
    version = places["run"] / "checkpoints" / "v000001"
    state_file = version / "state.json"
    state = json.loads(state_file.read_text())
    state.pop("fingerprint_fields")
    state.pop("dataset_identity")
    state_file.write_text(json.dumps(state))
    from marius_py.storage.manifest import write_manifest
    write_manifest(version)
    assert mp.load_checkpoint(places["run"]).evaluate("test")["mrr"] > 0
    assert run_cli(shlex.split(f"train --resume {places['run']} training.epochs=2 --quiet")) == 0
    resumed = json.loads((places["run"] / "checkpoints" / "v000002" / "state.json").read_text())
    assert resumed["dataset_identity"] == read_metadata(places["data"]).identity


def test_order_free_digest():
    rows = np.random.default_rng(0).integers(0, 1 << 40, size=(1000, 3))
    digest = OrderFreeDigest()
    digest.add_rows(rows)
    shuffled = OrderFreeDigest()
    for part in np.array_split(rows[np.random.default_rng(1).permutation(1000)], 7):
        shuffled.add_rows(part)
    assert shuffled.hexdigest() == digest.hexdigest()
    changed = rows.copy()
    changed[5, 1] += 1
    other = OrderFreeDigest()
    other.add_rows(changed)
    assert other.hexdigest() != digest.hexdigest()
    swapped = OrderFreeDigest()
    swapped.add_rows(rows[:, [2, 1, 0]])  # (head and tail swapped: another edge)
    assert swapped.hexdigest() != digest.hexdigest()


def test_a_dataset_from_before_identities_records_one_only_of_sound_names(reference, tmp_path, monkeypatch):
    """Its names file damaged, it is refused and records nothing; put back, it opens and records the identity;
    where its metadata cannot be written (a read-only directory), it opens with the identity computed anew."""
    places = _copy_places(reference, tmp_path)
    identity = read_metadata(places["data"]).identity
    metadata = read_metadata(places["data"])
    metadata.identity = {}
    write_metadata(places["data"], metadata)
    nodes = places["data"] / "nodes.txt"
    sound = nodes.read_bytes()
    _write_lines(nodes, line_deleted(_lines(nodes)))
    with pytest.raises(MariusInputError, match="134 names"):
        Dataset(places["data"])
    assert read_metadata(places["data"]).identity == {}
    nodes.write_bytes(sound)

    def read_only(*args):
        raise PermissionError(13, "Permission denied")
    with monkeypatch.context() as patch:
        patch.setattr("marius_py.dataset.write_metadata", read_only)
        dataset = Dataset(places["data"])
        assert dataset.identity == identity and read_metadata(places["data"]).identity == {}
        dataset.close()
    Dataset(places["data"]).close()
    assert read_metadata(places["data"]).identity == identity
