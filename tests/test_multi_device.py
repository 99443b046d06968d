"""Several devices sharing host tables, with G devices simulated on the CPU (and real GPUs with -m gpu).

Routing is exact (every row a batch needs reaches its device, every gradient
reaches its owner once), deduplicated training equals the baseline where every
device reads and writes its own rows, and no update is lost at any bound.
"""

from __future__ import annotations

import copy
import json

import numpy as np
import pytest
import torch

import marius_py as mp
from marius_py.config import dedup_setting
from marius_py.dataset import Dataset
from marius_py.step.runners import build_multi_device_runner
from marius_py.step.model import StepModel
from marius_py.random_streams import epoch_generator
from marius_py.trainer import Trainer
from marius_py.pipeline.device_cache import RowCache, endpoint_degree, hot_rows
from marius_py.pipeline.routing import group_steps_by_head
from marius_py.pipeline.routing import group_by_owner, union_of_requests
from marius_py.pipeline.row_kernels import gather_rows, sparse_adagrad_

RUNNER_VARIANTS = {"dedup": ["pipeline.dedup=true", "pipeline.cache_rows=0"],
                   "baseline": ["pipeline.dedup=false"],
                   "cache": ["pipeline.dedup=true", "pipeline.cache_rows=8"],
                   "split": ["pipeline.dedup=true", "pipeline.placement=split"],
                   "replicated": ["pipeline.placement=replicated"]}


def setup(small_config, devices: list[str], *overrides: str):
    """(config, replicas, nodes, state, edges) for a runner on ``devices`` over UMLS.

    The runner takes its devices from the replicas, so ``devices`` may repeat a GPU (two sets of lanes on
    one GPU exercise the streams, events and graphs where only one GPU is at hand)."""
    config = small_config("model.dropout=0", *overrides)
    dataset = Dataset(config.dataset.path)
    torch.manual_seed(0)
    first = StepModel(config, dataset.num_nodes, dataset.num_relations, torch.device(devices[0]))
    replicas = [first]
    for name in devices[1:]:
        replica = StepModel(config, dataset.num_nodes, dataset.num_relations, torch.device(name))
        replica.load_state_dict(copy.deepcopy(first.state_dict()))
        replicas.append(replica)
    generator = torch.Generator().manual_seed(1)
    nodes = torch.randn(dataset.num_nodes, config.model.dim, generator=generator) * 0.1
    state = torch.zeros(dataset.num_nodes, replicas[0].node_optimizer.state_dim(config.model.dim))
    edges = torch.from_numpy(dataset.train)[torch.randperm(len(dataset.train), generator=generator)]
    return config, replicas, nodes, state, edges


def run_runner(config, replicas, nodes, state, edges, bound: int = 1):
    devices = [r.device for r in replicas]
    placement = config.pipeline.placement if config.pipeline.placement in ("split", "replicated") else "host"
    row_bytes = (nodes.shape[1] + state.shape[1]) * 4
    config.pipeline.staleness_bound = bound
    runner = build_multi_device_runner(replicas, placement, config, devices, row_bytes)
    loss = torch.zeros((), device=devices[0])
    runner.run(edges, nodes, state, None, [epoch_generator(0, 1, d, stream=2 + g) for g, d in enumerate(devices)],
               [epoch_generator(0, 1, d, stream=9 + g) for g, d in enumerate(devices)], loss, lambda n: None)
    return runner, loss


class RecordingStep:
    """A step whose gradient of a row is scale * (device + 1) in every column: updates are countable."""

    def __init__(self, model, device_index: int, log: list, scale: float = 1.0):
        self.model, self.device_index, self.log, self.scale = model, device_index, log, scale

    def negative_draws(self, *args, **kwargs):
        return self.model.negative_draws(*args, **kwargs)

    def plan_batch(self, *args, **kwargs):
        return self.model.plan_batch(*args, **kwargs)

    def gradients(self, plan, embeddings, generator):
        edges = plan.edges
        negatives = torch.cat([plan.tail_negatives.reshape(-1), plan.head_negatives.reshape(-1)])
        needed = torch.unique(torch.cat([edges[:, 0], edges[:, 2], negatives]))
        count = int(plan.unique_count)  # rows past it are padding
        got = plan.rows[:count]
        self.log.append((self.device_index, needed.clone(), got.clone(), embeddings[:count].clone()))
        grad = torch.full_like(embeddings, self.scale * (self.device_index + 1))
        return grad, [torch.zeros_like(p) for p in self.model.relation_parameters()], torch.zeros(())

    def step_relations(self, gradients):
        pass


@pytest.mark.parametrize("variant", sorted(RUNNER_VARIANTS))
@pytest.mark.parametrize("num_devices", [2, 3, 4])
@pytest.mark.parametrize("bound", [1, 2, 4])
def test_every_row_reaches_its_device_and_every_gradient_its_owner_once(small_config, variant, num_devices, bound):
    config, replicas, nodes, state, edges = setup(small_config, ["cpu"] * num_devices, "model.decoder=distmult",
                                                  "model.reg_weight=0", *RUNNER_VARIANTS[variant])
    nodes, state = nodes.double(), state.double()
    start_nodes, start_state = nodes.clone(), state.clone()
    log: list = []
    runner = _recording_runner(config, replicas, nodes, state, bound, log)
    runner.run(edges, nodes, state, None, [torch.Generator().manual_seed(g) for g in range(num_devices)],
               [torch.Generator() for _ in range(num_devices)], torch.zeros((), dtype=torch.float64), lambda n: None)
    expected_squares = torch.zeros(len(nodes), dtype=torch.float64)
    for device, needed, got, embeddings in log:
        assert torch.equal(torch.sort(got).values, needed), "a device got other rows than its batch needs"
        assert embeddings.shape == (len(got), nodes.shape[1])
        expected_squares[needed] += float(device + 1) ** 2
    assert len(log) == -(-len(edges) // config.training.batch_size)
    if state.shape[1] > 1:  # full Adagrad: each column gains g^2 once per (step, device) needing the row
        torch.testing.assert_close(state - start_state, expected_squares[:, None].expand_as(state),
                                   rtol=0, atol=1e-9)
    assert not torch.equal(nodes, start_nodes)


@pytest.mark.parametrize("variant", sorted(RUNNER_VARIANTS))
@pytest.mark.parametrize("num_devices", [2, 3, 4])
def test_every_device_receives_the_table_rows_it_needs(small_config, variant, num_devices):
    """Zero gradients leave the tables unchanged: every row a device receives must equal the table's."""
    config, replicas, nodes, state, edges = setup(small_config, ["cpu"] * num_devices, *RUNNER_VARIANTS[variant])
    start = nodes.clone()
    log: list = []
    runner = _recording_runner(config, replicas, nodes, state, 2, log, scale=0.0)
    runner.run(edges, nodes, state, None, [torch.Generator().manual_seed(g) for g in range(num_devices)],
               [torch.Generator() for _ in range(num_devices)], torch.zeros(()), lambda n: None)
    assert len(log) == -(-len(edges) // config.training.batch_size)
    for _, needed, got, embeddings in log:
        assert torch.equal(embeddings, start[got])
    assert torch.equal(nodes, start)


def _recording_runner(config, replicas, nodes, state, bound, log, scale: float = 1.0):
    from marius_py.pipeline.multi_device import MultiDeviceRunner
    from marius_py.pipeline.replicated import ReplicatedRunner
    devices = [r.device for r in replicas]
    steps = [RecordingStep(model, g, log, scale) for g, model in enumerate(replicas)]
    p = config.pipeline
    update = lambda *a, **k: sparse_adagrad_(*a, lr=0.1, eps=1e-10, **k)  # noqa: E731
    if p.placement == "replicated":
        return ReplicatedRunner(steps, update, devices, config.training.batch_size, bound)
    return MultiDeviceRunner(steps, update, devices, config.training.batch_size, bound,
                             dedup=dedup_setting(p.dedup),  # (the config's name: "false" is no dedup)
                             cache_rows=max(p.cache_rows, 0), cache_all=p.placement == "split")


@pytest.mark.parametrize("decoder, num_devices", [("complex", 2), ("distmult", 2), ("distmult", 3), ("distmult", 4)])
@pytest.mark.parametrize("bound", [1, 2, 3])
def test_deduplicated_training_equals_every_device_reading_its_own_rows(small_config, decoder, bound, num_devices):
    """Same seed: dedup, dedup with caches, tables split across devices and the baseline train the same model;
    replicated tables too at bound 1 (at 2 their relations, like their rows, miss the previous step's update:
    see the next test)."""
    results = {}
    for variant, overrides in RUNNER_VARIANTS.items():
        config, replicas, nodes, state, edges = setup(small_config, ["cpu"] * num_devices, f"model.decoder={decoder}",
                                                      "model.reg_weight=0.01", *overrides)
        runner, loss = run_runner(config, replicas, nodes, state, edges, bound)
        results[variant] = nodes, state, [r.decoder.relations.detach() for r in replicas], loss, runner
    nodes, state, relations, loss, _ = results["baseline"]
    assert all(torch.equal(relations[0], other) for other in relations[1:]), "relation replicas diverged"
    for variant in ("dedup", "cache", "split", "replicated")[:None if bound == 1 else -1]:
        got_nodes, got_state, got_relations, got_loss, _ = results[variant]
        torch.testing.assert_close(got_nodes, nodes, rtol=0, atol=1e-6)
        torch.testing.assert_close(got_state, state, rtol=0, atol=1e-6)
        torch.testing.assert_close(got_relations[-1], relations[-1], rtol=0, atol=1e-6)
        torch.testing.assert_close(got_loss, loss, rtol=1e-6, atol=0)
    cached = results["cache"][4].counters.snapshot(4, 8)
    assert cached["cache_hits"] > 0


@pytest.mark.parametrize("num_devices", [3, 4])
def test_replicated_tables_stay_equal_and_train_like_the_baseline_at_bound_two(small_config, num_devices):
    """Every replica applies the same gradients in the same order: all end equal to device 0's (the model),
    and training matches the baseline's loss within what one step of staleness moves it."""
    results = {}
    for variant in ("baseline", "replicated"):
        config, replicas, nodes, state, edges = setup(small_config, ["cpu"] * num_devices, "model.decoder=complex",
                                                      "model.reg_weight=0.01", *RUNNER_VARIANTS[variant])
        start = nodes.clone()
        runner, loss = run_runner(config, replicas, nodes, state, edges, bound=2)
        results[variant] = loss
    assert runner.effective_staleness == 2 and runner.max_in_flight == 2
    for replica_nodes, replica_state in runner.tables[1:]:
        assert replica_nodes is not nodes and torch.equal(replica_nodes, nodes) and torch.equal(replica_state, state)
    assert not torch.equal(nodes, start)
    for replica in replicas[1:]:
        assert torch.equal(replica.decoder.relations, replicas[0].decoder.relations)
    torch.testing.assert_close(results["replicated"], results["baseline"], rtol=0.02, atol=0)


@pytest.mark.parametrize("bound", [1, 2])
def test_replicated_static_steps_equal_eager_steps(small_config, bound):
    """The replicated runner's graphed path (static inputs, gradients and received copies alternating per
    step; CPU: each 'graph' reruns its phase) trains exactly like fresh tensors, on three devices."""
    from marius_py.pipeline.replicated import ReplicaGraphs
    results = []
    for graphed in (False, True):
        config, replicas, nodes, state, edges = setup(small_config, ["cpu"] * 3, "model.decoder=distmult",
                                                      "model.reg_weight=0.01", "pipeline.placement=replicated",
                                                      "training.batch_size=256")
        runner = build_multi_device_runner(replicas, "replicated", config, [r.device for r in replicas], 0)
        runner.staleness_bound = bound
        if graphed:
            runner.graphs = ReplicaGraphs(runner)
        loss = torch.zeros(())
        runner.run(edges, nodes, state, None, [epoch_generator(0, 1, "cpu", stream=2 + g) for g in range(3)],
                   [epoch_generator(0, 1, "cpu", stream=9 + g) for g in range(3)], loss, lambda n: None)
        results.append((nodes, state, replicas[2].decoder.relations.detach(), loss, runner))
    assert results[1][4].graphs.sets[0] is not None and results[1][4].graphs.sets[1] is not None, \
        "no step was replayed"
    _assert_graphed_trains_as_eager(*results)


def _assert_graphed_trains_as_eager(eager, graphed) -> None:
    """(nodes, state, relations, loss, runner) of an eager and a graphed run: the same training, and one
    relation step counted per training step on every replica."""
    for got, expected in zip(graphed[:3], eager[:3]):
        torch.testing.assert_close(got, expected, rtol=0, atol=1e-6)
    torch.testing.assert_close(graphed[3], eager[3], rtol=1e-6, atol=0)
    runner = graphed[4]
    for step in runner.steps:
        model = step.model
        assert float(model.relation_optimizer.state[model.decoder.relations]["step"]) == runner.counters.steps


@pytest.mark.parametrize("shared, dedup", [(False, True), (True, True), (False, False)])
def test_replayed_static_steps_equal_eager_steps(small_config, shared, dedup):
    """The graphed runner's static tensors, alternating per step, train exactly like fresh ones (CPU:
    each 'graph' replays its phase eagerly into the static state), with and without dedup."""
    from marius_py.pipeline.phase_graphs import PhaseGraphs
    results = []
    for graphed in (False, True):
        config, replicas, nodes, state, edges = setup(small_config, ["cpu", "cpu"], "model.decoder=distmult",
                                                      "model.reg_weight=0", f"training.shared_negatives={shared}",
                                                      "pipeline.cache_rows=8", f"pipeline.dedup={dedup}")
        runner = build_multi_device_runner(replicas, "host", config, [r.device for r in replicas],
                                           2 * config.model.dim * 4)
        if graphed:
            assert all(step.graphable for step in runner.steps)
            runner.graphs = PhaseGraphs(runner)
        loss = torch.zeros(())
        runner.staleness_bound = 2
        runner.run(edges, nodes, state, None, [epoch_generator(0, 1, "cpu", stream=2 + g) for g in range(2)],
                   [epoch_generator(0, 1, "cpu", stream=9 + g) for g in range(2)], loss, lambda n: None)
        results.append((nodes, state, replicas[1].decoder.relations.detach(), loss, runner))
    graphs = results[1][4].graphs.graphs
    assert graphs[0] is not None and graphs[1] is not None, "no step was replayed"
    _assert_graphed_trains_as_eager(*results)


def test_counters_show_rows_read_once_per_step(small_config):
    config, replicas, nodes, state, edges = setup(small_config, ["cpu", "cpu"], *RUNNER_VARIANTS["dedup"])
    dedup = run_runner(config, replicas, nodes, state, edges)[0].counters.snapshot(64, 128)
    config, replicas, nodes, state, edges = setup(small_config, ["cpu", "cpu"], *RUNNER_VARIANTS["baseline"])
    baseline = run_runner(config, replicas, nodes, state, edges)[0].counters.snapshot(64, 128)
    assert dedup["device_rows"] == baseline["device_rows"] == baseline["host_to_device"]["rows"]
    assert dedup["host_to_device"]["rows"] == dedup["union_rows"] < baseline["host_to_device"]["rows"]
    assert dedup["rho"] == pytest.approx(dedup["device_rows"] / dedup["union_rows"]) and dedup["rho"] > 1
    assert dedup["shared_rows"] == dedup["device_rows"] - dedup["union_rows"]
    # The same rows cross devices either way: rows and returning gradients with dedup, gradients without.
    assert baseline["device_to_device"]["rows"] == dedup["device_to_device"]["rows"] > 0
    assert baseline["device_to_device"]["bytes"] < dedup["device_to_device"]["bytes"]
    saved = 1 - dedup["host_to_device"]["bytes"] / baseline["host_to_device"]["bytes"]
    assert saved == pytest.approx(1 - 1 / dedup["rho"])  # every host byte scales with the rows read


@pytest.mark.parametrize("num_devices", [3, 4])
@pytest.mark.parametrize("bound", [1, 2])
def test_link_counters_equal_what_routing_planned(small_config, num_devices, bound):
    """Each host link and each pair of devices carries the bytes the steps' row sets imply (recounted here
    from the rows every device trained, owner ``row % G``): with dedup an owner reads the union of its rows
    once per step, so the host links carry less than when every device reads its own."""
    embedding, row = 64, 96  # bytes of a row's embedding, and of its embedding and optimizer state
    snapshots = {}
    for variant in ("dedup", "baseline"):
        config, replicas, nodes, state, edges = setup(small_config, ["cpu"] * num_devices, "model.decoder=distmult",
                                                      *RUNNER_VARIANTS[variant])
        log: list = []
        runner = _recording_runner(config, replicas, nodes, state, bound, log)
        runner.run(edges, nodes, state, None, [torch.Generator().manual_seed(g) for g in range(num_devices)],
                   [torch.Generator() for _ in range(num_devices)], torch.zeros(()), lambda n: None)
        relations = sum(p.numel() * p.element_size() for p in replicas[0].relation_parameters())
        expected = _planned_links(_steps_of(log), num_devices, variant == "dedup", embedding, row, relations)
        snapshot = snapshots[variant] = runner.counters.snapshot(embedding, row)
        assert snapshot["links"] == expected
        for direction in ("host_to_device", "device_to_host"):
            assert snapshot[direction]["bytes"] == sum(expected[direction])
        assert snapshot["device_to_device"]["bytes"] == sum(map(sum, expected["device_to_device"]))
    dedup, baseline = (snapshots[v]["links"]["host_to_device"] for v in ("dedup", "baseline"))
    assert sum(dedup) < sum(baseline) and all(d <= b for d, b in zip(dedup, baseline))


def _steps_of(log: list) -> list[list[set[int]]]:
    """RecordingStep's log, one entry per device and step in device order, as each step's row sets."""
    steps: list[list[set[int]]] = []
    for device, _, rows, _ in log:
        if device == 0:
            steps.append([])
        steps[-1].append(set(rows.tolist()))
    return steps


def _planned_links(steps: list[list[set[int]]], n: int, dedup: bool, embedding: int, row: int,
                   relations: int) -> dict:
    """Bytes per host link and per (sender, receiver) pair that routing the steps' row sets moves."""
    to_device, to_host = [0] * n, [0] * n
    pairs = [[0] * n for _ in range(n)]
    for rows in steps:
        for owner in range(n):
            mine = [{r for r in device_rows if r % n == owner} for device_rows in rows]
            if dedup:  # the owner reads the union once (gather + read-modify-write) and sends the rows
                union = set().union(*mine)
                to_device[owner] += len(union) * (embedding + row)
                to_host[owner] += len(union) * row
            else:  # each device gathers its own rows; the owner updates each device's in turn
                gathered = len(rows[owner]) if owner < len(rows) else 0  # (a short last step)
                to_device[owner] += gathered * embedding + sum(map(len, mine)) * row
                to_host[owner] += sum(map(len, mine)) * row
            for g, wanted in enumerate(mine):
                if g != owner:
                    pairs[owner][g] += len(wanted) * embedding if dedup else 0
                    pairs[g][owner] += len(wanted) * (embedding + 8)
        for sender in range(len(rows)):  # the relation gradients' all-reduce
            for receiver in range(n):
                pairs[sender][receiver] += relations if receiver != sender else 0
    return {"host_to_device": to_device, "device_to_host": to_host, "device_to_device": pairs}


@pytest.mark.parametrize("num_devices", [3, 4])
def test_replicated_counters_count_each_copy_between_devices(small_config, num_devices):
    """Replicated tables: every device sends its packed gradients to every other one each step (counted as
    GPUs copy them, though simulated devices share memory); no host link carries rows."""
    config, replicas, nodes, state, edges = setup(small_config, ["cpu"] * num_devices, *RUNNER_VARIANTS["replicated"])
    runner = build_multi_device_runner(replicas, "replicated", config, [r.device for r in replicas], 0)
    sent = [0] * num_devices
    gradients_on = runner.gradients_on

    def counting(g, *args):
        packed = gradients_on(g, *args)
        sent[g] += packed.nbytes()
        return packed
    runner.gradients_on = counting
    runner.run(edges, nodes, state, None, [epoch_generator(0, 1, "cpu", stream=2 + g) for g in range(num_devices)],
               [epoch_generator(0, 1, "cpu", stream=9 + g) for g in range(num_devices)], torch.zeros(()),
               lambda n: None)
    links = runner.counters.snapshot(4, 8)["links"]
    assert links["device_to_device"] == [[0 if h == d else sent[h] for d in range(num_devices)]
                                         for h in range(num_devices)]
    assert min(sent) > 0 and links["host_to_device"] == links["device_to_host"] == [0] * num_devices


def test_group_by_owner_and_union_route_each_row_to_one_owner():
    generator = torch.Generator().manual_seed(0)
    per_device = [torch.unique(torch.randint(50, (30,), generator=generator)) for _ in range(3)]
    grouped = []
    for rows in per_device:
        padded = torch.cat([rows, rows[:1].repeat(5)])  # padding after the count, as plans have
        local = torch.randint(len(rows), (40,), generator=generator)
        g = group_by_owner(padded, local, torch.tensor([len(rows)]), 3)
        assert torch.equal(g.rows[g.local], padded[local])
        assert g.per_owner.tolist() == [int((rows % 3 == o).sum()) for o in range(3)]
        assert g.offsets.tolist() == [0, int(g.per_owner[0]), int(g.per_owner[:2].sum())]
        assert int(g.count) == len(rows)
        grouped.append(g)
    for owner in range(3):
        requests = [g.rows[int(g.offsets[owner]):][:int(g.per_owner[owner])] for g in grouped]
        assert all(bool((r % 3 == owner).all()) for r in requests)
        lengths = [len(g.rows) for g in grouped]
        padded = torch.full((sum(lengths),), 50)  # the sentinel: one past the last row
        starts = [0, lengths[0], lengths[0] + lengths[1]]
        for start, request in zip(starts, requests):
            padded[start:start + len(request)] = request
        union = union_of_requests(padded, lengths, sentinel=50)
        expected = torch.unique(torch.cat(requests))
        assert int(union.count) == len(expected) and torch.equal(union.rows[:len(expected)], expected)
        for request, positions in zip(requests, union.positions):
            assert torch.equal(union.rows[positions[:len(request)]], request)


def test_adagrad_of_several_gradients_equals_consecutive_steps():
    generator = torch.Generator().manual_seed(2)
    for state_cols in (1, 6):
        nodes = torch.randn(20, 6, generator=generator, dtype=torch.float64)
        state = torch.rand(20, state_cols, generator=generator, dtype=torch.float64)
        rows = torch.tensor([3, 7, 11, 19, 0])
        grads = torch.randn(3, 5, 6, generator=generator, dtype=torch.float64)
        grads[1, 2] = 0  # a device without row 11 gives it a zero gradient: no change
        at_once, one_by_one = (nodes.clone(), state.clone()), (nodes.clone(), state.clone())
        sparse_adagrad_(*at_once, rows, grads, torch.tensor([4]), lr=0.3, eps=1e-10)
        for grad in grads:
            sparse_adagrad_(*one_by_one, rows[:4], grad[:4], 4, lr=0.3, eps=1e-10)
        torch.testing.assert_close(at_once, one_by_one, rtol=0, atol=1e-15)
        assert torch.equal(at_once[0][0], nodes[0]), "rows past the count must stay"
        flagged = (nodes.clone(), state.clone())  # absent gradients as flags: their entries are never read
        present = torch.ones(3, 5, dtype=torch.bool)
        present[1, 2] = False
        garbage = grads.clone()
        garbage[1, 2] = float("nan")
        sparse_adagrad_(*flagged, rows, garbage, torch.tensor([4]), lr=0.3, eps=1e-10, present=present)
        torch.testing.assert_close(flagged, at_once, rtol=0, atol=0)
        offset, sliced = (nodes.clone(), state.clone()), (nodes.clone(), state.clone())  # an owner's share
        sparse_adagrad_(*offset, rows, grads[0], torch.tensor([2]), lr=0.3, eps=1e-10, start=torch.tensor([1]))
        sparse_adagrad_(*sliced, rows[1:3], grads[0, 1:3], 2, lr=0.3, eps=1e-10)
        torch.testing.assert_close(offset, sliced, rtol=0, atol=0)


def test_captures_run_with_the_cycle_collector_off_and_restore_it(monkeypatch):
    """A collection inside a capture could free another graph and break the capture: none may start there."""
    import contextlib
    import gc

    from marius_py.pipeline.phase_graphs import capturing
    seen = []

    @contextlib.contextmanager
    def fake_graph(graph, **kwargs):
        seen.append(gc.isenabled())
        yield

    monkeypatch.setattr(torch.cuda, "graph", fake_graph)
    assert gc.isenabled()
    with pytest.raises(RuntimeError):
        with capturing(None):
            seen.append(gc.isenabled())
            raise RuntimeError("capture failed")
    assert seen == [False, False] and gc.isenabled()


def test_cached_rows_are_read_and_updated_in_the_cache_until_flushed():
    generator = torch.Generator().manual_seed(3)
    nodes, state = torch.randn(30, 4, generator=generator), torch.rand(30, 4, generator=generator)
    rows, grad = torch.tensor([2, 5, 9, 14]), torch.randn(4, 4, generator=generator)
    expected = nodes.clone(), state.clone()
    sparse_adagrad_(*expected, rows, grad, None, lr=0.1, eps=1e-10)
    cache = RowCache.empty(30, 3, 4, 4, "cpu")
    cache.admit(torch.tensor([5, 14]), nodes, state)
    tables = nodes.clone(), state.clone()
    sparse_adagrad_(*tables, rows, grad, None, lr=0.1, eps=1e-10, cache=cache)
    assert torch.equal(tables[0][5], nodes[5]), "a cached row is updated in the cache, not the table"
    torch.testing.assert_close(tables[0][9], expected[0][9])
    read = gather_rows(tables[0], rows, torch.empty(4, 4), None, cache)
    torch.testing.assert_close(read, expected[0][rows])
    cache.flush(*tables)
    torch.testing.assert_close(tables, expected)
    assert int((cache.slot_of >= 0).sum()) == 0 and cache.num_rows == 0


def test_hot_rows_are_an_owners_most_frequent_endpoints():
    edges = torch.tensor([[4, 0, 6], [4, 0, 2], [4, 0, 8], [6, 0, 3], [1, 0, 6], [5, 0, 7]])
    degree = endpoint_degree(edges, 10)
    assert degree.tolist() == [0, 1, 1, 1, 3, 1, 3, 1, 1, 0]
    assert hot_rows(degree, 0, 2, 2).tolist() == [4, 6]
    assert hot_rows(degree, 1, 2, 5).tolist() == [1, 3, 5, 7]  # only rows that are endpoints
    assert hot_rows(degree, 0, 2, 0).tolist() == []


def test_step_grouping_reorders_edges_so_a_steps_batches_share_heads():
    generator = torch.Generator().manual_seed(5)
    edges = torch.stack([torch.randint(40, (1000,), generator=generator), torch.zeros(1000, dtype=torch.long),
                         torch.arange(1000)], dim=1)
    grouped = group_steps_by_head(edges, step_edges=100, num_devices=2, window_steps=4)
    assert torch.equal(torch.sort(grouped[:, 2]).values, edges[:, 2]), "every edge exactly once"

    def heads_per_step_and_overlap(order):
        distinct, overlap = [], []
        for first in range(0, 1000, 100):
            a, b = set(order[first:first + 50, 0].tolist()), set(order[first + 50:first + 100, 0].tolist())
            distinct.append(len(a | b))
            overlap.append(len(a & b) / len(a | b))
        return np.mean(distinct), np.mean(overlap)

    distinct_before, overlap_before = heads_per_step_and_overlap(edges)
    distinct_after, overlap_after = heads_per_step_and_overlap(grouped)
    assert distinct_after < distinct_before / 2 and overlap_after > 0.9 > overlap_before


@pytest.mark.parametrize("extra", [[], ["storage.num_partitions=4", "storage.buffer_capacity=2"],
                                   ["pipeline.dedup=false"], ["training.shared_negatives=true"],
                                   ["pipeline.step_grouping=4"]])
def test_trainer_on_simulated_devices_learns_and_logs_transfers(small_config, tmp_path, extra):
    config = small_config("training.devices=cpu,cpu", "training.epochs=6", "evaluation.every=3",
                          "pipeline.cache_rows=10", *extra)
    if "storage.num_partitions=4" in extra:
        config.dataset.path = _bucketed(config, tmp_path, 4)
    model = mp.train(config, tmp_path / "run", progress=False)
    assert model.test_metrics["mrr"] > 0.3
    records = [json.loads(line) for line in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()]
    epochs = [r for r in records if r["event"] == "epoch"]
    assert len(epochs) == 6
    transfers = epochs[-1]["devices"]
    assert transfers["names"] == ["cpu", "cpu"] and transfers["steps"] > 0
    links = transfers["links"]  # each link's bytes, adding up to the totals
    assert len(links["host_to_device"]) == 2 and min(links["host_to_device"]) > 0
    assert sum(links["host_to_device"]) == transfers["host_to_device"]["bytes"]
    assert sum(map(sum, links["device_to_device"])) == transfers["device_to_device"]["bytes"]
    assert transfers["host_to_device"]["bytes"] > 0 and transfers["device_to_host"]["bytes"] > 0
    assert transfers["dedup"] is (config.pipeline.dedup != "false")  # (auto is dedup on a CPU)
    if transfers["dedup"]:
        assert transfers["rho"] > 1 and transfers["host_to_device"]["rows"] < transfers["device_rows"]
    else:
        # Rows the other device owns still cross: the owner reads their gradients.
        assert transfers["rho"] == 1 and transfers["host_to_device"]["rows"] == transfers["device_rows"]
        assert transfers["device_to_device"]["rows"] > 0


@pytest.mark.parametrize("devices", ["cpu,cpu,cpu", "cpu,cpu,cpu,cpu"])
def test_trainer_with_replicated_tables_learns_and_resumes_where_it_stopped(small_config, tmp_path, devices):
    """Replicated tables through the trainer: it learns, logs the placement, and a run stopped after two
    epochs and resumed for two more ends where an unbroken four-epoch run does (bound 1: synchronous)."""
    overrides = [f"training.devices={devices}", "pipeline.placement=replicated", "pipeline.staleness_bound=1"]
    whole = mp.train(small_config(*overrides, "training.epochs=4"), tmp_path / "whole", progress=False)
    assert whole.test_metrics["mrr"] > 0.3
    records = [json.loads(line) for line in (tmp_path / "whole" / "metrics.jsonl").read_text().splitlines()]
    epochs = [r for r in records if r["event"] == "epoch"]
    assert [r["pipeline"]["placement"] for r in epochs] == ["replicated"] * 4
    assert epochs[-1]["devices"]["steps"] > 0
    assert all(r["devices"]["host_enqueue_seconds"] > 0 for r in epochs)  # (the host's share of each epoch)
    pairs = epochs[-1]["devices"]["links"]["device_to_device"]  # every GPU's gradients to every other
    assert all((pairs[h][d] > 0) == (h != d) for h in range(len(pairs)) for d in range(len(pairs)))
    mp.train(small_config(*overrides, "training.epochs=2"), tmp_path / "split", progress=False)
    resumed = mp.train(small_config(*overrides, "training.epochs=4"), tmp_path / "split", progress=False,
                       resume=True)
    np.testing.assert_allclose(resumed.embeddings(), whole.embeddings(), rtol=0, atol=1e-6)


PROCESS_GROUPS = [pytest.param("cpu,cpu,cpu", 1, marks=pytest.mark.slow, id="3-cpus-bound-1"),
                  pytest.param("cpu,cpu,cpu", 2, marks=pytest.mark.slow, id="3-cpus-bound-2"),
                  pytest.param("cpu,cpu,cpu,cpu", 1, marks=pytest.mark.slow, id="4-cpus-bound-1"),
                  pytest.param("cpu,cpu,cpu,cpu", 2, marks=pytest.mark.slow, id="4-cpus-bound-2"),
                  pytest.param("cuda:0,cuda:1", 1, id="2-gpus-bound-1", marks=[pytest.mark.gpu, pytest.mark.skipif(
                      not torch.cuda.is_available() or torch.cuda.device_count() < 2, reason="needs two GPUs")])]


@pytest.mark.parametrize("devices, bound", PROCESS_GROUPS)
def test_a_process_per_device_trains_as_one_process(small_config, tmp_path, devices, bound):
    """Replicated tables with a worker process per further device (gloo on the CPU, NCCL on GPUs) train the
    model one process trains: same tables, relations and loss after two epochs through the trainer (GPUs:
    within their atomics' rounding)."""
    tolerance = {"rtol": 0, "atol": 1e-6} if devices.startswith("cpu") else {"rtol": 1e-4, "atol": 1e-5}
    results = {}
    for processes in ("one", "per_device"):
        config = small_config(f"training.devices={devices}", "pipeline.placement=replicated",
                              f"pipeline.staleness_bound={bound}", f"pipeline.processes={processes}",
                              "training.batch_size=256", "evaluation.every=0")
        trainer = Trainer.of(config, Dataset(config.dataset.path), tmp_path / processes, progress=False)
        try:
            trainer.train()
            records = [json.loads(line) for line in (tmp_path / processes / "metrics.jsonl").read_text().splitlines()]
            losses = [r["loss"] for r in records if r["event"] == "epoch"]
            results[processes] = (trainer.tables.nodes.clone(), trainer.tables.node_state.clone(),
                                  trainer.model.decoder.relations.detach().clone(), losses)
        finally:
            trainer.close()
    one, group = results["one"], results["per_device"]
    for got, expected in zip(group[:3], one[:3]):
        torch.testing.assert_close(got, expected, **tolerance)
    assert group[3] == pytest.approx(one[3], rel=1e-5)


@pytest.mark.parametrize("faster", [True, False])
def test_dedup_auto_times_both_modes_keeps_the_faster_and_trains_the_same_model(small_config, monkeypatch, faster):
    """dedup=auto runs a few steps of each mode in a long span, keeps the one that took less per step, and
    trains what dedup trains (the modes share their arithmetic; bound 1, so every step sees the last)."""
    from marius_py.pipeline import multi_device
    results = {}
    for dedup in (True, "auto"):
        config, replicas, nodes, state, edges = setup(small_config, ["cpu"] * 3, "model.decoder=distmult",
                                                      "model.reg_weight=0", "pipeline.cache_rows=8",
                                                      "training.batch_size=32")
        runner = multi_device.MultiDeviceRunner(replicas, lambda *a, **k: sparse_adagrad_(*a, lr=0.1, eps=1e-10, **k),
                                                [r.device for r in replicas], 32, 1, dedup=dedup, cache_rows=8)
        timings = iter([1.0, 2.0] if faster else [2.0, 1.0])  # seconds per step: dedup first, then without
        monkeypatch.setattr(runner, "_seconds_per_step", lambda run, count: (run(), next(timings))[1])
        assert len(edges) // (32 * 3) > 2 * (multi_device.AUTO_WARM_STEPS + multi_device.AUTO_TIMED_STEPS)
        runner.run(edges, nodes, state, None, [torch.Generator().manual_seed(g) for g in range(3)],
                   [torch.Generator() for _ in range(3)], torch.zeros(()), lambda n: None)
        results[dedup] = nodes, runner
    nodes, runner = results["auto"]
    assert runner.dedup is faster and runner.counters.dedup is faster and not runner.auto
    assert runner.dedup_trial == {"seconds_per_step": {"dedup": 1.0 if faster else 2.0,
                                                       "no_dedup": 2.0 if faster else 1.0}, "chosen": faster}
    torch.testing.assert_close(nodes, results[True][0], rtol=0, atol=1e-6)
    # The trial's steps without dedup count as such: their rows are read once per device, not per owner.
    auto, dedup = (results[k][1].counters.snapshot(4, 8) for k in ("auto", True))
    assert auto["device_rows"] == dedup["device_rows"]
    assert dedup["union_rows"] < auto["union_rows"] < auto["device_rows"]
    assert auto["host_to_device"]["bytes"] > dedup["host_to_device"]["bytes"]


@pytest.mark.parametrize("value, expected", [(False, False), (True, True), ("false", False), ("auto", True)])
def test_dedup_set_from_python_counts_as_its_name(small_config, value, expected):
    """pipeline.dedup set on a config object (a bool, not the validated name) is read as its name (auto is
    dedup on a CPU)."""
    config, replicas, *_ = setup(small_config, ["cpu", "cpu"])
    config.pipeline.dedup = value
    runner = build_multi_device_runner(replicas, "host", config, [r.device for r in replicas], 8)
    assert runner.dedup is expected


def test_closing_a_group_whose_worker_died_does_not_raise():
    """Stopping the workers tolerates one that already died (its pipe is closed), and forgets them."""
    import multiprocessing
    import os
    from marius_py.step.replica_workers import ReplicaProcessesRunner
    context = multiprocessing.get_context("spawn")
    ours, theirs = context.Pipe()
    worker = context.Process(target=os._exit, args=(1,))
    worker.start()
    worker.join()
    theirs.close()
    runner = ReplicaProcessesRunner.__new__(ReplicaProcessesRunner)
    runner.pipes, runner.workers = [ours], [worker]
    runner.close()
    assert runner.workers == []


def test_a_worker_that_dies_before_joining_is_reported_not_waited_for():
    """A replica worker that exits before it joins the group (an import or device error) stops the trainer's
    process with its exit code, instead of a rendezvous waiting out its timeout."""
    import multiprocessing
    import os
    from marius_py.step.replica_workers import ReplicaProcessesRunner, WorkerFailed
    context = multiprocessing.get_context("spawn")
    ours, _ = context.Pipe()
    worker = context.Process(target=os._exit, args=(3,))
    worker.start()
    worker.join()
    runner = ReplicaProcessesRunner.__new__(ReplicaProcessesRunner)
    runner.pipes, runner.workers = [ours], [worker]
    with pytest.raises(WorkerFailed, match="replica worker 1 exited with code 3 before joining"):
        runner._await_joining()


def _bucketed(config, tmp_path, partitions: int) -> str:
    from marius_py.preprocess import PreprocessOptions, preprocess
    from conftest import UMLS_RAW  # (tests/ is on the path; the checkout need not be)
    out = tmp_path / f"umls-p{partitions}"
    preprocess(out, UMLS_RAW / "train.txt", UMLS_RAW / "valid.txt", UMLS_RAW / "test.txt",
               PreprocessOptions(num_partitions=partitions), progress=False)
    return str(out)


@pytest.mark.parametrize("devices", ["cpu,cpu,cpu", "cpu,cpu,cpu,cpu"])
def test_replicas_leave_training_equal(small_config, tmp_path, devices):
    config = small_config(f"training.devices={devices}", "training.epochs=2")
    trainer = Trainer.of(config, Dataset(config.dataset.path), tmp_path / "run", progress=False)
    try:
        initial = trainer.replicas[0].decoder.relations.detach().clone()
        trainer.train()
        first = trainer.replicas[0].decoder.relations.detach()
        assert not torch.equal(first, initial), "the relations did not train"
        for replica in trainer.replicas[1:]:
            assert torch.equal(replica.decoder.relations.detach(), first)
    finally:
        trainer.close()


@pytest.mark.parametrize(("devices", "message"), [("cpu", "at least two"), ("cuda:0,cpu", "one kind"),
                                                  ("gpu0,gpu1", "cpu or cuda:N"), ("cuda:0,cuda:0", "each GPU once")])
def test_bad_devices_are_config_errors(small_config, devices, message):
    with pytest.raises(mp.MariusInputError, match=f"training.devices.*{message}"):
        small_config(f"training.devices={devices}")


def test_split_tables_with_partitions_or_without_dedup_are_refused(small_config, tmp_path):
    for extra in (["pipeline.dedup=false"], ["storage.num_partitions=4", "storage.buffer_capacity=2"]):
        config = small_config("training.devices=cpu,cpu", "pipeline.placement=split", *extra)
        if "storage.num_partitions=4" in extra:
            config.dataset.path = _bucketed(config, tmp_path, 4)
        with pytest.raises(mp.MariusInputError, match="pipeline.placement: split shares"):
            Trainer.of(config, Dataset(config.dataset.path), tmp_path / f"run{len(extra)}", progress=False)


def test_gpus_one_overrides_devices_of_a_config(tmp_path, monkeypatch):
    from marius_py import api
    from marius_py.cli import main
    from types import SimpleNamespace
    seen = {}

    def fake_train(config, *args, **kwargs):  # stop right after the command line has built the config
        seen["config"] = config
        return SimpleNamespace(run_dir=tmp_path, test_metrics=None)

    monkeypatch.setattr(api, "train", fake_train)
    config_file = tmp_path / "two.yaml"
    config_file.write_text("training:\n  devices: cpu,cpu\n")
    assert main(["train", str(config_file), "--gpus", "1", "--quiet"]) == 0
    assert seen["config"].training.devices == "" and seen["config"].training.device == "cuda"


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the message of a machine without GPUs")
def test_gpus_on_a_machine_without_them_is_a_clear_error(umls_dataset, tmp_path, capsys):
    from marius_py.cli import main
    code = main(["train", f"dataset.path={umls_dataset}", "--gpus", "2", "--run-dir", str(tmp_path / "run"),
                 "--quiet"])
    assert code == 2
    assert "training.devices: cuda:0 requested but 0 CUDA device(s)" in capsys.readouterr().err
    assert not (tmp_path / "run").exists()


GPU_PAIRS = [pytest.param(["cuda:0", "cuda:1"], id="two-gpus", marks=pytest.mark.skipif(
                 not torch.cuda.is_available() or torch.cuda.device_count() < 2, reason="needs two CUDA devices")),
             pytest.param(["cuda:0", "cuda:0"], id="two-lanes-one-gpu")]


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
@pytest.mark.parametrize("devices", GPU_PAIRS)
@pytest.mark.parametrize("decoder", ["distmult", "complex"])
def test_two_gpus_dedup_equals_baseline(small_config, decoder, devices):
    """On real GPUs (peer reads, zero-copy kernels, graphs, copies between replicas): dedup, caches, split and
    replicated tables and the baseline train alike.

    Equality needs staleness bound 1: with 2, whether a step's loads see the previous step's updates
    depends on how the streams interleave (the documented bounded staleness), and on a GPU shared with
    other work the variants then drift apart (measured: every entry differed under load, none alone).
    Bound 2 is run too, for its overlap: the same training within a loose tolerance."""
    results = {}
    stale = [("dedup, bound 2", RUNNER_VARIANTS["dedup"]), ("replicated, bound 2", RUNNER_VARIANTS["replicated"])]
    for variant, overrides in [*RUNNER_VARIANTS.items(), *stale]:
        config, replicas, nodes, state, edges = setup(small_config, devices, f"model.decoder={decoder}",
                                                      "model.reg_weight=0", *overrides)
        replicated = "replicated" in variant  # tables start on device 0; the others read pinned host tables
        nodes, state = (nodes.to(devices[0]), state.to(devices[0])) if replicated else \
            (nodes.pin_memory(), state.pin_memory())
        runner, loss = run_runner(config, replicas, nodes, state, edges, bound=2 if "bound 2" in variant else 1)
        torch.cuda.synchronize()
        results[variant] = nodes.cpu(), state.cpu(), loss.cpu(), runner.counters.snapshot(4, 8)
        if replicated:
            assert all(torch.equal(n.cpu(), results[variant][0]) for n, _ in runner.tables), "replicas differ"
        if decoder == "distmult":
            sets = runner.graphs.sets if replicated else runner.graphs.graphs
            assert runner.graphs is not None and sets != [None, None], "no graphed step"
        if "bound 2" in variant:
            assert runner.max_in_flight == 2  # loads ran ahead of finishes
    nodes, state, loss, _ = results["baseline"]
    for variant in ("dedup", "cache", "split", "replicated"):
        got_nodes, got_state, got_loss, counters = results[variant]
        close = torch.isclose(got_nodes, nodes, rtol=1e-4, atol=1e-5)
        assert close.float().mean() > 0.999, f"{variant}: {int((~close).sum())} entries differ"
        torch.testing.assert_close(got_loss, loss, rtol=1e-4, atol=1e-6)
        assert counters.get("rho", 2) > 1
    replicated_nodes, _, replicated_loss, _ = results["replicated, bound 2"]
    torch.testing.assert_close(replicated_loss, loss, rtol=0.05, atol=0)
    assert torch.isfinite(replicated_nodes).all()
    stale_nodes, _, stale_loss, _ = results["dedup, bound 2"]
    torch.testing.assert_close(stale_loss, loss, rtol=0.05, atol=0)
    assert torch.isfinite(stale_nodes).all() and not torch.equal(stale_nodes, setup(small_config, devices)[2])


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_one_gpu_runner_replays_its_phases_and_trains_as_eager(small_config):
    """The multi-device runner on one GPU (``bench/multi_gpu.py --one-gpu-runner``): replayed as CUDA graphs it
    trains as it does eagerly (bound 1, so both see every earlier update). A first run is thrown away: a
    process's first GPU run rounds the first step's near-zero gradients differently (RESULTS, twelfth session)."""
    results = {}
    for variant in ("throwaway", "eager", "graphed"):
        config, replicas, nodes, state, edges = setup(small_config, ["cuda:0"], "model.decoder=distmult",
                                                      "model.reg_weight=0", "pipeline.dedup=false",
                                                      f"training.cuda_graphs={variant == 'graphed'}")
        nodes, state = nodes.pin_memory(), state.pin_memory()
        runner, loss = run_runner(config, replicas, nodes, state, edges, bound=1)
        torch.cuda.synchronize()
        assert (runner.graphs is not None and runner.graphs.graphs != [None, None]) == (variant == "graphed")
        results[variant] = nodes, loss.cpu()
    (nodes, loss), (got_nodes, got_loss) = results["eager"], results["graphed"]
    assert not torch.equal(nodes, setup(small_config, ["cuda:0"])[2]), "nothing trained"
    close = torch.isclose(got_nodes, nodes, rtol=1e-4, atol=1e-5)
    assert close.float().mean() > 0.999, f"{int((~close).sum())} entries differ"
    torch.testing.assert_close(got_loss, loss, rtol=1e-4, atol=1e-6)


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_adagrad_of_an_owners_share_matches_the_torch_version():
    """``start``: the Triton kernel updates rows[start:start + count] with the same gradient rows."""
    generator = torch.Generator().manual_seed(6)
    nodes, state = torch.randn(200, 100, generator=generator), torch.rand(200, 100, generator=generator)
    rows, grad = torch.randperm(200, generator=generator)[:90], torch.randn(90, 100, generator=generator)
    outputs = []
    for device in ("cpu", "cuda"):
        tables = [t.clone() if device == "cpu" else t.clone().pin_memory() for t in (nodes, state)]
        sparse_adagrad_(*tables, rows.to(device), grad.to(device), torch.tensor([37], device=device), 0.1, 1e-10,
                        start=torch.tensor([21], device=device))
        torch.cuda.synchronize()
        outputs.append(tables)
    torch.testing.assert_close(outputs[1], outputs[0], rtol=1e-5, atol=1e-6)
    changed = (outputs[1][0] != nodes).any(dim=1)
    assert torch.equal(changed.nonzero().flatten().sort().values, rows[21:58].sort().values)


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
@pytest.mark.parametrize("rowwise", [False, True])
@pytest.mark.parametrize("flagged", [False, True])
def test_cached_multi_gradient_kernels_match_torch_versions(rowwise, flagged):
    generator = torch.Generator().manual_seed(4)
    nodes = torch.randn(300, 100, generator=generator)
    state = torch.rand(300, 1 if rowwise else 100, generator=generator)
    rows = torch.randperm(300, generator=generator)[:120]
    grads = torch.randn(3, 120, 100, generator=generator)
    present = torch.rand(3, 120, generator=generator) < 0.6 if flagged else None
    if flagged:  # absent gradients hold garbage the kernels must not read
        grads[~present] = float("nan")
    outputs = []
    for device in ("cpu", "cuda"):
        tables = [t.clone().to(device) if device == "cpu" else t.clone().pin_memory() for t in (nodes, state)]
        cache = RowCache.empty(300, 40, 100, state.shape[1], device)
        cache.admit(rows[::4][:40], *tables)
        sparse_adagrad_(*tables, rows.to(device), grads.to(device), torch.tensor([111], device=device), 0.1,
                        1e-10, cache, present=None if present is None else present.to(device))
        read = gather_rows(tables[0], rows.to(device), torch.full((120, 104), float("nan"), device=device),
                           torch.tensor([117], device=device), cache)
        torch.cuda.synchronize()
        cache.flush(*tables)
        outputs.append([t.cpu() for t in (*tables, read[:117])])
    for got, expected in zip(outputs[1], outputs[0]):
        torch.testing.assert_close(got, expected, rtol=1e-4, atol=1e-5)


def test_one_device_runner_trains_as_with_dedup_and_replayed(small_config):
    """One device (the one-GPU host placement's graphed step): without dedup, with dedup, and replayed through
    PhaseGraphs (CPU: each 'graph' replays its phase eagerly), the same model from the same seed."""
    from marius_py.pipeline.phase_graphs import PhaseGraphs
    results = {}
    for variant in ("no-dedup", "dedup", "replayed"):
        config, replicas, nodes, state, edges = setup(small_config, ["cpu"], "model.decoder=distmult",
                                                      "model.reg_weight=0", "pipeline.cache_rows=0",
                                                      f"pipeline.dedup={variant == 'dedup'}")
        runner = build_multi_device_runner(replicas, "host", config, [r.device for r in replicas],
                                           2 * config.model.dim * 4)
        if variant == "replayed":
            runner.graphs = PhaseGraphs(runner)
        loss = torch.zeros(())
        runner.staleness_bound = 2
        runner.run(edges, nodes, state, None, [epoch_generator(0, 1, "cpu", stream=2)],
                   [epoch_generator(0, 1, "cpu", stream=9)], loss, lambda n: None)
        results[variant] = nodes, state, replicas[0].decoder.relations.detach(), loss, runner
    nodes, state, relations, loss, _ = results["no-dedup"]
    assert float(loss) > 0 and not torch.equal(state, torch.zeros_like(state)), "nothing trained"
    assert results["replayed"][4].graphs.graphs[0] is not None, "no step was replayed"
    for variant in ("dedup", "replayed"):
        got_nodes, got_state, got_relations, got_loss, _ = results[variant]
        torch.testing.assert_close(got_nodes, nodes, rtol=0, atol=1e-6)
        torch.testing.assert_close(got_state, state, rtol=0, atol=1e-6)
        torch.testing.assert_close(got_relations, relations, rtol=0, atol=1e-6)
        torch.testing.assert_close(got_loss, loss, rtol=1e-6, atol=0)
