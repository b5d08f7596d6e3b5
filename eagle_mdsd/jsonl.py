"""Files of one JSON record a line, appended one write at a time (answer files, check rows, self-written prompts).

A last line without its newline is a write cut short (a kill inside the write): it is not a record.  Readers
skip it; a writer drops it before appending, so that the next record starts a line of its own.  An append that
fails (a full disk) cuts the file back to what it held, removes a file it made, and is a one-line error.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

from .errors import UsageError, read_text
from .outputs import check_writable_file, write_all, write_failed


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


def checked(path: Path, name: str, kind: str, fault, advice: str, prepare=None) -> list[tuple[int, object]]:
    """(line number, record) of each finished line; a line that is not JSON, or whose fault(record) names a problem
    (None: none), is a one-line error naming `name` and the line as not `kind`, then `advice`.  prepare(record)
    runs first on each (a foreign format's keys read as ours)."""
    numbered = lines(path)
    values = decode(numbered, name, advice)
    for (number, _), value in zip(numbered, values):
        if prepare is not None:
            prepare(value)
        problem = fault(value)
        if problem:
            raise UsageError(f"{name}, line {number} is not {kind} ({problem}): {advice}")
    return [(number, value) for (number, _), value in zip(numbered, values)]


def records(path: Path) -> list:
    """The JSON value of each finished line; a line that is not JSON is a one-line error naming it."""
    return decode(lines(path), str(path), "delete that line, and a rerun writes its record again")


def append(path: Path, *records) -> None:
    """Append records, one a line, in one write: a kill or Ctrl-C leaves the last line whole or cut short (which
    readers skip and `drop_cut_short_line` drops), never two records on one line.  A write that fails leaves
    the file as it was (and no file where there was none) and is a one-line error naming it."""
    path = check_writable_file(path)
    data = "".join(json.dumps(record) + "\n" for record in records).encode()
    made = not path.exists()
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        descriptor = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o666)  # the umask gives its mode
    except OSError as error:
        raise write_failed(path, error) from None
    size = os.fstat(descriptor).st_size
    try:
        write_all(descriptor, data)
    except OSError as error:
        os.ftruncate(descriptor, size)
        if made:
            path.unlink(missing_ok=True)
        raise write_failed(path, error, "" if made else "its earlier lines are kept") from None
    finally:
        os.close(descriptor)


def drop_cut_short_line(path: Path) -> None:
    """Before appending: cut the file back to its last newline."""
    path = Path(path)
    if path.is_file() and path.stat().st_size:
        data = path.read_bytes()
        if not data.endswith(b"\n"):
            with path.open("rb+") as handle:
                handle.truncate(data.rfind(b"\n") + 1)
