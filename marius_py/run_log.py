"""The JSON-lines logs of a run (``metrics.jsonl``, the torchrun trainers' ``distributed/*.jsonl``): one JSON
object per line, appended as training goes; a kill may cut the last line short."""

from __future__ import annotations

import json
from pathlib import Path

from marius_py.errors import MariusInputError

_ONE_OBJECT_PER_LINE = ("one JSON object per line, as `marius-py train` writes them; the log is not training state: "
                        "fix or remove the line")


def read_json_lines(path: Path) -> list[tuple[int, dict]]:
    """(line number, object) of every line of a JSON-lines log ([] when there is none): a last line without
    its newline that does not parse (a write a kill cut short) is skipped, any other damaged line refused
    with the file and line."""
    try:
        data = path.read_bytes()
    except FileNotFoundError:
        return []
    except OSError as error:
        raise MariusInputError(f"cannot read the log ({error.strerror})", path=path) from None
    lines = data.split(b"\n")
    torn = lines.pop()  # what follows the last newline: empty unless a write was cut short
    records = [(number, _record(raw, path, number)) for number, raw in enumerate(lines, 1) if raw.strip()]
    if torn.strip(b"\x00 \t\r"):
        try:
            records.append((len(lines) + 1, _record(torn, path, len(lines) + 1)))
        except MariusInputError:
            pass  # the record a kill cut short
    return records


def _record(raw: bytes, path: Path, line: int) -> dict:
    """One line of a log as its JSON object; MariusInputError naming the file and line."""
    try:
        record = json.loads(raw.decode("utf-8"))
    except UnicodeDecodeError:
        raise MariusInputError("not a JSON line: not UTF-8 text", path=path, line=line,
                               expected=_ONE_OBJECT_PER_LINE) from None
    except json.JSONDecodeError as error:
        raise MariusInputError(f"not a JSON line: {error.msg} at column {error.colno}", path=path, line=line,
                               expected=_ONE_OBJECT_PER_LINE) from None
    if not isinstance(record, dict):
        raise MariusInputError(f"a JSON {type(record).__name__}, not an object", path=path, line=line,
                               expected=_ONE_OBJECT_PER_LINE)
    return record
