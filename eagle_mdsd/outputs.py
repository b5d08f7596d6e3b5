"""Writing results so that nothing is half-written, mixed or overwritten.

A page (markdown, JSON, a chart) is written to a temporary file beside it and renamed over it, so a reader or
a Ctrl-C sees the old page or the new one, never a part; it gets the mode the umask gives a new file, as an
answer file does.  A write that fails (a full disk, a read-only folder, a path that is no regular file) is a
one-line error naming the path and the cause, and leaves no temporary file.  A fresh run's folder is made with
one `os.mkdir`, which fails if the folder exists: of two runs started with one name, one gets it and the other
a one-line error, so they never append to the same files.
"""

from __future__ import annotations

import errno
import os
import tempfile
from pathlib import Path

from .errors import UsageError


def umask() -> int:
    """The process's umask (read by setting it, and set back at once)."""
    mask = os.umask(0o022)
    os.umask(mask)
    return mask


# What to do when a write fails, by its errno; any other cause: give another path.
WRITE_FIXES = {errno.ENOSPC: "free space on that disk", errno.EDQUOT: "free space within your quota",
               errno.EROFS: "give a path on a writable disk", errno.EACCES: "give a path you can write to",
               errno.EPERM: "give a path you can write to"}


def write_failed(path: Path, error: OSError, kept: str = "") -> UsageError:
    """The one line of a write to `path` that failed: the path, the cause, and what to do about it; `kept` says
    what stays as it was."""
    cause = error.strerror or type(error).__name__
    fix = WRITE_FIXES.get(error.errno, "give another path")
    return UsageError(f"cannot write {path} ({cause}){f'; {kept}' if kept else ''}: {fix}, and run again")


def check_writable_file(path: Path) -> Path:
    """A one-line error when `path` exists and is no regular file (a folder, a device such as /dev/full, a pipe):
    the command would replace it, or read it without end."""
    path = Path(path)
    if path.is_dir():
        raise UsageError(f"{path} is a folder: give the path of a file")
    if path.exists() and not path.is_file():
        raise UsageError(f"{path} is not a regular file (a device, a pipe or a socket): give the path of a file")
    return path


def write_all(descriptor: int, data: bytes) -> None:
    """Write all of `data`: a regular file takes it in one write, a full disk may take part and then fail."""
    written = 0
    while written < len(data):
        written += os.write(descriptor, data[written:])


def write_atomically(path: Path, data: str | bytes) -> Path:
    """Write `data` to `path` whole: a temporary file in the same folder, renamed over `path`; a write that
    fails is a one-line error (`write_failed`) and leaves `path` as it was."""
    path = check_writable_file(path)
    staging = None
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        descriptor, staging = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
        try:
            os.fchmod(descriptor, 0o666 & ~umask())  # mkstemp makes it 0600
            write_all(descriptor, data.encode() if isinstance(data, str) else data)
        finally:
            os.close(descriptor)
        os.replace(staging, path)
    except BaseException as error:  # Ctrl-C included: no temporary file stays behind
        if staging is not None:
            Path(staging).unlink(missing_ok=True)
        if isinstance(error, OSError):
            raise write_failed(path, error, "the file there before is kept" if path.exists() else "") from None
        raise
    return path


def save_figure(figure, path: Path, **options) -> Path:
    """A matplotlib figure saved whole (`write_atomically`)."""
    import io

    buffer = io.BytesIO()
    figure.savefig(buffer, format=Path(path).suffix.lstrip(".") or "png", **options)
    return write_atomically(path, buffer.getvalue())


def new_run_folder(folder: Path, resume_hint: str) -> Path:
    """Make a fresh run's folder in one `os.mkdir` (its parents as needed); one that exists, made by another
    run meanwhile, is a one-line error ending in `resume_hint`."""
    folder = Path(folder)
    try:
        folder.parent.mkdir(parents=True, exist_ok=True)
        os.mkdir(folder)
    except FileExistsError:
        raise UsageError(f"{folder} exists (another run with this name made it): {resume_hint}") from None
    except OSError as error:
        raise write_failed(folder, error) from None
    return folder


def refuse_existing(paths, what: str, fix: str) -> None:
    """A one-line error naming the first of `paths` that exists: a fresh run never overwrites a page."""
    for path in paths:
        if Path(path).exists():
            raise UsageError(f"{what} {path} exists and a fresh run never overwrites one: {fix}")


def stem_file(stem: Path, suffix: str) -> Path:
    """A page beside its stem: the stem's dots are part of its name (run.v1 -> run.v1.md, where with_suffix
    would write run.md, another run's page)."""
    return stem.with_name(stem.name + suffix)
