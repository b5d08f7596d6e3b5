"""One writer per run folder or answer file, as git's `index.lock`.

A command that appends answers holds an exclusive `fcntl.flock` on a lock file beside what it writes, from before
it reads what is finished until it ends; the lock file holds its pid.  A second process on the same run or answer
file is refused in one line that names that pid, so two processes never answer the same questions into the same
files.  The kernel drops a flock when its process ends however it ends, so a killed run leaves no stale lock;
the holder removes the lock file when it is done.  Sharded runs (torchrun, accelerate) keep one writer per
file: each process locks the shard it writes.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
from pathlib import Path

from .errors import UsageError
from .outputs import write_failed


def lock_file(path: Path) -> Path:
    """The lock file of a run folder or an answer file: a hidden file beside it."""
    path = Path(path)
    return path.with_name(f".{path.name}.lock")


def _holder(descriptor: int) -> str:
    """'process PID' of the lock file's holder, as it wrote it (it may not have yet)."""
    pid = os.pread(descriptor, 32, 0).decode(errors="replace").strip()
    return f"process {pid}" if pid.isdigit() else "another process"


@contextlib.contextmanager
def held(path: Path, what: str, fix: str):
    """Hold the lock of `path` (`lock_file`) for the block; when another process holds it, a one-line error:
    '`what` is being written by process PID: wait for it to end (or stop it), then `fix`'."""
    lock = lock_file(path)
    while True:
        try:
            lock.parent.mkdir(parents=True, exist_ok=True)
            descriptor = os.open(lock, os.O_RDWR | os.O_CREAT, 0o666)
        except OSError as error:
            raise write_failed(lock, error) from None
        try:
            fcntl.flock(descriptor, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            holder = _holder(descriptor)
            os.close(descriptor)
            raise UsageError(f"{what} is being written by {holder} (it holds {lock}): wait for it to end, or stop "
                             f"it, then {fix}") from None
        try:  # its last holder may have removed the file between our open and our lock: lock the one there now
            current = os.stat(lock).st_ino == os.fstat(descriptor).st_ino
        except FileNotFoundError:
            current = False
        if current:
            break
        os.close(descriptor)
    try:
        with contextlib.suppress(OSError):  # (the pid only names the holder: a full disk does not stop the run)
            os.ftruncate(descriptor, 0)
            os.write(descriptor, f"{os.getpid()}\n".encode())
        yield
    finally:
        lock.unlink(missing_ok=True)  # before the lock goes: a process that opened it meanwhile locks it, and
        os.close(descriptor)  # finds it removed, and opens a new one
