"""``marius-py plot RUN_DIR``: PNGs of a run's metrics log (matplotlib, the ``plot`` extra).

- ``training.png``: loss and validation MRR per epoch;
- ``throughput.png``: edges/s per epoch;
- ``epoch_time.png``: where each epoch's time went (waiting for the buffer, preparing edges, training,
  synchronising, validating, committing on the critical path), each commit written behind training
  (hatched, off the critical path, at the epoch it holds; a folded commit point marked) and the start-up
  before the first batch;
- ``timeline.png`` (out of core): one epoch buffer state by buffer state, as Marius' utilisation
  figure: time waiting for the buffer against time training, and the partition bytes read per state
  (``marius_py.timeline`` records them).
"""

from __future__ import annotations

import io
from pathlib import Path

from marius_py.checkpoint import CONFIG_FILE, RunDirectory
from marius_py.errors import MariusInputError
from marius_py.storage.durable import is_disk_full, on_disk, reporting_full_disk, write_bytes_atomic
from marius_py.timeline import EPOCH_PHASES


def _pyplot():
    try:
        import matplotlib
    except ImportError:
        raise MariusInputError("plotting needs matplotlib", path="command line",
                               expected="pip install 'marius-py[plot]' (or matplotlib)") from None
    matplotlib.use("Agg")  # files only, no display
    import matplotlib.pyplot as pyplot
    return pyplot


def plot_run(run_dir: str | Path, out_dir: str | Path | None = None, epoch: int | None = None) -> list[Path]:
    """Write the run's PNGs into ``out_dir`` (default ``RUN_DIR/plots``); return their paths."""
    run = RunDirectory(run_dir)
    if not (run.path / CONFIG_FILE).exists():
        raise MariusInputError("not a run directory (no config.yaml)", path=run.path,
                               expected="a directory written by `marius-py train`")
    lines = run.metric_lines()  # (a damaged line: file:line; a last line a kill cut short: skipped)
    for number, record in lines:
        if record.get("event") == "epoch":
            _check(record, ("epoch", "loss", "edges_per_s"), run.path / "metrics.jsonl", number)
            for row in record.get("states") or ():
                _check(row, ("wait", "train", "read", "written"), run.path / "metrics.jsonl", number)
        elif record.get("split") == "valid":
            _check(record, ("epoch", "mrr"), run.path / "metrics.jsonl", number)
    records = [record for _, record in lines]
    epochs = [r for r in records if r.get("event") == "epoch"]
    if not epochs:
        raise MariusInputError("no epoch in the metrics log", path=run.path / "metrics.jsonl",
                               expected="a run directory with at least one trained epoch")
    timeline = _timeline_record(epochs, epoch, run.path / "metrics.jsonl")  # (refused before anything is written)
    pyplot = _pyplot()
    out = Path(out_dir) if out_dir else run.path / "plots"
    drawn = [_training(pyplot, epochs, [r for r in records if r.get("split") == "valid"], out / "training.png"),
             _throughput(pyplot, epochs, out / "throughput.png")]
    timed = [r for r in epochs if isinstance(r.get("time"), dict)]
    if timed:
        startups = [r for r in records if r.get("event") == "startup"]
        commits = [r for r in records if r.get("event") == "commit"]
        drawn.append(_epoch_time(pyplot, timed, commits, startups[-1] if startups else None,
                                 out / "epoch_time.png"))
    if timeline is not None:
        drawn.append(_timeline(pyplot, timeline, out / "timeline.png"))
    return _write_pngs(out, drawn)


def _timeline_record(epochs: list[dict], epoch: int | None, log: Path) -> dict | None:
    """The epoch record whose buffer states ``timeline.png`` draws: ``epoch``'s (refused where it has none), by
    default the last with states; None where no epoch has any (a run without a partition buffer)."""
    with_states = [r for r in epochs if r.get("states")]
    if epoch is None:
        return with_states[-1] if with_states else None
    chosen = next((r for r in with_states if r["epoch"] == epoch), None)
    if chosen is None:
        raise MariusInputError(f"epoch {epoch} has no buffer-state timeline", path=log,
                               expected=f"--epoch one of {[r['epoch'] for r in with_states]}" if with_states else
                               "no --epoch: no epoch of this run has buffer states (it trained without a "
                               "partition buffer)")
    return chosen


def _check(record, keys: tuple[str, ...], path: Path, line: int) -> None:
    """A record the plots read: a JSON object with a number under each of ``keys``."""
    wrong = [key for key in keys if not isinstance(record, dict) or isinstance(record.get(key), bool)
             or not isinstance(record.get(key), (int, float))]
    if wrong:
        raise MariusInputError(f"a record without a number for {', '.join(wrong)}", path=path, line=line,
                               expected="the records `marius-py train` writes (epoch, loss, edges_per_s per epoch; "
                                        "epoch, mrr per validation)")


def _training(pyplot, epochs: list[dict], validations: list[dict], path: Path) -> tuple[Path, bytes]:
    figure, (loss_axis, mrr_axis) = pyplot.subplots(2, 1, figsize=(7, 6), sharex=True)
    loss_axis.plot([r["epoch"] for r in epochs], [r["loss"] for r in epochs], marker=".")
    loss_axis.set_ylabel("training loss")
    if validations:
        mrr_axis.plot([r["epoch"] for r in validations], [r["mrr"] for r in validations], marker="o", color="C1")
    mrr_axis.set_ylabel("validation MRR")
    mrr_axis.set_xlabel("epoch")
    return _save(pyplot, figure, path)


def _throughput(pyplot, epochs: list[dict], path: Path) -> tuple[Path, bytes]:
    figure, axis = pyplot.subplots(figsize=(7, 3.5))
    axis.bar([r["epoch"] for r in epochs], [r["edges_per_s"] / 1e6 for r in epochs], color="C2")
    axis.set_xlabel("epoch")
    axis.set_ylabel("million edges / s")
    return _save(pyplot, figure, path)


def _epoch_time(pyplot, epochs: list[dict], commits: list[dict], startup: dict | None,
                path: Path) -> tuple[Path, bytes]:
    figure, axis = pyplot.subplots(figsize=(8, 4))
    numbers = [r["epoch"] for r in epochs]
    bottom = [0.0] * len(epochs)
    for index, phase in enumerate(EPOCH_PHASES):
        heights = [_seconds(r["time"].get(phase)) for r in epochs]
        axis.bar(numbers, heights, bottom=bottom, color=f"C{index}", label=phase)
        bottom = [b + h for b, h in zip(bottom, heights)]
    behind = {r.get("epoch"): _seconds(r.get("seconds")) for r in commits}
    if behind:  # (written while the next epoch trained)
        axis.bar(numbers, [behind.get(n, 0.0) for n in numbers], bottom=bottom, fill=False, hatch="//",
                 edgecolor="gray", label="commit behind training")
    folded = [(n, b) for n, b, r in zip(numbers, bottom, epochs) if r.get("commit_folded")]
    if folded:
        axis.scatter([n for n, _ in folded], [b for _, b in folded], marker="x", color="black",
                     label="commit point folded into the next")
    title = "where each epoch's time went"
    if startup is not None:
        title += f"; start-up to the first batch {_seconds(startup.get('seconds_to_first_batch')):.1f} s"
    axis.set_title(title)
    axis.set_xticks(numbers if len(numbers) <= 20 else numbers[::-(-len(numbers) // 20)])
    axis.set_xlabel("epoch")
    axis.set_ylabel("seconds")
    axis.legend(loc="upper right", fontsize="small")
    return _save(pyplot, figure, path)


def _seconds(value) -> float:
    return float(value) if isinstance(value, (int, float)) and not isinstance(value, bool) else 0.0


def _timeline(pyplot, record: dict, path: Path) -> tuple[Path, bytes]:
    states = record["states"]
    figure, (time_axis, io_axis) = pyplot.subplots(2, 1, figsize=(10, 6), sharex=True,
                                                   gridspec_kw={"height_ratios": [1, 2]})
    clock, middles = 0.0, []
    for row in states:
        time_axis.barh(0, row["wait"], left=clock, color="C3", height=0.8)
        time_axis.barh(0, row["train"], left=clock + row["wait"], color="C0", height=0.8)
        middles.append(clock + row["wait"] + row["train"] / 2)
        clock += row["wait"] + row["train"]
    waited = sum(row["wait"] for row in states)
    time_axis.set_yticks([])
    time_axis.set_title(f"epoch {record['epoch']}: {len(states)} buffer states, training "
                        f"{100 * (1 - waited / clock) if clock else 0:.0f}% of the time "
                        f"(red: waiting for the buffer, blue: training)")
    widths = [max(row["wait"] + row["train"], 1e-9) * 0.8 for row in states]
    io_axis.bar(middles, [row["read"] / 2**20 for row in states], width=widths, color="C3", label="read")
    io_axis.bar(middles, [-row["written"] / 2**20 for row in states], width=widths, color="C4", label="written")
    io_axis.axhline(0, color="black", linewidth=0.5)
    io_axis.set_ylabel("partition MiB per state")
    io_axis.set_xlabel("seconds into the epoch")
    io_axis.legend(loc="upper right")
    return _save(pyplot, figure, path)


def _save(pyplot, figure, path: Path) -> tuple[Path, bytes]:
    """``path`` and the figure's PNG, written by ``_write_pngs`` once every figure is drawn."""
    figure.tight_layout()
    png = io.BytesIO()
    figure.savefig(png, format="png", dpi=110)
    pyplot.close(figure)
    return path, png.getvalue()


def _write_pngs(out: Path, drawn: list[tuple[Path, bytes]]) -> list[Path]:
    """Write the drawn PNGs into ``out``, each replacing its earlier copy whole; where they do not all fit,
    none is written (``DiskFullError``); their paths."""
    with reporting_full_disk(f"writing the plots {out}", out, on_disk(len(png) for _, png in drawn)):
        try:
            out.mkdir(parents=True, exist_ok=True)
        except OSError as error:
            if is_disk_full(error):
                raise
            raise MariusInputError(f"cannot create the output folder ({error.strerror})", path=out,
                                   expected="-o FOLDER where this user can write") from None
        for path, png in drawn:
            write_bytes_atomic(path, png)
    return [path for path, _ in drawn]
