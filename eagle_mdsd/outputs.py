"""Writing results so that nothing is half-written, mixed or overwritten.

A page (markdown, JSON, a chart) is written to a temporary file beside it and renamed over it, so a reader or
a Ctrl-C sees the old page or the new one, never a part.  A fresh run's folder is made with one `os.mkdir`,
which fails if the folder exists: of two runs started with one name, one gets it and the other a one-line
error, so they never append to the same files.
"""

from __future__ import annotations

import os
import tempfile
from pathlib import Path

from .errors import UsageError


def write_atomically(path: Path, data: str | bytes) -> Path:
    """Write `data` to `path` whole: a temporary file in the same folder, renamed over `path`."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    descriptor, staging = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        with os.fdopen(descriptor, "wb") as handle:
            handle.write(data.encode() if isinstance(data, str) else data)
        os.replace(staging, path)
    except BaseException:  # Ctrl-C included: no temporary file stays behind
        Path(staging).unlink(missing_ok=True)
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
    folder.parent.mkdir(parents=True, exist_ok=True)
    try:
        os.mkdir(folder)
    except FileExistsError:
        raise UsageError(f"{folder} exists (another run with this name made it): {resume_hint}") from None
    return folder


def refuse_existing(paths, what: str, fix: str) -> None:
    """A one-line error naming the first of `paths` that exists: a fresh run never overwrites a page."""
    for path in paths:
        if Path(path).exists():
            raise UsageError(f"{what} {path} exists and a fresh run never overwrites one: {fix}")
