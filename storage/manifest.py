"""Checksums of every file of a committed directory (a checkpoint version), and their verification.

A version's ``MANIFEST.json`` maps each file's path (relative, '/'-separated)
to its size and BLAKE2b digest (hashlib: no extra dependency). It is written
before the version is fsynced and renamed into place, so a committed version
always carries it. Files a version shares with the previous one by hard link
(partitions training did not touch) have the same inode: their digest is taken
from the previous manifest instead of being read again. The previous version's
links keep those inodes alive, so an inode number cannot have been reused.
"""

from __future__ import annotations

import hashlib
import json
import os
from pathlib import Path

MANIFEST_FILE = "MANIFEST.json"
_READ_BYTES = 1 << 22


def file_digest(path: Path) -> str:
    digest = hashlib.blake2b(digest_size=16)
    with open(path, "rb") as handle:
        while block := handle.read(_READ_BYTES):
            digest.update(block)
    return digest.hexdigest()


def _files(root: Path) -> list[Path]:
    return sorted(p for p in root.rglob("*") if p.is_file() and p.name != MANIFEST_FILE)


def write_manifest(root: Path, previous: Path | None = None) -> None:
    """Write ``root/MANIFEST.json`` for every file below ``root``, reusing ``previous``'s digests of files
    that are hard links of the same inode."""
    known = {}
    entries = _entries(previous / MANIFEST_FILE) if previous is not None else None
    for relative, entry in (entries or {}).items():  # (an unreadable previous manifest: every file is read)
        try:
            stat = (previous / relative).stat()
        except OSError:
            continue
        known[(stat.st_dev, stat.st_ino, stat.st_size)] = entry["blake2b"]
    files = {}
    for path in _files(root):
        stat = path.stat()
        digest = known.get((stat.st_dev, stat.st_ino, stat.st_size)) or file_digest(path)
        files[path.relative_to(root).as_posix()] = {"bytes": stat.st_size, "blake2b": digest}
    (root / MANIFEST_FILE).write_text(json.dumps({"files": files}, indent=1) + "\n", encoding="utf-8")


def verify_manifest(root: Path) -> list[str]:
    """Problems of ``root`` against its manifest, one line each (empty: intact). A directory without a
    manifest (written before manifests existed) reports that it cannot be checked."""
    path = root / MANIFEST_FILE
    if not path.exists():
        return [f"{root}: no {MANIFEST_FILE} (written before checksums existed): not checked"]
    files = _entries(path)
    if files is None:
        return [f"{path}: unreadable manifest (not the JSON that a commit writes)"]
    problems = []
    for relative, entry in files.items():
        file = root / relative
        if not file.is_file():
            problems.append(f"{file}: missing")
        elif file.stat().st_size != entry["bytes"]:
            problems.append(f"{file}: {file.stat().st_size} bytes, the manifest says {entry['bytes']}")
        elif file_digest(file) != entry["blake2b"]:
            problems.append(f"{file}: checksum mismatch (the file changed after it was committed)")
    listed = set(files)
    problems += [f"{p}: not in the manifest" for p in _files(root) if p.relative_to(root).as_posix() not in listed]
    return problems


def _entries(path: Path) -> dict | None:
    """A manifest's ``files``: {relative path: {"bytes": int, "blake2b": str}}; None when the file is missing,
    unreadable or of another shape (entries with a path leaving the directory included)."""
    try:
        files = json.loads(path.read_text(encoding="utf-8"))["files"]
    except (OSError, UnicodeDecodeError, ValueError, KeyError, TypeError):
        return None
    if not isinstance(files, dict):
        return None
    for relative, entry in files.items():
        if (not isinstance(entry, dict) or not isinstance(entry.get("bytes"), int)
                or not isinstance(entry.get("blake2b"), str) or relative.startswith("/")
                or ".." in relative.split("/")):
            return None
    return files


def has_manifest(root: Path) -> bool:
    return os.path.exists(root / MANIFEST_FILE)
