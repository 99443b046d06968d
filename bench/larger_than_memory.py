"""One epoch on a graph whose embeddings + optimizer state exceed the machine's RAM (or its GPU's).

    python bench/larger_than_memory.py --workdir /work/ltm --nodes 24200000 --rmat-edges 8000000 \
        --dim 200 --partitions 16 --buffer 4 --out bench/results/larger_than_memory.json
    # Freebase86m's shape with Marius' settings (issue 13), on a GPU:
    python bench/larger_than_memory.py --workdir /data/fb86m --graph freebase --partitions 16 --buffer 8 \
        --decoder complex --dim 100 --batch-size 50000 --negatives 1000 --degree-fraction 0.5 \
        --adagrad rowwise --device cuda --out bench/results/gpu-freebase-shape-epoch.json

Steps (each measured in its own process): generate a seeded R-MAT graph
(bench/rmat.py) and preprocess it (``marius-py preprocess --pairs``), or with
``--graph freebase`` write bench/freebase_shape.py's graph (``--scale``), then passes
over one epoch's ordering with c = ``--buffer`` of ``--partitions`` (``--passes``):
``io`` (the buffer walks every state, reading and writing partitions, no
training), ``compute`` (training with partition IO replaced by no-ops, the buffer's
rows as a new store's), ``full`` (the real epoch) and ``train`` (the real epoch
through ``marius-py train``, in a process of its own); compute, full and train first
train ``--warmup-epochs`` untimed (the first epoch pays kernel compiles and CUDA-graph
captures, start-up that ``marius-py train`` reports apart), and every pass times the
epoch after them. Prints a table and writes JSON: times, edges/s,
peak RSS against the documented bound, and the buffer's IO counters against
the simulator's prediction.
"""

from __future__ import annotations

import argparse
import faulthandler
import json
import resource
import signal
import subprocess
import sys
import time
from pathlib import Path

GiB = 1 << 30


def run_json(command: list[str]) -> dict:
    result = subprocess.run(command, check=True, stdout=subprocess.PIPE, text=True)  # progress on stderr
    return json.loads(result.stdout.strip().splitlines()[-1])


def dd_bandwidth(directory: Path, gib: int) -> dict:
    """Sequential O_DIRECT write then read of ``gib`` GiB with dd, in bytes/s (the disk's own figure)."""
    target = directory / "dd.bin"
    rates = {}
    for name, command in (("write", ["dd", "if=/dev/zero", f"of={target}", "bs=64M", f"count={gib * 16}",
                                     "oflag=direct", "conv=fsync"]),
                          ("read", ["dd", f"if={target}", "of=/dev/null", "bs=64M", "iflag=direct"])):
        started = time.perf_counter()
        subprocess.run(command, check=True, capture_output=True)
        rates[f"{name}_bytes_per_s"] = gib * GiB / (time.perf_counter() - started)
    target.unlink()
    return rates


def report_states(buffer) -> None:
    """Print each buffer state's start to stderr: a pass cut short by a time limit still shows its pace."""
    walk, started = buffer.walk, time.perf_counter()

    def timed_walk(states, *args, **kwargs):
        for index, view in enumerate(walk(states, *args, **kwargs)):
            print(f"  state {index + 1}/{len(states)} at {time.perf_counter() - started:7.1f} s",
                  file=sys.stderr, flush=True)
            yield view
    buffer.walk = timed_walk


def config_overrides(dataset: Path, args) -> list[str]:
    return [f"dataset.path={dataset}", f"model.decoder={args.decoder}", f"model.dim={args.dim}",
            f"training.device={args.device}", "training.epochs=1", f"training.batch_size={args.batch_size}",
            "training.num_chunks=10", f"training.num_negatives={args.negatives}",
            f"training.degree_fraction={args.degree_fraction}", f"training.adagrad_variant={args.adagrad}",
            "evaluation.every=0", "evaluation.protocol=sampled", "evaluation.negative_sampling=mixed",
            "evaluation.num_negatives=2000", f"storage.num_partitions={args.partitions}",
            f"storage.buffer_capacity={args.buffer}", f"storage.ordering={args.ordering}",
            f"storage.lookahead={args.lookahead}", f"storage.edge_assignment={args.edge_assignment}", *args.set]


def train_end_to_end(args) -> None:
    """The ``train`` pass: the epoch as ``marius-py train`` runs it, in a process of its own (bench/plans.py's
    child: the library's train with the command's allocator settings, stopped once the timed epoch is logged,
    its own peak RSS); prints one JSON line. No commit falls inside it: what a commit after an epoch writes,
    the compute and full passes time apart."""
    from plans import run_child
    timed_epoch = args.warmup_epochs + 1
    result = run_child([*config_overrides(Path(args.dataset), args), f"training.epochs={timed_epoch + 1}",
                        "training.checkpoint_interval=1e9"], Path(args.run_dir).with_name("train-run"), timed_epoch)
    if "error" in result:
        raise SystemExit(f"the train pass failed: {result['error']}")
    epoch, plan = result["epoch"], result["plan"]
    print(json.dumps({
        "mode": "train", "seconds": epoch["seconds"], "wall_seconds": result["wall_seconds"], "settings": args.set,
        "phases": epoch["time"], "states": epoch.get("states"), "timed_epoch": timed_epoch, "plan": plan,
        "num_edges": round(epoch["edges_per_s"] * epoch["seconds"]), "buffer_bytes": plan["buffer_bytes"],
        "peak_rss_bytes": result["peak_rss_bytes"], "allocator_settings_taken": result["allocator_settings_taken"],
        "counters": epoch["io"]}))


def fill_as_new_store(buffer, init_scale: float) -> None:
    """The compute pass's buffer, which reads no partition, holding what a new store would: normal(0,
    init_scale) embeddings and zero optimizer state (all-zero rows would make every gradient zero), in its
    host slots too (on a GPU every read copies a host slot over the slot's rows)."""
    for tables in {id(tables): tables for tables in (buffer.tables, buffer.host_slots)}.values():
        embeddings, state = tables
        embeddings.normal_(0, init_scale)
        state.zero_()


def measure(args) -> None:
    """One pass (``--mode``) in this process; prints one JSON line."""
    # A time limit's SIGTERM (timeout signals the whole process group) first prints every thread's stack:
    # a stalled pass says where it stalled.
    faulthandler.register(signal.SIGTERM, all_threads=True, chain=True)
    import marius_py as mp
    from marius_py.dataset import Dataset
    from marius_py.resources import keep_freed_memory
    from marius_py.trainer import Trainer
    from marius_py.orderings import simulate, walk_io
    from marius_py.storage.chunk_files import ChunkFiles

    allocator_settings_taken = args.allocator == "command" and keep_freed_memory()
    config = mp.make_config(None, config_overrides(Path(args.dataset), args))
    started = time.perf_counter()
    trainer = Trainer.of(config, Dataset(args.dataset), args.run_dir, progress=False)
    setup_seconds = time.perf_counter() - started
    timed_epoch = args.warmup_epochs + 1
    ordering = trainer.ordering(timed_epoch)
    states = [ordering.resident(k) for k in range(ordering.num_states)]
    if args.mode != "eval":  # (evaluation never allocates the buffer)
        report_states(trainer.partition_buffer())
    if args.mode == "compute":
        fill_as_new_store(trainer.partition_buffer(), config.model.init_scale)
        ChunkFiles.read_into = lambda self, chunk, out: self.chunk_bytes
        ChunkFiles.write = lambda self, chunk, data, for_commit=True: self.chunk_bytes
    if args.mode in ("compute", "full"):
        for epoch in range(1, timed_epoch):  # kernel compiles and CUDA-graph captures: start-up, not the epoch
            trainer.train_epoch(epoch)
    counters = trainer.partition_buffer().counters if args.mode != "eval" else None
    before = counters.snapshot() if counters else {}
    carried = trainer.partition_buffer().resident if args.mode in ("compute", "full") else []  # (kept from the
    started, record = time.perf_counter(), {}                                                 # warm-up epoch)
    if args.mode == "io":
        for _ in trainer.partition_buffer().walk(states):
            pass
        trainer.partition_buffer().flush()
    elif args.mode != "eval":  # (eval: the store as created; evaluation takes as long as after training)
        record = trainer.train_epoch(timed_epoch)
    seconds = time.perf_counter() - started
    write_back = {}
    if args.mode in ("compute", "full"):  # what a commit or an evaluation after the epoch writes first
        started, written = time.perf_counter(), counters.snapshot()["checkpoint_bytes_written"]
        trainer.spans.write_back()
        write_back = {"write_back_seconds": time.perf_counter() - started,
                      "write_back_bytes": counters.snapshot()["checkpoint_bytes_written"] - written}
    peak_rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024  # (before any evaluation)
    evaluation = {}
    if args.mode == "eval" or args.eval and args.mode == "full":  # Marius': 1,000 uniform + 1,000 by degree
        started = time.perf_counter()
        metrics = trainer.evaluate("test")
        evaluation = {"eval_seconds": time.perf_counter() - started, "test_mrr": metrics["mrr"],
                      "test_edges": trainer.dataset.metadata.num_test,
                      "peak_rss_through_eval_bytes": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024}
    chunk_bytes = sum(f.chunk_bytes for f in trainer.tables.store.chunk_files())
    predicted = simulate(ordering, chunk_bytes) if args.mode == "io" else \
        walk_io(ordering, chunk_bytes, carried, carried_dirty=True)  # (the buffer stays filled between epochs)
    predicted_counts = ({"partitions_read": predicted.physical_partitions_read,
                         "partitions_written": predicted.physical_partitions_written,
                         "bytes_read": predicted.bytes_read, "bytes_written": predicted.bytes_written}
                        if args.mode == "io" else predicted)
    edges = trainer.dataset.edges
    offsets = edges.bucket_offsets()
    state_edges = [sum(int(offsets[i * edges.num_partitions + j + 1] - offsets[i * edges.num_partitions + j])
                       for i, j in buckets) for buckets in ordering.buckets]
    print(json.dumps({
        "mode": args.mode, "seconds": seconds, "setup_seconds": setup_seconds, **evaluation,
        "settings": args.set, "phases": record.get("time"), "states": record.get("states"),
        "num_edges": trainer.dataset.metadata.num_train, "num_nodes": trainer.dataset.num_nodes,
        "peak_rss_bytes": peak_rss, "allocator_settings_taken": allocator_settings_taken,
        "buffer_bytes": trainer.plan.buffer_bytes, "max_state_edges": max(state_edges), "plan": trainer.plan.record(),
        "store_bytes": chunk_bytes * trainer.tables.store.num_partitions,
        "timed_epoch": timed_epoch,
        "counters": ({key: value - before[key] for key, value in counters.snapshot().items()} if before
                     else {"bytes_read": 0, "bytes_written": 0}),
        "predicted": predicted_counts, **write_back}))  # (storage partitions, as counted)
    trainer.close()


def memory_total() -> int:
    for line in Path("/proc/meminfo").read_text().splitlines():
        if line.startswith("MemTotal:"):
            return int(line.split()[1]) * 1024
    raise RuntimeError("no MemTotal")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--workdir", required=True)
    parser.add_argument("--nodes", type=int, default=24_200_000)
    parser.add_argument("--rmat-edges", type=int, default=8_000_000)
    parser.add_argument("--dim", type=int, default=200)
    parser.add_argument("--partitions", type=int, default=16)
    parser.add_argument("--buffer", type=int, default=4, help="storage.buffer_capacity (0: the plan chooses it, "
                        "within storage.memory_limit_gib if --set gives one)")
    parser.add_argument("--batch-size", type=int, default=10_000)
    parser.add_argument("--negatives", type=int, default=100)
    parser.add_argument("--degree-fraction", type=float, default=0.0)
    parser.add_argument("--decoder", default="dot")
    parser.add_argument("--adagrad", choices=("full", "rowwise"), default="full")
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--ordering", default="beta", help="storage.ordering (comet: the default's k)")
    parser.add_argument("--edge-assignment", default="bucket", help="storage.edge_assignment (balanced: "
                        "buckets spread so that every state's training overlaps its swap)")
    parser.add_argument("--lookahead", type=int, default=2, help="storage.lookahead: states read ahead")
    parser.add_argument("--graph", choices=("rmat", "freebase"), default="rmat")
    parser.add_argument("--scale", type=float, default=1.0, help="--graph freebase: of Freebase86m's counts")
    parser.add_argument("--passes", default="io,compute,full", help="which passes, in this order (eval: the "
                        "test evaluation alone, on the store as created; train: the epoch through `marius-py "
                        "train`, end to end)")
    parser.add_argument("--dd-gib", type=int, default=0, help="first measure the disk with dd (O_DIRECT), GiB")
    parser.add_argument("--eval", action="store_true", help="after the full pass, time the test split's "
                        "sampled evaluation (1,000 uniform + 1,000 degree negatives, as Marius)")
    parser.add_argument("--allocator", choices=("command", "system"), default="command",
                        help="command: glibc malloc as `marius-py train` sets it (resources.keep_freed_memory); "
                             "system: glibc's defaults, as the library leaves them")
    parser.add_argument("--warmup-epochs", type=int, default=1, help="compute and full: epochs trained "
                        "before the timed one (the first pays kernel compiles and graph captures)")
    parser.add_argument("--set", nargs="*", default=[], metavar="KEY=VALUE", help="more config overrides")
    parser.add_argument("--out", default="bench/results/larger_than_memory.json")
    parser.add_argument("--mode", choices=("io", "compute", "full", "eval", "train"), help=argparse.SUPPRESS)
    parser.add_argument("--dataset", help=argparse.SUPPRESS)
    parser.add_argument("--run-dir", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.mode:
        return train_end_to_end(args) if args.mode == "train" else measure(args)
    if args.allocator == "system" and "train" in args.passes.split(","):
        parser.error("--passes train runs as the command does, with its allocator settings: "
                     "--allocator system applies to the other passes only; run it without train")

    work = Path(args.workdir)
    work.mkdir(parents=True, exist_ok=True)
    edges_file, dataset, run_dir = work / "edges.tsv", work / "dataset", work / "run"
    steps = {}
    if args.graph == "freebase" and not (dataset / "metadata.json").exists():
        started = time.perf_counter()
        subprocess.run([sys.executable, str(Path(__file__).parent / "freebase_shape.py"), "--out", str(dataset),
                        "--partitions", str(args.partitions), "--scale", str(args.scale)], check=True)
        steps["generate_seconds"] = time.perf_counter() - started
    if args.graph == "rmat" and not edges_file.exists():
        started = time.perf_counter()
        subprocess.run([sys.executable, str(Path(__file__).parent / "rmat.py"), "--nodes", str(args.nodes),
                        "--edges", str(args.rmat_edges), "--out", str(edges_file)], check=True)
        steps["generate_seconds"] = time.perf_counter() - started
    if not (dataset / "metadata.json").exists():
        started = time.perf_counter()
        subprocess.run(["marius-py", "preprocess", "--train", str(edges_file), "--pairs", "--partitions",
                        str(args.partitions), "--split", "0.0001,0.0001", "-o", str(dataset), "--quiet"],
                       check=True)
        steps["preprocess_seconds"] = time.perf_counter() - started
    base = [sys.executable, __file__, "--workdir", str(work), "--dataset", str(dataset), "--run-dir",
            str(run_dir), "--dim", str(args.dim), "--partitions", str(args.partitions), "--buffer",
            str(args.buffer), "--batch-size", str(args.batch_size), "--negatives", str(args.negatives),
            "--degree-fraction", str(args.degree_fraction), "--decoder", args.decoder, "--adagrad", args.adagrad,
            "--device", args.device, "--ordering", args.ordering, "--lookahead", str(args.lookahead),
            "--edge-assignment", args.edge_assignment, "--allocator", args.allocator,
            "--warmup-epochs", str(args.warmup_epochs)] + \
        (["--eval"] if args.eval else []) + (["--set", *args.set] if args.set else [])
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    if args.dd_gib:
        steps["dd"] = dd_bandwidth(work, args.dd_gib)
        print(f"dd O_DIRECT: write {steps['dd']['write_bytes_per_s'] / GiB:.2f} GiB/s, "
              f"read {steps['dd']['read_bytes_per_s'] / GiB:.2f} GiB/s", flush=True)
    passes = {}
    for mode in args.passes.split(","):
        passes[mode] = run_json(base + ["--mode", mode])
        passes[mode]["disk_bytes_per_s"] = (passes[mode]["counters"]["bytes_read"] + passes[mode]["counters"][
            "bytes_written"]) / max(passes[mode]["seconds"], 1e-9)
        print(f"{mode:8s} {passes[mode]['seconds']:8.1f} s  peak RSS {passes[mode]['peak_rss_bytes'] / GiB:6.2f} GiB"
              f"  partition IO {passes[mode]['disk_bytes_per_s'] / GiB:.2f} GiB/s", flush=True)
        if "write_back_seconds" in passes[mode]:
            print(f"{'':8s} then {passes[mode]['write_back_seconds']:.1f} s writing back the "
                  f"{passes[mode]['write_back_bytes'] / GiB:.2f} GiB a commit after it writes first", flush=True)
        if "eval_seconds" in passes[mode]:
            print(f"test evaluation: {passes[mode]['test_edges']:,} edges in {passes[mode]['eval_seconds']:.1f} s "
                  f"(MRR {passes[mode]['test_mrr']:.4f}), peak RSS through it "
                  f"{passes[mode]['peak_rss_through_eval_bytes'] / GiB:.2f} GiB", flush=True)
        write_report(out, steps, passes, {})  # after every pass: a run cut short keeps what finished
    epoch_pass = passes.get("train") or passes.get("full")  # (the epoch as a user runs it, where measured)
    if epoch_pass is None:
        return
    # The bound the plan prints (buffer there, a state's edges, a margin); the IO the compute or full pass predicted.
    bound = epoch_pass["plan"]["host_bytes"]
    predicted = next((passes[mode]["predicted"] for mode in ("full", "compute") if mode in passes), None)
    summary = {"pass": epoch_pass["mode"], "peak_rss_bytes": epoch_pass["peak_rss_bytes"],
               "rss_bound_bytes": bound, "allocator_settings_taken": epoch_pass["allocator_settings_taken"],
               "counters_match_simulator": predicted is not None and all(
                   epoch_pass["counters"][key] == value for key, value in predicted.items())}
    plan = epoch_pass["plan"]
    state_edges = next((p["max_state_edges"] for p in passes.values() if "max_state_edges" in p), 0)
    print(f"plan: {plan['num_partitions']} partitions through a buffer of {plan['buffer_capacity']} "
          f"({plan['physical_partitions']}:{plan['physical_buffer']} stored, {plan['ordering']}, {plan['dtype']}, "
          f"buffer {epoch_pass['buffer_bytes'] / GiB:.2f} GiB in {plan['placement']} memory)")
    not_taken = args.allocator == "command" and not epoch_pass["allocator_settings_taken"]
    print(f"{epoch_pass['mode']} pass: peak RSS {epoch_pass['peak_rss_bytes'] / GiB:.2f} GiB (the plan's bound "
          f"{bound / GiB:.2f} GiB; {state_edges:,} edges in the largest state; allocator: {args.allocator}"
          f"{', settings not taken' if not_taken else ''})")
    print(f"IO counters {epoch_pass['counters']} vs simulator " + (
        f"{predicted}: {'match' if summary['counters_match_simulator'] else 'MISMATCH'}" if predicted is not None
        else "(no prediction: add the compute or full pass)"))
    if "train" in passes and "compute" in passes:
        summary["train_over_compute"] = passes["train"]["seconds"] / passes["compute"]["seconds"]
        print(f"end to end: epoch {passes['train']['seconds']:.1f} s through marius-py train "
              f"({passes['train']['num_edges'] / passes['train']['seconds']:,.0f} edges/s), the step alone "
              f"{passes['compute']['seconds']:.1f} s: {summary['train_over_compute']:.2f} x")
    full = passes.get("full")
    if full and set(passes) >= {"io", "compute"}:
        ram = memory_total()
        summary.update({
            "ram_bytes": ram, "store_bytes": full["store_bytes"], "store_over_ram": full["store_bytes"] / ram,
            "epoch_seconds": full["seconds"], "edges_per_s": full["num_edges"] / full["seconds"],
            "io_only_seconds": passes["io"]["seconds"], "compute_only_seconds": passes["compute"]["seconds"],
            "epoch_over_max": full["seconds"] / max(passes["io"]["seconds"], passes["compute"]["seconds"])})
        print(f"nodes {full['num_nodes']:,}  edges {full['num_edges']:,}  store {full['store_bytes'] / GiB:.1f} "
              f"GiB = {summary['store_over_ram']:.2f} x RAM ({ram / GiB:.1f} GiB)")
        print(f"epoch {full['seconds']:.1f} s ({summary['edges_per_s']:,.0f} edges/s); IO only "
              f"{passes['io']['seconds']:.1f} s; compute only {passes['compute']['seconds']:.1f} s; "
              f"epoch / max = {summary['epoch_over_max']:.2f}")
    if "dd" in steps and "io" in passes:
        disk = steps["dd"]["read_bytes_per_s"] + steps["dd"]["write_bytes_per_s"]
        summary["io_pass_over_dd"] = passes["io"]["disk_bytes_per_s"] * 2 / disk
        print(f"partition IO of the IO-only pass {summary['io_pass_over_dd']:.0%} of dd's (mean of read and write)")
    write_report(out, steps, passes, summary)
    print(f"wrote {out}")


def write_report(out: Path, steps: dict, passes: dict, summary: dict) -> None:
    out.write_text(json.dumps({"date": time.strftime("%Y-%m-%d"), "command": " ".join(sys.argv),
                               "steps": steps, "passes": passes, "summary": summary}, indent=2))


if __name__ == "__main__":
    main()
