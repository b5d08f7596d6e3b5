"""The one error class for bad input, and the one way a Ctrl-C ends.

A `UsageError` is raised where a user's input enters (an option, a file, a folder, a checkpoint, a device) and
names what is wrong and how to fix it; the command line prints it as one line and exits with 2.  Any other
exception is a bug and keeps its traceback.  It subclasses ValueError so that library callers catching
ValueError keep working.
"""

from __future__ import annotations

import contextlib
import json
import math
import signal
import threading
from pathlib import Path


class UsageError(ValueError):
    """Bad input from the user: the message names the input and the fix, in one line."""


class Interrupted(KeyboardInterrupt):
    """A Ctrl-C caught where the command knows its state: the message says, in one line, what was finished,
    what was not, and the exact command that continues the work.  Only whole records were written."""


def compiler_failure(error: Exception) -> str:
    """The first line (at most 200 characters) of what failed inside torch.compile: the compiler's own error where
    dynamo wraps it (BackendCompilerFailed.inner_exception), for a one-line UsageError."""
    cause = getattr(error, "inner_exception", None) or error
    return (str(cause).strip().splitlines() or [type(cause).__name__])[0][:200]


def out_of_memory(error: BaseException) -> str | None:
    """The one line for a run that ran out of memory (CUDA's OutOfMemoryError, a CPU allocator's refusal, Python's
    MemoryError): the machine's limit, not a bug; None for any other error."""
    if not (isinstance(error, MemoryError) or type(error).__name__ == "OutOfMemoryError"
            or "can't allocate memory" in str(error)):
        return None
    what = (str(error).strip().splitlines() or [type(error).__name__])[0][:200]
    return (f"out of memory ({what}): use smaller batches or shorter answers (--batch-size, --tokens-per-batch or "
            f"--max-new-tokens, where the command has them), or a device with more memory")


MIN_TEMPERATURE = 1e-6  # below it (but 0) logits / T leave float32's range: nan, and transformers' sampling fails


def check_temperature(temperature: float, name: str = "temperature") -> None:
    """One-line error unless `temperature` is 0 or a finite number >= MIN_TEMPERATURE (NaN would otherwise sample
    garbage)."""
    if not math.isfinite(temperature) or temperature < 0:
        raise UsageError(f"{name} must be >= 0 (a finite number), got {temperature}")
    if 0 < temperature < MIN_TEMPERATURE:
        raise UsageError(f"{name} {temperature:g} is too small to sample at: use 0 (greedy) or at least "
                         f"{MIN_TEMPERATURE:g}")


def check_context(target, prompt: int, max_new_tokens: int, tree_depth: int = 0) -> None:
    """One-line error unless a prompt of `prompt` tokens, `max_new_tokens` and a tree's depth fit the target's
    context (where its config states one): past it, a model answers garbage or runs without end."""
    context = getattr(target.config, "max_position_embeddings", None)
    if context is not None and prompt + max_new_tokens + tree_depth > context:
        raise UsageError(f"prompt ({prompt} tokens) + max_new_tokens ({max_new_tokens}) + tree depth "
                         f"({tree_depth}) exceed the model's context of {context} tokens: shorten the prompt "
                         f"or lower max_new_tokens")


RESUMABLE = ("bench", "check-greedy", "study", "train-head")  # commands that keep whole records and continue


def interrupted_message(stop: KeyboardInterrupt, command: str) -> str:
    """The one line a Ctrl-C of subcommand `command` ends with: an `Interrupted`'s own message, or what holds for
    every run of the command (files are written whole or not at all)."""
    if isinstance(stop, Interrupted) and str(stop):
        return str(stop)
    if command in RESUMABLE:
        return (f"{command} stopped; what it finished is kept whole and nothing is half-written: run the same "
                f"command again to continue where it stopped")
    return f"{command} stopped before it finished and wrote nothing new: run the same command again"


@contextlib.contextmanager
def deferred_interrupts():
    """Ctrl-C and SIGTERM that arrive inside the block take effect when it ends, through the handler they would have
    met: a block that changes state in several steps (an optimizer step and its count) is never cut in two.  A
    signal without a Python handler (ignored, or SIGTERM's default outside the command line) is left as it is, and
    off the main thread, which cannot set handlers, the block runs unguarded."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    caught, previous = [], {}
    for number in (signal.SIGINT, signal.SIGTERM):
        if callable(signal.getsignal(number)):
            previous[number] = signal.signal(number, lambda signum, frame: caught.append(signum))
    try:
        yield
    finally:
        for number, handler in previous.items():
            signal.signal(number, handler)
    if caught:
        previous[caught[0]](caught[0], None)


class MissingFile(UsageError, FileNotFoundError):
    """A file or folder the user named is not there.  Also a FileNotFoundError, so that library callers that
    catch that keep working."""


def read_text(path, what: str, fix: str | None = None) -> str:
    """The text of a file the user gave, `what` naming it in the error and `fix` (when given) saying what to do:
    a file that is missing, a folder, no regular file (a device such as /dev/full reads without end), unreadable
    or not UTF-8 is a one-line usage error."""
    path = Path(path)
    if path.exists() and not path.is_file() and not path.is_dir():
        raise UsageError(f"{what} {path} is not a regular file (a device, a pipe or a socket): "
                         f"{fix or 'give a file'}")
    try:
        return path.read_text(encoding="utf-8")
    except FileNotFoundError:
        raise MissingFile(f"{what} {path} does not exist" + (f": {fix}" if fix else "")) from None
    except IsADirectoryError:
        raise UsageError(f"{what} {path} is a folder, not a file: {fix or 'give a file'}") from None
    except OSError as error:
        raise UsageError(f"{what} {path} cannot be read ({error.strerror or type(error).__name__}): "
                         f"{fix or 'check that it is a readable file'}") from None
    except UnicodeDecodeError as error:
        raise UsageError(f"{what} {path} is not UTF-8 text (byte {error.start}): {fix or 'give a text file'}") from None


def read_json(path, what: str, fix: str | None = None, kind: type | None = None):
    """The JSON value of a file the user gave, of type `kind` unless None; see `read_text`, and a file that is
    not JSON, nests too deeply, or holds another type is a usage error."""
    text = read_text(path, what, fix)
    fix = fix or "fix the file or replace it"
    try:
        value = json.loads(text)
    except json.JSONDecodeError as error:
        raise UsageError(f"{what} {path} is not valid JSON ({error.msg} at line {error.lineno}, column "
                         f"{error.colno}): {fix}") from None
    except RecursionError:
        raise UsageError(f"{what} {path} nests too deeply to read: {fix}") from None
    if kind is not None and not isinstance(value, kind):
        wanted = "an object" if kind is dict else f"a {type_name(kind())}"
        raise UsageError(f"{what} {path} holds a JSON {type_name(value)}, not {wanted}: {fix}")
    return value


def type_name(value) -> str:
    """The JSON name of a decoded value's type."""
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "boolean"
    if isinstance(value, (int, float)):
        return "number"
    return {str: "string", list: "list", dict: "object"}.get(type(value), type(value).__name__)
