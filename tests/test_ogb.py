"""OGB's link-prediction downloads (issue 54): split files of id arrays (torch.save'd dicts of NumPy arrays)
read by an unpickler that builds arrays only, every node kept, the given negatives put in the dataset's ids,
and the ``given`` protocol ranking each edge against its own negatives. The archives here are built in
OGB's layout from a small random graph; a local HTTP server serves them."""

from __future__ import annotations

import gzip
import hashlib
import io
import pickle
import zipfile

import numpy as np
import pytest
import torch

import marius_py as mp
from marius_py.catalog import DATASETS, DatasetSource, Download, Stats
from marius_py.dataset import Dataset
from marius_py.errors import MariusInputError
from marius_py.evaluation import evaluate_given
from marius_py.models import build_decoder
from marius_py.dataset import given_negatives
from marius_py.ogb import OgbLayout, read_split
from test_datasets_by_name import Server, cache, server  # noqa: F401  (fixtures)

NUM_NODES, NUM_RELATIONS, NEGATIVES = 60, 4, 7


def triples(rng, count: int) -> dict[str, np.ndarray]:
    return {"head": rng.integers(NUM_NODES, size=count), "relation": rng.integers(NUM_RELATIONS, size=count),
            "tail": rng.integers(NUM_NODES, size=count)}


def saved(value) -> bytes:
    buffer = io.BytesIO()
    torch.save(value, buffer)
    return buffer.getvalue()


def wikikg_like(seed: int = 0) -> tuple[bytes, dict]:
    """A zip in ogbl-wikikg2's layout; node 59 is in no train edge, only in a test edge and negatives."""
    rng = np.random.default_rng(seed)
    train = triples(rng, 600)
    train["head"][train["head"] == 59], train["tail"][train["tail"] == 59] = 0, 1
    splits = {"train": train}
    for split, count in (("valid", 40), ("test", 50)):
        splits[split] = {**triples(rng, count), "head_neg": rng.integers(NUM_NODES, size=(count, NEGATIVES)),
                         "tail_neg": rng.integers(NUM_NODES, size=(count, NEGATIVES))}
    splits["test"]["tail"][0] = 59
    buffer = io.BytesIO()
    with zipfile.ZipFile(buffer, "w") as archive:
        for split, arrays in splits.items():
            archive.writestr(f"wikikg-v2/split/time/{split}.pt", saved(arrays))
        archive.writestr("wikikg-v2/raw/num-node-list.csv.gz", gzip.compress(f"{NUM_NODES}\n".encode()))
    return buffer.getvalue(), splits


def wikikg_entry(url: str, data: bytes, stats: Stats | None = None) -> DatasetSource:
    return DatasetSource(
        task="link_prediction", downloads=(Download(url, "wikikg-v2.zip",
                                                    sha256=hashlib.sha256(data).hexdigest()),),
        splits={split: f"wikikg-v2.zip!wikikg-v2/split/time/{split}.pt" for split in ("train", "valid", "test")},
        ogb=OgbLayout(num_nodes="wikikg-v2.zip!wikikg-v2/raw/num-node-list.csv.gz"),
        stats=stats or Stats(nodes=NUM_NODES, relations=NUM_RELATIONS, train=600, valid=40, test=50),
        license="test data", protocol="given")


@pytest.fixture
def wikikg(server, cache):  # noqa: F811
    data, splits = wikikg_like()
    server.files["/wikikg-v2.zip"] = data
    with DATASETS.registered("wikikg-test", wikikg_entry(server.url("/wikikg-v2.zip"), data)):
        yield mp.load_dataset("wikikg-test"), splits


def test_an_ogb_dataset_keeps_every_node_and_edge_and_its_negatives_in_its_own_ids(wikikg):
    dataset, splits = wikikg
    assert (dataset.num_nodes, dataset.num_relations) == (NUM_NODES, NUM_RELATIONS)
    assert (len(dataset.train), len(dataset.valid), len(dataset.test)) == (600, 40, 50)
    names = np.array(dataset.node_names)
    for split in ("valid", "test"):
        edges, ogb = dataset.split(split), splits[split]
        # the split's edges, in OGB's order, named by OGB's ids
        np.testing.assert_array_equal(names[edges[:, 0]].astype(int), ogb["head"])
        np.testing.assert_array_equal(names[edges[:, 2]].astype(int), ogb["tail"])
        negatives = given_negatives(dataset.directory, split)
        assert negatives.directions == ("heads", "tails") and negatives.ids.shape == (len(edges), 2, NEGATIVES)
        np.testing.assert_array_equal(names[negatives.ids[:, 0]].astype(int), ogb["head_neg"])
        np.testing.assert_array_equal(names[negatives.ids[:, 1]].astype(int), ogb["tail_neg"])
    assert "59" in dataset.node_names  # (a node only a test edge has keeps its row)


def test_the_given_protocol_equals_an_independent_numpy_computation(wikikg):
    """DistMult scored in NumPy alone (float64): for each edge and direction, the answer's rank among itself
    and its K given candidates, ties counted half (the mean of the optimistic and pessimistic rank)."""
    dataset, _ = wikikg
    torch.manual_seed(0)
    nodes = torch.randn(NUM_NODES, 8)
    decoder = build_decoder("distmult", NUM_RELATIONS, 8, 0.5)
    table, relations = nodes.numpy().astype(np.float64), decoder.relations.detach().numpy().astype(np.float64)
    for split in ("valid", "test"):
        edges, negatives = dataset.split(split), given_negatives(dataset.directory, split)
        got = evaluate_given(decoder, nodes, edges, negatives)
        reciprocal = []
        for direction in (0, 1):  # (heads, then tails)
            for (h, r, t), drawn in zip(edges.tolist(), negatives.ids[:, direction].tolist()):
                # (heads are asked of the tail with the relation's inverse row, R + r, as the engine trains them)
                query = table[h] * relations[r] if direction else table[t] * relations[NUM_RELATIONS + r]
                answer = table[t if direction else h] @ query
                others = table[drawn] @ query
                others[np.array(drawn) == (t if direction else h)] = answer  # (the answer drawn: the same score)
                rank = 1 + np.sum(others > answer) + 0.5 * np.sum(others == answer)
                reciprocal.append(1 / rank)
        assert got["mrr"] == pytest.approx(np.mean(reciprocal), abs=1e-6)
        assert got["num_queries"] == 2 * len(edges) and "7 negatives the dataset gives" in got["protocol"]


def test_training_evaluates_with_the_given_protocol_and_a_partitioned_copy_keeps_the_negatives(wikikg, tmp_path):
    dataset, _ = wikikg
    model = mp.train(mp.make_config(None, [f"dataset.path=wikikg-test", "training.device=cpu", "model.dim=8",
                                           "training.epochs=1", "evaluation.protocol=given",
                                           "storage.num_partitions=2"]), tmp_path / "run", progress=False)
    assert "negatives the dataset gives each edge" in model.test_metrics["protocol"]
    assert model.test_metrics["num_queries"] == 2 * 50


def test_the_given_protocol_needs_a_dataset_that_gives_negatives(small_config, tmp_path):
    with pytest.raises(MariusInputError, match="gives no negatives for its valid edges"):
        mp.train(small_config("evaluation.protocol=given", "training.epochs=1"), tmp_path / "run", progress=False)


def test_a_typed_ogb_graph_names_nodes_by_type_and_maps_negatives_within_the_type(server, cache):  # noqa: F811
    rng = np.random.default_rng(1)
    counts = {"drug": 12, "protein": 20}
    kinds = np.array(["drug", "protein"], dtype=object)

    def typed(count: int, negatives: bool) -> dict:
        head_type, tail_type = kinds[rng.integers(2, size=count)], kinds[rng.integers(2, size=count)]
        arrays = {"head_type": head_type, "tail_type": tail_type, "relation": rng.integers(3, size=count),
                  "head": np.array([rng.integers(counts[t]) for t in head_type]),
                  "tail": np.array([rng.integers(counts[t]) for t in tail_type])}
        if negatives:
            arrays["head_neg"] = np.array([rng.integers(counts[t], size=5) for t in head_type])
            arrays["tail_neg"] = np.array([rng.integers(counts[t], size=5) for t in tail_type])
        return arrays
    splits = {"train": typed(300, False), "valid": typed(20, True), "test": typed(20, True)}
    buffer = io.BytesIO()
    with zipfile.ZipFile(buffer, "w") as archive:
        for split, arrays in splits.items():
            archive.writestr(f"biokg/split/random/{split}.pt", saved(arrays))
        archive.writestr("biokg/raw/num-node-dict.csv.gz", gzip.compress(b"drug,protein\n12,20\n"))
    data = buffer.getvalue()
    server.files["/biokg.zip"] = data
    entry = DatasetSource(
        task="link_prediction",
        downloads=(Download(server.url("/biokg.zip"), sha256=hashlib.sha256(data).hexdigest()),),
        splits={split: f"biokg.zip!biokg/split/random/{split}.pt" for split in ("train", "valid", "test")},
        ogb=OgbLayout(num_nodes="biokg.zip!biokg/raw/num-node-dict.csv.gz", typed=True),
        stats=Stats(nodes=32, relations=3, train=300, valid=20, test=20), license="test data")
    with DATASETS.registered("biokg-test", entry):
        dataset = mp.load_dataset("biokg-test")
    assert dataset.num_nodes == 32 and all(":" in name for name in dataset.node_names)
    names = np.array(dataset.node_names)
    negatives = given_negatives(dataset.directory, "test")
    for row, (head_type, tail_type) in enumerate(zip(splits["test"]["head_type"], splits["test"]["tail_type"])):
        assert list(names[negatives.ids[row, 0]]) == [f"{head_type}:{n}" for n in splits["test"]["head_neg"][row]]
        assert list(names[negatives.ids[row, 1]]) == [f"{tail_type}:{n}" for n in splits["test"]["tail_neg"][row]]


def test_a_split_file_that_would_run_code_is_refused(tmp_path, capsys):
    class Payload:
        def __reduce__(self):
            return (print, ("this ran",))
    path = tmp_path / "train.pt"
    torch.save({"head": Payload()}, path, pickle_module=pickle)
    with pytest.raises(MariusInputError, match=r"print is not an array"):
        read_split(path)
    assert "this ran" not in capsys.readouterr().out
    torch.save({"head": np.arange(3), "relation": np.zeros(3, dtype=np.int64)}, path)
    assert read_split(path)["head"].tolist() == [0, 1, 2]


@pytest.mark.parametrize("name", ["ogbl-wikikg2", "ogbl-biokg"])
def test_the_shipped_ogb_configs_name_their_registry_dataset_and_its_protocol(name):
    from marius_py.catalog_entries import registered
    config = mp.make_config(name)
    assert config.dataset.path == name and config.evaluation.protocol == "given"
    assert registered(name).protocol == "given" and registered(name).ogb is not None


def test_train_help_names_every_shipped_config(capsys):
    from marius_py.bundled import BUNDLED_CONFIGS
    from marius_py.cli import build_parser
    text = " ".join(build_parser()._subparsers._group_actions[0].choices["train"].format_help().split())
    assert all(name in text for name in BUNDLED_CONFIGS)


def test_the_top10_protocol_counts_tails_only_and_nothing_past_the_tenth():
    """WikiKG90Mv2's MRR against NumPy: each tail's rank among all nodes (nothing filtered), reciprocal 0
    past rank 10; head queries are not asked."""
    from marius_py.evaluation import evaluate_top10
    rng = np.random.default_rng(3)
    torch.manual_seed(3)
    nodes, decoder = torch.randn(NUM_NODES, 8), build_decoder("distmult", NUM_RELATIONS, 8, 0.5)
    edges = np.stack([rng.integers(NUM_NODES, size=80), rng.integers(NUM_RELATIONS, size=80),
                      rng.integers(NUM_NODES, size=80)], axis=1)
    got = evaluate_top10(decoder, nodes, edges, NUM_RELATIONS, batch_size=16)
    table, relations = nodes.numpy().astype(np.float64), decoder.relations.detach().numpy().astype(np.float64)
    reciprocal, ranks = [], []
    for h, r, t in edges.tolist():
        scores = table @ (table[h] * relations[r])
        others = np.delete(scores, t)
        rank = 1 + np.sum(others > scores[t]) + 0.5 * np.sum(others == scores[t])
        ranks.append(rank)
        reciprocal.append(1 / rank if rank <= 10 else 0.0)
    assert got["num_queries"] == len(edges) and "top 10" in got["protocol"]
    assert got["mrr"] == pytest.approx(np.mean(reciprocal), abs=1e-6)
    assert got["mean_rank"] == pytest.approx(np.mean(ranks), abs=1e-6) and max(ranks) > 10  # (the cut matters)


def test_an_ogb_lsc_download_reads_its_npy_splits_with_the_valid_tails_apart(server, cache):  # noqa: F811
    """WikiKG90Mv2's layout: processed/train_hrt.npy, val_hr.npy and val_t.npy, the counts in meta.pt; the
    test tails are hidden, so the entry names the valid split for test too."""
    from marius_py.evaluation import PROTOCOL_TOP10
    rng = np.random.default_rng(4)
    train = np.stack([rng.integers(NUM_NODES, size=500), rng.integers(NUM_RELATIONS, size=500),
                      rng.integers(NUM_NODES, size=500)], axis=1)
    valid_hr = np.stack([rng.integers(NUM_NODES, size=30), rng.integers(NUM_RELATIONS, size=30)], axis=1)
    valid_t = rng.integers(NUM_NODES, size=30)

    def npy(array) -> bytes:
        buffer = io.BytesIO()
        np.save(buffer, array)
        return buffer.getvalue()
    buffer = io.BytesIO()
    with zipfile.ZipFile(buffer, "w") as archive:
        archive.writestr("wikikg90m-v2/processed/train_hrt.npy", npy(train))
        archive.writestr("wikikg90m-v2/processed/val_hr.npy", npy(valid_hr))
        archive.writestr("wikikg90m-v2/processed/val_t.npy", npy(valid_t))
        archive.writestr("wikikg90m-v2/meta.pt", saved({"num_entities": NUM_NODES, "num_relations": NUM_RELATIONS}))
    data = buffer.getvalue()
    server.files["/wikikg90m-v2.zip"] = data
    member = "wikikg90m-v2.zip!wikikg90m-v2/"
    entry = DatasetSource(
        task="link_prediction", downloads=(Download(server.url("/wikikg90m-v2.zip")),),
        splits={"train": f"{member}processed/train_hrt.npy", "valid": f"{member}processed/val_hr.npy",
                "test": f"{member}processed/val_hr.npy"},
        ogb=OgbLayout(num_nodes=f"{member}meta.pt", valid_tails=f"{member}processed/val_t.npy"),
        stats=Stats(nodes=NUM_NODES, relations=NUM_RELATIONS, train=500, valid=30, test=30), license="test data",
        protocol="top10")
    with DATASETS.registered("lsc-test", entry):
        dataset = mp.load_dataset("lsc-test")
        config = mp.make_config(None, ["dataset.path=lsc-test", "training.device=cpu", "model.dim=8",
                                       "training.epochs=1", "evaluation.protocol=top10"])
        assert mp.train(config, cache.parent / "run", progress=False).test_metrics["protocol"] == PROTOCOL_TOP10
    names = np.array(dataset.node_names)
    assert (dataset.num_nodes, len(dataset.train), len(dataset.valid)) == (NUM_NODES, 500, 30)
    np.testing.assert_array_equal(names[dataset.valid[:, 2]].astype(int), valid_t)
    np.testing.assert_array_equal(names[dataset.valid[:, 0]].astype(int), valid_hr[:, 0])
    assert given_negatives(dataset.directory, "valid") is None


def test_a_dotted_global_cannot_walk_from_an_allowed_module_to_eval(tmp_path):
    """Pickle protocol 4 resolves dotted names: numpy.dtypes + '_add_dtype_helper.__globals__...' would reach
    eval. The file is refused before anything runs."""
    def global_(module: str, name: str) -> bytes:
        return (b"\x8c" + bytes([len(module)]) + module.encode() + b"\x8c" + bytes([len(name)]) + name.encode()
                + pickle.STACK_GLOBAL)

    def text(value: str) -> bytes:
        return b"\x8c" + bytes([len(value.encode())]) + value.encode()
    marker = tmp_path / "ran"
    payload = (pickle.PROTO + b"\x04" + global_("numpy.dtypes", "_add_dtype_helper.__globals__.__class__.get")
               + global_("numpy.dtypes", "_add_dtype_helper.__globals__.get") + text("__builtins__")
               + pickle.TUPLE1 + pickle.REDUCE + text("eval") + pickle.TUPLE2 + pickle.REDUCE
               + text(f"open({str(marker)!r}, 'w').close() or {{}}") + pickle.TUPLE1 + pickle.REDUCE + pickle.STOP)
    torch.save({"a": 1}, tmp_path / "good.pt")
    with zipfile.ZipFile(tmp_path / "good.pt") as good, zipfile.ZipFile(tmp_path / "evil.pt", "w") as evil:
        for info in good.infolist():
            evil.writestr(info, payload if info.filename.endswith("data.pkl") else good.read(info.filename))
    with pytest.raises(MariusInputError, match="is not an array"):
        read_split(tmp_path / "evil.pt")
    assert not marker.exists()


def test_a_dataset_is_published_only_with_its_negatives(server, cache, monkeypatch):  # noqa: F811
    """An interrupt while the negatives are written leaves no dataset that looks prepared; the next run
    prepares it whole (a cached dataset without negatives would fail every given evaluation)."""
    import marius_py.registered_data as prepared
    data, _ = wikikg_like()
    server.files["/wikikg-v2.zip"] = data
    original = prepared.write_given_negatives

    def interrupted(*args, **kwargs):
        raise KeyboardInterrupt
    monkeypatch.setattr(prepared, "write_given_negatives", interrupted)
    with DATASETS.registered("wikikg-test", wikikg_entry(server.url("/wikikg-v2.zip"), data)):
        with pytest.raises(KeyboardInterrupt):
            mp.load_dataset("wikikg-test")
        assert not [p for p in (cache / "datasets").iterdir() if not p.name.startswith(".")]
        monkeypatch.setattr(prepared, "write_given_negatives", original)
        dataset = mp.load_dataset("wikikg-test")
    assert given_negatives(dataset.directory, "test").ids.shape == (50, 2, NEGATIVES)


def test_the_given_protocol_is_refused_before_training_on_a_dataset_without_negatives(small_config, tmp_path,
                                                                                        monkeypatch):
    from marius_py.trainer import Trainer
    monkeypatch.setattr(Trainer, "train_epoch", lambda *args: pytest.fail("trained before refusing"))
    with pytest.raises(MariusInputError, match="gives no negatives for its valid edges"):
        mp.train(small_config("evaluation.protocol=given", "evaluation.every=0"), tmp_path / "run", progress=False)


def test_given_negatives_are_stored_in_32_bits(wikikg):
    dataset, _ = wikikg
    assert given_negatives(dataset.directory, "valid").ids.dtype == np.int32
