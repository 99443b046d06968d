"""The trained model as research code uses it (issue 52, items 5 and 6): evaluate any triples, predict in
batches, named relation vectors, the node table without a copy; run directories that cannot collide and
process-wide settings put back after a run. One tiny UMLS run serves the module."""

from __future__ import annotations

import time

import numpy as np
import pytest
import torch

import marius_py as mp
import marius_py.api as api
from marius_py.evaluation import NodeTable
from marius_py.trainer import Trainer

HEADS = ["animal", "bacterium", "virus", "plant", "fish", "bird"]
RELATIONS = ["practices", "isa", "interacts_with", "causes", "location_of", "isa"]


@pytest.fixture(scope="module")
def config(umls_dataset):
    return mp.make_config(None, [f"dataset.path={umls_dataset}", "training.device=cpu", "model.dim=8",
                                 "training.epochs=1"])


@pytest.fixture(scope="module")
def model(config, tmp_path_factory):
    return mp.train(config, tmp_path_factory.mktemp("research") / "run", progress=False)


def names_of(dataset, edges) -> list[tuple[str, str, str]]:
    nodes, relations = dataset.node_names, dataset.relation_names
    return [(nodes[h], relations[r], nodes[t]) for h, r, t in edges.tolist()]


# ---- evaluate ----

def test_evaluating_the_test_triples_by_name_is_evaluating_the_test_split(model):
    triples = names_of(model.dataset, model.dataset.test)
    split = model.evaluate("test")
    assert model.evaluate(triples) == split
    assert model.evaluate(np.array(triples)) == split
    assert split["num_queries"] == 2 * len(triples)


def test_unfiltered_ranks_at_least_as_badly(model):
    triples = names_of(model.dataset, model.dataset.test)
    filtered, unfiltered = model.evaluate(triples), model.evaluate(triples, filtered=False)
    assert unfiltered == model.evaluate("test", filtered=False)
    assert unfiltered["protocol"].startswith("unfiltered ranking vs all nodes")
    assert unfiltered["mean_rank"] > filtered["mean_rank"]  # (UMLS's test edges share many known answers)
    assert unfiltered["mrr"] <= filtered["mrr"] and unfiltered["hits@10"] <= filtered["hits@10"]


def realistic_rank(answers: list[tuple[str, float]], target: str, target_score: float) -> float:
    """(1 + #other answers scoring higher + 1 + #other answers scoring at least as high) / 2."""
    others = [score for name, score in answers if name != target]
    return (2 + sum(score > target_score for score in others) + sum(score >= target_score for score in others)) / 2


@pytest.mark.parametrize("filtered", [True, False])
def test_a_triple_ranks_where_predict_puts_its_answers(model, filtered):
    """The ranks evaluate gives one triple are those predict's scores of every candidate give it, known
    answers left out when filtered (the target's own score comes from the unfiltered list)."""
    head, relation, tail = names_of(model.dataset, model.dataset.test[:1])[0]
    every = model.dataset.num_nodes
    ranks = []
    for side, anchor, target in (("head", head, tail), ("tail", tail, head)):
        target_score = dict(model.predict(relation=relation, **{side: anchor}, k=every))[target]
        answers = model.predict(relation=relation, **{side: anchor}, k=every, filter_known=filtered)
        ranks.append(realistic_rank(answers, target, target_score))
    metrics = model.evaluate([(head, relation, tail)], filtered=filtered)
    assert metrics["mean_rank"] == pytest.approx(sum(ranks) / 2)
    assert metrics["mrr"] == pytest.approx((1 / ranks[0] + 1 / ranks[1]) / 2)


# ---- predict ----

@pytest.mark.parametrize("filter_known", [False, True])
@pytest.mark.parametrize("side", ["head", "tail"])
def test_batched_predict_is_one_by_one_predict(model, side, filter_known):
    names, scores = model.predict(relation=RELATIONS, **{side: HEADS}, k=7, filter_known=filter_known)
    assert names.shape == scores.shape == (len(HEADS), 7) and names.dtype.kind == "U"
    for row, (anchor, relation) in enumerate(zip(HEADS, RELATIONS)):
        one = model.predict(relation=relation, **{side: anchor}, k=7, filter_known=filter_known)
        assert list(names[row]) == [name for name, _ in one]
        np.testing.assert_allclose(scores[row], [score for _, score in one], rtol=1e-6)


def test_one_name_stands_for_every_query_and_filtered_rows_end_empty(model):
    """One head under several of the relations it has edges of: with every node asked for, its known
    answers are left out and each row ends in "" and -inf."""
    head = names_of(model.dataset, model.dataset.train[:1])[0][0]
    relations = sorted({relation for h, relation, _ in names_of(model.dataset, model.dataset.train) if h == head})
    names, scores = model.predict(relation=relations, head=head, k=model.dataset.num_nodes, filter_known=True)
    for row, relation in enumerate(relations):
        one = model.predict(relation=relation, head=head, k=model.dataset.num_nodes, filter_known=True)
        assert 0 < len(one) < model.dataset.num_nodes
        assert list(names[row][:len(one)]) == [name for name, _ in one]
        assert set(names[row][len(one):]) == {""} and np.isneginf(scores[row][len(one):]).all()


# ---- embeddings ----

def test_relation_vectors_by_name_are_the_table_rows(model):
    names, table = model.relation_embeddings()
    count = model.dataset.num_relations
    assert table.shape == tuple(model.decoder.relations.shape) and len(names) == 2 * count
    for relation in ("isa", "practices"):
        row = model.dataset.relation_id(relation)
        np.testing.assert_array_equal(model.relation_embedding(relation), table[names.index(relation)])
        np.testing.assert_array_equal(model.relation_embedding(relation), table[row])
        inverse = model.relation_embedding(relation, inverse=True)
        np.testing.assert_array_equal(inverse, table[names.index(f"{relation}__inverse")])
        np.testing.assert_array_equal(inverse, model.decoder.relations[count + row].detach().numpy())
    table[:] = 0  # a copy: the model's own vectors are untouched
    assert model.decoder.relations.abs().sum() > 0


def test_the_node_table_is_the_models_own_tensor(model, tmp_path):
    table = model.node_table()
    assert isinstance(table, torch.Tensor) and table.data_ptr() == model.table.nodes.data_ptr()
    assert table.shape == (model.dataset.num_nodes, 8)
    loaded = mp.load_checkpoint(model.run_dir, device="cpu")
    assert loaded.node_table().data_ptr() == loaded.table.nodes.data_ptr()
    np.testing.assert_array_equal(loaded.node_table().numpy(), model.embeddings())


class Streamed(NodeTable):
    device = torch.device("cpu")


def test_the_node_table_of_a_model_out_of_core_is_refused_with_what_to_use(model):
    streamed = mp.TrainedModel(model.config, model.dataset, model.model, Streamed())
    with pytest.raises(mp.MariusInputError, match=r"node_table: .*out of core.*blocks\(\)"):
        streamed.node_table()


# ---- run directories and process settings ----

def test_default_run_dirs_of_one_second_differ(config, monkeypatch, tmp_path):
    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(time, "strftime", lambda *_: "20240101-120000")
    first, second = mp.train(config, progress=False), mp.train(config, progress=False)
    assert first.run_dir != second.run_dir and first.run_dir.parent == second.run_dir.parent
    assert (first.run_dir / "config.yaml").is_file() and (second.run_dir / "config.yaml").is_file()
    draws = iter(["aaaa", "aaaa", "bbbb"])  # the same random suffix drawn twice in one process
    monkeypatch.setattr(api.secrets, "token_hex", lambda _: next(draws))
    assert api.default_run_dir(config) != api.default_run_dir(config)
    monkeypatch.setattr(api.secrets, "token_hex", lambda _: "cccc")  # another process, the same draw
    names = set()
    for pid in (100, 101):
        monkeypatch.setattr(api.os, "getpid", lambda pid=pid: pid)
        names.add(api.default_run_dir(config))
    assert len(names) == 2


def process_settings():
    return (torch.get_num_threads(), torch.get_float32_matmul_precision(),
            torch.are_deterministic_algorithms_enabled(), torch.is_deterministic_algorithms_warn_only_enabled())


@pytest.mark.parametrize("fails", [False, True])
def test_a_run_leaves_the_process_settings_as_it_found_them(config, tmp_path, monkeypatch, fails):
    threads = 1 if torch.get_num_threads() != 1 else 2
    before = process_settings()
    torch.manual_seed(7)
    expected_draw = torch.rand(3)
    torch.manual_seed(7)
    seen = {}
    train = Trainer.train

    def spy(trainer):
        seen["threads"] = torch.get_num_threads()
        seen["deterministic"] = torch.are_deterministic_algorithms_enabled()
        if fails:
            raise RuntimeError("stopped")
        return train(trainer)
    monkeypatch.setattr(Trainer, "train", spy)
    run_config = mp.make_config(None, [f"dataset.path={config.dataset.path}", "training.device=cpu",
                                       "model.dim=8", "training.epochs=1", f"training.num_threads={threads}"])
    if fails:
        with pytest.raises(RuntimeError, match="stopped"):
            mp.train(run_config, tmp_path / "run", progress=False)
    else:
        mp.train(run_config, tmp_path / "run", progress=False)
    assert seen["threads"] == threads  # (the run did change it)
    assert process_settings() == before
    assert torch.equal(torch.rand(3), expected_draw)  # the caller's random stream goes on where it was


# ---- mistakes ----

MISTAKES = {
    "evaluate_unknown_split": (lambda m: m.evaluate("train"), "evaluate: split 'train'"),
    "evaluate_a_number": (lambda m: m.evaluate(5), "evaluate: triples_or_split: 5 is not a list"),
    "evaluate_nothing": (lambda m: m.evaluate([]), "evaluate: triples_or_split is empty"),
    "evaluate_pairs_on_a_graph_with_relations": (lambda m: m.evaluate([("animal", "bacterium")]),
                                                 "evaluate: triples_or_split: item 0 is"),
    "evaluate_an_unknown_node": (lambda m: m.evaluate([("animal", "isa", "unicorn")]), "unicorn"),
    "evaluate_filtered_a_string": (lambda m: m.evaluate("test", filtered="no"), "evaluate: filtered is a str"),
    "predict_lists_of_two_lengths": (lambda m: m.predict(relation=["isa"], head=["animal", "virus"]),
                                     "predict: relation has 1 names, head has 2 names"),
    "predict_an_empty_list": (lambda m: m.predict(relation="isa", head=[]), "predict: head is empty"),
    "predict_a_number_in_a_list": (lambda m: m.predict(relation="isa", head=["animal", 3]),
                                   "predict: head[1] is a int"),
    "predict_a_table_of_names": (lambda m: m.predict(relation="isa", head=np.array([["animal"]])),
                                 "predict: head is a 2-D array"),
    "predict_heads_and_tails": (lambda m: m.predict(relation="isa", head=["animal"], tail=["virus"]),
                                "give exactly one of head and tail"),
    "predict_a_list_without_relations": (lambda m: m.predict(head=["animal"]), "a relation is required"),
    "predict_an_unknown_relation_in_a_list": (lambda m: m.predict(relation=["isa", "eats"], head="animal"),
                                              "eats"),
    "relation_embedding_a_number": (lambda m: m.relation_embedding(3), "relation_embedding: name is a int"),
    "relation_embedding_unknown": (lambda m: m.relation_embedding("eats"), "eats"),
    "relation_embedding_inverse_a_string": (lambda m: m.relation_embedding("isa", inverse="yes"),
                                            "relation_embedding: inverse is a str"),
    "evaluate_a_0d_array": (lambda m: m.evaluate(np.array("test")), "evaluate: triples_or_split: array("),
    "dataset_split_unknown": (lambda m: m.dataset.split("tests"), "split: 'tests'"),
    "dataset_node_id_a_number": (lambda m: m.dataset.node_id(3), "node_id: name is a int"),
    "dataset_relation_id_a_list": (lambda m: m.dataset.relation_id(["isa"]), "relation_id: name is a list"),
    "dataset_degrees_in_chunks_of_none": (lambda m: m.dataset.degrees(0), "degrees: chunk_rows 0"),
    "dataset_of_a_number": (lambda m: mp.Dataset(3), "Dataset: directory is a int"),
}


@pytest.mark.parametrize("name", sorted(MISTAKES))
def test_a_mistake_is_a_marius_input_error_naming_the_argument(model, name):
    call, fragment = MISTAKES[name]
    with pytest.raises(mp.MariusInputError) as caught:
        call(model)
    assert fragment in str(caught.value), str(caught.value)
