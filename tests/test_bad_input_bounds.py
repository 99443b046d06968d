"""Bad-input corpus, family "bounds and API types" (issue 51): numeric keys that reach the OS or the
allocator, sizes the graph makes too large, a partition split that cannot be honoured, and arguments of the
wrong type to the Python API.

``CASES``: name -> ("cli", command, message fragment) or ("api", call, message fragment). A command
must exit with status 2 and one message naming the key, without a traceback, writing nothing (no run
directory); a call must raise ``MariusInputError`` naming the argument. Commands and fragments are
formatted with ``places`` ({raw}: UMLS, {out}: where a run would go, {cores}: this machine's).
"""

from __future__ import annotations

import os
import shlex
from pathlib import Path

import numpy as np
import pytest

import marius_py as mp
from marius_py.config_loading import load_config
from marius_py.config_validation import SEED_MAX, THREADS_PER_CORE, check_threads
from marius_py.plan import GiB, GraphSize, Machine, plan_run
from test_bad_input_corpus import TRAIN, UMLS_RAW, run_cli

HUGE = 100_000

CASES = {
    # ---- keys that reach the OS: threads at most a few per core ----
    "torch_threads": ("cli", f"{TRAIN} training.num_threads={HUGE} --run-dir {{out}}",
                      "training.num_threads: expected at most {most_threads} (4 threads for each of this "
                      "machine's {cores} cores), got 100000"),
    "load_threads": ("cli", f"{TRAIN} pipeline.load_threads={HUGE} --run-dir {{out}}",
                     "pipeline.load_threads: expected at most {most_threads}"),
    "io_threads": ("cli", f"{TRAIN} storage.num_partitions=4 storage.io_threads={HUGE} --run-dir {{out}}",
                   "storage.io_threads: expected at most {most_threads}"),
    "timeout_past_a_year": ("cli", f"{TRAIN} distributed.timeout_seconds=1e300 --run-dir {{out}}",
                            "distributed.timeout_seconds: expected at most 31536000 (a year)"),
    # ---- seeds and counts that reach numpy and torch ----
    "seed_past_numpy": ("cli", f"{TRAIN} training.seed={SEED_MAX + 1} --run-dir {{out}}",
                        f"training.seed: expected at most {SEED_MAX} (numpy's seed range)"),
    "seed_past_64_bits": ("cli", f"{TRAIN} training.seed={2**64} --run-dir {{out}}",
                          "training.seed: expected at most 2^40"),
    # (2^63 - 1 made torch.arange of the query batches empty: an MRR of 1.0 over no queries)
    "evaluation_batch_of_63_bits": ("cli", f"{TRAIN} evaluation.batch_size={2**63 - 1} --run-dir {{out}}",
                                    "evaluation.batch_size: expected at most 2^40"),
    "epochs_past_the_bound": ("cli", f"{TRAIN} training.epochs={2**70} --run-dir {{out}}",
                              "training.epochs: expected at most"),
    # ---- partitions: an ordering grows with the square of those stored ----
    "partitions_past_the_bound": ("cli", f"{TRAIN} storage.num_partitions=5000 --run-dir {{out}}",
                                  "storage.num_partitions: expected at most 4096 partitions as stored"),
    "split_past_the_bound": ("cli", f"{TRAIN} storage.num_partitions=64 storage.partition_split=100 "
                                    f"--run-dir {{out}}", "storage.partition_split: expected at most 4096"),
    "negative_group_size": ("cli", f"{TRAIN} storage.group_size=-1 --run-dir {{out}}",
                            "storage.group_size: expected >= 0"),
    # ---- sizes the graph and the machine bound, refused by the plan ----
    "negatives_past_memory": ("cli", f"{TRAIN} training.num_negatives=1000000000 --run-dir {{out}}",
                              "training.num_negatives: a step's scores and rows of"),
    "full_batches_past_memory": ("cli", f"{TRAIN} training.devices=cpu,cpu training.num_negatives=-1 "
                                        f"training.batch_size=10000000000 --run-dir {{out}}",
                                 "training.batch_size: a step's scores and rows of 10,000,000,000 edges against "
                                 "all 135 nodes"),
    "lookahead_past_memory": ("cli", f"{TRAIN} storage.num_partitions=4 storage.lookahead=1000000000 "
                                     f"--run-dir {{out}}", "storage.lookahead=1000000000 adds"),
    "plan_command_negatives": ("cli", "plan dataset.path={raw} training.device=cpu model.dim=8 "
                                      "training.num_negatives=1000000000", "training.num_negatives"),
    # ---- a partition split the user gave is refused where it cannot be honoured, never lowered ----
    "split_the_nodes_cannot_fill": ("cli", f"{TRAIN} storage.num_partitions=4 storage.partition_split=6 "
                                           f"--run-dir {{out}}",
                                    "storage.partition_split=6 stores 4 x 6 partitions, but the 135 nodes leave "
                                    "the last of them empty (expected storage.partition_split=5"),
    "split_the_nodes_cannot_fill_in_memory": ("cli", f"{TRAIN} storage.partition_split=1000 --run-dir {{out}}",
                                              "storage.partition_split=135 (the largest up to 1000"),
    "split_of_a_one_level_ordering": ("cli", f"{TRAIN} storage.ordering=beta storage.partition_split=2 "
                                             f"--run-dir {{out}}",
                                      "storage.partition_split: expected 0 or 1 with storage.ordering=beta"),
    # ---- the Python API: every wrong type is a MariusInputError naming the argument ----
    "api_train_run_dir_int": ("api", lambda p: mp.train(p["config"], 5), "train: run_dir is a int"),
    "api_train_run_dir_list": ("api", lambda p: mp.train(p["config"], [str(p["out"])]), "train: run_dir is a list"),
    "api_train_resume_a_string": ("api", lambda p: mp.train(p["config"], p["out"], resume="false"),
                                  "train: resume is a str"),
    "api_train_trackers_int": ("api", lambda p: mp.train(p["config"], p["out"], trackers=3),
                               "train: trackers is a int"),
    "api_train_tracker_without_log": ("api", lambda p: mp.train(p["config"], p["out"], trackers=[object()]),
                                      "train: trackers[0], a object, lacks log() or close()"),
    "api_load_checkpoint_int": ("api", lambda p: mp.load_checkpoint(3), "run_dir is a int"),
    "api_load_checkpoint_none": ("api", lambda p: mp.load_checkpoint(None), "run_dir is a NoneType"),
    "api_load_checkpoint_bytes": ("api", lambda p: mp.load_checkpoint(str(p["run"]).encode()), "run_dir is a bytes"),
    "api_load_run_config_list": ("api", lambda p: mp.api.load_run_config([p["run"]]), "run_dir is a list"),
    "api_load_dataset_array": ("api", lambda p: mp.load_dataset(np.zeros((4, 3), dtype=np.int64)),
                               "load_dataset: path_or_name is a ndarray"),
    "api_load_dataset_int": ("api", lambda p: mp.load_dataset(3), "load_dataset: path_or_name is a int"),
    "api_load_dataset_none": ("api", lambda p: mp.load_dataset(None), "load_dataset: path_or_name is a NoneType"),
    "api_load_dataset_progress": ("api", lambda p: mp.load_dataset(str(UMLS_RAW), progress="no"),
                                  "load_dataset: progress is a str"),
    "api_make_config_dict": ("api", lambda p: mp.make_config({"training": {"epochs": 1}}),
                             "make_config: config {{'training': {{'epochs': 1}}}} is a dict"),
    "api_probe_machine_dict": ("api", lambda p: mp.api.probe_machine({"training": {}}),
                               "probe_machine: config is a dict"),
    "api_default_run_dir_int": ("api", lambda p: mp.api.default_run_dir(3), "default_run_dir: config is a int"),
    "api_embedding_list": ("api", lambda p: p["model"].embedding(["animal"]), "embedding: name is a list"),
    "api_embedding_array": ("api", lambda p: p["model"].embedding(np.array(["animal"])),
                            "embedding: name is a ndarray"),
    "api_embedding_int": ("api", lambda p: p["model"].embedding(3), "embedding: name is a int"),
    "api_score_list_head": ("api", lambda p: p["model"].score([(["animal"], "practices", "animal")]),
                            "score: item 0's head is a list"),
    "api_score_int_relation": ("api", lambda p: p["model"].score([("animal", 3, "animal")]),
                               "score: item 0's relation is a int"),
    "api_predict_float_k": ("api", lambda p: p["model"].predict("practices", head="animal", k=2.0),
                            "k must be a whole number, got 2.0"),
    "api_predict_list_in_a_list_head": ("api", lambda p: p["model"].predict("practices", head=[["animal"]]),
                                        "predict: head[0] is a list"),
    "api_predict_int_relation": ("api", lambda p: p["model"].predict(3, head="animal"),
                                 "predict: relation is a int"),
    "api_predict_filter_known_a_string": ("api", lambda p: p["model"].predict("practices", head="animal",
                                                                              filter_known="no"),
                                          "predict: filter_known is a str"),
    "api_evaluate_array": ("api", lambda p: p["model"].evaluate(np.array(["valid"])),
                           "evaluate: triples_or_split: item 0 is"),
    "api_tune_space_an_int": ("api", lambda p: mp.tune(p["config"], 3, 1, p["out"]), "tune: space is a int"),
    "api_tune_run_dir_a_list": ("api", lambda p: mp.tune(p["config"], {"training.lr": [0.1]}, 1, [p["out"]]),
                                "tune: run_dir is a list"),
    "api_resume_tune_an_int": ("api", lambda p: mp.resume_tune(3), "resume_tune: run_dir is a int"),
    "api_known_answers_string": ("api", lambda p: p["model"].known_answers("tails"),
                                 "known_answers: inverse is a str"),
}


@pytest.fixture(scope="module")
def trained(tmp_path_factory):
    """A one-epoch UMLS run, trained through the API with a Path (which it takes), and its model."""
    run = tmp_path_factory.mktemp("bounds") / "run"
    config = mp.make_config(None, f"dataset.path={UMLS_RAW} training.device=cpu model.dim=8 "
                                  "training.epochs=1".split())
    mp.train(config, Path(run), progress=False)
    return {"run": run, "config": config, "model": mp.load_checkpoint(Path(run), device="cpu")}


@pytest.fixture
def places(trained, tmp_path):
    cores = os.cpu_count() or 1
    return {**trained, "raw": UMLS_RAW, "out": tmp_path / "out", "cores": cores,
            "most_threads": THREADS_PER_CORE * cores}


def test_the_family_has_at_least_fifteen_cases():
    assert len(CASES) >= 15


@pytest.mark.parametrize("name", sorted(name for name, case in CASES.items() if case[0] == "cli"))
def test_a_bound_past_is_one_clean_error_and_writes_nothing(name, places, capsys):
    _, command, fragment = CASES[name]
    code = run_cli(shlex.split(command.format(**places)))
    err = capsys.readouterr().err
    assert code == 2, err
    assert fragment.format(**places) in err, err
    assert "Traceback" not in err and err.count("marius-py: error:") == 1, err
    assert not places["out"].exists()  # no run directory left behind


@pytest.mark.parametrize("name", sorted(name for name, case in CASES.items() if case[0] == "api"))
def test_an_api_mistake_is_a_marius_input_error_naming_the_argument(name, places):
    _, call, fragment = CASES[name]
    with pytest.raises(mp.MariusInputError) as caught:
        call(places)
    assert fragment.format(**places) in str(caught.value), str(caught.value)
    assert not places["out"].exists()


# ---- what is not an error ----

def test_paths_numpy_names_and_whole_numbers_are_taken(places):
    model = places["model"]
    assert mp.load_dataset(Path(UMLS_RAW)).num_nodes == 135
    assert mp.api.load_run_config(Path(places["run"])).model.dim == 8
    assert mp.make_config(Path(__file__).parents[1] / "marius_py" / "configs" / "codex-s.yaml").model.dim > 0
    assert model.embedding(np.str_("animal")).shape == (8,)
    assert len(model.predict("practices", head="animal", k=np.int64(3), filter_known=np.bool_(True))) == 3


def test_large_legitimate_settings_validate():
    """A 128-core machine's threads, the bench's batches and negatives, the shipped configs."""
    config = load_config(None, ["training.num_threads=512", "pipeline.load_threads=64", "storage.io_threads=64",
                                "training.batch_size=50000", "training.num_negatives=1000", "training.seed=123",
                                "storage.num_partitions=1024", "storage.buffer_capacity=256",
                                "pipeline.staleness_bound=64", "distributed.timeout_seconds=86400"])
    assert config.training.num_threads == 512
    check_threads(config, 128)
    with pytest.raises(mp.MariusInputError, match="training.num_threads: expected at most 64"):
        check_threads(config, 16)
    for path in (Path(mp.__file__).parent / "configs").glob("*.yaml"):
        load_config(path)


def test_a_run_from_a_larger_machine_opens_here_and_resumes_once_its_threads_fit(trained, tmp_path, capsys):
    """Threads are bounded by the cores of the machine that trains: a run whose config.yaml names more still
    loads for eval; a resume here is refused, naming the key, until it is overridden."""
    import shutil
    run = tmp_path / "run"
    shutil.copytree(trained["run"], run)
    config = run / "config.yaml"
    config.write_text(config.read_text().replace("num_threads: 0", "num_threads: 4096"))
    assert mp.load_checkpoint(run).evaluate("test")["mrr"] > 0
    assert run_cli(["train", "--resume", str(run), "training.epochs=2", "--quiet"]) == 2
    assert "training.num_threads: expected at most" in capsys.readouterr().err
    assert run_cli(["train", "--resume", str(run), "training.epochs=2", "training.num_threads=1", "--quiet"]) == 0


def test_large_graphs_plan_their_batches_and_refuse_a_staleness_past_memory():
    """A 100M-node graph's bench batches fit an H100; batches in flight past host memory are refused."""
    gpu = Machine(gpu_free=(78 * GiB,), host_available=500 * GiB, disk_free=10 << 40)
    overrides = ["training.batch_size=50000", "training.num_negatives=1000", "model.dim=100",
                 "evaluation.protocol=sampled", "storage.num_partitions=16", "storage.buffer_capacity=4"]
    config = load_config(None, overrides)
    plan_run(config, GraphSize.of(config, 100_000_000, 1_000_000_000), gpu)
    on_cpu = Machine(host_available=500 * GiB, disk_free=10 << 40)
    stale = load_config(None, [*overrides, "pipeline.staleness_bound=1000000"])
    with pytest.raises(mp.MariusInputError, match="pipeline.staleness_bound: 20,000 batches in flight"):
        plan_run(stale, GraphSize.of(stale, 100_000_000, 1_000_000_000), on_cpu)
    plan_run(load_config(None, [*overrides, "pipeline.staleness_bound=64"]),
             GraphSize.of(config, 100_000_000, 1_000_000_000), on_cpu)


def test_a_partition_split_that_fills_the_nodes_is_kept(tmp_path):
    assert run_cli(shlex.split(TRAIN.format(raw=UMLS_RAW)) + [
        "storage.num_partitions=4", "storage.partition_split=5", "--run-dir", str(tmp_path / "run"), "--quiet"]) == 0
    assert mp.api.load_run_config(tmp_path / "run").storage.partition_split == 5
