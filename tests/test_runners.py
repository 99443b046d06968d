"""The runner contract (``pipeline/runner.py``): every runner the builders return is a ``Runner``, trains a
span of UMLS edges into the tables it is handed with a finite loss, and closes, twice, without error.

A meta-test keeps the contract's parameters complete: every class of the packages named ``*Runner`` or
``*Stepper`` (or defining ``effective_staleness``, as a runner does) is one the contract builds, or is
listed, with its reason, as no runner of the trainer's.
"""

from __future__ import annotations

import ast
import copy
from pathlib import Path

import pytest
import torch

import marius_py
from marius_py.dataset import Dataset
from marius_py.pipeline.placements import PLACEMENT_CPU, PLACEMENT_DEVICE, PLACEMENT_HOST
from marius_py.pipeline.row_kernels import zero_copy_available
from marius_py.pipeline.runner import Runner, TransferCounts
from marius_py.random_streams import epoch_generators
from marius_py.step.model import StepModel
from marius_py.step.runners import build_multi_device_runner, build_span_runner

needs_cuda = [pytest.mark.gpu, pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")]
needs_zero_copy = [pytest.mark.gpu, pytest.mark.skipif(not zero_copy_available(), reason="needs CUDA and Triton")]
two_gpus = pytest.mark.skipif(torch.cuda.device_count() < 2, reason="needs two GPUs (each GPU is given once)")


def case(case_id: str, runner_class: str, devices: str, placement: str, *overrides: str, marks=()):
    return pytest.param(runner_class, devices, placement, list(overrides), id=case_id, marks=marks)


# (the runner class the builder returns, devices, placement, config overrides)
RUNNERS = [
    case("cpu-inline", "SpanRunner", "cpu", PLACEMENT_CPU, "pipeline.staleness_bound=1"),
    case("cpu-threads", "SpanRunner", "cpu", PLACEMENT_CPU, "pipeline.staleness_bound=4"),
    case("device-graphed", "SpanRunner", "cuda", PLACEMENT_DEVICE, marks=needs_cuda),
    case("device-fused", "SpanRunner", "cuda", PLACEMENT_DEVICE, "training.cuda_graphs=false", marks=needs_cuda),
    case("device-planned-ahead", "SpanRunner", "cuda", PLACEMENT_DEVICE, "training.fused_step=false",
         marks=needs_cuda),
    case("host-zero-copy", "SpanRunner", "cuda", PLACEMENT_HOST, marks=needs_zero_copy),
    case("host-staged", "SpanRunner", "cuda", PLACEMENT_HOST, "training.fused_step=false", marks=needs_cuda),
    case("cpus-host-dedup", "MultiDeviceRunner", "cpu,cpu", "host", "pipeline.dedup=true"),
    case("cpus-host-no-dedup", "MultiDeviceRunner", "cpu,cpu", "host", "pipeline.dedup=false"),
    case("cpus-host-cache", "MultiDeviceRunner", "cpu,cpu", "host", "pipeline.dedup=true", "pipeline.cache_rows=8"),
    case("cpus-split", "MultiDeviceRunner", "cpu,cpu", "split", "pipeline.dedup=true"),
    case("cpus-replicated", "ReplicatedRunner", "cpu,cpu", "replicated"),
    case("cpus-replicated-per-device", "ReplicaProcessesRunner", "cpu,cpu", "replicated",
         "pipeline.processes=per_device"),  # (~4 s: two processes start)
    case("gpus-host", "MultiDeviceRunner", "cuda:0,cuda:1", "host", marks=[*needs_zero_copy, two_gpus]),
    case("gpus-split", "MultiDeviceRunner", "cuda:0,cuda:1", "split", "pipeline.dedup=true",
         marks=[*needs_zero_copy, two_gpus]),
    case("gpus-replicated", "ReplicatedRunner", "cuda:0,cuda:1", "replicated", marks=[*needs_cuda, two_gpus]),
]

# Classes with a runner's name that the builders never hand to the trainer, and why.
NOT_THE_TRAINERS = {"GroupStepper": "one process's step in a replica group: ReplicaProcessesRunner (and each of its "
                                    "workers) drives it with dealt batches; the trainer never sees it"}


def build(small_config, devices: str, placement: str, overrides: list[str]):
    """(runner, nodes, state, edges, sampling, dropout, loss) as the trainer hands them, for one span."""
    names = devices.split(",")
    config = small_config("model.dim=8", "training.batch_size=256", "training.num_negatives=32",
                          f"training.devices={devices}" if len(names) > 1 else f"training.device={devices}",
                          *overrides)
    dataset = Dataset(config.dataset.path)
    torch.manual_seed(0)
    replicas = [StepModel(config, dataset.num_nodes, dataset.num_relations, torch.device(names[0]))]
    for name in names[1:]:
        replica = StepModel(config, dataset.num_nodes, dataset.num_relations, torch.device(name))
        replica.load_state_dict(copy.deepcopy(replicas[0].state_dict()))
        replicas.append(replica)
    devices_ = [r.device for r in replicas]
    device = devices_[0]
    nodes = torch.randn(dataset.num_nodes, 8, generator=torch.Generator().manual_seed(1)) * 0.1
    state = torch.zeros(dataset.num_nodes, replicas[0].node_optimizer.state_dim(8))
    edges = torch.from_numpy(dataset.train)
    if len(names) > 1:
        row_bytes = (nodes.shape[1] + state.shape[1]) * 4
        runner = build_multi_device_runner(replicas, placement, config, devices_, row_bytes)
        table_device = device if placement == "replicated" else torch.device("cpu")
        _, sampling, dropout = epoch_generators(0, 1, table_device, device, devices_)
    else:
        runner = build_span_runner(replicas[0], placement, config, device)
        table_device = device if placement == PLACEMENT_DEVICE else torch.device("cpu")
        plan_device = device if runner.zero_copy else table_device
        _, sampling, dropout = epoch_generators(0, 1, plan_device, device)
    if runner.zero_copy:
        nodes, state = nodes.pin_memory(), state.pin_memory()
    else:
        nodes, state = nodes.to(table_device), state.to(table_device)
    return runner, nodes, state, edges, sampling, dropout, torch.zeros((), device=device)


@pytest.mark.parametrize("runner_class, devices, placement, overrides", RUNNERS)
def test_every_runner_keeps_the_contract(small_config, runner_class, devices, placement, overrides):
    runner, nodes, state, edges, sampling, dropout, loss = build(small_config, devices, placement, overrides)
    try:
        assert type(runner).__name__ == runner_class
        assert isinstance(runner, Runner)
        several = "," in devices
        assert isinstance(runner.counters, TransferCounts) if several else runner.counters is None
        assert runner.host_seconds is None or isinstance(runner.host_seconds, float)
        assert runner.dedup is None or isinstance(runner.dedup, bool)
        assert runner.dedup_trial is None or isinstance(runner.dedup_trial, dict)
        if not several:
            assert runner.dedup is None and runner.host_seconds is None
        assert isinstance(runner.zero_copy, bool) and runner.effective_staleness >= 1
        before_nodes, before_state = nodes.clone(), state.clone()
        runner.max_in_flight = 0
        batches = []
        runner.run(edges, nodes, state, None, sampling, dropout, loss, batches.append)
        if torch.cuda.is_available():
            torch.cuda.synchronize()
        num_batches = -(-len(edges) // 256)  # (a step of several devices may count its empty batches)
        assert num_batches <= sum(batches) < num_batches + len(devices.split(","))
        assert torch.isfinite(loss) and float(loss) > 0
        assert not torch.equal(nodes, before_nodes) and not torch.equal(state, before_state)
        assert runner.max_in_flight >= 1
        if several:
            assert isinstance(runner.counters.snapshot(8 * 4, 16 * 4), dict)
    finally:
        runner.close()
    runner.close()  # (twice: a trainer closed after a failed start closes again)


def runner_like_classes() -> set[str]:
    """Classes of the packages named *Runner or *Stepper, or defining ``effective_staleness``."""
    found = set()
    for root in {Path(marius_py.__path__[0]), *(Path(p) for p in marius_py.pipeline.__path__)}:
        for path in root.rglob("*.py"):
            for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
                if not isinstance(node, ast.ClassDef) or node.name == "Runner":
                    continue
                members = {m.name for m in node.body if isinstance(m, (ast.FunctionDef, ast.AsyncFunctionDef))}
                if node.name.endswith(("Runner", "Stepper")) or "effective_staleness" in members:
                    found.add(node.name)
    return found


def test_the_contract_covers_every_runner_class():
    covered = {param.values[0] for param in RUNNERS}
    found = runner_like_classes()
    assert found - covered - set(NOT_THE_TRAINERS) == set(), "a runner class the contract does not build"
    assert set(NOT_THE_TRAINERS) <= found and covered <= found, "the contract names a class that is gone"


def test_the_builders_return_only_covered_classes():
    """Every class the builders' modules construct and return is one the contract builds."""
    import marius_py.step.runners as runners
    tree = ast.parse(Path(runners.__file__).read_text(encoding="utf-8"))
    returned = {node.value.func.id for node in ast.walk(tree) if isinstance(node, ast.Return)
                and isinstance(node.value, ast.Call) and isinstance(node.value.func, ast.Name)
                and node.value.func.id[0].isupper()}
    assert returned and returned <= {param.values[0] for param in RUNNERS}
