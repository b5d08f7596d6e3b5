"""The one error class for bad input.

A `UsageError` is raised where a user's input enters (an option, a file, a folder, a checkpoint, a device) and
names what is wrong and how to fix it; the command line prints it as one line and exits with 2.  Any other
exception is a bug and keeps its traceback.  It subclasses ValueError so that library callers catching
ValueError keep working.
"""

from __future__ import annotations

import json
from pathlib import Path


class UsageError(ValueError):
    """Bad input from the user: the message names the input and the fix, in one line."""


class MissingFile(UsageError, FileNotFoundError):
    """A file or folder the user named is not there.  Also a FileNotFoundError, so that library callers that
    catch that keep working."""


def read_text(path, what: str) -> str:
    """The text of a file the user gave, `what` naming it in the error: a file that is missing, a folder,
    unreadable or not UTF-8 is a one-line usage error."""
    path = Path(path)
    try:
        return path.read_text()
    except FileNotFoundError:
        raise MissingFile(f"{what} {path} does not exist") from None
    except IsADirectoryError:
        raise UsageError(f"{what} {path} is a folder: give a file") from None
    except OSError as error:
        raise UsageError(f"{what} {path} cannot be read ({error.strerror or type(error).__name__}): check "
                         f"that it is a readable file") from None
    except UnicodeDecodeError as error:
        raise UsageError(f"{what} {path} is not UTF-8 text (byte {error.start}): give a text file") from None


def read_json(path, what: str):
    """The JSON value of a file the user gave; see `read_text`, and a file that is not JSON is a usage error."""
    text = read_text(path, what)
    try:
        return json.loads(text)
    except json.JSONDecodeError as error:
        raise UsageError(f"{what} {path} is not valid JSON ({error.msg} at line {error.lineno}): fix the file "
                         f"or replace it") from None
