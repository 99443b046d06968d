"""A corpus of full disks through the command line: every command that writes (preprocess, export in each
format, plot, train re-bucketing or preprocessing into the cache, tune creating its study), each on a real 4 MiB tmpfs filled at a
level of its own. Each must exit with status 2 and one message that says there is no space, names the
place and the space needed (no traceback); leave nothing temporary, partial or hidden on the disk; and
change no file that was there before (a run's checkpoints and plots, an earlier export).

Commands run in subprocesses: a crash (HDF5's segmentation fault, a memory map's bus error) would kill
pytest itself. They run a few at a time, each on its own disk, to keep the module fast.
"""

from __future__ import annotations

import hashlib
import os
import re
import shlex
import shutil
import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import NamedTuple

import pytest

from marius_py.cli import main
from test_disk_full import UMLS_RAW, fill, mount_small_disk, unmount


class DiskCase(NamedTuple):
    command: str  # marius-py's arguments: {disk} is the full disk; {run}, {dataset}, {raw}, {tmp} are elsewhere
    keep_bytes: int  # left free on the disk before the command
    names: str  # the place the message must name
    on_disk: str = ""  # on the disk first: "run" (a trained run, its plots too) or "export" (an earlier npy one)
    size_check: bool = True  # False: export skips its size check, so the full disk is met inside the writers


FILES = "--train {raw}/train.txt --valid {raw}/valid.txt --test {raw}/test.txt"
TRAIN_SETTINGS = "training.device=cpu model.dim=8 training.epochs=1"
TRAIN = f"train {TRAIN_SETTINGS} --quiet"
CACHE = "{disk}/cache/datasets"  # where train preprocesses or re-buckets a dataset ($MARIUS_PY_CACHE on the disk)

CASES = {
    # preprocess: a dataset's edges.h5 takes ~4.5 MiB (a 1.5 MiB HDF5 chunk a split), more than the disk
    "preprocess_files_at_once": DiskCase(f"preprocess {FILES} -o {{disk}}/out", 4096, "{disk}/out"),
    "preprocess_files_in_the_edges": DiskCase(f"preprocess {FILES} -o {{disk}}/out", 200_000, "{disk}/out"),
    "preprocess_files_late": DiskCase(f"preprocess {FILES} -o {{disk}}/out", 3_500_000, "{disk}/out"),
    "preprocess_split": DiskCase("preprocess --train {raw}/train.txt -o {disk}/out", 65536, "{disk}/out"),
    "preprocess_split_four_partitions": DiskCase("preprocess --train {raw}/train.txt --partitions 4 -o {disk}/out",
                                                 600_000, "{disk}/out"),
    "preprocess_split_four_partitions_late": DiskCase(
        "preprocess --train {raw}/train.txt --partitions 4 -o {disk}/out", 2_500_000, "{disk}/out"),
    # export: h5 and npy know their size and refuse first; tsv meets the full disk as it writes
    "export_h5": DiskCase("export {run} --format h5 -o {disk}/out", 8192, "{disk}/out"),
    "export_npy": DiskCase("export {run} --format npy -o {disk}/out", 4096, "{disk}/out"),
    "export_tsv": DiskCase("export {run} --format tsv -o {disk}/out", 8192, "{disk}/out"),
    "export_h5_inside_hdf5": DiskCase("export {run} --format h5 -o {disk}/out", 12288, "{disk}/out",
                                      size_check=False),
    "export_npy_inside_the_writes": DiskCase("export {run} --format npy -o {disk}/out", 12288, "{disk}/out",
                                             size_check=False),
    "export_h5_into_the_run": DiskCase("export {disk}/run --format h5", 8192, "{disk}/run/export-h5", on_disk="run"),
    "export_tsv_into_the_run": DiskCase("export {disk}/run --format tsv", 4096, "{disk}/run/export-tsv",
                                        on_disk="run"),
    "export_h5_over_an_export": DiskCase("export {run} --format h5 -o {disk}/out --overwrite", 8192, "{disk}/out",
                                         on_disk="export", size_check=False),
    "export_tsv_over_an_export_no_space_at_all": DiskCase("export {run} --format tsv -o {disk}/out --overwrite", 0,
                                                          "{disk}/out", on_disk="export"),
    # plot: every PNG is drawn first, written only where all fit
    "plot": DiskCase("plot {run} -o {disk}/plots", 20000, "{disk}/plots"),
    "plot_over_earlier_plots": DiskCase("plot {disk}/run", 16384, "{disk}/run/plots", on_disk="run"),
    # train: the dataset it needs is written into the cache first
    "train_rebucketing_into_the_cache": DiskCase(f"{TRAIN} dataset.path={{dataset}} --partitions 4 "
                                                 "--run-dir {tmp}/run", 300_000, CACHE),
    "train_preprocessing_into_the_cache": DiskCase(f"{TRAIN} dataset.path={{raw}} --run-dir {{tmp}}/run", 8192,
                                                   CACHE),
    # tune: its study (SQLite) and the lock of its search directory
    "tune_creating_its_study": DiskCase(f"tune dataset.path={{dataset}} {TRAIN_SETTINGS} --space {{space}} --trials 1 "
                                        "--run-dir {disk}/search", 50_000, "{disk}/search"),
    "tune_with_no_byte_free": DiskCase(f"tune dataset.path={{dataset}} {TRAIN_SETTINGS} --space {{space}} --trials 1 "
                                       "--run-dir {disk}/search", 0, "{disk}/search"),
}
NEW_ON_DISK = {"cache", "cache/datasets"}  # the only entries a failed command may add: the cache's folders
# Export with its size check skipped: the full disk is met inside the HDF5 and npy writers.
UNCHECKED_EXPORT = ("import sys, marius_py.export as export; export._export_bytes = lambda *args: None; "
                    "from marius_py.cli import main; sys.exit(main(sys.argv[1:]))")


class Outcome(NamedTuple):
    code: int
    err: str
    before: dict[str, str | None]  # path on the disk -> digest (None: a folder)
    after: dict[str, str | None]
    names: str


def test_corpus_has_ten_cases():
    assert len(CASES) >= 10


@pytest.fixture(scope="module")
def places(tmp_path_factory, umls_dataset):
    """A trained run (with its plots) and an npy export of it, off the small disks, made once."""
    tmp = tmp_path_factory.mktemp("disk-corpus")
    run, export = tmp / "run", tmp / "export"
    assert main(shlex.split(TRAIN) + [f"dataset.path={umls_dataset}", "--run-dir", str(run)]) == 0
    assert main(["plot", str(run)]) == 0
    assert main(["export", str(run), "--format", "npy", "-o", str(export)]) == 0
    space = tmp / "space.yaml"
    space.write_text("training.lr: [0.1, 0.2]\n")
    return {"tmp": tmp, "run": run, "export": export, "dataset": umls_dataset, "raw": UMLS_RAW, "space": space}


@pytest.fixture(scope="module")
def outcomes(places, tmp_path_factory) -> dict[str, Outcome]:
    """Every case run on its own full disk, three at a time."""
    disks = {name: mount_small_disk(tmp_path_factory.mktemp("disk") / name) for name in CASES}
    try:
        with ThreadPoolExecutor(3) as pool:
            futures = {name: pool.submit(run_case, CASES[name], disks[name], places) for name in CASES}
            return {name: future.result() for name, future in futures.items()}
    finally:
        for disk in disks.values():
            unmount(disk)


def run_case(case: DiskCase, disk: Path, places: dict) -> Outcome:
    tmp = places["tmp"] / f"case-{disk.name}"
    if case.on_disk:
        shutil.copytree(places[case.on_disk], disk / ("run" if case.on_disk == "run" else "out"))
    filler = fill(disk, case.keep_bytes)
    before = snapshot(disk, filler)
    fields = {**places, "disk": disk, "tmp": tmp}
    python = [sys.executable] + (["-m", "marius_py"] if case.size_check else ["-c", UNCHECKED_EXPORT])
    done = subprocess.run(python + shlex.split(case.command.format(**fields)), capture_output=True, text=True,
                          env={**os.environ, "MARIUS_PY_CACHE": str(disk / "cache")}, timeout=300)
    return Outcome(done.returncode, done.stderr, before, snapshot(disk, filler), case.names.format(**fields))


def snapshot(disk: Path, filler: Path) -> dict[str, str | None]:
    """Everything on the disk but the filler: relative path -> the file's digest, None for a folder."""
    return {str(path.relative_to(disk)): None if path.is_dir() else hashlib.sha256(path.read_bytes()).hexdigest()
            for path in disk.rglob("*") if path != filler}


@pytest.mark.parametrize("name", sorted(CASES))
def test_full_disk_is_one_clean_error(name, outcomes):
    outcome = outcomes[name]
    errors = [line for line in outcome.err.splitlines() if line.startswith("marius-py: error:")]
    assert outcome.code == 2, outcome.err  # (139: a segmentation fault, 135: a bus error)
    assert len(errors) == 1 and "Traceback" not in outcome.err and "Exception ignored" not in outcome.err, outcome.err
    assert "no space left on the device" in errors[0] and outcome.names in errors[0], errors[0]
    assert re.search(r"needs (about|more than the) [\d.]+ (B|KiB|MiB)", errors[0]), errors[0]
    assert {path: outcome.after.get(path) for path in outcome.before} == outcome.before  # nothing changed
    assert set(outcome.after) - set(outcome.before) <= NEW_ON_DISK  # nothing temporary, partial or hidden
