"""Pages generated from the code and the benchmark results (run by conf.py before every build).

- ``reference/config.md``: every config key, its default and help, from ``marius_py.config``'s schema;
- ``reference/cli.md``: every command's usage and options, from ``marius_py.cli``'s parser;
- ``reference/datasets.md``: every registered dataset, from ``marius_py.catalog_entries``;
- ``results.md``: the benchmark suite's current figures, from ``bench/results`` (``results_page``).
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import sys
from collections.abc import Callable
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent


def config_reference() -> str:
    from marius_py.config import Config
    lines = ["# Configuration reference", "",
             "Every key of a run's config, with its default. A config file is YAML with these sections; any "
             "key can also be given on the command line as `section.key=value`. `marius-py train "
             "--help-config` prints the same list. (Generated from `marius_py/config.py`.)", ""]
    for section in dataclasses.fields(Config):
        lines += [f"## {section.name}", ""]
        instance = section.default_factory()
        for key in dataclasses.fields(instance):
            default = getattr(instance, key.name)
            help_text = key.metadata["help"].replace("\n", " ")
            lines.append(f"- **`{section.name}.{key.name}`** (default `{default!r}`): {help_text}")
        lines.append("")
    return "\n".join(lines)


def cli_reference() -> str:
    from marius_py.cli import build_parser
    os.environ["COLUMNS"] = "100"  # (argparse wraps help to the terminal's width: the page is the same anywhere)
    parser = build_parser()
    lines = ["# Command-line reference", "",
             "`marius-py COMMAND [options]`; options and `section.key=value` overrides may come in any order. "
             "(Generated from `marius_py/cli.py`.)", ""]
    commands = next(action for action in parser._actions if isinstance(action, argparse._SubParsersAction))
    for name, command in commands.choices.items():
        lines += [f"## {name}", "", "```text", command.format_help().rstrip(), "```", ""]
    return "\n".join(lines)


def datasets_reference() -> str:
    from marius_py.catalog_entries import DATASETS
    lines = ["# Registered datasets", "",
             "The datasets `marius-py download NAME` fetches, checks and prepares, and that `dataset.path` and "
             "`mp.load_dataset` take by name ([the guide](../guides/datasets.md)). Counts are the published "
             "ones, which preparing a dataset checks. (Generated from `marius_py/catalog_entries.py`.)", "",
             "| name | task | nodes | relations | edges (train / valid / test) | protocol | license | citation |",
             "|---|---|---|---|---|---|---|---|"]
    for name, entry in DATASETS.items():
        s = entry.stats
        if entry.task == "node_classification":
            edges = f"{s.edges:,}; nodes {s.train:,} / {s.valid:,} / {s.test:,}"
        elif s.train is not None:
            edges = f"{s.train:,} / {s.valid:,} / {s.test:,}"
        else:
            edges = f"{s.edges:,}" + (" (split by preprocessing)" if entry.split else "")
        cells = [f"`{name}`", entry.task.replace("_", " "), f"{s.nodes:,}" if s.nodes else "",
                 f"{s.relations:,}" if s.relations else "", edges, entry.protocol, entry.license, entry.citation]
        lines.append("| " + " | ".join(cell.replace("|", "/") for cell in cells) + " |")
    return "\n".join(lines + [""])


def results_page() -> str:
    """The benchmark suite's newest figures: the shipped configs' quality (bench/quality.py), one GPU end to
    end against the step (bench/e2e.py), several GPUs (bench/scaling.py), a disk epoch against its IO and
    compute bounds (bench/larger_than_memory.py), a commit against the disk (bench/commit_digest.py), what
    knowing a dataset by its content costs (bench/dataset_identity.py), research code's decoders against the
    built-ins (bench/plugins.py) and the network several machines need
    (bench/distributed.py), each with the file it comes from."""
    lines = ["# Results", "",
             "Figures measured by the benchmark suite (`bench/README.md` lists it), read from the JSON the "
             "benches wrote under `bench/results/`: the newest measurement of each setting, with its file and "
             "the command that remeasures it. The [design notes](design.md) say what they decided. (Generated "
             "by `docs/generate.py`.)", ""]
    for section in (_quality_table, _search_table, _e2e_table, _scaling_table, _disk_table, _plan_disk_table,
                    _plan_accuracy_table, _plans_table, _commit_table, _identity_table, _plugins_table,
                    _datasets_table, _network_table):
        try:
            lines += section()
        except (KeyError, TypeError, ValueError, AttributeError, IndexError) as error:
            # a result file of an unexpected shape leaves its table out; the build goes on (-W: not a warning)
            print(f"docs/generate.py: {section.__name__[1:]} left out: {error!r}", file=sys.stderr)
    return "\n".join(lines)


def _json_files() -> list[tuple[Path, object]]:
    """Every JSON file under bench/results, oldest first (by its date, then call number and name)."""
    found = []
    for path in (REPO / "bench/results").rglob("*.json"):
        try:
            data = json.loads(path.read_text())
        except (OSError, ValueError):
            continue
        date = data.get("date", "") if isinstance(data, dict) else ""
        found.append(((str(date), _call_number(path), path.name), path, data))
    return [(path, data) for _, path, data in sorted(found, key=lambda item: item[0])]


def _relative(path: Path) -> str:
    return path.relative_to(REPO).as_posix()


def _rows(part: str) -> list[tuple[Path, dict, dict]]:
    """(file, its JSON, row) of every row of ``part`` that a bench's row recorder wrote (except in files
    marked ``superseded``: measurements of code that was reverted)."""
    return [(path, data, row) for path, data in _json_files()
            if isinstance(data, dict) and isinstance(data.get("rows"), list) and not data.get("superseded")
            for row in data["rows"] if isinstance(row, dict) and row.get("part") == part]


ROUTINE_KEYS = {"training.checkpoint_interval", "evaluation.every", "dataset.path"}  # (not the model's)


def _shipped_settings(name: str) -> dict[str, object] | None:
    """The ``section.key`` values a bundled config sets (its YAML file), but routine ones."""
    import yaml
    from marius_py.bundled import BUNDLED_CONFIGS, bundled_config
    if name not in BUNDLED_CONFIGS:
        return None
    raw = yaml.safe_load(Path(bundled_config(name)).read_text()) or {}
    return {f"{section}.{key}": value for section, values in raw.items() for key, value in (values or {}).items()
            if f"{section}.{key}" not in ROUTINE_KEYS}


def _as_shipped(run: dict) -> bool:
    """Whether a bench/quality.py run trained its config as it ships today, in memory: every value the
    bundled YAML sets is the run's, and its overrides set nothing else."""
    shipped, resolved = _shipped_settings(run.get("config", "")), run.get("resolved_config")
    if shipped is None or not isinstance(resolved, dict) or not isinstance(run.get("test"), dict):
        return False
    overridden = {item.split("=", 1)[0] for item in run.get("overrides", [])}
    return (resolved.get("storage", {}).get("num_partitions") == 1 and overridden <= set(shipped) | ROUTINE_KEYS
            and all(resolved.get(key.split(".")[0], {}).get(key.split(".")[1]) == value
                    for key, value in shipped.items()))


def _table(heading: str, intro: str, columns: list[str], rows: list[list[object]]) -> list[str]:
    """A section of the results page: a heading, what was measured and how, and a markdown table (none when
    there are no rows)."""
    if not rows:
        return []
    return [f"## {heading}", "", intro, "", "| " + " | ".join(columns) + " |", "|" + "---|" * len(columns),
            *("| " + " | ".join(str(cell) for cell in row) + " |" for row in rows), ""]


def _rates(edges_per_s: list[float]) -> str:
    return f"{min(edges_per_s) / 1e6:.1f}-{max(edges_per_s) / 1e6:.1f}"


def _newest(has: Callable[[dict], bool]) -> tuple[Path, dict] | None:
    """The newest result file whose JSON (an object) ``has`` what a table reads."""
    found = [(path, data) for path, data in _json_files() if isinstance(data, dict) and has(data)]
    return found[-1] if found else None


# Filtered test MRR of the best published shallow model we know of on each dataset: ComplEx-N3 with relation
# prediction (Chen et al., AKBC 2021), beside which the shipped configs are measured.
PUBLISHED_MRR = {"fb15k-237": 0.388, "codex-m": 0.352, "codex-s": 0.473}


def _quality_table() -> list[str]:
    runs = {}
    for path, data in _json_files():
        for run in _quality_runs(data):
            if _as_shipped(run):
                runs[(run["dataset"], run["config"])] = (path, data, run)
    return _table(
        "Shipped configs: link prediction quality",
        "Filtered test MRR of the shipped configs as they ship today (the best-validation checkpoint), from the "
        "newest run of each: `python bench/quality.py --runs DATASET:CONFIG --datasets-root DIR`, or the search "
        "that found the shipped values (`bench/search.py`, its best.yaml trained again). Published: "
        "ComplEx-N3 with relation prediction (Chen et al., AKBC 2021), the best shallow model we know of there.",
        ["dataset", "config", "test MRR", "published", "Hits@10", "training seconds", "machine", "date", "file"],
        [[dataset, f"`{config}`", f"{run['test']['mrr']:.4f}", PUBLISHED_MRR.get(dataset, ""),
          f"{run['test'].get('hits@10', 0):.3f}",
          f"{run.get('train_seconds', 0):.0f}", data.get("machine", ""), data.get("date", ""), f"`{_relative(path)}`"]
         for (dataset, config), (path, data, run) in sorted(runs.items())])


def _quality_runs(data) -> list[dict]:
    """The trained and tested runs of a bench JSON: bench/quality.py's, and bench/search.py's best.yaml trained
    again (a run of the config searched, with the best values: it counts as shipped once the config ships them)."""
    if not isinstance(data, dict):
        return []
    command = str(data.get("command", ""))
    if "bench/quality.py" in command:
        return [run for run in data.get("results", []) if isinstance(run, dict)]
    if "bench/search.py" in command and isinstance(data.get("retrained"), dict):
        return [{**data["retrained"], "config": data["config"], "overrides": []}]
    return []


def _search_table() -> list[str]:
    runs = {(data["dataset"], data["config"]): (path, data) for path, data in _json_files()
            if isinstance(data, dict) and "bench/search.py" in str(data.get("command", ""))}
    return _table(
        "Hyperparameter searches",
        "`marius-py tune` around a shipped config, selecting on validation alone, then its best.yaml trained again "
        "and tested, from the newest run of each: `python bench/search.py --dataset DATASET --config CONFIG --space "
        "SPACE --trials N`. Search time is wall clock; the best trial's time is its training run's.",
        ["dataset", "config", "trials", "search seconds", "best valid MRR", "its seconds", "test MRR of best.yaml",
         "published", "best values", "machine", "date", "file"],
        [[dataset, f"`{config}`", ", ".join(f"{n} {state}" for state, n in sorted(data["search"]["trials"].items())),
          f"{data['search']['wall_seconds']:.0f}", f"{data['search']['best']['valid_mrr']:.4f}",
          f"{data['search']['best']['seconds']:.0f}", f"{data['retrained']['test']['mrr']:.4f}",
          PUBLISHED_MRR.get(dataset, ""), " ".join(f"`{k}={v:.4g}`" if isinstance(v, float) else f"`{k}={v}`"
                                                    for k, v in data["search"]["best"]["params"].items()),
          data.get("machine", ""), data.get("date", ""), f"`{_relative(path)}`"]
         for (dataset, config), (path, data) in sorted(runs.items())])


def _e2e_table() -> list[str]:
    rows = {(r["placement"], r["dim"], r["decoder"], r["score_dtype"]): (path, r) for path, _, r in _rows("e2e")}
    return _table(
        "One GPU: end to end against the step alone",
        "`marius-py train` epochs (after the first) beside the training step alone at the same settings, measured "
        "in the same run: `python bench/e2e.py` (4M nodes, 40M edges, B=50k, 10 x 1000 negatives, half by "
        "degree, row-wise Adagrad). The disk row's step is the host placement's.",
        ["placement", "d", "decoder", "scores", "end to end (M edges/s)", "step (M edges/s)", "share", "file"],
        [[*key, _rates(row["e2e_edges_per_s"]), f"{row['step_edges_per_s'] / 1e6:.1f}",
          f"{row['share']:.0%}" if key[0] != "disk" else "", f"`{_relative(path)}`"]
         for key, (path, row) in sorted(rows.items())])


def _scaling_table() -> list[str]:
    rows = {(r["placement"], r["dim"], r["variant"], r["gpus"]): (path, data, r) for path, data, r in _rows("scaling")}
    return _table(
        "Several GPUs of one host",
        "`marius-py train --gpus G` against one GPU at the same placement, with the step alone (the same runner "
        "from tables already in place) measured in the same run, each GPU's busy share during the epochs and "
        "the bytes that crossed the host links per trained edge: `python bench/scaling.py`.",
        ["placement", "d", "dedup", "GPUs", "ran", "M edges/s", "x one GPU here", "x one GPU's best", "step alone",
         "GPUs busy", "host B/edge", "cards", "file"],
        [[*key, row.get("placement_run", ""), _rates(row["edges_per_s"]), f"{row['speedup']:.2f}",
          f"{row['speedup_vs_best']:.2f}" if "speedup_vs_best" in row else "",
          f"{row['step_edges_per_s'] / 1e6:.1f}" if row.get("step_edges_per_s") else "",
          _busy(row.get("gpu_busy")),
          f"{row['host_bytes_per_edge']:.0f}" if "host_bytes_per_edge" in row else "",
          ", ".join(sorted(set(data.get("devices", [])))), f"`{_relative(path)}`"]
         for key, (path, data, row) in sorted(rows.items())])


def _busy(shares: list | None) -> str:
    """Each GPU's busy share, as a bench row keeps them (None where NVML gave none)."""
    return " / ".join("?" if share is None else f"{share:.0f}%" for share in shares or [])


def _disk_table() -> list[str]:
    newest = _newest(lambda data: isinstance(data.get("summary"), dict) and "epoch_over_max" in data["summary"])
    if newest is None:
        return []
    path, data = newest
    summary = data["summary"]
    return _table(
        "A disk epoch against its bounds",
        f"`python {data.get('command', 'bench/larger_than_memory.py')}`: the epoch against the pass that only moves "
        "partitions and the one that only trains.",
        ["epoch", "IO only", "compute only", "epoch / max(IO, compute)", "file"],
        [[f"{summary['epoch_seconds']:.2f} s", f"{summary['io_only_seconds']:.2f} s",
          f"{summary['compute_only_seconds']:.2f} s", f"{summary['epoch_over_max']:.2f}", f"`{_relative(path)}`"]])


def _epoch_pass(data: object) -> dict | None:
    """A larger_than_memory report's epoch as a user gets it: the train pass (through `marius-py train`) where
    there is one, else the full pass; None for reports of neither."""
    passes = data.get("passes") if isinstance(data, dict) else None
    if not isinstance(passes, dict):
        return None
    epoch = passes.get("train") or passes.get("full")
    return epoch if epoch and "plan" in epoch else None


def _io_matches(data: dict, epoch: dict) -> bool:
    """Whether the epoch's partition IO is the simulator's (its own prediction, else its report's other pass's)."""
    others = [data["passes"].get(mode, {}) for mode in ("full", "compute")]
    predicted = epoch.get("predicted") or next((other["predicted"] for other in others if "predicted" in other), None)
    return predicted is not None and all(epoch["counters"][k] == v for k, v in predicted.items())


def _plan_disk_table() -> list[str]:
    """The newest call that timed float32 BETA's epoch and the plan's (bench/larger_than_memory.py, one file each,
    named callNN-COMMIT-...): the issue's disk figure is their ratio; beside it the plan's step alone and the
    newest end-to-end train pass."""
    files = _json_files()  # (read once: every JSON file under bench/results)
    runs = [(path, data, epoch) for path, data in files if (epoch := _epoch_pass(data))]
    orderings_of = {}
    for path, _, epoch in runs:
        orderings_of.setdefault(tuple(path.name.split("-")[:2]), set()).add(epoch["plan"]["ordering"])
    paired = [call for call, orderings in orderings_of.items() if {"beta", "comet"} <= orderings]
    if not paired:
        return []
    newest = list(paired[-1])
    rows, epochs = [], {}
    for path, data, epoch in (run for run in runs if run[0].name.split("-")[:2] == newest):
        plan = epoch["plan"]
        epochs[plan["ordering"]] = epoch["seconds"]
        rows.append([f"{plan['num_partitions']}:{plan['buffer_capacity']} ({plan['physical_partitions']}:"
                     f"{plan['physical_buffer']}), {plan['ordering']}, {plan['dtype']}",
                     "`marius-py train`" if epoch["mode"] == "train" else "full pass",
                     " ".join(f"`{item}`" for item in epoch.get("settings") or []),
                     f"{epoch['buffer_bytes'] / 2 ** 30:.1f} GiB", f"{epoch['seconds']:.1f} s",
                     f"{epoch['num_edges'] / epoch['seconds'] / 1e6:.1f} M",
                     f"{(epoch['counters']['bytes_read'] + epoch['counters']['bytes_written']) / 2 ** 30:.1f} GiB",
                     "yes" if _io_matches(data, epoch) else "no",
                     f"{epoch['peak_rss_bytes'] / 2 ** 30:.1f} GiB", f"`{_relative(path)}`"])
    ratio = (f" The plan's epoch took {epochs['comet'] / epochs['beta']:.2f} of float32 BETA's time "
             f"({epochs['beta'] / epochs['comet']:.2f}x as fast)." if {"beta", "comet"} <= set(epochs) else "")
    computes = [(path, data["passes"]["compute"]) for path, data in files if isinstance(data, dict)
                and isinstance(data.get("passes"), dict) and data["passes"].get("compute", {}).get("plan", {})
                .get("ordering") == "comet" and {"train", "wait"} <= set(data["passes"]["compute"].get("phases") or {})]
    same_call = [run for run in computes if run[0].name.split("-")[:2] == newest]
    if computes:  # the step alone: the same epoch with partition IO replaced by no-ops
        path, compute = (same_call or computes)[-1]
        when = "in the same call" if same_call else "in another call"
        ratio += (f" The plan's step alone, measured {when} (`--passes compute`: partition IO replaced by "
                  f"no-ops), took {compute['seconds']:.1f} s, {compute['phases']['train']:.1f} s of it "
                  f"training and {compute['phases']['wait']:.1f} s waiting for states (their edges), in "
                  f"`{_relative(path)}`.")
    graph_edges = next(epoch["num_edges"] for path, _, epoch in runs if path.name.split("-")[:2] == newest)
    trains = [(path, data) for path, data in files if isinstance(data, dict) and isinstance(
        data.get("passes"), dict) and {"train", "compute"} <= set(data["passes"])
        and data["passes"]["train"]["num_edges"] == graph_edges and data["passes"]["train"]["plan"]["ordering"]
        == "comet"]  # (the same graph's, the plan's)
    if trains and trains[-1][0].name.split("-")[:2] != newest:
        path, data = trains[-1]
        train, compute = data["passes"]["train"], data["passes"]["compute"]
        settings = "".join(f", `{item}`" for item in train.get("settings") or [])
        ratio += (f" The newest end-to-end pass (`--passes compute,train`{settings}) took "
                  f"{train['seconds']:.1f} s ({train['num_edges'] / train['seconds'] / 1e6:.1f} M edges/s) through "
                  f"`marius-py train`, beside its step alone of {compute['seconds']:.1f} s in the same call, IO "
                  f"{'equal to' if _io_matches(data, train) else 'unlike'} the simulator's, peak RSS "
                  f"{train['peak_rss_bytes'] / 2 ** 30:.1f} GiB: `{_relative(path)}`.")
    return _table(
        "A Freebase86m-shaped epoch from disk: float32 BETA against the plan",
        "`python bench/larger_than_memory.py --graph freebase --partitions 16 ...` in one call on one GPU: float32 "
        "BETA 16:8 (`--buffer 8 --ordering beta --set storage.dtype=float32`), then the plan's store in the same "
        "memory (`--buffer 0 --ordering comet --set storage.memory_limit_gib=...`), as a full pass or through "
        "`marius-py train` (`--passes train`): the timed epoch after a warm-up one, its partition IO against the "
        "simulator's, and peak RSS." + ratio,
        ["P:C (stored), ordering, rows", "run", "--set", "buffer", "epoch", "edges/s", "partition IO",
         "IO = simulator", "peak RSS", "file"], rows)


def _plan_accuracy_table() -> list[str]:
    """The newest call's out-of-core rows as the plan chooses them (bench/partition_accuracy.py ``memory:P:C``)
    against the in-memory run of the same call."""
    results = [(path, result) for path, data in _json_files() if isinstance(data, dict)
               and isinstance(data.get("results"), list) for result in data["results"]
               if isinstance(result, dict) and str(result.get("variant", "")).startswith(("memory:", "p=1"))]
    calls = [path.name.split("-")[:2] for path, result in results if result["variant"].startswith("memory:")]
    if not calls:
        return []
    newest = [(path, result) for path, result in results if path.name.split("-")[:2] == calls[-1]]
    baseline = {result["dataset"]: result["test"]["mrr"] for _, result in newest if result["variant"] == "p=1"}
    rows = []
    for path, result in newest:
        if not result["variant"].startswith("memory:") or result["dataset"] not in baseline:
            continue
        storage = result["resolved_config"]["storage"]
        rows.append([result["dataset"], result["variant"].split("+")[0],
                     f"{storage['num_partitions']}:{storage['buffer_capacity']} ({storage['dtype']})",
                     f"{result['test']['mrr']:.4f}", f"{result['test']['mrr'] - baseline[result['dataset']]:+.4f}",
                     "yes" if all(result["io"][k] == v for k, v in result["io_predicted"].items()) else "no",
                     f"`{_relative(path)}`"])
    return _table(
        "Out-of-core accuracy as the plan chooses",
        "`python bench/partition_accuracy.py --variants memory:P:C`: P partitions with the plan's buffer, ordering "
        "and dtype in the memory a float32 default P:C buffer takes, against the in-memory run of the same call "
        "(FB15k-237 at 60 epochs, CoDEx-M as shipped); filtered test MRR.",
        ["dataset", "memory of", "plan P:C (dtype)", "test MRR", "vs in memory", "IO = simulator", "file"], rows)


def _plans_table() -> list[str]:
    """The newest bench/plans.py row of each graph on each machine: the plan's run against manual settings."""
    rows, settings = {}, {}
    for path, data in _json_files():
        if isinstance(data, dict) and "bench/plans.py" in str(data.get("command", "")):
            for row in data["rows"]:
                if "epoch" in row.get("plan", {}):  # (not a follow-up call of manual settings alone)
                    rows[(data["machine"], row["graph"])] = (path, row)
            settings[path] = _option_values(str(data["command"]), "--set")

    def chosen(run: dict) -> str:
        plan = run["plan"]
        return (f"{plan['tier']}, {plan['num_partitions']}:{plan['buffer_capacity']} ({plan['physical_partitions']}:"
                f"{plan['physical_buffer']}, {plan['ordering']}, {plan['dtype']})")

    def best_manual(row: dict) -> str:
        trained = [run for run in row["manual"] if "epoch" in run]
        if not trained:
            return ""
        best = max(trained, key=lambda run: run["epoch"]["edges_per_s"])
        return f"{chosen(best)}: {best['epoch']['edges_per_s'] / 1e6:.2f} M"

    return _table(
        "The plan on a machine: does it fit, and how fast against manual settings",
        "`python bench/plans.py --graphs ...`: what `marius-py train` plans when left to itself, its run's peak "
        "RSS against the plan's host bound, and its epoch's edges/s beside manual settings' (every run in its "
        "own process, the same model in a row: ComplEx d=100, 100 negatives, batches of 10,000, unless the row's "
        "`--set` says otherwise).",
        ["machine", "graph", "--set", "plan", "M edges/s", "fastest manual setting", "plan / fastest manual",
         "peak RSS / bound", "file"],
        [[machine, graph, " ".join(f"`{o}`" for o in settings[path] if not o.startswith("training.device=")),
          chosen(row["plan"]), f"{row['plan']['epoch']['edges_per_s'] / 1e6:.2f}", best_manual(row),
          f"{row['plan_over_best_manual']:.2f}" if "plan_over_best_manual" in row else "",
          f"{row['plan']['peak_rss_bytes'] / 2 ** 30:.1f} / {row['plan']['plan']['host_bytes'] / 2 ** 30:.1f} GiB",
          f"`{_relative(path)}`"] for (machine, graph), (path, row) in sorted(rows.items())])


def _option_values(command: str, option: str) -> list[str]:
    """The words after ``option`` in a recorded command line, up to the next option."""
    words = command.split()
    if option not in words:
        return []
    rest = words[len(words) - words[::-1].index(option):]  # (the last one: argparse keeps it)
    return rest[:next((i for i, word in enumerate(rest) if word.startswith("--")), len(rest))]


def _commit_table() -> list[str]:
    newest = _newest(lambda data: "write_unhashed_seconds" in data and "write_seconds" in data)
    if newest is None:
        return []
    path, data = newest
    return _table(
        "A checkpoint commit against the disk",
        f"`python bench/commit_digest.py --nodes {data['nodes']} --dim {data['dim']} --partitions "
        f"{data['partitions']}` ({data['bytes'] / 2 ** 30:.1f} GiB, best of the turns): the commit's write with its "
        "digests against the same write hashing nothing.",
        ["write with digests", "bare write", "read back with block digests", "file"],
        [[f"{data['write_seconds']:.2f} s", f"{data['write_unhashed_seconds']:.2f} s",
          f"{data.get('crc32_blocks_seconds', data.get('blocks_seconds', 0)):.2f} s", f"`{_relative(path)}`"]])


def _identity_table() -> list[str]:
    newest = _newest(lambda data: "added_seconds" in data and isinstance(data.get("seconds"), dict))
    if newest is None:
        return []
    path, data = newest
    seconds = data["seconds"]
    return _table(
        "Knowing a dataset by its content",
        f"`{data['command']}` ({data['cpus']} cores, {data['date']}, median of {data['repeats']}): opening "
        f"{data['dataset']} ({data['num_nodes']:,} nodes) with its identity checks (the raw files' content key, the "
        "names files against their digests) against opening the same files without them; the identity is "
        "computed once, at preprocessing. Nothing is checked per epoch.",
        ["without checks", "through the raw directory", "preprocessed directory", "added", "identity, once",
         "file"],
        [[f"{seconds['open without checks']:.3f} s", f"{seconds['open, raw directory']:.3f} s",
          f"{seconds['open, preprocessed']:.3f} s", f"{data['added_seconds']:.3f} s",
          f"{seconds['identity, once']:.3f} s", f"`{_relative(path)}`"]])


def _datasets_table() -> list[str]:
    """bench/datasets_by_name.py: a registered dataset from one command, and OGB's layout against TSV."""
    newest = _newest(lambda data: "ogb_against_tsv" in data or "fb15k_237" in data)
    if newest is None:
        return []
    path, data = newest
    rows = []
    if "fb15k_237" in data:
        first, second = data["fb15k_237"]["first"], data["fb15k_237"]["second"]
        rows.append(["FB15k-237 from `marius-py train fb15k-237`, empty cache",
                     f"{first['wall_seconds']:.1f} s to its first epoch's end "
                     f"(dataset {first['dataset_seconds']:.1f} s)",
                     f"again: dataset {second['dataset_seconds']:.2f} s", f"`{_relative(path)}`"])
    if "ogb_against_tsv" in data:
        ogb = data["ogb_against_tsv"]
        rows.append([f"{ogb['counts']['train']:,} edges in OGB's layout / as TSV",
                     f"{ogb['ogb']['seconds']:.1f} s / {ogb['tsv']['seconds']:.1f} s "
                     f"({ogb['ogb_over_tsv']:.2f}x)",
                     f"peak RSS {ogb['ogb']['peak_rss_bytes'] / 2**30:.2f} / "
                     f"{ogb['tsv']['peak_rss_bytes'] / 2**30:.2f} GiB",
                     f"`{_relative(path)}`"])
    return _table("Datasets by name", f"`{data['command']}` ({data['cpus']} cores, {data['date']}): the upstream "
                  "archive's bytes served from loopback, and a synthetic graph prepared in fresh processes.",
                  ["what", "time", "and", "file"], rows)


def _plugins_table() -> list[str]:
    """Every bench/plugins.py file (a CPU's and a GPU's): plug-in DistMult against the built-in, and SimplE."""
    found = [(path, data) for path, data in _json_files() if isinstance(data, dict) and data.get("bench") == "plugins"]

    def cell(row: dict) -> str:
        return f"{row['edges_per_s']:,.0f} edges/s, MRR {row['test_mrr']:.4f}"
    return _table(
        "Research code's decoders: plug-ins against the built-ins",
        "`python bench/plugins.py --dataset DIR [--device cuda] --epochs N`: DistMult written as a plug-in (a score "
        "function of broadcast h, r, t, or an operator on the dot comparator) against the built-in at the same "
        "settings and seed, and the built-in SimplE, each a `marius-py train` of its own. On a GPU a plug-in "
        "trains on the autograd step, the built-in DistMult on the fused one.",
        ["machine", "dataset", "epochs", "plug-in, score function", "plug-in, operator", "built-in DistMult",
         "SimplE", "MRR gap", "file"],
        [[data["machine"], Path(str(data["dataset"]).split(" ")[0]).name, data["epochs"],
          cell(data["rows"]["plugin distmult"]),
          cell(data["rows"]["plugin distmult, operator"]) if "plugin distmult, operator" in data["rows"] else "",
          cell(data["rows"]["distmult"]), cell(data["rows"]["simple"]), f"{data['plugin_distmult_mrr_gap']:.4f}",
          f"`{_relative(path)}`"] for path, data in found])


def _network_table() -> list[str]:
    newest = _newest(lambda data: isinstance(data.get("projection"), dict) and "rows" in data["projection"])
    if newest is None:
        return []
    path, data = newest
    projection, measured = data["projection"], data.get("rows", [])
    checked = ", ".join(f"{r['trainers']} trainers: {'equal' if r['handed_over_as_planned'] else 'NOT equal'}"
                        for r in measured)
    return _table(
        "Several machines: the network each trainer needs",
        f"Partitions handed over between torchrun trainers, projected from the scheduler's grants played out in "
        f"simulated time (`python bench/distributed.py --project-only`): d=100, row-wise Adagrad, float32, one "
        f"trainer per GPU at {projection['edges_per_second'] / 1e6:.1f}M edges/s; network bytes are the partitions "
        f"a trainer receives from other machines per epoch. Bytes handed over against the plan, measured in the "
        f"same run ({data.get('device', 'cpu')}): {checked or 'not measured'}.",
        ["graph", "machines", "trainers", "partitions held", "epoch", "idle", "GiB per trainer per epoch",
         "Gbit/s per trainer", "file"],
        [[row["graph"], row["machines"], row["trainers"], row["partitions_per_trainer"],
          f"{row['epoch_seconds']:.1f} s", f"{row['idle_share']:.0%}",
          f"{row['network_bytes_per_trainer'] / 2 ** 30:.0f}", f"{row['network_gbit_per_s']:.0f}",
          f"`{_relative(path)}`"] for row in projection["rows"]])


def _call_number(path: Path) -> int:
    digits = "".join(ch for ch in path.name.split("-")[0] if ch.isdigit())
    return int(digits or 0)


def write_all(docs: Path) -> None:
    pages = {docs / "reference" / "config.md": config_reference(), docs / "reference" / "cli.md": cli_reference(),
             docs / "reference" / "datasets.md": datasets_reference(), docs / "results.md": results_page()}
    for path, text in pages.items():
        path.parent.mkdir(parents=True, exist_ok=True)
        if not path.exists() or path.read_text() != text:
            path.write_text(text)
