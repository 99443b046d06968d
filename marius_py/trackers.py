"""Metrics trackers: the run's metrics records mirrored elsewhere, as PyKEEN's result trackers do. They are
callbacks (``marius_py.callbacks``), written to its protocol here to stay below it (it registers them).

``training.tensorboard=true`` (or ``training.callbacks=tensorboard``) writes TensorBoard event files to
``RUN_DIR/tensorboard``: per epoch ``train/loss``, ``train/edges_per_s``, ``train/seconds`` (and out of core
``train/buffer_wait_share``, the share of the epoch spent waiting for the buffer); per evaluation
``<split>/mrr``, ``hits@1/3/10`` and ``mean_rank``, at the epoch they were taken. Event files are append-only:
epochs a crash made a resumed run train again appear twice at their step (the metrics log keeps the last).
"""

from __future__ import annotations

from marius_py.errors import MariusInputError

EVAL_METRICS = ("mrr", "hits@1", "hits@3", "hits@10", "mean_rank")
TENSORBOARD_DIR = "tensorboard"


class TensorBoard:
    """Writes each metrics record to TensorBoard (flushed per record: a killed run keeps what it logged)."""

    def __init__(self):
        try:
            from torch.utils.tensorboard import SummaryWriter
        except ImportError:
            raise MariusInputError("training.tensorboard needs the tensorboard package", path="training.tensorboard",
                                   expected="pip install 'marius-py[tensorboard]' (or tensorboard)") from None
        self._make_writer = SummaryWriter
        self.writer = None  # opened in the run directory at the start

    def on_train_start(self, run) -> None:
        self.writer = self._make_writer(str(run.run_dir / TENSORBOARD_DIR))

    def on_record(self, run, record: dict) -> None:
        if record.get("event") == "epoch":
            step = record["epoch"]
            for key in ("loss", "edges_per_s", "seconds"):
                self.writer.add_scalar(f"train/{key}", record[key], step)
            states = record.get("states")
            if states:
                waited = sum(row["wait"] for row in states)
                total = waited + sum(row["train"] for row in states)
                self.writer.add_scalar("train/buffer_wait_share", waited / total if total else 0.0, step)
        elif record.get("event") == "eval":
            for key in EVAL_METRICS:
                self.writer.add_scalar(f"{record['split']}/{key}", record[key], record["epoch"])
        self.writer.flush()

    def on_train_end(self, run) -> None:
        self.writer.close()
