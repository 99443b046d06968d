"""Plug-ins (issue 52): the contract every registered decoder, loss, regulariser and negative sampler keeps,
parametrised over the live registries with a plug-in of each kind written here as a user would (plain PyTorch),
and a meta-test that every registered one ran it; a user's decoder on every placement; runs made with a
plug-in reopened by a process that registers it and refused, naming it, by one that does not; registrations
and configs that contradict a plug-in refused with one error each, with nothing half-written."""

from __future__ import annotations

import contextlib
import runpy
import subprocess
import sys
from pathlib import Path

import pytest
import torch

import marius_py as mp
from marius_py.cli import main as cli_main
from marius_py.config_loading import load_config
from marius_py.errors import MariusInputError
from marius_py.models import DECODERS, LOSSES, REGULARIZERS, build_decoder
from marius_py.negatives import NEGATIVE_SAMPLERS
from marius_py.plan import GraphSize, Machine, plan_run
from marius_py.step.fused import supports_fused_step
from marius_py.step.model import StepModel

EXAMPLE = Path(__file__).resolve().parent.parent / "examples" / "custom_decoder.py"
F64 = torch.float64


# ---- plug-ins as research code writes them ----

class ScoreDistMult(mp.Decoder):
    """DistMult as a score function alone."""

    def score_hrt(self, h, r, t):
        return (h * r * t).sum(-1)


class ScoreComplEx(mp.Decoder):
    """ComplEx as a score function over [re | im] rows: complex-valued, so model.dim must be even."""

    complex_valued = True

    def score_hrt(self, h, r, t):
        (h_re, h_im), (r_re, r_im), (t_re, t_im) = (x.chunk(2, dim=-1) for x in (h, r, t))
        return (h_re * r_re * t_re + h_im * r_re * t_im + h_re * r_im * t_im - h_im * r_im * t_re).sum(-1)


def squared_error(positive, negative, valid, margin):
    """Positive scores towards 1, the valid negatives' towards 0."""
    return (positive - 1) ** 2 + (negative * negative * valid).sum(1) / valid.sum(1).clamp_min(1)


def l1(tensors, complex_valued):
    return sum(x.abs().sum() for x in tensors)


def endpoints_only(num_endpoints, num_candidates, num_chunks, num_negatives, degree_fraction, generator):
    """Every negative from the batch's own endpoints (PyTorch-BigGraph's batch negatives)."""
    device = generator.device
    picks = torch.randint(num_endpoints, (num_chunks, num_negatives), generator=generator, device=device)
    return torch.empty(num_chunks, 0, dtype=torch.long, device=device), picks


TEST_PLUGINS = {DECODERS: {"score_distmult": ScoreDistMult, "score_complex": ScoreComplEx},
                LOSSES: {"squared_error": squared_error}, REGULARIZERS: {"l1": l1},
                NEGATIVE_SAMPLERS: {"endpoints_only": endpoints_only}}
CONTRACT_REGISTRIES = (DECODERS, LOSSES, REGULARIZERS, NEGATIVE_SAMPLERS)
EXERCISED: dict[str, set[str]] = {registry.kind: set() for registry in CONTRACT_REGISTRIES}


def contract_names(registry) -> list[str]:
    """What the contract runs on: the registry's names at collection and this module's plug-ins of its kind."""
    return sorted(set(registry.names()) | set(TEST_PLUGINS[registry]))


@pytest.fixture(scope="module", autouse=True)
def registered_test_plugins():
    with contextlib.ExitStack() as stack:
        for registry, plugins in TEST_PLUGINS.items():
            for name, plugin in plugins.items():
                stack.enter_context(registry.registered(name, plugin))
        yield


def config_of(*overrides: str):
    return load_config(None, ["training.device=cpu", "model.dim=8", "training.num_negatives=5",
                              "training.batch_size=8", "model.dropout=0.1", *overrides])


def trains_one_step(*overrides: str) -> None:
    """One batch on the CPU's autograd step: a finite loss, node deltas, and the relations moved."""
    config = config_of(*overrides)
    torch.manual_seed(0)
    model = StepModel(config, 12, 3, torch.device("cpu"))
    before = [p.detach().clone() for p in model.relation_parameters()]
    generator = torch.Generator().manual_seed(1)
    edges = torch.stack([torch.randint(12, (8,), generator=generator), torch.randint(3, (8,), generator=generator),
                         torch.randint(12, (8,), generator=generator)], dim=1)
    update = model.compute_batch(torch.randn(12, config.model.dim), torch.zeros(12, config.model.dim), edges,
                                 generator)
    assert torch.isfinite(update.loss) and torch.isfinite(update.delta).all() and update.delta.abs().sum() > 0
    assert all(not torch.equal(b, p) for b, p in zip(before, model.relation_parameters()))


# ---- the contracts ----

@pytest.mark.parametrize("name", contract_names(DECODERS))
def test_decoder_contract(name):
    """compare_pairs agrees with compare_all and with score, gradients reach nodes and relations, a batch
    trains, and validation refuses a dimension the decoder's rows cannot take."""
    cls = DECODERS.get(name)
    dim = 4 * cls.dim_step()
    torch.manual_seed(0)
    decoder = build_decoder(name, 3, dim, 0.5).to(F64)
    nodes = torch.randn(9, dim, dtype=F64, requires_grad=True)
    heads, tails, ids = nodes[:4], nodes[4:8], torch.tensor([0, 2, 1, 1])
    for inverse, anchors, targets in ((False, heads, tails), (True, tails, heads)):
        queries = decoder.query(anchors, ids, inverse)
        pairs = decoder.compare_pairs(queries, targets)
        chunks = decoder.compare_all(queries.reshape(2, 2, -1), nodes[None, :, :].expand(2, -1, -1))
        assert pairs.shape == (4,) and chunks.shape == (2, 2, 9)
        for row in range(4):  # each query against every node, one pair at a time
            torch.testing.assert_close(chunks.reshape(4, 9)[row],
                                       decoder.compare_pairs(queries[row].expand(9, -1), nodes))
        target_rows = torch.arange(4) + (0 if inverse else 4)
        torch.testing.assert_close(pairs, chunks.reshape(4, 9)[torch.arange(4), target_rows])
    torch.testing.assert_close(decoder.score(heads, ids, tails),
                               decoder.compare_pairs(decoder.query(heads, ids, False), tails))
    (pairs.sum() + chunks.square().sum()).backward()
    assert torch.isfinite(nodes.grad).all() and nodes.grad[:8].abs().sum(1).min() > 0
    if decoder.relations.numel():
        assert torch.isfinite(decoder.relations.grad).all() and decoder.relations.grad.abs().sum() > 0
    trains_one_step(f"model.decoder={name}", f"model.dim={dim}")
    if cls.dim_step() > 1:
        with pytest.raises(MariusInputError, match=rf"model.dim: expected (even|a multiple of \d+) for {name} "):
            config_of(f"model.decoder={name}", f"model.dim={dim + 1}")
    EXERCISED[DECODERS.kind].add(name)


@pytest.mark.parametrize("name", contract_names(LOSSES))
def test_loss_contract(name):
    """One loss per edge, finite; masked negatives count for nothing (value and gradient); a batch trains."""
    loss = LOSSES.get(name)
    generator = torch.Generator().manual_seed(2)
    positive = torch.randn(5, dtype=F64, generator=generator).requires_grad_(True)
    negative = torch.randn(5, 4, dtype=F64, generator=generator).requires_grad_(True)
    valid = torch.tensor([[1, 1, 1, 1], [1, 0, 1, 0], [0, 0, 0, 0], [0, 1, 1, 1], [1, 1, 0, 1]], dtype=torch.bool)
    per_edge = loss(positive, negative, valid, 1.0)
    assert per_edge.shape == (5,) and torch.isfinite(per_edge).all()
    per_edge.sum().backward()
    assert torch.isfinite(positive.grad).all() and positive.grad.abs().sum() > 0
    assert torch.all(negative.grad[~valid] == 0) and negative.grad[valid].abs().sum() > 0
    moved = negative.detach().masked_fill(~valid, 50.0)
    torch.testing.assert_close(loss(positive.detach(), moved, valid, 1.0), per_edge.detach())
    trains_one_step(f"model.loss={name}")
    EXERCISED[LOSSES.kind].add(name)


@pytest.mark.parametrize("name", contract_names(REGULARIZERS))
def test_regularizer_contract(name):
    """A scalar penalty, finite and non-negative, zero at zero, with finite gradients; a batch trains."""
    regularizer = REGULARIZERS.get(name)
    for complex_valued in (False, True):
        tensors = [torch.randn(4, 6, dtype=F64, requires_grad=True) for _ in range(2)]
        penalty = regularizer(tensors, complex_valued)
        assert penalty.shape == () and torch.isfinite(penalty) and penalty >= 0
        if penalty.requires_grad:  # (none: a constant)
            penalty.backward()
            assert all(x.grad is None or torch.isfinite(x.grad).all() for x in tensors)
        assert float(regularizer([torch.zeros(3, 6, dtype=F64)], complex_valued)) == 0.0
    trains_one_step(f"model.regularizer={name}", "model.reg_weight=0.01")
    EXERCISED[REGULARIZERS.kind].add(name)


@pytest.mark.parametrize("name", contract_names(NEGATIVE_SAMPLERS))
def test_negative_sampler_contract(name):
    """Candidate positions and endpoint picks in range, int64, as many as asked; the same seed draws the same,
    and only the generator handed over is drawn from; a batch trains."""
    sampler = NEGATIVE_SAMPLERS.get(name)
    for endpoints, candidates, chunks, negatives, fraction in ((10, 50, 1, 8, 0.0), (10, 50, 3, 8, 0.5),
                                                                (6, 3, 2, 5, 1.0)):
        global_state = torch.random.get_rng_state()
        draws = sampler(endpoints, candidates, chunks, negatives, fraction, torch.Generator().manual_seed(3))
        again = sampler(endpoints, candidates, chunks, negatives, fraction, torch.Generator().manual_seed(3))
        assert torch.equal(global_state, torch.random.get_rng_state())
        positions, picks = draws
        assert positions.dtype == torch.int64 and positions.shape[0] == chunks
        assert positions.numel() == 0 or 0 <= positions.min() and positions.max() < candidates
        drawn = positions.shape[1]
        if picks is not None:
            assert picks.dtype == torch.int64 and picks.shape[0] == chunks and 0 <= picks.min() < endpoints
            assert picks.max() < endpoints
            drawn += picks.shape[1]
        assert drawn == negatives
        assert all((a is None and b is None) or torch.equal(a, b) for a, b in zip(draws, again))
    trains_one_step(f"training.negative_sampler={name}", "training.degree_fraction=0.5")
    EXERCISED[NEGATIVE_SAMPLERS.kind].add(name)


@pytest.mark.parametrize("sampler", ["uniform", "endpoints_only"])
def test_a_sampler_fills_the_buffers_a_cuda_graph_reads(sampler):
    """Draws into the buffers of an earlier call (``out``, as graphed steps ask) equal fresh draws of the same
    seed: the built-in sampler fills them itself, another's draws are copied there."""
    model = StepModel(config_of(f"training.negative_sampler={sampler}", "training.degree_fraction=0.5"), 12, 3,
                  torch.device("cpu"))
    buffers = model.negative_draws(8, None, torch.Generator().manual_seed(0))
    held = [tuple(t.data_ptr() if t is not None else None for t in direction) for direction in buffers]
    filled = model.negative_draws(8, None, torch.Generator().manual_seed(5), out=buffers)
    fresh = model.negative_draws(8, None, torch.Generator().manual_seed(5))
    assert [tuple(t.data_ptr() if t is not None else None for t in direction) for direction in filled] == held
    for got, expected in zip(filled, fresh):
        assert all((a is None and b is None) or torch.equal(a, b) for a, b in zip(got, expected))


def uncovered(exercised: dict[str, set[str]]) -> list[str]:
    return [f"{registry.kind} {name}" for registry in CONTRACT_REGISTRIES for name in registry.names()
            if name not in exercised[registry.kind]]


def test_every_registered_plugin_passed_its_contract():
    """(After the contract tests, which record what they ran: a plug-in registered without running them fails.
    Where a selection (-k) ran none of them, there is nothing to judge.)"""
    if not any(EXERCISED.values()):
        pytest.skip("no contract test ran in this session (deselected)")
    assert uncovered(EXERCISED) == []


def test_the_meta_test_finds_a_plugin_without_contract_coverage():
    with LOSSES.registered("planted", squared_error):
        assert "loss planted" in uncovered(EXERCISED)


# ---- a user's decoder trains on the autograd step, on every placement ----

@pytest.mark.parametrize("placement", [[], ["storage.num_partitions=4", "storage.buffer_capacity=2"],
                                       ["training.devices=cpu,cpu"]], ids=["memory", "out-of-core", "two-devices"])
def test_a_score_function_decoder_trains_on_every_placement(small_config, tmp_path, placement):
    config = small_config("model.decoder=score_distmult", "training.epochs=3", "evaluation.every=0",
                          "model.dim=32", *placement)
    model = mp.train(config, tmp_path / "run", progress=False)
    assert model.test_metrics["mrr"] > 0.15  # (random ranking: about 0.04)
    assert not supports_fused_step(model.model)


def test_the_plan_says_the_fused_step_is_off_and_why():
    graph = GraphSize(1000, 10000, 8, 8, 0)
    plugin = plan_run(config_of("model.decoder=score_distmult"), graph, Machine()).describe()
    assert "note: fused step off: decoder score_distmult has no fused kernel (no edge_operator); every batch " \
           "runs the autograd step" in plugin
    assert "fused step off: loss squared_error" in plan_run(config_of("model.loss=squared_error"), graph,
                                                            Machine()).describe()
    assert "fused step" not in plan_run(config_of("model.decoder=distmult"), graph, Machine()).describe()


def test_help_names_the_registries_and_lists_what_is_registered_now():
    """Help strings name where plug-ins register, not a list frozen at import; --help-config lists them live."""
    import dataclasses
    from marius_py.config import PLUGIN_KEYS, Config, describe_schema
    helps = {f"{section.name}.{key.name}": key.metadata["help"] for section in dataclasses.fields(Config)
             for key in dataclasses.fields(section.default_factory())}
    for key, registry in PLUGIN_KEYS.items():
        assert registry.home in helps[key] and ", ".join(registry.names()[:2]) not in helps[key], key
    listing = describe_schema()
    assert "    registered: dot, distmult, complex, transe, rotate, simple, score_distmult, score_complex" in listing
    assert "    registered: uniform, endpoints_only" in listing


def test_the_example_trains_simple_as_a_plugin_beside_the_built_in(umls_dataset):
    example = runpy.run_path(str(EXAMPLE))
    try:
        mrr = example["main"]([str(umls_dataset)], epochs=2)
    finally:
        DECODERS.unregister("plain_simple")
    assert mrr["plain_simple"] > 0.3 and mrr["plain_simple"] == pytest.approx(mrr["simple"], abs=0.01)


# ---- a run made with a plug-in, reopened ----

PLUGIN_MODULE = '''
import marius_py as mp


class FileDistMult(mp.Decoder):
    def score_hrt(self, h, r, t):
        return (h * r * t).sum(-1)


mp.DECODERS.register("file_distmult", FileDistMult)
'''


def test_a_run_with_a_plugin_module_reopens_in_every_command_and_is_refused_without_it(umls_dataset, tmp_path,
                                                                                       capsys):
    module = tmp_path / "my_plugins.py"
    module.write_text(PLUGIN_MODULE)
    run = tmp_path / "run"
    config = tmp_path / "config.yaml"  # (model.plugins as a YAML list)
    config.write_text(f"model:\n  plugins: [{module}]\n  decoder: file_distmult\n  dim: 16\n")
    fast = [f"dataset.path={umls_dataset}", "training.device=cpu", "training.epochs=1", "training.batch_size=512",
            "training.num_negatives=32", "evaluation.every=0"]
    try:
        assert cli_main(["train", str(config), *fast, "--run-dir", str(run), "--quiet"]) == 0
        assert f"plugins: {module}" in (run / "config.yaml").read_text()
        for command in (["eval", str(run)], ["export", str(run), "-o", str(tmp_path / "export")],
                        ["predict", str(run), "--head", "animal", "--relation", "practices", "-k", "2"],
                        ["train", "--resume", str(run), "training.epochs=2", "--quiet"]):
            assert cli_main(command) == 0, command
        assert mp.load_checkpoint(run).decoder.__class__.__name__ == "FileDistMult"
        fresh = subprocess.run([sys.executable, "-m", "marius_py", "eval", str(run), "--json"],
                               capture_output=True, text=True, timeout=120)
        assert fresh.returncode == 0, fresh.stderr  # (another process: it imports the module again)
    finally:
        DECODERS.unregister("file_distmult")
        sys.modules.pop("my_plugins", None)
    module.rename(tmp_path / "moved.py")
    with pytest.raises(MariusInputError, match=rf"config.yaml:\d+: model.plugins: plug-in module '{module}' not "
                                               "found"):
        mp.load_checkpoint(run)
    capsys.readouterr()


@pytest.mark.slow
def test_a_plugin_module_by_name_from_the_current_directory_reaches_worker_processes(umls_dataset, tmp_path,
                                                                                     monkeypatch):
    """model.plugins=my_plugins from the directory it is in (as a console script finds no module there by
    itself), with a worker process per device, which imports it again."""
    (tmp_path / "my_plugins.py").write_text(PLUGIN_MODULE)
    monkeypatch.chdir(tmp_path)
    try:
        assert cli_main(["train", f"dataset.path={umls_dataset}", "model.plugins=my_plugins",
                         "model.decoder=file_distmult", "model.dim=16", "training.epochs=1", "training.device=cpu",
                         "training.devices=cpu,cpu", "pipeline.placement=replicated", "pipeline.processes=per_device",
                         "training.batch_size=256", "evaluation.every=0", "--run-dir", "run", "--quiet"]) == 0
    finally:
        DECODERS.unregister("file_distmult")
        sys.modules.pop("my_plugins", None)


class NarrowRelations(ScoreDistMult):
    def relation_dim(self, dim):
        return dim // 2


def test_a_run_with_a_plugin_registered_in_code_is_refused_where_it_is_not(small_config, tmp_path):
    with DECODERS.registered("code_distmult", ScoreDistMult):
        mp.train(small_config("model.decoder=code_distmult", "training.epochs=1", "evaluation.every=0"),
                 tmp_path / "run", progress=False)
        assert mp.load_checkpoint(tmp_path / "run").test_metrics is None
    with pytest.raises(MariusInputError, match=r"config.yaml:\d+: model.decoder: expected one of .*"
                                               r"mp.DECODERS.register\(name, \.\.\.\).* got 'code_distmult'"):
        mp.load_checkpoint(tmp_path / "run")
    with DECODERS.registered("code_distmult", NarrowRelations):  # (another plug-in under that name)
        with pytest.raises(MariusInputError, match=r"decoder parameters do not fit decoder 'code_distmult' as "
                                                   r"registered now \(.*NarrowRelations\)"):
            mp.load_checkpoint(tmp_path / "run")


# ---- bad input: one error each, naming what and where, nothing half-written ----

def test_a_name_registered_twice_is_refused():
    with pytest.raises(MariusInputError, match=r"decoder 'distmult' is already registered \(by the engine\)"):
        DECODERS.register("distmult", ScoreDistMult)
    with pytest.raises(MariusInputError, match=r"loss 'squared_error' is already registered \(by .*test_plugins\)"):
        LOSSES.register("squared_error", l1)
    assert DECODERS.get("distmult").__name__ == "DistMult" and LOSSES.get("squared_error") is squared_error


class OnlyOperator(mp.Decoder):
    def operator(self, nodes, relations):
        return nodes * relations


class Nothing(mp.Decoder):
    pass


class ClaimsRelationPrediction(ScoreDistMult):
    supports_relation_prediction = True


class TakesMore(ScoreDistMult):
    def __init__(self, num_relations, dim, init_scale, width):
        super().__init__(num_relations, dim, init_scale)


@pytest.mark.parametrize("registry,plugin,problem", [
    (DECODERS, OnlyOperator, r"decoder 'bad' \(.*OnlyOperator\) defines operator but not compare_pairs, "
                             r"compare_all"),
    (DECODERS, Nothing, r"decoder 'bad' \(.*Nothing\) defines neither score_hrt nor operator"),
    (DECODERS, ScoreDistMult(1, 2, 0.1), r"decoder 'bad' \(.*\) is not a subclass of marius_py.models.Decoder"),
    (DECODERS, ClaimsRelationPrediction, r"declares supports_relation_prediction but does not define "
                                         r"relation_features"),
    (DECODERS, TakesMore, r"its constructor does not take \(num_relations, dim, init_scale\)"),
    (LOSSES, lambda positive, negative: positive, r"loss 'bad' \(.*<lambda>\) does not take \(positive, "
                                                  r"negative, valid, margin\)"),
    (LOSSES, lambda p, n, v, m: (p - 1).square().mean(), r"returned a float32 tensor of shape \(\) on a small probe "
                                                         r"\(expected a tensor of one loss per edge"),
    (REGULARIZERS, lambda tensors, complex_valued: tensors[0] ** 2, r"regulariser 'bad'.* returned a float32 tensor "
                                                                    r"of shape \(2, 4\)"),
    (NEGATIVE_SAMPLERS, lambda e, c, k, n, f, g: (torch.rand(k, n, generator=g), None),
     r"negative sampler 'bad'.* returned \(a float32 tensor of shape \(2, 4\), None\)"),
    (NEGATIVE_SAMPLERS, lambda e, c, k, n, f, g: 1 / 0, r"failed on a small probe: ZeroDivisionError"),
], ids=["operator-only", "nothing", "an-instance", "false-capability", "constructor", "loss-signature",
        "loss-not-per-edge", "regulariser-not-scalar", "sampler-floats", "sampler-raises"])
def test_an_unfit_plugin_is_refused_and_not_registered(registry, plugin, problem):
    with pytest.raises(MariusInputError, match=problem):
        registry.register("bad", plugin)
    assert "bad" not in registry


def test_a_capability_the_config_contradicts_is_refused_where_the_config_says_it(tmp_path):
    config = tmp_path / "config.yaml"
    config.write_text("model:\n  decoder: score_complex\n  dim: 7\n")
    with pytest.raises(MariusInputError, match=r"config.yaml:3: model.dim: expected even for score_complex "
                                               r"\(complex-valued rows: .*ScoreComplEx\), got 7"):
        load_config(config)
    with pytest.raises(MariusInputError, match=r"training.relation_prediction: needs a decoder linear in the "
                                               r"relation vector .* not score_distmult"):
        config_of("model.decoder=score_distmult", "training.relation_prediction=0.1")
    run = tmp_path / "run"
    assert cli_main(["train", str(config), "--run-dir", str(run)]) == 2
    assert not run.exists()


def test_a_plugin_module_that_fails_leaves_nothing_registered(tmp_path):
    module = tmp_path / "half_plugins.py"
    module.write_text("import marius_py as mp\nfrom marius_py.models import DistMult\n\n"
                      "mp.DECODERS.register('half_registered', type('Half', (DistMult,), {}))\n"
                      "raise RuntimeError('boom')\n")
    with pytest.raises(MariusInputError, match=rf"model.plugins: plug-in module '{module}' failed to import: "
                                               "RuntimeError: boom"):
        config_of(f"model.plugins={module}")
    assert "half_registered" not in DECODERS and "half_plugins" not in sys.modules
    with pytest.raises(MariusInputError, match=r"command line: model.plugins: plug-in module 'no_such_plugins_x' "
                                               r"not found \(expected a module importable here"):
        load_config(None, ["model.plugins=no_such_plugins_x"], source="command line")


def test_an_ordering_registered_by_research_code_is_validated_and_built():
    from marius_py.layout import epoch_ordering, storage_layout
    from marius_py.orderings import OrderingSpec
    from marius_py.orderings.visits import build_sequential
    spec = OrderingSpec("rows_again", build_sequential, "row-major buckets", randomized=False, permute_labels=False)
    with mp.ORDERINGS.registered("rows_again", spec):
        config = config_of("storage.ordering=rows_again", "storage.num_partitions=4", "storage.buffer_capacity=2")
        ordering = epoch_ordering(storage_layout(config.storage), seed=0, epoch=0)
        assert ordering.name == "rows_again" and sum(len(state) for state in ordering.buckets) == 16
    with pytest.raises(MariusInputError, match=r"storage.ordering: expected one of beta, .*, got 'rows_again'"):
        config_of("storage.ordering=rows_again")
    with pytest.raises(MariusInputError, match="ordering 'other' .* is not an OrderingSpec named 'other'"):
        mp.ORDERINGS.register("other", spec)
