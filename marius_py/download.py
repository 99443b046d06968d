"""Fetching a registered dataset's files into the cache: resumed after a cut, checked, never half-kept.

Each file goes to ``$MARIUS_PY_CACHE/downloads/NAME/``. It is written as ``FILE.part`` (a cut download
resumes from there with an HTTP range request, when the server allows it and the file it serves has not
changed) and renamed once complete and checked: against the entry's published SHA-256 (and MD5) where it
has one, else against the digest recorded for the file (``FILE.sha256``). A recorded digest is binding
once a dataset was prepared from the file (``confirm_digests``): a file that changed upstream or in the
cache is then refused rather than used; until then a fetch that differs replaces it (a first download
that was cut short must not bar the right file). One process at a time fetches a file (``FILE.lock``).
``$MARIUS_PY_MIRROR`` (a base URL) is tried before the entry's URLs: ``$MARIUS_PY_MIRROR/NAME/FILE``.
Without the internet, ``source`` (``--from``) names the file or a directory holding it, fetched on another
machine, and ``offline`` (``--offline``, or ``$MARIUS_PY_OFFLINE=1``) fetches nothing.
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import http.client
import json
import os
import re
import shutil
import sys
import time
import urllib.error
import urllib.request
from pathlib import Path

from marius_py.catalog import DatasetSource, Download
from marius_py.dataset_cache import cache_dir
from marius_py.errors import MariusInputError
from marius_py.storage.durable import is_disk_full, reporting_full_disk, write_atomic, write_text_atomic

MIRROR_VARIABLE = "MARIUS_PY_MIRROR"
OFFLINE_VARIABLE = "MARIUS_PY_OFFLINE"
ATTEMPTS = 3          # per URL: a cut connection resumes where it stopped
TIMEOUT_SECONDS = 60  # without a byte
_BLOCK = 1 << 20
_NETWORK_ERRORS = (urllib.error.URLError, http.client.HTTPException, OSError)


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
    offline = offline or offline_by_default()
    if source is None and not offline and any(not (directory / d.filename).is_file() for d in entry.downloads):
        _say_license(name, entry, progress)
    return {d.filename: _obtain(name, d, directory, offline, source, progress) for d in entry.downloads}


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
    with _locked(directory / f"{download.filename}.lock"):
        if target.is_file():
            _check_digest(name, download, target, directory, fresh=False)
            return target
        if source is not None:
            _copy_from(name, download, Path(source).expanduser(), target)
        elif offline:
            raise MariusInputError(f"dataset {name}: {download.filename} is not in the cache and downloads are "
                                   f"off (--offline or {OFFLINE_VARIABLE})", path=target,
                                   expected=f"--from PATH naming {download.filename} or a directory holding it "
                                            f"(fetched elsewhere from {download.url}), or a run with downloads on")
        else:
            _download(name, download, target, progress)
        _check_digest(name, download, target, directory, fresh=True)
        return target


@contextlib.contextmanager
def _locked(path: Path):
    """An exclusive lock on ``path`` for the block: runs started together fetch a file once, in turn."""
    with open(path, "a") as handle:
        fcntl.flock(handle, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(handle, fcntl.LOCK_UN)


def _copy_from(name: str, download: Download, source: Path, target: Path) -> None:
    """Copy ``download`` from ``source`` (the file itself, or a directory holding it) into the cache."""
    found = source / download.filename if source.is_dir() else source
    if not found.is_file() or (not source.is_dir() and found.name != download.filename):
        raise MariusInputError(f"dataset {name}: --from has no {download.filename}", path=source,
                               expected=f"the file {download.filename} (from {download.url}) or a directory "
                                        "holding it")
    with reporting_full_disk(f"copying {download.filename} of {name}", target.parent, found.stat().st_size), \
            open(found, "rb") as reader:
        write_atomic(target, lambda out: shutil.copyfileobj(reader, out, 1 << 22))


def candidate_urls(name: str, download: Download) -> list[str]:
    mirror = os.environ.get(MIRROR_VARIABLE, "").strip().rstrip("/")
    return ([f"{mirror}/{name}/{download.filename}"] if mirror else []) + list(download.urls)


def _download(name: str, download: Download, target: Path, progress: bool) -> None:
    """Fetch ``download`` into ``target`` through ``FILE.part`` (kept after a failure: the next attempt
    resumes it from the same URL); a full disk is one ``DiskFullError`` at once, the part removed."""
    partial = target.with_name(target.name + ".part")
    failures = []
    for url in candidate_urls(name, download):
        for attempt in range(ATTEMPTS):
            try:
                with reporting_full_disk(f"downloading {download.filename} of {name}", target.parent,
                                         download.size):
                    try:
                        _fetch_into(url, partial, download.filename, progress)
                    except OSError as error:
                        if is_disk_full(error):  # (nothing half-fetched is kept where nothing fits)
                            _forget_part(partial)
                        raise
                _forget_part(partial, keep=True)
                os.replace(partial, target)
                return
            except (*_NETWORK_ERRORS, _Cut) as error:
                failures.append(f"{url}: {_reason(error)}")
                if isinstance(error, urllib.error.HTTPError) and error.code in (403, 404, 410):
                    break  # (this URL will not serve it: the next one)
                time.sleep(min(2 ** attempt, 5) if attempt + 1 < ATTEMPTS else 0)
    shown = "; ".join(dict.fromkeys(failures))
    raise MariusInputError(f"dataset {name}: cannot download {download.filename} ({shown})", path=partial,
                           expected=f"a reachable {download.url} (or ${MIRROR_VARIABLE}), or --from PATH holding "
                                    f"{download.filename} fetched elsewhere (--offline then fetches nothing); "
                                    "what was fetched is kept and resumed next time")


def _reason(error: BaseException) -> str:
    if isinstance(error, urllib.error.HTTPError):
        return f"HTTP {error.code} {error.reason}"
    return str(getattr(error, "reason", None) or error) or type(error).__name__


def _part_source(partial: Path) -> Path:
    return partial.with_name(partial.name + ".source")


def _forget_part(partial: Path, keep: bool = False) -> None:
    """Remove a part (unless ``keep``: it is complete) and the note of where it came from."""
    if not keep:
        partial.unlink(missing_ok=True)
    _part_source(partial).unlink(missing_ok=True)


def _fetch_into(url: str, partial: Path, label: str, progress: bool) -> None:
    """Append the rest of ``url`` to ``partial``: from its current size where it came from the same URL and
    the server says the file is unchanged (``If-Range``, ``Content-Range``), else from the start. Raises
    ``_Cut`` where the response ends early."""
    from tqdm import tqdm
    have, validator = _resumable(partial, url)
    headers = {"User-Agent": "marius-py"}
    if have:
        headers["Range"] = f"bytes={have}-"
        if validator:
            headers["If-Range"] = validator
    try:
        response = urllib.request.urlopen(urllib.request.Request(url, headers=headers), timeout=TIMEOUT_SECONDS)
    except urllib.error.HTTPError as error:
        if error.code == 416 and have and _total_of(error.headers.get("Content-Range")) == have:
            return  # (the part is the whole file)
        if error.code == 416:
            _forget_part(partial)
        raise
    with response:
        resumed = have and getattr(response, "status", None) == 206 and \
            _start_of(response.headers.get("Content-Range")) == have
        if not resumed:
            have = 0
        write_text_atomic(_part_source(partial), json.dumps({"url": url, "validator": _validator_of(response)}))
        length = _length_of(response.headers.get("Content-Length"))
        total = have + length if length is not None else None
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


def _resumable(partial: Path, url: str) -> tuple[int, str | None]:
    """(bytes to resume from, the validator to send) for a part fetched from ``url``; (0, None) otherwise."""
    try:
        noted = json.loads(_part_source(partial).read_text(encoding="utf-8"))
        have = partial.stat().st_size
    except (OSError, ValueError):
        return 0, None
    if not isinstance(noted, dict) or noted.get("url") != url:
        return 0, None  # (bytes from another URL are not spliced with these)
    return have, noted.get("validator")


def _validator_of(response) -> str | None:
    etag = response.headers.get("ETag")
    return etag if etag and not etag.startswith("W/") else response.headers.get("Last-Modified")


def _length_of(value: str | None) -> int | None:
    try:
        return int(value) if value is not None and int(value) >= 0 else None
    except ValueError:
        return None


def _start_of(content_range: str | None) -> int | None:
    match = re.fullmatch(r"\s*bytes\s+(\d+)-\d+/(\d+|\*)\s*", content_range or "")
    return int(match.group(1)) if match else None


def _total_of(content_range: str | None) -> int | None:
    match = re.fullmatch(r"\s*bytes\s+\*/(\d+)\s*", content_range or "")
    return int(match.group(1)) if match else None


def file_digests(path: Path, md5: bool = False) -> tuple[str, str | None]:
    """(SHA-256, MD5 where asked) of a file, in one read."""
    digests = [hashlib.sha256()] + ([hashlib.md5(usedforsecurity=False)] if md5 else [])
    with open(path, "rb") as handle:
        while block := handle.read(1 << 24):
            for digest in digests:
                digest.update(block)
    return digests[0].hexdigest(), digests[1].hexdigest() if md5 else None


def _check_digest(name: str, download: Download, path: Path, directory: Path, fresh: bool) -> str:
    """The file's SHA-256, checked against the published one or a binding recorded one (a mismatching file
    is removed, so the next attempt fetches it again). A file already in the cache is hashed once per
    version: the digest is remembered with its size, inode and times; a ``fresh`` one (just fetched: the
    clock may not have moved) always."""
    status = path.stat()
    stamp = {"size": status.st_size, "inode": status.st_ino, "mtime_ns": status.st_mtime_ns,
             "ctime_ns": status.st_ctime_ns}
    memo = directory / f"{download.filename}.sha256"
    recorded = _read_memo(memo)
    if not fresh and recorded is not None and recorded.get("stamp") == stamp:
        return recorded["sha256"]
    digest, md5 = file_digests(path, md5=download.md5 is not None)
    if md5 is not None and md5 != download.md5:
        path.unlink()
        raise MariusInputError(f"dataset {name}: {download.filename} has MD5 {md5}, not the published "
                               f"{download.md5}; removed it", path=path,
                               expected=f"the file {download.url} serves (fetch it again)")
    binding = recorded.get("sha256") if recorded is not None and recorded.get("confirmed") else None
    expected = download.sha256 or binding
    if expected is not None and digest != expected:
        path.unlink()
        if download.sha256:
            whose, remedy = "the published", "fetch it again"
        else:
            whose, remedy = "the one recorded when a dataset was prepared from it", \
                f"fetch it again; if the source changed, delete {memo} to accept the new file"
        raise MariusInputError(f"dataset {name}: {download.filename} has SHA-256 {digest}, not {whose} "
                               f"{expected}; removed it", path=path,
                               expected=f"the file {download.url} serves ({remedy})")
    confirmed = bool(download.sha256) or (binding is not None)
    _write_memo(memo, {"sha256": digest, "stamp": stamp, "confirmed": confirmed}, recorded)
    return digest


def confirm_digests(name: str, entry: DatasetSource) -> None:
    """Make the recorded digests of ``entry``'s files binding: a dataset was prepared from them."""
    directory = downloads_dir(name)
    for download in entry.downloads:
        memo = directory / f"{download.filename}.sha256"
        recorded = _read_memo(memo)
        if recorded is not None and not recorded.get("confirmed"):
            _write_memo(memo, {**recorded, "confirmed": True}, recorded)


def _write_memo(memo: Path, value: dict, recorded: dict | None) -> None:
    if value != recorded:  # (a read-only shared cache is read, never rewritten)
        write_text_atomic(memo, json.dumps(value) + "\n")


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
