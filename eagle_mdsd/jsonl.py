"""Files of one JSON record a line, appended one write at a time (answer files, check rows, self-written prompts).

A last line without its newline is a write cut short (a kill or a full disk inside the write): it is not a
record.  Readers skip it; a writer drops it before appending, so that the next record starts a line of its own.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

from .errors import UsageError, read_text


def lines(path: Path) -> list[tuple[int, str]]:
    """(line number, text) of the file's finished, non-blank lines; none if it does not exist."""
    path = Path(path)
    if not path.exists():
        return []
    finished = read_text(path, "file", "give a JSONL file, one JSON record a line").split("\n")[:-1]
    # (the last piece is "" or a line cut short)
    return [(number, line) for number, line in enumerate(finished, 1) if line.strip()]


def decode(numbered_lines, name: str, advice: str) -> list:
    """The JSON value of each (line number, text); a line that is not JSON is a one-line error naming `name` and
    the line, then `advice`."""
    values = []
    for number, line in numbered_lines:
        try:
            values.append(json.loads(line))
        except json.JSONDecodeError as error:
            raise UsageError(f"{name}, line {number} is not JSON ({error.msg} at column {error.colno}): "
                             f"{advice}") from None
        except RecursionError:
            raise UsageError(f"{name}, line {number} nests too deeply to read: {advice}") from None
    return values


def records(path: Path) -> list:
    """The JSON value of each finished line; a line that is not JSON is a one-line error naming it."""
    return decode(lines(path), str(path), "delete that line, and a rerun writes its record again")


def append(path: Path, record) -> None:
    """Append one record as one line in one write: a kill or Ctrl-C leaves the line whole or cut short (which
    readers skip and `drop_cut_short_line` drops), never two records on one line."""
    data = (json.dumps(record) + "\n").encode()
    descriptor = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
    try:
        written = 0
        while written < len(data):  # a regular file takes it whole; a full disk may not
            written += os.write(descriptor, data[written:])
    finally:
        os.close(descriptor)


def drop_cut_short_line(path: Path) -> None:
    """Before appending: cut the file back to its last newline."""
    path = Path(path)
    if path.exists() and path.stat().st_size:
        data = path.read_bytes()
        if not data.endswith(b"\n"):
            with path.open("rb+") as handle:
                handle.truncate(data.rfind(b"\n") + 1)
