"""The fused step of every decoder against the autograd step (StepModel.compute + SparseAdagrad.apply)."""

from __future__ import annotations

import sys

import pytest
import torch

from marius_py.config_loading import load_config
from marius_py.models import build_decoder
from marius_py.step.edge_kernels import EdgeMaths, edge_backward_, edge_queries
from marius_py.step.fused import FusedStep, supports_fused_step
from marius_py.pipeline.row_kernels import gather_rows, scatter_add_rows_, sparse_adagrad_
from marius_py.optim import SparseAdagrad
from marius_py.step.model import StepModel

NODES, RELATIONS, DIM = 60, 5, 12


def make_model(decoder: str, variant: str, device: str, double: bool, extra=()) -> StepModel:
    config = load_config(None, [f"model.decoder={decoder}", "model.loss=softmax_ce", f"model.dim={DIM}",
                                "training.batch_size=23", "training.num_chunks=3", "training.num_negatives=7",
                                "training.degree_fraction=0.4", f"training.adagrad_variant={variant}",
                                "model.reg_weight=0", "model.init_scale=0.5", *extra])
    torch.manual_seed(3)
    model = StepModel(config, NODES, RELATIONS, torch.device(device))
    if double:
        model.decoder.double()  # in place: the relation optimizer keeps its parameters
    return model


def make_tables(variant: str, device: str, dtype: torch.dtype):
    generator = torch.Generator().manual_seed(5)
    nodes = torch.randn(NODES, DIM, generator=generator, dtype=dtype)
    state = torch.rand(NODES, 1 if variant == "rowwise" else DIM, generator=generator, dtype=dtype)
    edges = torch.stack([torch.randint(NODES, (23,), generator=generator),
                         torch.randint(RELATIONS, (23,), generator=generator),
                         torch.randint(NODES, (23,), generator=generator)], dim=1)
    return nodes.to(device), state.to(device), edges.to(device)


def autograd_step(model, nodes, state, edges, seed):
    plan = model.plan_batch(edges, torch.Generator(nodes.device).manual_seed(seed))
    update = model.compute(plan, nodes[plan.rows], state[plan.rows], torch.Generator(nodes.device))
    SparseAdagrad.apply(nodes, state, plan.rows, update.delta, update.squared)
    return update.loss


def fused_step(model, nodes, state, edges, seed):
    plan = model.plan_batch(edges, torch.Generator(nodes.device).manual_seed(seed), defer_count=True)
    loss = torch.zeros((), dtype=nodes.dtype, device=nodes.device)
    FusedStep(model).run(plan, nodes, state, loss, torch.Generator(nodes.device))  # dropout draws as autograd's
    return loss / len(edges)


def warm_relation_state(model) -> None:
    """Relation Adagrad sums of 1 instead of 0. With zero sums the first step moves every coordinate by about
    lr whatever its gradient's size, so a gradient that is 0 up to rounding (TransE-L1: a query coordinate above
    every candidate's gets sum(P) - (1 - p_pos)) takes a full step of either sign."""
    model.step_relations([[torch.zeros_like(model.decoder.relations)]])  # creates the optimizer state
    model.relation_optimizer.state[model.decoder.relations]["sum"].fill_(1)


def compare_steps(decoder, variant, device, dtype, tolerance, extra=(), warm_relations=False):
    tables = make_tables(variant, device, dtype)
    results = []
    for step in (autograd_step, fused_step):
        model = make_model(decoder, variant, device, dtype == torch.float64, extra)
        if warm_relations:
            warm_relation_state(model)
        nodes, state, edges = (t.clone() for t in tables)
        losses = [step(model, nodes, state, edges, seed) for seed in (11, 12)]  # a second step sees the first
        results.append((torch.stack(losses), nodes, state, model.decoder.relations.detach()))
    assert not torch.equal(results[0][1], tables[0]), "the step must change the embeddings"
    for expected, got in zip(*results):
        torch.testing.assert_close(got, expected, **tolerance)


@pytest.mark.parametrize("decoder", ["distmult", "dot"])
@pytest.mark.parametrize("variant", ["full", "rowwise"])
def test_fused_step_equals_autograd_step(decoder, variant):
    compare_steps(decoder, variant, "cpu", torch.float64, {"rtol": 1e-10, "atol": 1e-12})


@pytest.mark.parametrize("decoder", ["dot", "distmult", "complex"])
@pytest.mark.parametrize("regularizer", ["none", "n3", "l2"])
@pytest.mark.parametrize("dropout", [0.0, 0.3])
def test_fused_step_with_regulariser_and_dropout_equals_autograd_step(decoder, regularizer, dropout):
    """Loss, updated rows and relations after two steps: ComplEx's complex product, N3 (complex moduli for
    ComplEx), L2 and query dropout with hand-written gradients, against autograd in float64."""
    compare_steps(decoder, "full", "cpu", torch.float64, {"rtol": 1e-9, "atol": 1e-12},
                  [f"model.regularizer={regularizer}", f"model.reg_weight={0 if regularizer == 'none' else 0.05}",
                   f"model.dropout={dropout}"])


DISTANCE_DECODERS = {"transe-l1": ["model.decoder=transe", "model.norm=1"],
                     "transe-l2": ["model.decoder=transe", "model.norm=2"],
                     "rotate": ["model.decoder=rotate"],
                     "rotate-l2": ["model.decoder=rotate", "model.norm=2"]}


def test_each_decoder_declares_its_operator_and_comparator():
    """The L2 forms of TransE and RotatE share the matmul expansion (l2); their L1 forms take the pairwise
    kernels (l1, modulus); the rest compare by dot products. Every decoder has a fused step."""
    expected = {("dot", 1): ("identity", "dot"), ("distmult", 1): ("diagonal", "dot"),
                ("complex", 1): ("complex", "dot"), ("transe", 1): ("translation", "l1"),
                ("transe", 2): ("translation", "l2"), ("rotate", 1): ("rotation", "modulus"),
                ("rotate", 2): ("rotation", "l2")}
    for (name, norm), (operator, comparator) in expected.items():
        decoder = build_decoder(name, 2, 8, 0.1, norm=norm)
        assert (decoder.edge_operator, decoder.comparator) == (operator, comparator)


@pytest.mark.parametrize("decoder", list(DISTANCE_DECODERS))
@pytest.mark.parametrize("regularizer", ["none", "n3", "l2"])
@pytest.mark.parametrize("dropout", [0.0, 0.3])
def test_fused_distance_step_equals_autograd_step(decoder, regularizer, dropout):
    """TransE (translation; L1 or L2 distance) and RotatE (rotation by phases; sum of complex moduli, or L2):
    loss, rows and relations after two steps against autograd in float64."""
    compare_steps(DISTANCE_DECODERS[decoder][0].split("=")[1], "full", "cpu", torch.float64,
                  {"rtol": 1e-9, "atol": 1e-12},
                  [*DISTANCE_DECODERS[decoder][1:], f"model.regularizer={regularizer}",
                   f"model.reg_weight={0 if regularizer == 'none' else 0.05}", f"model.dropout={dropout}"],
                  warm_relations=True)


@pytest.mark.parametrize("decoder", ["distmult", "complex"])
def test_fused_step_with_relation_prediction_equals_autograd_step(decoder):
    compare_steps(decoder, "full", "cpu", torch.float64, {"rtol": 1e-9, "atol": 1e-12},
                  ["training.relation_prediction=0.3", "model.regularizer=n3", "model.reg_weight=0.05"])


def test_fused_complex_step_rowwise_equals_autograd_step():
    compare_steps("complex", "rowwise", "cpu", torch.float64, {"rtol": 1e-9, "atol": 1e-12},
                  ["model.regularizer=n3", "model.reg_weight=0.05", "model.dropout=0.2"])


def test_fused_step_with_adam_relations_equals_autograd_step():
    """Relation optimizers other than plain Adagrad are stepped by torch (and keep the step out of graphs)."""
    model = make_model("distmult", "full", "cpu", True, ["training.relation_optimizer=adam"])
    assert not FusedStep(model).own_relation_step
    compare_steps("distmult", "full", "cpu", torch.float64, {"rtol": 1e-10, "atol": 1e-12},
                  ["training.relation_optimizer=adam"])


def test_supported_models_only():
    for decoder in ("dot", "distmult", "complex", "transe", "rotate"):
        assert supports_fused_step(make_model(decoder, "full", "cpu", False, ["model.dropout=0.1",
                                                                             "model.reg_weight=0.1"]))
    assert not supports_fused_step(make_model("distmult", "full", "cpu", False, ["model.loss=logistic"]))


@pytest.mark.parametrize("decoder", ["complex", "distmult"])
def test_fused_one_vs_all_step_with_bfloat16_scores_equals_autograd_step(decoder):
    """The shipped fb15k-237 form: 1-vs-all, N3, bfloat16 score blocks with one candidate block shared by both
    directions (float32 tables; the two steps round the block differently: differences of ~1e-4 measured)."""
    compare_steps(decoder, "full", "cpu", torch.float32, {"rtol": 1e-2, "atol": 2e-3},
                  ["training.num_negatives=-1", "training.score_dtype=bfloat16", "model.regularizer=n3",
                   "model.reg_weight=0.05"], warm_relations=True)


def test_only_one_vs_all_over_every_row_shares_its_candidates():
    """The shared block needs candidate j to be plan row j: 1-vs-all over an in-memory table (and its rows
    gathered), not sampled negatives, rows regrouped for several devices, or the pairwise (L1) kernels."""
    nodes, _, edges = make_tables("full", "cpu", torch.float64)
    generator = torch.Generator().manual_seed(1)
    complex_step = FusedStep(make_model("complex", "full", "cpu", True, ["training.num_negatives=-1"]))
    plan = complex_step.model.plan_batch(edges, generator, defer_count=True)
    assert complex_step._shares_candidates(plan) and complex_step._shares_candidates(plan.in_row_positions())
    assert all(complex_step._shares_candidates(moved) for moved in (plan.to("cpu"), plan.trimmed(NODES)))
    assert torch.equal(plan.rows[:NODES], torch.arange(NODES)), "row j must be candidate j"
    assert not complex_step._shares_candidates(plan.routed(plan.rows.flip(0), plan.local))
    sampled = FusedStep(make_model("complex", "full", "cpu", True))
    assert not sampled._shares_candidates(sampled.model.plan_batch(edges, generator))
    l1 = FusedStep(make_model("transe", "full", "cpu", True, ["training.num_negatives=-1", "model.norm=1"]))
    assert not l1._shares_candidates(l1.model.plan_batch(edges, generator))


def test_adagrad_skips_padding_rows():
    nodes, state = torch.ones(4, 2, dtype=torch.float64), torch.ones(4, 2, dtype=torch.float64)
    rows = torch.tensor([1, 3, 1, 1])  # two real rows, then padding that repeats a real one
    grad = torch.ones(4, 2, dtype=torch.float64)
    sparse_adagrad_(nodes, state, rows, grad, torch.tensor([2]), lr=0.5, eps=0.0)
    step = 1 - 0.5 / 2 ** 0.5
    torch.testing.assert_close(nodes[:, 0], torch.tensor([1, step, 1, step], dtype=torch.float64))
    torch.testing.assert_close(state[:, 0], torch.tensor([1, 2, 1, 2], dtype=torch.float64))


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
@pytest.mark.parametrize("decoder", ["distmult", "dot", "complex"])
@pytest.mark.parametrize("variant", ["full", "rowwise"])
@pytest.mark.parametrize("extra", [[], ["model.regularizer=n3", "model.reg_weight=0.05", "model.dropout=0.3"],
                                   ["model.regularizer=l2", "model.reg_weight=0.05"]])
def test_fused_step_kernels_match_autograd_on_gpu(decoder, variant, extra):
    compare_steps(decoder, variant, "cuda", torch.float32, {"rtol": 1e-4, "atol": 1e-5}, extra)


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
@pytest.mark.parametrize("decoder", list(DISTANCE_DECODERS))
@pytest.mark.parametrize("extra", [[], ["model.regularizer=n3", "model.reg_weight=0.05", "model.dropout=0.3"]])
def test_fused_distance_step_matches_autograd_on_gpu(decoder, extra):
    name, *options = DISTANCE_DECODERS[decoder]
    compare_steps(name.split("=")[1], "full", "cuda", torch.float32, {"rtol": 1e-4, "atol": 1e-5},
                  [*options, *extra], warm_relations=True)


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
@pytest.mark.parametrize("decoder", ["complex", "transe-l2", "transe-l1", "rotate-l2"])
def test_fused_one_vs_all_step_over_an_unaligned_node_count_matches_autograd_on_gpu(monkeypatch, decoder):
    """61 nodes: the matmul forms' 1-vs-all blocks get 3 padding candidates (cuBLAS's aligned kernels; row 0
    gathered in their place, their gradients exactly 0), and train as the autograd step does."""
    monkeypatch.setattr(sys.modules[__name__], "NODES", 61)
    name, *options = DISTANCE_DECODERS.get(decoder, [f"model.decoder={decoder}"])
    compare_steps(name.split("=")[1], "full", "cuda", torch.float32, {"rtol": 1e-4, "atol": 1e-5},
                  ["training.num_negatives=-1", "model.regularizer=n3", "model.reg_weight=0.05", *options],
                  warm_relations=True)


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
@pytest.mark.parametrize("decoder", ["distmult", "complex"])
def test_fused_relation_prediction_matches_autograd_on_gpu(decoder):
    compare_steps(decoder, "full", "cuda", torch.float32, {"rtol": 1e-4, "atol": 1e-5},
                  ["training.relation_prediction=0.3", "model.regularizer=n3", "model.reg_weight=0.05"])


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
@pytest.mark.parametrize("operator, comparator", [("identity", "dot"), ("diagonal", "dot"), ("complex", "dot"),
                                                  ("translation", "l2"), ("translation", "l1"), ("rotation", "l2"),
                                                  ("rotation", "modulus")])
@pytest.mark.parametrize("regularizer", ["none", "n3", "l2"])
@pytest.mark.parametrize("dropout", [False, True])
def test_edge_kernels_match_torch_versions(operator, comparator, regularizer, dropout):
    """Every per-edge kernel variant against its torch version, with query rows padded past d (bf16 scores)."""
    dim, width, batch = 100, 104, 333
    generator = torch.Generator().manual_seed(7)
    nodes = torch.randn(500, dim, generator=generator)
    relation_dim = dim // 2 if operator == "rotation" else dim  # RotatE's relations: phases
    relations = None if operator == "identity" else torch.randn(2 * 9, relation_dim, generator=generator)
    edges = torch.stack([torch.randint(500, (batch,), generator=generator),
                         torch.randint(9, (batch,), generator=generator),
                         torch.randint(500, (batch,), generator=generator)], dim=1)
    local = torch.randint(40, (2 * batch,), generator=generator)
    mask = (torch.rand(2 * batch, dim, generator=generator) > 0.3).float() / 0.7 if dropout else None
    grad_q = torch.randn(2 * 340, width, generator=generator)
    grad_pos = torch.randn(2 * 340, generator=generator)
    maths = EdgeMaths(operator, regularizer, operator not in ("identity", "rotation"), comparator)
    outputs = []
    for device in ("cpu", "cuda"):
        to = (lambda t: None if t is None else t.to(device))
        queries, positive, reg = edge_queries(to(nodes), to(relations), to(edges), torch.bfloat16, width, maths,
                                              to(mask))
        grad_rows = torch.zeros(40, dim, device=device)
        grad_relations = None if relations is None else torch.zeros_like(to(relations))
        edge_backward_(grad_rows, grad_relations, to(nodes), to(relations), to(edges), to(local), to(grad_q),
                       to(grad_pos), 340, maths, to(mask), 0.07)
        outputs.append([queries.float().cpu(), positive.cpu(), None if reg is None else reg.sum().cpu(),
                        grad_rows.cpu(), None if grad_relations is None else grad_relations.cpu()])
    for got, expected in zip(outputs[1], outputs[0]):
        if expected is not None:
            torch.testing.assert_close(got, expected, rtol=1e-2, atol=1e-2)  # bf16 queries; float32 the rest


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
@pytest.mark.parametrize("dim", [7, 100, 400])
def test_triton_kernels_match_torch_versions(dim):
    generator = torch.Generator().manual_seed(dim)
    nodes = torch.randn(500, dim, generator=generator)
    relations = torch.randn(2 * 9, dim, generator=generator)
    edges = torch.stack([torch.randint(500, (333,), generator=generator), torch.randint(9, (333,), generator=generator),
                         torch.randint(500, (333,), generator=generator)], dim=1)
    local = torch.randint(40, (2 * 333,), generator=generator)
    grad_q = torch.randn(2 * 340, dim + 5, generator=generator)  # aligned rows are wider than d
    grad_pos = torch.randn(2 * 340, generator=generator)
    outputs = []
    for device in ("cpu", "cuda"):
        n, r, e, lo, gq, gp = (t.to(device).clone() for t in (nodes, relations, edges, local, grad_q, grad_pos))
        queries, positive, _ = edge_queries(n, r, e, torch.float32, dim + 5, EdgeMaths("diagonal"))
        grad_rows, grad_relations = torch.zeros(40, dim, device=device), torch.zeros_like(r)
        edge_backward_(grad_rows, grad_relations, n, r, e, lo, gq, gp, 340, EdgeMaths("diagonal"))
        state = torch.rand(500, dim, generator=torch.Generator().manual_seed(1)).to(device)
        sparse_adagrad_(n, state, torch.randperm(500, generator=torch.Generator().manual_seed(2))[:40].to(device),
                        grad_rows, torch.tensor([37], device=device), lr=0.1, eps=1e-10)
        gathered = gather_rows(n, lo[:50], torch.full((50, dim + 5), float("nan"), device=device))
        gathered_bf16 = gather_rows(nodes.to(device), lo[:50], torch.full((50, dim + 5), float("nan"),
                                                                          dtype=torch.bfloat16, device=device))
        scatter_add_rows_(grad_rows, lo[:300] % 40, gq[:300])
        outputs.append([t.cpu() for t in (queries, positive, grad_rows, grad_relations, n, state, gathered,
                                          gathered_bf16)])
    for got, expected in zip(outputs[1], outputs[0]):
        torch.testing.assert_close(got, expected, rtol=1e-4, atol=1e-5)  # bfloat16 rows: the same rounding


@pytest.mark.parametrize("decoder", ["complex", "transe-l2", "transe-l1", "rotate", "rotate-l2"])
@pytest.mark.parametrize("dropout", [0.0, 0.2])
@pytest.mark.parametrize("tiled", [True, False])
def test_fused_one_vs_all_step_equals_autograd_step(monkeypatch, decoder, dropout, tiled):
    """1-vs-all (every node a candidate; the matmul forms score one block of candidates shared by both
    directions): the fused step, with its score block whole or in tiles of 7 candidates (the last of 60 holds
    4), equals the autograd step with the whole block."""
    from marius_py.step import fused_loss
    name, *options = DISTANCE_DECODERS.get(decoder, [f"model.decoder={decoder}"])
    decoder = name.split("=")[1]
    extra = ["training.num_negatives=-1", "model.regularizer=n3", "model.reg_weight=0.05",
             f"model.dropout={dropout}", *options]
    tables = make_tables("full", "cpu", torch.float64)
    # A tile costs 2 directions x 23 queries x (float64 scores + two float64 copies) per candidate.
    tiles_of_7 = 2 * 23 * (8 + 2 * 8) * 7
    results = []
    for step, budget in ((autograd_step, fused_loss.SCORE_BLOCK_BYTES),
                         (fused_step, tiles_of_7 if tiled else fused_loss.SCORE_BLOCK_BYTES)):
        monkeypatch.setattr(fused_loss, "SCORE_BLOCK_BYTES", budget)
        model = make_model(decoder, "full", "cpu", True, extra)
        warm_relation_state(model)
        nodes, state, edges = (t.clone() for t in tables)
        losses = [step(model, nodes, state, edges, seed) for seed in (11, 12)]
        results.append((torch.stack(losses), nodes, state, model.decoder.relations.detach()))
    for expected, got in zip(*results):
        torch.testing.assert_close(got, expected, rtol=1e-9, atol=1e-12)


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
@pytest.mark.parametrize("num_candidates", [37, 1500])  # one block per row, and the two-pass kernel
@pytest.mark.parametrize("squared_l2", [False, True])
def test_softmax_row_kernel_matches_torch_version(num_candidates, squared_l2):
    from marius_py.step import fused_loss
    generator = torch.Generator().manual_seed(num_candidates)
    raw = torch.randn(3, 6, num_candidates, generator=generator)
    if squared_l2:  # squared distances, one of them 0
        raw = raw.abs() * 3
        raw[0, 0, 0] = 0.0
    positive = torch.randn(3, 6, generator=generator)
    target_ids = torch.randint(50, (3, 6), generator=generator)
    candidate_ids = torch.randint(50, (3, num_candidates), generator=generator)
    weight = torch.rand(3, 6, generator=generator)
    outputs = []
    for device in ("cpu", "cuda"):
        scores = raw.to(device, copy=True)  # softmax_rows_ works in place: each device gets its own copy
        loss, grad_positive = fused_loss.softmax_rows_(scores, positive.to(device), target_ids.to(device),
                                                       candidate_ids.to(device), weight.to(device), squared_l2)
        outputs.append([t.cpu() for t in (scores, loss, grad_positive)])
    for got, expected in zip(outputs[1], outputs[0]):
        torch.testing.assert_close(got, expected, rtol=1e-4, atol=1e-6)


def test_a_decoder_subclass_gets_no_fused_step_unless_it_declares_one():
    """The fused step computes a decoder's declared maths: a subclass that changes the operator without
    declaring its own must not inherit its parent's."""
    from marius_py.models import DistMult

    class Scaled(DistMult):
        name = "scaled"

        def operator(self, nodes, relations):
            return 2 * nodes * relations

    class Declared(DistMult):
        edge_operator = "diagonal"

    assert Scaled.edge_operator is None and Declared.edge_operator == "diagonal"
    assert DistMult.edge_operator == "diagonal"
