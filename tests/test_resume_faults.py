"""Resume after damage to each file of a run directory: it continues from the newest intact version or
refuses with one error naming the file, and never removes a committed version that no normal commit
superseded.

The run: three epochs on UMLS (validation every 2 epochs: best v000002, latest v000003, the two versions
the commit protocol keeps), then a resume whose commit of v000004 was cut between the rename and the
pointer bump, so checkpoints/ also holds a complete version that was never committed.
"""

from __future__ import annotations

import hashlib
import json
import shutil
from pathlib import Path

import pytest

from marius_py.checkpoint import RunDirectory
from marius_py.cli import main

UMLS_RAW = Path(__file__).parent / "data" / "umls"
SETTINGS = [f"dataset.path={UMLS_RAW}", "training.device=cpu", "model.dim=8", "training.num_negatives=16",
            "evaluation.every=2", "training.epochs=3"]
RESUME_TO = 5
COMMITTED = ("v000002", "v000003")  # best and latest


def first_chunk(version: Path) -> Path:
    return next(p for p in sorted((version / "nodes").rglob("*")) if p.is_file() and p.stat().st_size > 100)


def flip(path: Path, offset: int = 10) -> None:
    data = bytearray(path.read_bytes())
    data[min(offset, len(data) - 1)] ^= 0xFF
    path.write_bytes(bytes(data))


def write(text: str):
    return lambda path: path.write_text(text)


def edit_config(change):
    return lambda path: path.write_text(change(path.read_text()))


# name -> (file relative to the run directory, what is done to it, expected outcome):
#   ("continues", E): the resume trains on from the version of epoch E (3: latest; 4: the complete version the
#                     recovery found on disk); ("refuses", F): exit 2, one message containing F (or every
#                     string of a tuple F), and nothing changed.
# A damaged best version (v000002) is refused before training, like a damaged latest one (the resume would
# otherwise find it only at the final test, or drop it and let the next commit delete it).
DAMAGED_BEST = "POINTERS.json: best names v000002, which is damaged: "
FAULTS = {
    "pointers_missing": ("checkpoints/POINTERS.json", Path.unlink, ("continues", 4)),
    "pointers_not_json": ("checkpoints/POINTERS.json", write("{latest: v3"), ("continues", 4)),
    "pointers_wrong_shape": ("checkpoints/POINTERS.json", write('["v000003"]\n'), ("continues", 4)),
    "pointers_escaping_name": ("checkpoints/POINTERS.json", write('{"latest": "../../elsewhere"}'),
                               ("continues", 4)),
    "pointers_best_newer_than_latest": ("checkpoints/POINTERS.json",
                                        write('{"latest": "v000002", "best": "v000003"}'), ("continues", 4)),
    "pointers_name_a_missing_version": ("checkpoints/POINTERS.json", write('{"latest": "v000009"}'),
                                        ("continues", 4)),
    "pointers_best_missing": ("checkpoints/POINTERS.json", write('{"latest": "v000003", "best": "v000001"}'),
                              ("continues", 3)),
    "pointers_empty": ("checkpoints/POINTERS.json", write(""), ("continues", 4)),
    "latest_manifest_missing": ("checkpoints/v000003/MANIFEST.json", Path.unlink,
                                ("refuses", "v000003/MANIFEST.json: missing")),
    "latest_manifest_garbage": ("checkpoints/v000003/MANIFEST.json", write("{\"files\": 3}"),
                                ("refuses", "v000003/MANIFEST.json: unreadable manifest")),
    "latest_state_missing": ("checkpoints/v000003/state.json", Path.unlink,
                             ("refuses", "v000003/state.json: missing")),
    "latest_state_flipped": ("checkpoints/v000003/state.json", flip,
                             ("refuses", "v000003/state.json: checksum mismatch")),
    "latest_model_missing": ("checkpoints/v000003/model.pt", Path.unlink, ("refuses", "v000003/model.pt: missing")),
    "latest_model_flipped": ("checkpoints/v000003/model.pt", flip,
                             ("refuses", "v000003/model.pt: checksum mismatch")),
    "latest_chunk_flipped": ("checkpoints/v000003", lambda v: flip(first_chunk(v), 50),
                             ("refuses", "checksum mismatch")),
    "latest_chunk_truncated": ("checkpoints/v000003", lambda v: first_chunk(v).write_bytes(b"\0" * 8),
                               ("refuses", "8 bytes, the manifest says")),
    "best_manifest_missing": ("checkpoints/v000002/MANIFEST.json", Path.unlink,
                              ("refuses", (DAMAGED_BEST, "v000002/MANIFEST.json: missing"))),
    "best_model_flipped": ("checkpoints/v000002/model.pt", flip,
                           ("refuses", (DAMAGED_BEST, "v000002/model.pt: checksum mismatch"))),
    "best_chunk_flipped": ("checkpoints/v000002", lambda v: flip(first_chunk(v), 50),
                           ("refuses", (DAMAGED_BEST, "v000002/nodes/", "checksum mismatch"))),
    "best_removed_after_damage": ("checkpoints/v000002", shutil.rmtree, ("continues", 3)),  # (what the refusal says)
    "leftover_version_flipped_without_pointers": (
        "checkpoints", lambda c: (flip(first_chunk(c / "v000004"), 50), (c / "POINTERS.json").unlink()),
        ("refuses", "POINTERS.json: missing, and the newest version, v000004, is damaged")),
    "stray_folder_in_checkpoints": ("checkpoints", lambda c: (c / "backup").mkdir() or
                                    (c / "backup" / "notes.txt").write_text("mine\n"), ("continues", 3)),
    "metrics_missing": ("metrics.jsonl", Path.unlink, ("continues", 3)),
    "metrics_torn_last_line": ("metrics.jsonl", lambda p: p.write_bytes(p.read_bytes() + b'{"epoch": 4, "lo'),
                               ("continues", 3)),
    "metrics_garbage_line": ("metrics.jsonl", lambda p: p.write_text("x" + p.read_text()),
                             ("refuses", "metrics.jsonl:1: not a JSON line")),
    "config_missing": ("config.yaml", Path.unlink, ("refuses", "config.yaml: missing")),
    "config_not_yaml": ("config.yaml", write("model:\n\tdim: 8\n"), ("refuses", "config.yaml:2: not valid YAML")),
    "config_other_model": ("config.yaml", edit_config(lambda text: text.replace("dim: 8", "dim: 12")),
                           ("refuses", "different model or dataset")),
}


def snapshot(root: Path) -> dict[str, str]:
    return {p.relative_to(root).as_posix(): hashlib.blake2b(p.read_bytes(), digest_size=8).hexdigest()
            for p in sorted(root.rglob("*")) if p.is_file()}


@pytest.fixture(scope="module")
def damaged_base(tmp_path_factory) -> Path:
    """Committed: v000002 (best), v000003 (latest); on disk, never committed: v000004."""
    run = tmp_path_factory.mktemp("faults") / "run"
    assert main(["train", *SETTINGS, "--run-dir", str(run), "--quiet"]) == 0
    pointers = json.loads((run / "checkpoints" / "POINTERS.json").read_text())
    assert pointers == {"latest": "v000003", "best": "v000002"}, pointers

    import marius_py.checkpoint as checkpoint
    original = checkpoint.fsync_directory

    def killed_after_the_rename(path):
        raise KeyboardInterrupt
    checkpoint.fsync_directory = killed_after_the_rename
    try:
        assert main(["train", "--resume", str(run), "training.epochs=4", "--quiet"]) == 130  # (interrupted)
    finally:
        checkpoint.fsync_directory = original
    assert (run / "checkpoints" / "v000004" / "MANIFEST.json").exists()
    assert json.loads((run / "checkpoints" / "POINTERS.json").read_text()) == pointers
    return run


def epochs_logged(run: Path) -> list[int]:
    return [r["epoch"] for r in RunDirectory(run).read_metrics() if r.get("event") == "epoch"]


@pytest.mark.parametrize("fault", sorted(FAULTS))
def test_resume_after_damage_continues_or_names_the_file(fault, damaged_base, tmp_path, capsys):
    run = tmp_path / "run"
    shutil.copytree(damaged_base, run)
    target, damage, (outcome, detail) = FAULTS[fault]
    damage(run / target)
    checkpoints_before = snapshot(run / "checkpoints")
    run_before = snapshot(run)

    code = main(["train", "--resume", str(run), f"training.epochs={RESUME_TO}", "--quiet"])
    err = capsys.readouterr().err
    assert "Traceback" not in err

    if outcome == "refuses":  # one message naming the file; nothing changed: no committed file, log, config
        assert code == 2, err
        assert all(part in err for part in (detail if isinstance(detail, tuple) else (detail,))), err
        assert err.count("marius-py: error:") == 1, err
        assert snapshot(run / "checkpoints") == checkpoints_before
        assert {k: v for k, v in snapshot(run).items() if k != "LOCK"} == \
               {k: v for k, v in run_before.items() if k != "LOCK"}
        return

    assert code == 0, err
    pointers = json.loads((run / "checkpoints" / "POINTERS.json").read_text())  # sound again
    assert pointers["latest"] == f"v{RESUME_TO:06d}"
    resumed_from = detail
    logged = epochs_logged(run)
    assert logged == sorted(set(logged)) and logged[-1] == RESUME_TO
    # The epochs trained now follow the version it resumed from (v000004 never logged its epoch: its commit
    # was cut before the log line).
    assert [e for e in logged if e > 3] == list(range(resumed_from + 1, RESUME_TO + 1))
    assert ("recovered from the versions" in err) == (resumed_from == 4)

    # No committed version is gone unless a newer commit superseded it (it is then not referenced), and one
    # that is still there is byte for byte what it was.
    after = snapshot(run / "checkpoints")
    for version in COMMITTED:
        files = {k: v for k, v in checkpoints_before.items() if k.startswith(version + "/")}
        if (run / "checkpoints" / version).exists():
            assert {k: v for k, v in after.items() if k.startswith(version + "/")} == files
        else:
            assert version not in pointers.values() and version < pointers["latest"]
    # Anything in checkpoints/ not named like a version is left alone.
    assert {k: v for k, v in after.items() if k.startswith("backup/")} == \
           {k: v for k, v in checkpoints_before.items() if k.startswith("backup/")}


def test_info_and_verify_read_a_run_without_its_pointer_file(damaged_base, tmp_path, capsys):
    """Read-only commands see what a resume would recover, and write nothing."""
    run = tmp_path / "run"
    shutil.copytree(damaged_base, run)
    (run / "checkpoints" / "POINTERS.json").unlink()
    before = snapshot(run)
    assert main(["info", str(run)]) == 0
    info = json.loads(capsys.readouterr().out)
    # (epoch 4's validation MRR, .51, beat epoch 2's, .41: v000004's state.json names itself the best)
    assert json.loads((run / "checkpoints" / "v000004" / "state.json").read_text())["best_epoch"] == 4
    assert info["latest"].endswith("v000004") and info["best"].endswith("v000004")
    assert "POINTERS.json: missing" in info["recovered"] and info["committed"]["epoch"] == 4
    assert main(["verify", str(run)]) == 0
    out = capsys.readouterr().out
    assert "v000002: intact" in out and "v000004: intact" in out and "recovered from the versions" in out
    flip(first_chunk(run / "checkpoints" / "v000004"), 50)
    before = snapshot(run)
    assert main(["verify", str(run)]) == 2
    captured = capsys.readouterr()
    assert "v000004:" in captured.out and "checksum mismatch" in captured.out and "v000003: intact" in captured.out
    assert "the newest version, v000004, is damaged" in captured.err
    assert snapshot(run) == before
