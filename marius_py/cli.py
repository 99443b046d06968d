"""The ``marius-py`` command: train | plan | tune | preprocess | eval | export | predict | ordering | verify | info | plot.

A thin entry point: parse arguments, call the library, print results. User
mistakes (``MariusInputError``) print one line and exit with status 2.
"""

from __future__ import annotations

import argparse
import errno
import json
import math
import os
import sys
from contextlib import closing, contextmanager
from pathlib import Path

from marius_py.config import STORAGE_DTYPES, device_list
from marius_py.errors import MariusInputError
from marius_py.search_space import PRUNERS

EXIT_USER_ERROR = 2
EXIT_INTERRUPTED = 130
# What Ctrl-C leaves, for commands that do not say it themselves (``_reporting_interrupt``)
INTERRUPT_MESSAGES = {
    "train": "training interrupted; the last committed checkpoint is intact (--resume continues from it; epochs "
             "after it are trained again)",
    "tune": "tune interrupted; the finished trials are kept (--resume continues the search and runs the "
            "interrupted trials again)",
    "plot": "plot interrupted: PNGs written before it stay, each whole (plot again to rewrite them); the run is "
            "unchanged",
}


class Interrupted(KeyboardInterrupt):
    """Ctrl-C in a command, with what it leaves behind (``_reporting_interrupt``)."""


def _interrupted_message(command: str, interrupt: KeyboardInterrupt) -> str:
    if isinstance(interrupt, Interrupted):
        return str(interrupt)
    return INTERRUPT_MESSAGES.get(command, f"{command} interrupted; nothing was written")


def _file_identity(path: Path) -> tuple[int, int, int] | None:
    """Which file ``path`` is now (device, inode, modification time); None where there is none."""
    try:
        info = os.stat(path)
    except OSError:
        return None
    return info.st_dev, info.st_ino, info.st_mtime_ns


@contextmanager
def _reporting_interrupt(doing: str, output: Path, marker: str, what: str, also: str = ""):
    """Ctrl-C inside raises ``Interrupted`` saying what is left of ``output``, a directory that appears whole
    (its ``what`` is complete when it holds ``marker``), told by comparing its marker with the one before."""
    before = _file_identity(output / marker)
    try:
        yield
    except KeyboardInterrupt:
        raise Interrupted(f"{doing} interrupted: {_left_behind(output, marker, what, before)}{also}") from None


def _left_behind(output: Path, marker: str, what: str, before: tuple | None) -> str:
    now = _file_identity(output / marker)
    if now is not None:
        return (f"{output} still holds its earlier {what} (the new one's staging folder is removed)" if now == before
                else f"{output} holds the new {what}, complete (the interrupt came after it was written)")
    if output.is_dir() and any(output.iterdir()):  # (files moving into an existing directory)
        return f"{output} holds a partial {what} (no {marker}): run it again with --overwrite"
    if before is not None and not os.path.lexists(output):  # (between the two renames of a replacement)
        return (f"{output} is missing: its earlier {what} waits in a hidden folder beside it, which the next run "
                f"into {output} puts back")
    return f"nothing was written to {output} (its staging folder is removed)"


def _print_metrics(title: str, metrics: dict) -> None:
    print(f"{title}: MRR {metrics['mrr']:.4f}  MR {metrics['mean_rank']:.1f}  "
          f"Hits@1 {metrics['hits@1']:.4f}  Hits@3 {metrics['hits@3']:.4f}  "
          f"Hits@10 {metrics['hits@10']:.4f}  ({metrics['num_queries']} queries; {metrics['protocol']})")


def _split_config_args(items: list[str]) -> tuple[str | None, list[str]]:
    """``[CONFIG] [key=value ...]``: the first item neither ``key=value`` nor shaped like ``section.key`` (an
    override missing its value, which ``config.apply_overrides`` refuses) is the config."""
    from marius_py.config import is_override_key
    config, overrides = None, []
    for item in items:
        if "=" in item or is_override_key(item):
            overrides.append(item)
        elif config is None:
            config = item
        else:
            raise MariusInputError(f"unexpected argument {item!r}", path="command line",
                                   expected="one CONFIG followed by key=value overrides")
    if config is not None:  # (a pipe, <(cat my.yaml), is read as a file)
        from marius_py.edge_text import refuse_special_file
        refuse_special_file(config, "config file", expected="a YAML file, or a pipe: <(command)")
    return config, overrides


def _run_config_overrides(args) -> tuple[str | None, list[str]]:
    """(CONFIG, overrides) of ``train`` and ``plan``: the key=value items and the options that stand for keys."""
    config_path, overrides = _split_config_args(args.config)
    overrides += [f"storage.{key}={value}" for key, value in
                  (("num_partitions", args.partitions), ("buffer_capacity", args.buffer)) if value is not None]
    if args.gpus is not None:
        if args.gpus < 1:
            raise MariusInputError(f"--gpus {args.gpus}", path="command line", expected="--gpus N with N >= 1")
        from marius_py.devices import gpus_overrides  # (torch: imported only by commands that train)
        overrides += gpus_overrides(args.gpus)
    return config_path, overrides


def cmd_train(args) -> None:
    from marius_py import api
    from marius_py.config import describe_schema
    if args.help_config:
        print(describe_schema())
        return
    config_path, overrides = _run_config_overrides(args)
    if args.no_dedup:
        overrides.append("pipeline.dedup=false")
    if args.resume:
        if args.run_dir is not None:
            raise MariusInputError("--resume continues its own run directory", path="command line",
                                   expected="either --resume RUN_DIR or --run-dir DIR, not both")
        if config_path is not None:
            raise MariusInputError("--resume takes its config from the run directory", path="command line",
                                   expected="only key=value overrides, e.g. training.epochs=40")
        config = api.load_run_config(args.resume, overrides, source="command line")
        run_dir = args.resume
    else:
        config = api.make_config(config_path or "codex-m", overrides, source="command line")
        run_dir = args.run_dir
    model = api.train(config, run_dir, progress=not args.quiet, resume=bool(args.resume))
    if model is None:  # a trainer other than rank 0 of several: rank 0 reports
        return
    print(f"run directory: {model.run_dir}")
    if model.test_metrics:
        _print_metrics("test", model.test_metrics)


def cmd_plan(args) -> None:
    """The plan ``train`` would follow, without training: on this machine, or on one described by options."""
    from dataclasses import replace
    from marius_py import api
    from marius_py.distributed.group import launched_by_torchrun
    from marius_py.plan import GiB, GraphSize, Machine, plan_run
    config_path, overrides = _run_config_overrides(args)
    config = api.make_config(config_path or "codex-m", overrides, source="command line")
    if (args.nodes is None) != (args.edges is None):
        raise MariusInputError("--nodes and --edges size a graph together", path="command line",
                               expected="both (a graph without its dataset), or neither (the config's dataset)")
    for option, value in (("--nodes", args.nodes), ("--edges", args.edges), ("--host-memory", args.host_memory),
                          ("--gpu-memory", args.gpu_memory), ("--disk", args.disk)):
        if value is not None and not (math.isfinite(value) and value >= 0):
            raise MariusInputError(f"{option} {value}", path="command line", expected=f"a number {option} >= 0")
    if args.nodes is None:
        graph = GraphSize.of_dataset(config, api.open_dataset(config, progress=True))
    else:  # (its valid and test edges, for filtered evaluation's memory: as many as a 90/5/5 split has)
        graph = GraphSize.of(config, args.nodes, args.edges, args.edges // 9)
    machine = Machine.probe([], args.run_dir) if args.gpu_memory is not None else \
        api.probe_machine(config, args.run_dir)
    if args.gpu_memory:
        machine = replace(machine, gpu_free=(int(args.gpu_memory * GiB),) * (args.gpus or 1))
    if args.host_memory is not None:
        machine = replace(machine, host_available=int(args.host_memory * GiB))
    if args.disk is not None:
        machine = replace(machine, disk_free=int(args.disk * GiB))
    torchrun = launched_by_torchrun()  # (under torchrun: the plan of its trainers, who share the tables)
    plan = plan_run(config, graph, machine, int(os.environ.get("WORLD_SIZE", "1")) if torchrun else 1, torchrun)
    print(json.dumps(plan.record()) if args.json else plan.describe())

def cmd_tune(args) -> None:
    from marius_py import api, search
    search.require_optuna()  # (before anything else is checked)
    devices = _tune_devices(args)
    if args.resume:
        given = [name for name, value in (("a config or key=value", args.config), ("--space", args.space),
                                          ("--pruner", args.pruner), ("--run-dir", args.run_dir)) if value]
        if given:
            raise MariusInputError(f"--resume continues a search with its own config, space and pruner: no {given[0]}",
                                   path="command line", expected="--resume RUN_DIR [--trials N] [--gpus N]")
        result = search.resume_tune(args.resume, args.trials, devices, progress=not args.quiet)
    else:
        missing = [name for name, value in (("--space", args.space), ("--trials", args.trials)) if value is None]
        if missing:
            raise MariusInputError(f"tune needs {' and '.join(missing)}", path="command line",
                                   expected="marius-py tune [CONFIG] [key=value ...] --space SPACE.yaml --trials N")
        config_path, overrides = _split_config_args(args.config)
        from marius_py.edge_text import refuse_special_file
        refuse_special_file(args.space, "search space", expected="a YAML file")
        config = api.make_config(config_path or "codex-m", overrides, source="command line")
        result = search.tune(config, args.space, args.trials, args.run_dir, args.pruner or "median", devices,
                             progress=not args.quiet)
    for line in result.summary():
        print(line)


def _tune_devices(args) -> list[str] | None:
    """The devices of --gpus N or --devices LIST (one trial on each at once); None: the config's device."""
    if args.gpus is not None and args.devices is not None:
        raise MariusInputError("both --gpus and --devices", path="command line", expected="one of them")
    if args.gpus is not None:
        if args.gpus < 1:
            raise MariusInputError(f"--gpus {args.gpus}", path="command line", expected="--gpus N with N >= 1")
        return [f"cuda:{index}" for index in range(args.gpus)]
    return device_list(args.devices) if args.devices is not None else None


def cmd_preprocess(args) -> None:
    from marius_py.dataset import METADATA_FILE
    with _reporting_interrupt("preprocessing", Path(args.output), METADATA_FILE, "dataset"):
        if args.name is not None:
            _preprocess_registered(args)
        else:
            _preprocess(args)


def _preprocess_registered(args) -> None:
    """``preprocess NAME -o DIR``: a registered dataset fetched and preprocessed into DIR."""
    from marius_py.registered_data import prepare
    given = [option for option, value in (("--train", args.train), ("--valid", args.valid), ("--test", args.test),
                                          ("--columns", args.columns), ("--split", args.split),
                                          ("--delimiter", args.delimiter != "\t"), ("--pairs", args.pairs),
                                          ("--skip-header", args.skip_header), ("--unseen", args.unseen)) if value]
    if given:
        raise MariusInputError(f"{args.name} is a registered dataset; {', '.join(given)} apply to files",
                               path="command line", expected="NAME with --partitions, --seed and -o (its entry says "
                                                             "how to read it), or --train FILE without NAME")
    output = prepare(args.name, args.partitions, progress=not args.quiet, offline=args.offline,
                     source=_from_path(args), output=Path(args.output), overwrite=args.overwrite, seed=args.seed)
    _print_dataset(output)


def cmd_download(args) -> None:
    from marius_py.catalog_entries import registered
    from marius_py.registered_data import node_files, prepare
    entry = registered(args.name)
    if entry is not None and entry.task == "node_classification":  # (its parts kept: nothing to preprocess)
        parts = node_files(args.name, entry, offline=args.offline, source=_from_path(args), progress=not args.quiet)
        for part, path in parts.items():
            print(f"{part}: {path}")
        print(f"{args.name}: {len(entry.downloads)} file(s) fetched and checked, {len(parts)} part(s) kept for "
              "node classification")
        return
    _print_dataset(prepare(args.name, args.partitions, progress=not args.quiet, offline=args.offline,
                           source=_from_path(args)))


def cmd_datasets(args) -> None:
    from marius_py.catalog import describe
    from marius_py.catalog_entries import DATASETS
    for name, entry in DATASETS.items():
        print(describe(name, entry))


def _from_path(args) -> Path | None:
    return Path(getattr(args, "from")).expanduser() if getattr(args, "from", None) else None


def _print_dataset(directory: Path) -> None:
    from marius_py.dataset import read_metadata
    m = read_metadata(directory)
    print(f"{directory}: {m.num_nodes:,} nodes, {m.num_relations:,} relations, {m.num_train:,} / {m.num_valid:,} / "
          f"{m.num_test:,} train / valid / test edges")


def _preprocess(args) -> None:
    from marius_py.preprocess import PreprocessOptions, preprocess
    if args.train is None:
        raise MariusInputError("no input", path="command line",
                               expected="--train FILE (with --valid and --test, or split by --split), or a "
                                        "registered dataset's NAME (`marius-py datasets` lists them)")
    columns = _number_list(args.columns, int, "--columns", "0-based column indices like 0,1,2")
    fractions = _number_list(args.split, float, "--split", "valid,test fractions like 0.05,0.05")
    if fractions is not None and (args.valid or args.test):
        raise MariusInputError("--split applies only to a single input file", path="command line",
                               expected="either --split or --valid/--test")
    if args.unseen is not None and not (args.valid or args.test):
        raise MariusInputError(f"--unseen {args.unseen} applies only to given --valid/--test files",
                               path="command line", expected="no --unseen with a random split (it moves "
                               "edges whose node or relation no train edge has into train)")
    options = PreprocessOptions(delimiter=_delimiter(args.delimiter), columns=columns,
                                pairs=args.pairs, skip_header=args.skip_header,
                                num_partitions=args.partitions, split_fractions=fractions or (0.05, 0.05),
                                seed=args.seed,
                                unseen_policy=args.unseen or "drop")
    metadata = preprocess(Path(args.output), args.train, args.valid, args.test, options,
                          progress=not args.quiet, overwrite=args.overwrite)
    if metadata.unseen_policy == "move":
        unseen = (f"moved {metadata.num_moved_valid} valid and {metadata.num_moved_test} test edges whose "
                  f"node or relation occurs in no train edge into train")
    else:
        unseen = (f"dropped {metadata.num_dropped_valid} valid and {metadata.num_dropped_test} test edges "
                  f"with nodes or relations unseen in train (policy: {metadata.unseen_policy})")
    print(f"wrote {args.output}: {metadata.num_nodes} nodes, {metadata.num_relations} relations, "
          f"{metadata.num_train} / {metadata.num_valid} / {metadata.num_test} train / valid / test edges; "
          f"{unseen}")


def _number_list(text: str | None, kind, option: str, expected: str):
    if text is None:
        return None
    try:
        return tuple(kind(part) for part in text.split(","))
    except ValueError:
        raise MariusInputError(f"{option}: cannot read {text!r}", path="command line",
                               expected=expected) from None


_ESCAPES = {"\\t": "\t", "\\s": " "}


def _delimiter(text: str) -> str:
    """The field delimiter, accepting the escapes '\\t' and '\\s' typed on a shell."""
    return _ESCAPES.get(text, text)


def _open_run(args, device: str | None = None, overrides: list[str] | None = None):
    """The checkpoint ``--checkpoint`` names of ``args.run_dir``, for eval, export and predict
    (``api.load_checkpoint`` checks the run, its dataset and the device before loading it). ``best`` where
    no validation selected one loads the latest and says so on stderr."""
    from marius_py import api
    from marius_py.checkpoint import RunDirectory
    model = api.load_checkpoint(args.run_dir, args.checkpoint, device=device, overrides=overrides,
                                source="command line")
    if args.checkpoint == "best" and RunDirectory(args.run_dir).best_version() is None:
        print(f"marius-py: {args.run_dir} has no best checkpoint (no validation selected one): using the "
              f"latest, {model.version.name}", file=sys.stderr)
    return model


def _similar_name(names: list[str], name: str) -> str | None:
    """A name equal to ``name`` but for case and surrounding white space (what a mistyped name often is)."""
    wanted = name.strip().casefold()
    return next((candidate for candidate in names if candidate.strip().casefold() == wanted), None)


def _check_name(lookup, names: list[str], name: str) -> None:
    """``lookup(name)``; an unknown name's error suggests a name differing only in case or white space."""
    try:
        lookup(name)
    except MariusInputError as error:
        close = _similar_name(names, name)
        if close is None:
            raise
        raise MariusInputError(f"{error.problem}; did you mean {close!r}?", path=error.path,
                               expected=error.expected) from None


def cmd_eval(args) -> None:
    wrong = [o for o in args.overrides if not o.startswith("evaluation.")]
    if wrong:
        raise MariusInputError(f"eval takes only evaluation.* overrides, got {wrong[0]!r}", path="command line",
                               expected="e.g. evaluation.protocol=sampled; the model comes from the checkpoint")
    model = _open_run(args, args.device, args.overrides)
    metrics = model.evaluate(args.split)
    _print_metrics(args.split, metrics)
    if args.json:
        print(json.dumps(metrics))


def cmd_export(args) -> None:
    from marius_py.export import MARKER, check_output, export_embeddings, relation_rows
    output = args.output or str(Path(args.run_dir) / f"export-{args.format}")
    with _reporting_interrupt("export", Path(output), MARKER, "export", also="; the run is unchanged"):
        check_output(output, args.overwrite)  # before the checkpoint is read (export checks again)
        model = _open_run(args, "cpu")
        names, relations = relation_rows(model.decoder.relations.detach().cpu().numpy(),
                                         model.dataset.relation_names)
        export_embeddings(output, args.format, model.dataset.node_names, model.blocks(), model.config.model.dim,
                          names, relations, overwrite=args.overwrite)
    print(f"wrote {output}")


def cmd_predict(args) -> None:
    from marius_py.api import TrainedModel
    TrainedModel.check_query(args.head, args.tail, args.k, source="command line")  # (before anything is loaded)
    model = _open_run(args, args.device)
    dataset = model.dataset
    _check_name(dataset.node_id, dataset.node_names, args.head if args.head is not None else args.tail)
    if args.relation is not None and dataset.metadata.has_relations:  # (a plain graph: predict refuses it)
        _check_name(dataset.relation_id, dataset.relation_names, args.relation)
    results = model.predict(relation=args.relation, head=args.head, tail=args.tail, k=args.k,
                            filter_known=args.filter_known)
    side = "tail" if args.head is not None else "head"
    for rank, (name, score) in enumerate(results, 1):
        print(f"{rank}\t{side}\t{name}\t{score:.6g}")


def as_trained(args, name: str, num_nodes: int, row_bytes: int):
    """Two-level ordering ``name`` at the store layout training resolves from ``--partitions/--buffer`` (split,
    group size, lowered until the nodes fill every partition): (its storage config, its IO row). Raises
    ``MariusInputError`` where training would refuse these counts."""
    from marius_py.config_loading import load_config
    from marius_py.distributed.group import launched_by_torchrun
    from marius_py.layout import storage_layout
    from marius_py.orderings import build_ordering, simulate
    from marius_py.storage.partitioning import partition_size
    given = load_config(None, [f"storage.ordering={name}", f"storage.num_partitions={args.partitions}",
                               f"storage.buffer_capacity={args.buffer}",
                               f"storage.group_size={args.group_size}"], source="command line").storage
    s = storage_layout(given, num_nodes or None, torchrun=launched_by_torchrun())
    k = s.group_size
    ordering = build_ordering(name, s.num_partitions // k, s.buffer_capacity // k, seed=args.seed, group_size=k)
    return s, simulate(ordering, (partition_size(num_nodes, s.num_partitions) if num_nodes else 0) * row_bytes)


def cmd_ordering(args) -> None:
    from marius_py.orderings import ORDERINGS, compare_orderings, format_table
    from marius_py.storage.partitioning import partition_size
    num_nodes = args.nodes
    if args.dataset:
        from marius_py.dataset import read_metadata
        num_nodes = read_metadata(args.dataset).num_nodes
    if not 2 <= args.buffer <= args.partitions:
        raise MariusInputError(f"--buffer {args.buffer} with --partitions {args.partitions}", path="command line",
                               expected="2 <= --buffer <= --partitions")
    state_dim = 1 if args.rowwise else args.dim
    import torch
    dtype = "bfloat16" if args.dtype == "auto" else args.dtype  # (auto: what a one-process run stores)
    itemsize = getattr(torch, dtype).itemsize
    row_bytes = (args.dim + state_dim) * itemsize
    rows = partition_size(num_nodes, args.partitions) if num_nodes else 0
    partition_bytes = rows * row_bytes
    storage, comet = as_trained(args, "comet", num_nodes, row_bytes)
    split, physical, group = storage.partition_split, storage.num_partitions, storage.group_size
    try:
        affine_storage, affine = as_trained(args, "affine", num_nodes, row_bytes)
    except MariusInputError as error:
        affine_storage, affine = error, None
    one_level = {r.ordering: r for r in compare_orderings(args.partitions, args.buffer, partition_bytes,
                                                           seed=args.seed)}
    trained = {"comet": comet, "affine": affine}  # two-level orderings at the layout training uses
    table = [row for row in (trained[n] if n in trained else one_level.get(n) for n in ORDERINGS) if row]
    print(format_table(table))
    stored = (f"the {args.partitions} partitions stored as {physical} (storage.partition_split={split}), "
              if split > 1 else "")
    print(f"comet (training's default ordering): {stored}BETA over {physical // group} logical partitions of "
          f"{group} physical ones, regrouped at random every epoch (storage.group_size={group})")
    if isinstance(affine_storage, MariusInputError):
        print(f"affine: not at {args.partitions}:{args.buffer} ({affine_storage.problem})")
    else:
        s, k = affine_storage, affine_storage.group_size
        print(f"affine: {s.num_partitions} partitions, buffer {s.buffer_capacity} (storage.partition_split="
              f"{s.partition_split}), the lines of an affine plane over {s.num_partitions // k} groups of {k}: each "
              f"trains in {s.buffer_capacity // k + 1} states an epoch")
    if num_nodes:
        print(f"partition = {rows:,} rows x (dim {args.dim} + optimizer state {state_dim}) x {itemsize} B "
              f"({dtype})")
    if not num_nodes:
        print("bytes are 0: give --dataset DIR or --nodes N (and --dim) to size the partitions")


def cmd_verify(args) -> None:
    from marius_py.checkpoint import RunDirectory, version_problems
    from marius_py.storage.manifest import MANIFEST_FILE, has_manifest, verify_manifest
    run = RunDirectory(args.run_dir)
    try:
        run.latest_version()  # a clear error when there is no committed checkpoint
        versions, failure = run.committed_versions(), None
    except MariusInputError as error:  # a damaged pointer file and a damaged newest version: list them all
        versions, failure = run.versions_on_disk(), error
        if not versions:
            raise
        print(error)
    if run.recovery_note:  # the pointer file was not sound: every version on disk is checked
        print(run.recovery_note)
        versions = run.versions_on_disk()
    corrupt = 0
    for version in versions:
        problems = verify_manifest(version) if has_manifest(version) else (
            version_problems(version) or [f"{version}: no {MANIFEST_FILE} (written before checksums existed): "
                                          f"not checked"])
        corrupt += bool(problems) and not problems[0].endswith("not checked")
        print(f"{version.name}: intact" if not problems else f"{version.name}:")
        for problem in problems:
            print(f"  {problem}")
    if failure is not None:
        raise failure
    if corrupt:
        raise MariusInputError(f"{corrupt} committed version(s) differ from their manifest", path=args.run_dir,
                               expected="restore the files listed above from a copy")


def cmd_info(args) -> None:
    from dataclasses import asdict
    from marius_py.checkpoint import CHECKPOINTS, CONFIG_FILE, RunDirectory, read_state
    from marius_py.dataset import Dataset
    path = Path(args.path)
    if (path / CONFIG_FILE).exists() or (path / CHECKPOINTS).is_dir():
        run = RunDirectory(path)
        latest = run.latest_version() if run.has_checkpoint() else None  # None: nothing committed yet
        committed = asdict(read_state(latest)[0]) if latest else None
        info = {"run": str(path), "latest": latest and str(latest), "best": str(run.best_version()),
                "committed": committed, "metrics": run.read_metrics()[-3:]}
        if run.recovery_note:
            info["recovered"] = run.recovery_note
        print(json.dumps(info, indent=2))
    else:
        with closing(Dataset(path)) as dataset:  # (checked: its names files and edge file)
            print(json.dumps(asdict(dataset.metadata), indent=2))


def cmd_plot(args) -> None:
    from marius_py.plot import plot_run
    for path in plot_run(args.run_dir, args.output, args.epoch):
        print(path)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="marius-py", description=__doc__.splitlines()[0])
    sub = parser.add_subparsers(dest="command", required=True)

    p = sub.add_parser("train", help="train embeddings (no arguments: the bundled CoDEx-M)")
    p.add_argument("config", nargs="*", help="[CONFIG] [section.key=value ...]; CONFIG is a YAML file or one "
                   "of codex-m, codex-m-best, codex-s, fb15k-237, ogbl-wikikg2, ogbl-biokg")
    p.add_argument("--run-dir", help="where to write checkpoints and logs (default runs/<dataset>-<time>)")
    p.add_argument("--resume", metavar="RUN_DIR", help="continue the run in RUN_DIR from its last checkpoint")
    p.add_argument("--quiet", action="store_true", help="no progress bars or per-epoch lines")
    p.add_argument("--partitions", type=int, help="same as storage.num_partitions=P")
    p.add_argument("--buffer", type=int, help="same as storage.buffer_capacity=C")
    p.add_argument("--gpus", type=int, help="train on the first N GPUs sharing the tables "
                   "(same as training.devices=cuda:0,...,cuda:N-1)")
    p.add_argument("--no-dedup", action="store_true", help="several GPUs: every GPU reads its own rows over "
                   "PCIe (same as pipeline.dedup=false; the baseline of the dedup counters)")
    p.add_argument("--help-config", action="store_true", help="list every config key with default and help")
    p.set_defaults(func=cmd_train)

    p = sub.add_parser("plan", help="where train would keep the tables (GPU, host memory or disk, with "
                                    "partitions and buffer) and the memory it would use, without training")
    p.add_argument("config", nargs="*", help="[CONFIG] [section.key=value ...], as for train")
    p.add_argument("--partitions", type=int, help="same as storage.num_partitions=P")
    p.add_argument("--buffer", type=int, help="same as storage.buffer_capacity=C")
    p.add_argument("--gpus", type=int, help="plan for the first N GPUs (same as train --gpus N)")
    p.add_argument("--run-dir", help="where the run would write (its disk's free space; default here)")
    p.add_argument("--nodes", type=int, help="plan for a graph of this many nodes (with --edges) instead of "
                                             "the config's dataset")
    p.add_argument("--edges", type=int, help="train edges of that graph")
    p.add_argument("--host-memory", type=float, metavar="GIB",
                   help="plan for a machine with this much host memory available, in GiB")
    p.add_argument("--gpu-memory", type=float, metavar="GIB",
                   help="plan for GPUs (--gpus of them, default one) with this much free memory each, in GiB "
                        "(0: no GPU)")
    p.add_argument("--disk", type=float, metavar="GIB", help="plan for this much free disk, in GiB")
    p.add_argument("--json", action="store_true", help="print the plan as JSON")
    p.set_defaults(func=cmd_plan)

    p = sub.add_parser("tune", help="search hyperparameters with Optuna (the tune extra): each trial trains on "
                                    "values drawn from a search space and is scored on validation MRR")
    p.add_argument("config", nargs="*", help="[CONFIG] [section.key=value ...]: the config every trial starts "
                   "from, as for train; the first trial trains it as given")
    p.add_argument("--space", help="the search space: a YAML file mapping config keys to ranges ({low: L, high: H, "
                   "log: true}) or choices ([a, b]), or fb15k-237 (the bundled space of that config)")
    p.add_argument("--trials", type=int, metavar="N", help="trials in all (a resumed search counts those already run)")
    p.add_argument("--run-dir", help="the search directory: its study (study.db), trials' runs and best.yaml "
                   "(default runs/tune-<dataset>-<time>)")
    p.add_argument("--resume", metavar="RUN_DIR", help="continue a search (killed or finished) with its own "
                   "config, space and pruner; --trials raises its total")
    p.add_argument("--pruner", choices=PRUNERS, help="stop unpromising trials at their validations: median "
                   "(below the median of the earlier trials at that epoch; the default), halving (successive "
                   "halving) or none")
    p.add_argument("--gpus", type=int, metavar="N", help="run N trials at once, one on each of the first N GPUs")
    p.add_argument("--devices", metavar="LIST", help="run trials at once, one on each device of a comma-separated list "
                   "(cuda:0,cuda:2)")
    p.add_argument("--quiet", action="store_true", help="no line per validation and trial")
    p.set_defaults(func=cmd_tune)

    p = sub.add_parser("preprocess", help="turn delimited edge files, or a registered dataset, into a dataset "
                                          "directory")
    p.add_argument("name", nargs="?", help="a registered dataset (fetched first; `marius-py datasets` lists them) "
                                          "instead of --train/--valid/--test")
    p.add_argument("--train", help="train edges (or all edges, split randomly when "
                   "--valid/--test are not given); UTF-8, LF or CRLF lines; .gz accepted")
    p.add_argument("--valid")
    p.add_argument("--test")
    p.add_argument("--output", "-o", required=True, help="dataset directory to create")
    p.add_argument("--delimiter", default="\t", help="field delimiter (default tab; '\\t' accepted); "
                   "whitespace around every field is stripped, quotes are not interpreted, one trailing "
                   "delimiter is accepted")
    p.add_argument("--columns", help="0-based columns of head,relation,tail (or head,tail with --pairs)")
    p.add_argument("--pairs", action="store_true", help="plain graph: lines are head,tail (no relation)")
    p.add_argument("--skip-header", type=int, default=0, help="lines to skip at the top of every file")
    p.add_argument("--partitions", type=int, default=1, help="node partitions for bucketed training edges")
    p.add_argument("--split", help="valid,test fractions for a single input file (default 0.05,0.05); "
                   "an edge drawn for valid/test whose node or relation no train edge has moves into train "
                   "(counted)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--unseen", choices=("drop", "error"), default=None,
                   help="given --valid/--test edges with nodes or relations absent from train: drop (counted; "
                   "the default) or error")
    p.add_argument("--overwrite", action="store_true")
    p.add_argument("--quiet", action="store_true")
    _fetch_options(p)
    p.set_defaults(func=cmd_preprocess)

    p = sub.add_parser("download", help="fetch a registered dataset, check it and prepare it in the cache "
                                        "(train, preprocess and mp.load_dataset do it for a name they are given)")
    p.add_argument("name", help="a registered dataset (`marius-py datasets` lists them)")
    p.add_argument("--partitions", type=int, default=1, help="node partitions for bucketed training edges")
    p.add_argument("--quiet", action="store_true")
    _fetch_options(p)
    p.set_defaults(func=cmd_download)

    p = sub.add_parser("datasets", help="list the registered datasets: task, counts, license")
    p.set_defaults(func=cmd_datasets)

    for name, func, text in (("eval", cmd_eval, "evaluate a run's checkpoint"),
                             ("export", cmd_export, "write embeddings keyed by original names"),
                             ("predict", cmd_predict, "top-k heads or tails for given names")):
        p = sub.add_parser(name, help=text)
        p.add_argument("run_dir")
        p.add_argument("--checkpoint", choices=("best", "latest"), default="best",
                       help="best validation (the latest where no validation selected one), or the latest")
        p.set_defaults(func=func)
        if name != "export":
            p.add_argument("--device", help="where to score: cpu, cuda or cuda:N (default the run's "
                                            "training.device)")
        if name == "eval":
            p.add_argument("--split", choices=("valid", "test"), default="test")
            p.add_argument("--json", action="store_true", help="also print the metrics as JSON")
            p.add_argument("overrides", nargs="*", help="evaluation.key=value overrides")
        elif name == "export":
            p.add_argument("--format", choices=("npy", "tsv", "h5"), default="npy")
            p.add_argument("--output", "-o", help="output directory (default RUN_DIR/export-FORMAT)")
            p.add_argument("--overwrite", action="store_true")
        else:
            p.add_argument("--relation", help="relation name (omit for plain graphs)")
            p.add_argument("--head", help="predict tails of (head, relation, ?)")
            p.add_argument("--tail", help="predict heads of (?, relation, tail)")
            p.add_argument("-k", type=int, default=10, help="how many answers (at least 1)")
            p.add_argument("--filter-known", action="store_true", help="skip answers already in the data")

    p = sub.add_parser("ordering", help="compare orderings: swaps and partition IO per epoch")
    p.add_argument("--partitions", "-p", type=int, required=True)
    p.add_argument("--buffer", "-c", type=int, required=True, help="partitions held in memory")
    p.add_argument("--dataset", help="preprocessed dataset (for its node count)")
    p.add_argument("--nodes", type=int, help="node count, instead of --dataset")
    p.add_argument("--dim", type=int, default=100)
    p.add_argument("--rowwise", action="store_true", help="row-wise Adagrad state (one value per row)")
    p.add_argument("--dtype", choices=STORAGE_DTYPES, default="auto",
                   help="storage.dtype (auto: bfloat16, as one process stores partitions on disk): bfloat16 "
                        "halves every partition's bytes")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--group-size", type=int, default=0,
                   help="comet and affine: physical partitions per logical one (0: as training picks it)")
    p.set_defaults(func=cmd_ordering)

    p = sub.add_parser("plot", help="PNGs of a run: loss, validation MRR, edges/s, and out of core the "
                                    "buffer states of an epoch (needs matplotlib: the plot extra)")
    p.add_argument("run_dir")
    p.add_argument("--output", "-o", help="folder for the PNGs (default RUN_DIR/plots)")
    p.add_argument("--epoch", type=int, help="the epoch of the timeline (default the last)")
    p.set_defaults(func=cmd_plot)

    p = sub.add_parser("verify", help="check every committed checkpoint of a run against its checksums")
    p.add_argument("run_dir")
    p.set_defaults(func=cmd_verify)

    p = sub.add_parser("info", help="describe a dataset directory or a run directory")
    p.add_argument("path")
    p.set_defaults(func=cmd_info)
    return parser


def _fetch_options(p: argparse.ArgumentParser) -> None:
    p.add_argument("--from", metavar="PATH", help="a registered dataset's file(s) fetched on another machine: the "
                   "file, or a directory holding them")
    p.add_argument("--offline", action="store_true", help="fetch nothing: use the cache and --from "
                   "(as MARIUS_PY_OFFLINE=1)")


# The list each verb gathers its key=value items into (verbs without one take none).
OVERRIDE_LISTS = {"train": "config", "plan": "config", "tune": "config", "eval": "overrides"}


def parse_arguments(argv: list[str] | None) -> argparse.Namespace:
    """Options and ``key=value`` items in any order: argparse fills a verb's positional list only from
    the items before the first option, so the items after it are gathered here."""
    parser = build_parser()
    args, extras = parser.parse_known_args(argv)
    destination = OVERRIDE_LISTS.get(args.command)
    stray = [item for item in extras if destination is None or item.startswith("-")]
    if stray:
        parser.error(f"unrecognized arguments: {' '.join(stray)}")
    if extras:
        getattr(args, destination).extend(extras)
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse_arguments(argv)
    from marius_py.resources import keep_freed_memory
    keep_freed_memory()
    try:
        args.func(args)
    except MariusInputError as error:
        print(f"marius-py: error: {error}", file=sys.stderr)
        return EXIT_USER_ERROR
    except OSError as error:
        if error.errno not in (errno.ENOSPC, errno.EDQUOT):
            raise
        where = f"{error.filename}: " if error.filename else ""
        print(f"marius-py: error: {where}no space left on the device; nothing half-written was committed (a "
              "run's last committed checkpoint is intact): free space, then run again (--resume for a run)",
              file=sys.stderr)
        return EXIT_USER_ERROR
    except KeyboardInterrupt as interrupt:
        print(f"marius-py: {_interrupted_message(args.command, interrupt)}", file=sys.stderr)
        return EXIT_INTERRUPTED
    return 0


if __name__ == "__main__":
    sys.exit(main())
