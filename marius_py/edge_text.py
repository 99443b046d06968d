"""Edge text files read for ``marius_py.preprocess``: bytes to checked lines to (head, relation, tail) names.

Reading: plain text or ``.gz`` (by suffix), strict UTF-8, LF or CRLF. The file is read ``_CHUNK_BYTES``
at a time and a clean chunk is decoded and split at C speed in one go; a chunk with anything to report
(a NUL byte, bytes that are not UTF-8, a carriage return inside a line, a line over ``_MAX_LINE_BYTES``)
goes through ``_decode_block`` line by line, in the blocks a line-by-line reader would have, so every
error names the line and the problem a line-by-line reader would. No line is held whole beyond
``_MAX_LINE_BYTES``: longer ones are refused (CR-only line endings, binary files).

Input rules (``_LineParser``): surrounding whitespace of every field is stripped (``"alga "`` is
``"alga"``); names may not be empty; with default columns a line has exactly 2 or 3 fields, plus at
most one empty trailing field (a trailing delimiter); with explicit ``columns`` it may carry extra ones
(weights, timestamps). Quotes are not interpreted (a quoted field keeps its quotes). A UTF-8 BOM is
ignored. Whitespace-only lines are blank, allowed only at the end of a file.

Header lines cannot be told from edges in general (``source<TAB>target`` is a valid pair); only a wrong
field count gives one away. A wrong count on the first line says its likely cause, read from the lines of
its block after it: the right count there suggests ``--skip-header``; the same count on all of them suggests
``--pairs`` (2 fields) or ``--columns`` (more than expected); otherwise another delimiter that would give the
right count is named.

Inputs (``refuse_special_file``, ``pipes_copied``): a file, or a pipe (a FIFO, or a process substitution's
``/dev/fd/N``), which is read once into a file in the output's staging folder (preprocess reads its train
input twice) and named as given in messages; gzip data in a pipe is recognised by its first bytes. A
directory, a socket or a device is refused by what it is.

Speed: text is split block by block (at most ``block_lines`` lines) with C-level list operations, not
line by line.
"""

from __future__ import annotations

import gzip
import os
import shutil
import stat
import zlib
from contextlib import contextmanager
from dataclasses import dataclass
from itertools import compress
from pathlib import Path
from typing import TYPE_CHECKING, Iterator, Sequence

import numpy as np
from tqdm import tqdm

from marius_py.errors import MariusInputError

if TYPE_CHECKING:
    from marius_py.preprocess import PreprocessOptions

PAIRS_RELATION = "__edge__"  # the one relation of a plain graph (pairs)
_MAX_LINE_BYTES = 1 << 20  # longer lines are refused before they are held whole (CR-only or binary files)
_CHUNK_BYTES = 1 << 20  # bytes read and decoded at a time (8 MiB: slower than line by line, out of cache)
_DELIMITER_NAMES = {"\t": "tab", ",": "comma", ";": "semicolon", " ": "space", "|": "pipe"}
_GZIP_MAGIC = b"\x1f\x8b"
_PIPES_FOLDER = ".pipes"  # pipes' copies, in the staging directory of the output
# what an input path may be that is neither a file nor a pipe, and is refused
_SPECIAL_KINDS = ((stat.S_ISDIR, "a directory"), (stat.S_ISSOCK, "a socket"), (stat.S_ISCHR, "a character device"),
                  (stat.S_ISBLK, "a block device"))


@dataclass
class _EdgeBlock:
    """Names of consecutive edge lines of one file (row i is line first_line + i)."""
    path: Path
    first_line: int
    heads: Sequence[str]
    relations: Sequence[str]
    tails: Sequence[str]
    splits: np.ndarray | int  # split code of every row, or one code for the block

    def __len__(self) -> int:
        return len(self.heads)

    def select(self, rows: list[bool]) -> tuple[list[str], list[str], list[str]]:
        return tuple(list(compress(names, rows))
                     for names in (self.heads, self.relations, self.tails))


class EdgeSource:
    """Edges that are not a file, which preprocessing reads as it reads a file (``marius_py.memory_data``: edges
    held in memory). ``str(source)`` names it in messages where a path names a file, and a message's line is
    the row (from 0) of its edge; ``name`` labels progress bars, ``origin`` is what a dataset's sources
    record (a file: its absolute path)."""
    name: str
    origin: str

    def blocks(self, block_lines: int, label: str, progress: bool) -> Iterator[tuple[int, list[Sequence[str]]]]:
        """(first row, [heads, relations, tails]) of consecutive blocks of at most ``block_lines`` edges, as
        ``_iter_blocks`` gives a file's (a graph without relations gets ``PAIRS_RELATION``), with a progress
        bar ``label``."""
        raise NotImplementedError


class _LineParser:
    """Checks the lines of one file and picks (head, relation, tail) names."""

    def __init__(self, path: Path, options: PreprocessOptions):  # (its delimiter, pairs, columns, skip_header)
        self.path = path
        self.delimiter = options.delimiter
        self.pairs = options.pairs
        self.skip_header = options.skip_header
        default = (0, 1) if options.pairs else (0, 1, 2)
        self.columns = tuple(int(c) for c in options.columns) if options.columns else default
        self.exact = options.columns is None  # explicit columns may leave extra fields
        self.num_fields = len(self.columns) if self.exact else max(self.columns) + 1
        self.blank_line: int | None = None  # first blank line seen: fine if nothing follows

    def describe(self) -> str:
        """What a line should look like, for error messages."""
        sep = _DELIMITER_NAMES.get(self.delimiter, repr(self.delimiter))
        roles = ("head", "tail") if self.pairs else ("head", "relation", "tail")
        if self.exact:
            return f"{self.num_fields} {sep}-separated fields ({', '.join(roles)})"
        where = ", ".join(f"{role} in column {c}" for role, c in zip(roles, self.columns))
        return f"at least {self.num_fields} {sep}-separated fields ({where}, 0-based)"

    def parse(self, rows: list[str], first_line: int) -> list[Sequence[str]]:
        """Name columns (head, relation, tail) of a block of lines, stripped, without trailing blanks."""
        fields = [row.split(self.delimiter) for row in rows]
        names = self._names_if_clean(fields, _may_need_strip("\n".join(rows), self.delimiter))
        if names is None:  # the slow path pinpoints the problem, or drops trailing blanks
            fields = self._check_rows(rows, fields, first_line)
            if not fields:
                return [(), (), ()]
            columns = list(zip(*fields))
            names = [tuple(map(str.strip, columns[c])) for c in self.columns]
        if self.pairs:
            names.insert(1, (PAIRS_RELATION,) * len(names[0]))
        return names

    def _names_if_clean(self, fields: list[list[str]], strip: bool) -> list[tuple[str, ...]] | None:
        """The stripped name columns if the whole block is well-formed (checked at C speed); ``strip``
        False: no field has surrounding whitespace."""
        lengths = set(map(len, fields))
        if self.blank_line is not None or not lengths:
            return None
        trailing = self.exact and lengths == {self.num_fields + 1}  # a trailing delimiter on every line
        if not trailing and ((lengths != {self.num_fields}) if self.exact else (min(lengths) < self.num_fields)):
            return None
        columns = list(zip(*fields))
        if trailing and any(map(str.strip, columns[-1])):
            return None
        names = [tuple(map(str.strip, columns[c])) if strip else columns[c] for c in self.columns]
        return None if any("" in column for column in names) else names

    def _check_rows(self, rows: list[str], fields: list[list[str]],
                    first_line: int) -> list[list[str]]:
        num_edges = len(rows)
        for index, row in enumerate(rows):
            lineno = first_line + index
            if not row.strip():
                self.blank_line = self.blank_line or lineno
                num_edges = min(num_edges, index)
            elif self.blank_line is not None:
                raise MariusInputError("blank line between edges", path=self.path,
                                       line=self.blank_line,
                                       expected="one edge per line, blank lines only at the end")
            else:
                self._check_fields(row, fields[index], lineno, fields[index + 1:])
        return fields[:num_edges]

    def _check_fields(self, row: str, fields: list[str], lineno: int, later: list[list[str]]) -> None:
        """Raise for a wrong field count or an empty name; drop one empty trailing field (in place). ``later``:
        the fields of the lines after it in its block (a wrong count's hint reads them)."""
        if self._ends_with_delimiter(fields):
            fields.pop()
        count = len(fields)
        if not self._fits(count):
            expected = self.describe() + self._hint(row, fields, lineno, later)
            plural = "" if count == 1 else "s"
            raise MariusInputError(f"line has {count} field{plural}: {_snippet(row)}",
                                   path=self.path, line=lineno, expected=expected)
        roles = ("head", "tail") if self.pairs else ("head", "relation", "tail")
        empty = [role for role, c in zip(roles, self.columns) if not fields[c].strip()]
        if empty:
            raise MariusInputError(f"empty name ({' and '.join(empty)}, after stripping surrounding whitespace) "
                                   f"in line {_snippet(row)}", path=self.path, line=lineno,
                                   expected=f"{self.describe()}, none empty")

    def _ends_with_delimiter(self, fields: list[str]) -> bool:
        """Whether a line's last field is the empty one of a trailing delimiter (accepted once)."""
        return self.exact and len(fields) == self.num_fields + 1 and not fields[-1].strip()

    def _fits(self, count: int) -> bool:
        """Whether a line of ``count`` fields (a trailing delimiter's not counted) holds the columns."""
        return count == self.num_fields if self.exact else count >= self.num_fields

    def _hint(self, row: str, fields: list[str], lineno: int, later: list[list[str]]) -> str:
        """The likely cause of a wrong field count: quotes, trailing delimiters, a header or a file of another
        width (on the first line read, told by ``later``, the fields of the lines after it), another delimiter."""
        if '"' in row:
            return ("; quotes are not interpreted: a quoted field keeps its quotes and a delimiter inside "
                    "quotes still splits it")
        empty_tail = next((i for i, f in enumerate(reversed(fields)) if f.strip()), len(fields))
        if len(fields) > self.num_fields and empty_tail >= len(fields) - self.num_fields:
            return (f"; the line ends with {empty_tail} empty fields (trailing delimiters; one trailing "
                    f"delimiter is accepted)")
        if lineno == self.skip_header + 1:
            counts = [len(f) - self._ends_with_delimiter(f) for f in later if any(map(str.strip, f))]
            hint = self._first_line_hint(len(fields), lineno, counts)
            if hint:
                return hint
        for delimiter, name in _DELIMITER_NAMES.items():
            if delimiter != self.delimiter and len(row.split(delimiter)) == self.num_fields:
                return f"; the line looks {name}-separated: set --delimiter"
        return ""

    def _first_line_hint(self, count: int, lineno: int, later_counts: list[int]) -> str:
        """A header (the lines after it fit), or a file of another width (they have ``count`` fields too)."""
        if later_counts and all(map(self._fits, later_counts)):
            return (f"; the lines after it have {later_counts[0]} fields: use --skip-header {self.skip_header + 1} "
                    f"if the file has a header")
        if count < 2 or any(c != count for c in later_counts):  # (one field: another delimiter, if any)
            return ""
        lines = f"lines {lineno}-{lineno + len(later_counts)} all have" if later_counts else "the line has"
        if count == 2 and not self.pairs:
            return f"; {lines} 2 fields: a graph without relations (head, tail lines) needs --pairs"
        if count > self.num_fields:
            roles, example = ("head and tail", "0,1") if self.pairs else ("head, relation and tail", "0,1,2")
            pick = f"pick the {roles} columns with --columns (e.g. --columns {example})"
            if self.pairs and count == 3:
                return f"; {lines} 3 fields: drop --pairs for head, relation, tail lines, or {pick}"
            return f"; {lines} {count} fields: {pick}"
        return ""


_WHITESPACE = tuple(c for c in map(chr, range(0x3001)) if c.isspace() and c != "\n")  # what str.strip strips


def _may_need_strip(text: str, delimiter: str) -> bool:
    """Whether a field of ``text`` (lines joined by newlines) may start or end with whitespace: a whitespace
    character beside a delimiter or a line boundary. Substring searches: far cheaper than stripping, except
    for spaces inside names (a space found every few characters): where there are spaces, say yes."""
    if delimiter != " " and " " in text:  # (finding where they stand took twice as long as stripping)
        return True
    for c in _WHITESPACE:
        if c != delimiter and c in text and (c + delimiter in text or delimiter + c in text or c + "\n" in text
                                             or "\n" + c in text or text.startswith(c) or text.endswith(c)):
            return True
    return False


def _snippet(line: str, limit: int = 80) -> str:
    return repr(line if len(line) <= limit else line[:limit] + "...")


def special_kind(path: str | os.PathLike) -> str | None:
    """What ``path`` is where it exists but is neither a file nor a pipe (both are read): "a directory", "a
    socket", "a character device" or "a block device"; else None (a missing path too)."""
    try:
        mode = os.stat(path).st_mode
    except OSError:
        return None
    return next((kind for is_kind, kind in _SPECIAL_KINDS if is_kind(mode)), None)


def refuse_special_file(path: str | os.PathLike, noun: str, expected: str) -> None:
    """Refuse a ``path`` that is a directory, a socket or a device, saying which (a device could block or
    never end: a terminal, /dev/zero)."""
    kind = special_kind(path)
    if kind is not None:
        raise MariusInputError(f"{noun} is {kind}, not a file", path=path, expected=expected)


def _is_pipe(path: Path) -> bool:
    try:
        return stat.S_ISFIFO(os.stat(path).st_mode)
    except OSError:
        return False


class PipeInput(type(Path())):
    """A pipe given as an input (a FIFO, or a process substitution's /dev/fd/N), read once into the file
    ``copy``: reading opens the copy, messages (and a dataset's sources) name the pipe."""
    copy: Path
    gzipped: bool  # gzip data (a pipe's name says nothing of its content)


@contextmanager
def pipes_copied(paths: Sequence[Path], within: Path) -> Iterator[list[Path]]:
    """``paths``, each pipe among them read once into a file in a folder of ``within`` (preprocess reads its
    train input twice, a pipe can be read once) and given as a ``PipeInput``; the folder is removed at the end."""
    folder = within / _PIPES_FOLDER
    copies: dict[Path, PipeInput] = {}
    try:
        for path in paths:
            if isinstance(path, Path) and path not in copies and _is_pipe(path):  # (an EdgeSource is no pipe)
                copies[path] = _copy_pipe(path, folder / str(len(copies)))
        yield [copies.get(path, path) for path in paths]
    finally:
        shutil.rmtree(folder, ignore_errors=True)


def _copy_pipe(path: Path, copy: Path) -> PipeInput:
    copy.parent.mkdir(exist_ok=True)
    with _open_input(path) as source, open(copy, "wb") as target:
        shutil.copyfileobj(source, target, _CHUNK_BYTES)
    pipe = PipeInput(path)
    pipe.copy = copy
    with open(copy, "rb") as start:
        pipe.gzipped = start.read(len(_GZIP_MAGIC)) == _GZIP_MAGIC
    return pipe


def _open_input(path: Path):
    try:
        return open(path.copy if isinstance(path, PipeInput) else path, "rb")
    except OSError as error:
        raise MariusInputError(f"cannot open input ({error.strerror})", path=path,
                               expected="a readable file") from None


@contextmanager
def _open_binary(path: Path):
    """(line iterator, raw file): gzip by suffix (a pipe's by content); the raw file's offset drives progress."""
    with _open_input(path) as raw:
        if path.gzipped if isinstance(path, PipeInput) else path.suffix == ".gz":
            with gzip.GzipFile(fileobj=raw, mode="rb") as lines:
                yield lines, raw
        else:
            yield raw, raw


def _decode_block(lines: list[bytes], path: Path, first_line: int) -> list[str]:
    """Strict UTF-8 lines without their endings (LF or CRLF) or a leading BOM; no NUL, no other CR.

    ``lines`` come from ``readline(_MAX_LINE_BYTES + 1)``: a piece without a newline is a longer line's
    start, unless it ends the file."""
    data = b"".join(lines)
    if data.count(b"\n") < len(lines) - 1 or (len(lines[-1]) > _MAX_LINE_BYTES and not data.endswith(b"\n")):
        index = next(i for i, line in enumerate(lines) if len(line) > _MAX_LINE_BYTES and not line.endswith(b"\n"))
        raise MariusInputError(f"line longer than {_MAX_LINE_BYTES >> 20} MiB", path=path, line=first_line + index,
                               expected="one edge per line, LF or CRLF line endings (is the file binary, or "
                                        "are its line endings CR only?)")
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError:
        _raise_decode_error(lines, path, first_line)
    if "\x00" in text:
        index = next(i for i, line in enumerate(lines) if b"\x00" in line)
        raise MariusInputError(f"NUL byte at byte {lines[index].index(0) + 1} of the line", path=path,
                               line=first_line + index,
                               expected="UTF-8 text without NUL bytes (is the file UTF-16 or binary?)")
    rows = text.split("\n")  # byte 0x0a never occurs inside a multi-byte character
    if text.endswith("\n"):
        rows.pop()
    if "\r" in text:
        if text.count("\r") != text.count("\r\n") + text.endswith("\r"):  # a CR not ending a line: where?
            index = next((i for i, line in enumerate(lines) if b"\r" in line.rstrip(b"\r\n")), None)
            if index is not None:
                raise MariusInputError("carriage return (CR) inside the line", path=path, line=first_line + index,
                                       expected="LF or CRLF line endings (CR-only line endings are not read: "
                                                "convert them, e.g. tr '\\r' '\\n')")
        rows = [row[:-1] if row.endswith("\r") else row for row in rows]
    if first_line == 1 and rows[0].startswith("\ufeff"):
        rows[0] = rows[0][1:]
    return rows


def _raise_decode_error(lines: list[bytes], path: Path, first_line: int) -> None:
    """Find the first line that is not UTF-8 (the block as a whole is not)."""
    if first_line == 1 and lines[0].startswith((b"\xff\xfe", b"\xfe\xff")):
        raise MariusInputError("the file starts with a UTF-16 byte-order mark", path=path, line=1,
                               expected="UTF-8 text (convert it, e.g. iconv -f UTF-16 -t UTF-8)")
    if first_line == 1 and lines[0].startswith(b"\x1f\x8b"):
        raise MariusInputError("the file is gzip-compressed but its name does not end in .gz", path=path,
                               line=1, expected="a .gz name for gzip data, or UTF-8 text")
    for index, data in enumerate(lines):
        try:
            data.decode("utf-8")
        except UnicodeDecodeError as error:
            raise MariusInputError(
                f"invalid UTF-8 byte 0x{data[error.start]:02x} at byte {error.start + 1} "
                f"of the line", path=path, line=first_line + index,
                expected="UTF-8 text (a Latin-1 or Windows-1252 file can be converted, e.g. "
                         "iconv -f latin1 -t utf-8)") from None
    raise AssertionError("block failed to decode but each of its lines decodes")


def _read_rows(source, path: Path, first_line: int, block_lines: int) -> Iterator[tuple[int, list[str]]]:
    """(first line number, rows) of blocks of ``block_lines`` decoded lines (the last one shorter) read from
    ``source``, its line ``first_line`` on.

    The file is read ``_CHUNK_BYTES`` at a time, cut after its last newline (the unfinished line carried
    over, at most ``_MAX_LINE_BYTES``: no line is held whole beyond that), and a clean chunk is decoded and
    split at C speed in one go (``_decode_chunk``). Lines of a chunk with anything to report (``raw``) are
    cut as ``readline(_MAX_LINE_BYTES + 1)`` would cut them and go through ``_decode_block`` a whole block
    at a time (completed from the next chunks), so the error and its line are a line-by-line reader's: the
    rows of the block decoded before are clean, and ``_decode_block`` reports the block's first problem of
    the first kind it checks."""
    pending: list[str] = []  # decoded (clean) rows of the block being filled
    raw: list[bytes] = []  # then its lines still to go through _decode_block
    start = first_line  # line number of its first row
    carry = b""
    while True:
        chunk = source.read(_CHUNK_BYTES)
        data = carry + chunk if carry else chunk
        if not data:
            break
        carry = b""
        if chunk:
            cut = data.rfind(b"\n") + 1
            if len(data) - cut <= _MAX_LINE_BYTES:  # (else: a line too long, which _decode_block reports)
                data, carry = data[:cut], data[cut:]
            if not data:
                continue
        rows = None if raw else _decode_chunk(data, start + len(pending) == 1)
        if rows is not None:
            if pending:
                need = block_lines - len(pending)
                pending += rows[:need]
                rows = rows[need:]
                if len(pending) < block_lines:
                    continue
                yield start, pending
                start, pending = start + block_lines, []
            full = len(rows) - len(rows) % block_lines
            for offset in range(0, full, block_lines):
                yield start, rows[offset:offset + block_lines]
                start += block_lines
            pending = rows[full:]
            continue
        lines, too_long = _readline_pieces(data)
        while lines:
            need = block_lines - len(pending) - len(raw)
            raw += lines[:need]
            lines = lines[need:]
            if len(pending) + len(raw) == block_lines or (too_long and not lines):
                rows = _decode_block(raw, path, start + len(pending))
                if too_long and not lines:
                    raise AssertionError("a line longer than _MAX_LINE_BYTES went unreported")
                yield start, pending + rows
                start, pending, raw = start + block_lines, [], []
    if raw:
        pending += _decode_block(raw, path, start + len(pending))
    if pending:
        yield start, pending


def _decode_chunk(data: bytes, at_line_one: bool) -> list[str] | None:
    """The lines of ``data`` (whole lines, the last one's newline missing only at the end of the file) as
    ``_decode_block`` gives them, or None when it has anything to report (or may have): a NUL byte, bytes
    that are not UTF-8, a CR not ending a line, a line over ``_MAX_LINE_BYTES``."""
    if b"\0" in data:
        return None
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError:
        return None
    rows = text.split("\n")  # byte 0x0a never occurs inside a multi-byte character
    if text.endswith("\n"):
        rows.pop()
    longest = max(map(len, rows), default=0)  # characters: at most 4 bytes each
    if longest * 4 > _MAX_LINE_BYTES and any(len(row) * 4 > _MAX_LINE_BYTES and len(row.encode()) > _MAX_LINE_BYTES
                                             for row in rows):
        return None
    if "\r" in text:
        if text.count("\r") != text.count("\r\n") + text.endswith("\r"):  # a CR not ending a line
            return None
        rows = [row[:-1] if row.endswith("\r") else row for row in rows]
    if at_line_one and rows and rows[0].startswith("\ufeff"):
        rows[0] = rows[0][1:]
    return rows


def _readline_pieces(data: bytes) -> tuple[list[bytes], bool]:
    """The lines of ``data`` as ``readline(_MAX_LINE_BYTES + 1)`` returns them (with their newline), and
    whether the last one is the start of a longer line (which ``_decode_block`` refuses: nothing after it
    is kept)."""
    lines = data.split(b"\n")
    last = lines.pop()  # b"" after a final newline; else the file's last line, or a line too long
    lines = [line + b"\n" for line in lines]
    if last:
        lines.append(last)
    for index, line in enumerate(lines):
        piece = line[:_MAX_LINE_BYTES + 1]
        if len(piece) > _MAX_LINE_BYTES and not piece.endswith(b"\n"):
            lines[index] = piece
            del lines[index + 1:]
            return lines, True
    return lines, False


def _iter_blocks(path: Path, options: PreprocessOptions, label: str, progress: bool,
                 block_lines: int) -> Iterator[tuple[int, list[Sequence[str]]]]:
    """(first line number, [heads, relations, tails]) for blocks of at most ``block_lines`` lines of one file's
    edges (blocks of blank lines only are left out); a progress bar ``label`` on stderr with ``progress``."""
    parser = _LineParser(path, options)
    num_edges, lineno = 0, 0  # lineno: lines consumed so far
    with _open_binary(path) as (source, raw), \
            tqdm(total=os.fstat(raw.fileno()).st_size, desc=label, unit="B", unit_scale=True,
                 leave=False, disable=None if progress else True) as bar:
        try:
            while lineno < options.skip_header and source.readline(_MAX_LINE_BYTES + 1):  # (as lines are cut)
                lineno += 1
            for first_line, rows in _read_rows(source, path, lineno + 1, block_lines):
                names = parser.parse(rows, first_line)
                if names[0]:
                    yield first_line, names
                num_edges += len(names[0])
                lineno += len(rows)
                bar.update(raw.tell() - bar.n)
        except (EOFError, zlib.error, gzip.BadGzipFile) as error:
            where = f" after line {lineno}" if lineno else ""
            raise MariusInputError(f"corrupt or truncated gzip data{where} ({error})", path=path,
                                   expected="a complete gzip file") from None
        except OSError as error:
            raise MariusInputError(f"cannot read input ({error})", path=path,
                                   expected="a readable file") from None
    if num_edges == 0:
        raise MariusInputError("no edges in input file", path=path,
                               expected=f"at least one line of {parser.describe()}")
