"""A full disk (ENOSPC) on a real size-limited filesystem: a clean error, the last checkpoint intact and
resumable, nothing half-written left. Needs a tmpfs mount (root, or a sandbox that allows it)."""

from __future__ import annotations

import os
import subprocess
import uuid
from pathlib import Path

import numpy as np
import pytest

import marius_py as mp
from marius_py.checkpoint import RunDirectory, load_version
from marius_py.cli import main
from marius_py.storage.manifest import verify_manifest

UMLS_RAW = Path(__file__).parent / "data" / "umls"


def mount_small_disk(mount_point: Path) -> Path:
    """A 4 MiB tmpfs at ``mount_point`` (made here); the test is skipped where mounting is refused."""
    mount_point.mkdir(parents=True, exist_ok=True)
    try:
        subprocess.run(["mount", "-t", "tmpfs", "-o", "size=4m", "tmpfs", str(mount_point)], check=True,
                       capture_output=True)
    except (OSError, subprocess.CalledProcessError) as error:
        pytest.skip(f"mounting a size-limited tmpfs is refused here ({error})")
    return mount_point


def unmount(mount_point: Path) -> None:
    subprocess.run(["umount", str(mount_point)], check=False)


@pytest.fixture
def small_disk(tmp_path):
    """A 4 MiB tmpfs; skipped where mounting is refused."""
    mount_point = mount_small_disk(tmp_path / "disk")
    yield mount_point
    unmount(mount_point)


def fill(directory, keep_bytes: int = 16 << 10):
    """Leave about ``keep_bytes`` free on the filesystem of ``directory``."""
    stat = os.statvfs(directory)
    free = stat.f_bavail * stat.f_frsize
    filler = directory / f"filler-{uuid.uuid4().hex}"
    with open(filler, "wb") as handle:
        try:
            handle.write(b"\0" * max(0, free - keep_bytes))
        except OSError:
            pass
    return filler


def test_full_disk_at_a_checkpoint_keeps_the_previous_one(small_disk, small_config, tmp_path, capsys):
    settings = ("model.dim=64",)
    run = small_disk / "run"
    mp.train(small_config("training.epochs=1", *settings), run, progress=False)
    filler = fill(small_disk)
    assert main(["train", "--resume", str(run), "training.epochs=3", "--quiet"]) == 2
    err = capsys.readouterr().err
    assert "no space left on the device" in err and "Traceback" not in err
    latest = RunDirectory(run).latest_version()
    assert latest.name == "v000001" and verify_manifest(latest) == []
    assert not any(p.name.endswith(".tmp") for p in run.rglob("*"))  # no half-written chunk or version

    filler.unlink()
    assert main(["train", "--resume", str(run), "training.epochs=3", "--quiet"]) == 0
    mp.train(small_config("training.epochs=3", *settings), tmp_path / "full", progress=False)
    np.testing.assert_array_equal(load_version(RunDirectory(run).latest_version())[0],
                                  load_version(RunDirectory(tmp_path / "full").latest_version())[0])


def test_full_disk_while_preprocessing_leaves_no_dataset(small_disk, capsys):
    fill(small_disk, keep_bytes=4 << 10)
    raw = UMLS_RAW
    assert main(["preprocess", "--train", str(raw / "train.txt"), "--valid", str(raw / "valid.txt"),
                 "--test", str(raw / "test.txt"), "-o", str(small_disk / "out")]) == 2
    assert "no space left on the device" in capsys.readouterr().err
    assert not (small_disk / "out").exists()
    assert [p.name for p in small_disk.iterdir() if p.name.startswith(".")] == []  # no staging left
