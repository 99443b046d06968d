"""The plan: which tier holds the tables, and the partitions and buffer on disk, from faked sizes on the CPU."""

from __future__ import annotations

import json

import pytest
import yaml

from marius_py import api
from marius_py.cli import main as cli_main
from marius_py.config_loading import load_config
from marius_py.errors import MariusInputError
from marius_py.plan import (GiB, HOST_FRACTION, MIN_GROUP_SIZE, TIER_DISK, TIER_GPU, TIER_HOST, GraphSize,
                            Machine, buffer_bytes, plan_run)

FREEBASE = (86_054_151, 304_727_650)  # Freebase86m's nodes and train edges
MARIUS = ["model.decoder=complex", "model.dim=100", "training.adagrad_variant=rowwise"]


def freebase_plan(machine: Machine, *overrides: str):
    config = load_config(None, [*MARIUS, *overrides])
    return plan_run(config, GraphSize.of(config, *FREEBASE), machine)


def test_freebase_on_a_128_gib_host_keeps_the_tables_in_host_memory():
    plan = freebase_plan(Machine(host_available=128 * GiB, disk_free=500 * GiB))
    assert plan.tier == TIER_HOST and plan.num_partitions == 1 and plan.layout.dtype == "float32"
    assert plan.table_bytes == 86_054_151 * 101 * 4
    assert plan.host_bytes <= HOST_FRACTION * 128 * GiB


def test_freebase_on_a_24_gib_host_goes_to_disk_in_a_plan_that_fits():
    plan = freebase_plan(Machine(host_available=24 * GiB, disk_free=500 * GiB))
    assert plan.tier == TIER_DISK and plan.num_partitions > 1 and 2 <= plan.buffer_capacity < plan.num_partitions
    assert plan.layout.dtype == "bfloat16" and plan.layout.group_size >= MIN_GROUP_SIZE
    assert plan.buffer_bytes <= plan.host_bytes <= HOST_FRACTION * 24 * GiB
    assert plan.chosen == ("storage.num_partitions", "storage.buffer_capacity", "storage.dtype")


def test_a_gpu_that_holds_the_tables_takes_them():
    plan = freebase_plan(Machine(gpu_free=(140 * GiB,), host_available=96 * GiB, disk_free=500 * GiB))
    assert (plan.tier, plan.placement, plan.num_partitions) == (TIER_GPU, "device", 1)
    assert plan.gpu_bytes == plan.table_bytes
    assert plan.host_bytes > plan.table_bytes  # (a resume reads the tables through host memory)
    small_host = freebase_plan(Machine(gpu_free=(140 * GiB,), host_available=24 * GiB, disk_free=500 * GiB))
    assert small_host.tier == TIER_DISK and small_host.host_bytes <= HOST_FRACTION * 24 * GiB


def test_several_gpus_replicate_or_split_the_tables_as_they_fit():
    gpus = ["training.devices=cuda:0,cuda:1,cuda:2,cuda:3"]
    each = freebase_plan(Machine(gpu_free=(80 * GiB,) * 4, host_available=128 * GiB), *gpus)
    assert (each.tier, each.placement) == (TIER_GPU, "replicated")
    shared = freebase_plan(Machine(gpu_free=(30 * GiB,) * 4, host_available=128 * GiB), *gpus)
    assert (shared.tier, shared.placement) == (TIER_GPU, "split")
    assert shared.gpu_bytes == shared.table_bytes // 4
    assert shared.host_bytes > shared.table_bytes  # (split tables' masters are in pinned host memory)
    small_host = freebase_plan(Machine(gpu_free=(30 * GiB,) * 4, host_available=16 * GiB, disk_free=500 * GiB),
                               *gpus)
    assert small_host.tier == TIER_DISK


def test_a_buffer_goes_to_the_gpu_where_it_fits_and_the_host_is_small():
    plan = freebase_plan(Machine(gpu_free=(24 * GiB,), host_available=24 * GiB, disk_free=500 * GiB))
    assert plan.tier == TIER_DISK and plan.placement == "device"
    assert plan.gpu_bytes == plan.buffer_bytes <= 0.6 * 24 * GiB


def test_what_the_user_gives_is_kept():
    machine = Machine(host_available=24 * GiB, disk_free=500 * GiB)
    plan = freebase_plan(machine, "storage.num_partitions=16", "storage.buffer_capacity=4", "storage.dtype=float32")
    assert (plan.num_partitions, plan.buffer_capacity, plan.layout.dtype) == (16, 4, "float32")
    assert plan.chosen == ()
    in_memory = freebase_plan(machine, "storage.num_partitions=1")
    assert in_memory.num_partitions == 1 and in_memory.notes  # (it says the tables may not fit)


def test_the_memory_limit_bounds_the_buffer_and_more_memory_buys_a_larger_one():
    machine = Machine(gpu_free=(140 * GiB,), host_available=128 * GiB, disk_free=500 * GiB)
    small = freebase_plan(machine, "storage.num_partitions=16", "storage.memory_limit_gib=10")
    large = freebase_plan(machine, "storage.num_partitions=16", "storage.memory_limit_gib=20")
    assert small.buffer_bytes <= 10 * GiB and large.buffer_bytes <= 20 * GiB
    assert small.buffer_capacity < large.buffer_capacity
    config = load_config(None, [*MARIUS, "storage.num_partitions=16", f"storage.buffer_capacity={large.buffer_capacity}"])
    assert buffer_bytes(large.layout, GraphSize.of(config, *FREEBASE), config.storage.lookahead) == large.buffer_bytes


def test_the_plan_trains_each_partition_in_the_fewest_states_that_fit():
    """Accuracy first: no buffer that fits trains a partition in fewer states (mean) than the plan's."""
    from marius_py.plan import _fitting_buffers, _states_per_partition
    from marius_py.layout import epoch_ordering
    machine = Machine(host_available=48 * GiB, disk_free=500 * GiB)
    plan = freebase_plan(machine, "storage.num_partitions=16")
    config = load_config(None, [*MARIUS, "storage.num_partitions=16"])
    fitting = _fitting_buffers(config, GraphSize.of(config, *FREEBASE), machine, 16)
    chosen = _states_per_partition(epoch_ordering(plan.layout, config.training.seed, 1))
    assert len(fitting) > 1 and chosen <= min(c.states_per_partition for c in fitting) + 0.05
    assert any(c.states_per_partition > chosen + 1 for c in fitting)  # (the choice mattered)


def test_no_memory_is_one_clear_error():
    with pytest.raises(MariusInputError, match="fit neither in memory nor behind a partition buffer"):
        freebase_plan(Machine(host_available=GiB // 4, disk_free=500 * GiB))


def test_a_disk_too_small_for_the_store_is_refused():
    with pytest.raises(MariusInputError, match="the store needs .* on disk"):
        freebase_plan(Machine(host_available=24 * GiB, disk_free=GiB))


def test_torchrun_trainers_get_partitions_for_each(monkeypatch):
    config = load_config(None, MARIUS)
    machine = Machine(host_available=128 * GiB, disk_free=500 * GiB)
    plan = plan_run(config, GraphSize.of(config, *FREEBASE), machine, world_size=4, torchrun=True)
    assert plan.num_partitions == 4 * 2 * 2 and plan.layout.dtype == "float32"
    monkeypatch.setenv("TORCHELASTIC_RUN_ID", "1")  # (torchrun's environment: the caller says, the plan never reads it)
    assert plan_run(config, GraphSize.of(config, *FREEBASE), machine).tier != TIER_DISK
    alone = plan_run(config, GraphSize.of(config, *FREEBASE), machine, torchrun=True)  # (a torchrun group of one)
    assert alone.trainers == 1 and alone.num_partitions == 4 and alone.layout.dtype == "float32"
    assert plan_run(config, GraphSize.of(config, *FREEBASE), machine, torchrun=False).tier != TIER_DISK


# ---- through training and the command line (UMLS, a CPU) ----

def test_a_run_the_plan_puts_on_disk_trains_and_pins_it_for_the_resume(small_config, tmp_path, monkeypatch,
                                                                         capsys):
    limit = 0.9 * 135 * (256 + 256) * 4 / GiB  # less than UMLS's float32 tables at d=256 take
    config = small_config("model.dim=256", f"storage.memory_limit_gib={limit}", "training.epochs=1")
    run_dir = tmp_path / "run"
    api.train(config, run_dir, progress=True)
    printed = capsys.readouterr().out
    assert "plan: tables on disk" in printed and "chosen by the plan: storage.num_partitions" in printed
    saved = yaml.safe_load((run_dir / "config.yaml").read_text())["storage"]
    assert saved["num_partitions"] > 1 and saved["buffer_capacity"] >= 2
    plan = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()
            if json.loads(line).get("event") == "plan"]
    assert plan and plan[0]["buffer_bytes"] <= limit * GiB
    assert (plan[0]["num_partitions"], plan[0]["buffer_capacity"]) == (saved["num_partitions"],
                                                                       saved["buffer_capacity"])
    # A resume with all the memory there is keeps the pinned store.
    resumed = api.load_run_config(run_dir, ["training.epochs=2", "storage.memory_limit_gib=0"])
    api.train(resumed, run_dir, progress=False, resume=True)
    again = yaml.safe_load((run_dir / "config.yaml").read_text())["storage"]
    assert (again["num_partitions"], again["buffer_capacity"]) == (saved["num_partitions"], saved["buffer_capacity"])


def test_the_plan_command_plans_for_another_machine(capsys):
    code = cli_main(["plan", "--nodes", str(FREEBASE[0]), "--edges", str(FREEBASE[1]), *MARIUS,
                     "evaluation.protocol=sampled", "--host-memory", "24", "--gpu-memory", "0", "--disk", "500",
                     "--json"])
    record = json.loads(capsys.readouterr().out)
    assert code == 0 and record["tier"] == TIER_DISK and record["dtype"] == "bfloat16"
    assert record["host_bytes"] <= HOST_FRACTION * 24 * GiB
    code = cli_main(["plan", "--nodes", str(FREEBASE[0]), "--edges", str(FREEBASE[1]), *MARIUS,
                     "--host-memory", "128", "--gpu-memory", "0", "--disk", "500"])
    assert code == 0 and "plan: tables in host memory" in capsys.readouterr().out


def test_the_plan_command_refuses_half_a_graph_and_sizes_that_are_not_numbers(capsys):
    assert cli_main(["plan", "--nodes", "1000"]) == 2
    assert "--nodes and --edges" in capsys.readouterr().err
    for option in ("--host-memory", "--gpu-memory", "--disk"):
        for value in ("nan", "inf", "-1"):
            assert cli_main(["plan", "--nodes", "1000", "--edges", "5000", option, value]) == 2
            assert f"{option} {float(value)}" in capsys.readouterr().err


def test_filtered_evaluation_counts_in_host_memory_and_is_named_where_nothing_fits():
    config = load_config(None, MARIUS)  # (filtered evaluation is the default)
    graph = GraphSize.of(config, *FREEBASE, 34_000_000)
    with pytest.raises(MariusInputError, match="evaluation.protocol=sampled keeps none"):
        plan_run(config, graph, Machine(host_available=24 * GiB, disk_free=500 * GiB))
    roomy = plan_run(config, graph, Machine(host_available=96 * GiB, disk_free=500 * GiB))
    assert roomy.host_bytes >= graph.evaluation_bytes + roomy.buffer_bytes


def test_partitions_the_nodes_cannot_fill_are_refused_by_the_plan():
    config = load_config(None, ["storage.num_partitions=64"])
    with pytest.raises(MariusInputError, match="fill only"):
        plan_run(config, GraphSize.of(config, 135, 5000), Machine(host_available=24 * GiB, disk_free=GiB))


def test_a_resume_counts_its_own_store_as_room(tmp_path, monkeypatch):
    """The store of a resumed run is already on the disk: free space need not hold it again."""
    import shutil as shutil_module
    from marius_py import plan as plan_module
    store = tmp_path / "run" / "store"
    store.mkdir(parents=True)
    (store / "chunk").write_bytes(b"x" * 4096)
    usage = shutil_module.disk_usage(tmp_path)
    monkeypatch.setattr(plan_module.shutil, "disk_usage", lambda path: usage._replace(free=100))
    assert plan_module._disk_free(tmp_path / "run") == 4196
    assert plan_module._disk_free(tmp_path / "elsewhere") == 100


def test_a_run_saved_before_the_plan_keeps_its_whole_buffer(small_config, tmp_path):
    """config.yaml with num_partitions 4 and buffer_capacity 0 (every partition, before the plan) resumes with
    all four resident, not a buffer the plan would choose anew."""
    config = small_config("storage.num_partitions=4", "storage.buffer_capacity=4", "training.epochs=1")
    run_dir = tmp_path / "run"
    api.train(config, run_dir, progress=False)
    saved = yaml.safe_load((run_dir / "config.yaml").read_text())
    saved["storage"]["buffer_capacity"] = 0
    (run_dir / "config.yaml").write_text(yaml.safe_dump(saved))
    resumed = api.load_run_config(run_dir, ["training.epochs=2", "storage.memory_limit_gib=0.000001"])
    assert (resumed.storage.num_partitions, resumed.storage.buffer_capacity) == (4, 4)
