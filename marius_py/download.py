"""Fetching a registered dataset's files into the cache: resumed after a cut, checked, never half-kept.

Each file goes to ``$MARIUS_PY_CACHE/downloads/NAME/``. It is written as ``FILE.part`` (a cut download
resumes from there with an HTTP range request, when the server allows it) and renamed once complete and
checked: against the entry's published SHA-256 where it has one, else against the digest its first
download recorded (``FILE.sha256``), so a file that changed upstream or in the cache is refused rather than
used. ``$MARIUS_PY_MIRROR`` (a base URL) is tried before the entry's URLs: ``$MARIUS_PY_MIRROR/NAME/FILE``.
Without the internet, ``source`` (``--from``) names an archive or a directory fetched on another machine,
and ``offline`` (``--offline``, or ``$MARIUS_PY_OFFLINE=1``) fetches nothing.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import sys
import time
import urllib.error
import urllib.request
from pathlib import Path

from marius_py.dataset_cache import cache_dir
from marius_py.catalog import DatasetSource, Download
from marius_py.errors import MariusInputError
from marius_py.storage.durable import reporting_full_disk, write_text_atomic

MIRROR_VARIABLE = "MARIUS_PY_MIRROR"
OFFLINE_VARIABLE = "MARIUS_PY_OFFLINE"
ATTEMPTS = 3          # per URL: a cut connection resumes where it stopped
TIMEOUT_SECONDS = 60  # without a byte
_BLOCK = 1 << 20


class _Cut(Exception):
    """A response that ended before its announced length."""


def offline_by_default() -> bool:
    return os.environ.get(OFFLINE_VARIABLE, "").strip().lower() in ("1", "true", "yes")


def downloads_dir(name: str) -> Path:
    return cache_dir() / "downloads" / name


def fetch_files(name: str, entry: DatasetSource, offline: bool = False, source: Path | None = None,
                progress: bool = True) -> dict[str, Path]:
    """Every download of ``entry`` in the cache, checked: filename -> path."""
    directory = downloads_dir(name)
    directory.mkdir(parents=True, exist_ok=True)
    if any(not (directory / d.filename).is_file() for d in entry.downloads):
        _say_license(name, entry, progress)
    return {d.filename: _obtain(name, d, directory, offline or offline_by_default(), source, progress)
            for d in entry.downloads}


def _say_license(name: str, entry: DatasetSource, progress: bool) -> None:
    """Before fetching: the dataset's license, always where it restricts use."""
    if entry.restricts_use:
        print(f"note: {name} is licensed for restricted use only: {entry.license}. Fetching it means you accept "
              f"its terms ({entry.homepage or 'see its source'}).", file=sys.stderr)
    elif progress and entry.license:
        print(f"fetching {name} (license: {entry.license})", file=sys.stderr)


def _obtain(name: str, download: Download, directory: Path, offline: bool, source: Path | None,
            progress: bool) -> Path:
    target = directory / download.filename
    if target.is_file():
        _check_digest(name, download, target, directory, fresh=False)
        return target
    if source is not None:
        _copy_from(name, download, Path(source).expanduser(), target)
    elif offline:
        raise MariusInputError(f"dataset {name}: {download.filename} is not in the cache and downloads are off "
                               f"(--offline or {OFFLINE_VARIABLE})", path=target,
                               expected=f"--from PATH naming {download.filename} or a directory holding it "
                                        f"(fetched elsewhere from {download.url}), or a run with downloads on")
    else:
        _download(name, download, target, progress)
    _check_digest(name, download, target, directory, fresh=True)
    return target


def _copy_from(name: str, download: Download, source: Path, target: Path) -> None:
    """Copy ``download`` from ``source`` (the file itself, or a directory holding it) into the cache."""
    found = source / download.filename if source.is_dir() else source
    if not found.is_file() or (not source.is_dir() and found.name != download.filename):
        raise MariusInputError(f"dataset {name}: --from has no {download.filename}", path=source,
                               expected=f"the file {download.filename} (from {download.url}) or a directory "
                                        "holding it")
    partial = target.with_name(target.name + ".part")
    shutil.copyfile(found, partial)
    os.replace(partial, target)


def candidate_urls(name: str, download: Download) -> list[str]:
    mirror = os.environ.get(MIRROR_VARIABLE, "").strip().rstrip("/")
    return ([f"{mirror}/{name}/{download.filename}"] if mirror else []) + list(download.urls)


def _download(name: str, download: Download, target: Path, progress: bool) -> None:
    """Fetch ``download`` into ``target`` through ``FILE.part`` (kept after a failure: the next attempt
    resumes it); a full disk is one ``DiskFullError`` at once, naming the cache and the file's size."""
    partial = target.with_name(target.name + ".part")
    failures = []
    for url in candidate_urls(name, download):
        for attempt in range(ATTEMPTS):
            try:
                with reporting_full_disk(f"downloading {download.filename} of {name}", target.parent,
                                         download.size):
                    _fetch_into(url, partial, download.filename, progress)
                os.replace(partial, target)
                return
            except (urllib.error.URLError, OSError, _Cut) as error:
                if isinstance(error, urllib.error.HTTPError):
                    reason = f"HTTP {error.code} {error.reason}"
                else:
                    reason = getattr(error, "reason", None) or error
                failures.append(f"{url}: {reason}")
                if isinstance(error, urllib.error.HTTPError) and error.code in (403, 404, 410):
                    break  # (this URL will not serve it: the next one)
                time.sleep(min(2 ** attempt, 5) if attempt + 1 < ATTEMPTS else 0)
    raise MariusInputError(f"dataset {name}: cannot download {download.filename} ({failures[-1]})",
                           path=partial, expected=f"a reachable {download.url} (or ${MIRROR_VARIABLE}), or "
                                                  f"--from PATH holding {download.filename} fetched elsewhere; "
                                                  "what was fetched is kept and resumed next time")


def _fetch_into(url: str, partial: Path, label: str, progress: bool) -> None:
    """Append the rest of ``url`` to ``partial`` (from its current size; from 0 where the server ignores the
    range), raising ``_Cut`` where the response ends early."""
    from tqdm import tqdm
    have = partial.stat().st_size if partial.exists() else 0
    headers = {"User-Agent": "marius-py"}
    if have:
        headers["Range"] = f"bytes={have}-"
    try:
        response = urllib.request.urlopen(urllib.request.Request(url, headers=headers), timeout=TIMEOUT_SECONDS)
    except urllib.error.HTTPError as error:
        if error.code == 416 and have:  # (nothing left past what we have: the server says we have it all)
            return
        raise
    with response:
        resumed = have and getattr(response, "status", None) == 206
        if not resumed:
            have = 0
        length = response.headers.get("Content-Length")
        total = have + int(length) if length is not None else None
        with open(partial, "ab" if resumed else "wb") as out, \
                tqdm(total=total, initial=have, unit="B", unit_scale=True, desc=label, disable=not progress,
                     leave=False) as bar:
            while block := response.read(_BLOCK):
                out.write(block)
                bar.update(len(block))
            out.flush()
            os.fsync(out.fileno())
    if total is not None and partial.stat().st_size != total:
        raise _Cut(f"ended after {partial.stat().st_size:,} of {total:,} bytes")


def file_digests(path: Path, md5: bool = False) -> tuple[str, str | None]:
    """(SHA-256, MD5 where asked) of a file, in one read."""
    digests = [hashlib.sha256()] + ([hashlib.md5(usedforsecurity=False)] if md5 else [])
    with open(path, "rb") as handle:
        while block := handle.read(1 << 24):
            for digest in digests:
                digest.update(block)
    return digests[0].hexdigest(), digests[1].hexdigest() if md5 else None


def _check_digest(name: str, download: Download, path: Path, directory: Path, fresh: bool) -> str:
    """The file's SHA-256, checked against the published one or the one its first download recorded (a
    mismatching file is removed, so the next attempt fetches it again). A file already in the cache is
    hashed once per version: the digest is remembered with its size, inode and times; a ``fresh`` one
    (just fetched: the clock may not have moved) always."""
    status = path.stat()
    stamp = {"size": status.st_size, "inode": status.st_ino, "mtime_ns": status.st_mtime_ns,
             "ctime_ns": status.st_ctime_ns}
    memo = directory / f"{download.filename}.sha256"
    recorded = _read_memo(memo)
    if not fresh and recorded is not None and recorded.get("stamp") == stamp:
        digest = recorded["sha256"]
    else:
        digest, md5 = file_digests(path, md5=download.md5 is not None)
        if md5 is not None and md5 != download.md5:
            path.unlink()
            raise MariusInputError(f"dataset {name}: {download.filename} has MD5 {md5}, not the published "
                                   f"{download.md5}; removed it", path=path,
                                   expected=f"the file {download.url} serves (fetch it again)")
    expected = download.sha256 or (recorded or {}).get("sha256")
    if expected is not None and digest != expected:
        path.unlink()
        whose = "published" if download.sha256 else "recorded by its first download"
        raise MariusInputError(f"dataset {name}: {download.filename} has SHA-256 {digest}, not the {whose} "
                               f"{expected}; removed it", path=path,
                               expected=f"the file {download.url} serves (fetch again; if the source changed, "
                                        f"delete {memo} to accept the new file)")
    write_text_atomic(memo, json.dumps({"sha256": digest, "stamp": stamp}) + "\n")
    return digest


def _read_memo(memo: Path) -> dict | None:
    try:
        recorded = json.loads(memo.read_text(encoding="utf-8"))
        return recorded if isinstance(recorded, dict) and isinstance(recorded.get("sha256"), str) else None
    except (OSError, ValueError):
        return None


def recorded_digests(name: str, entry: DatasetSource) -> dict[str, str]:
    """filename -> SHA-256 of each download in the cache (as checked)."""
    directory = downloads_dir(name)
    return {d.filename: (_read_memo(directory / f"{d.filename}.sha256") or {}).get("sha256", "")
            for d in entry.downloads}
