"""The one error class for bad input.

A `UsageError` is raised where a user's input enters (an option, a file, a folder, a checkpoint, a device) and
names what is wrong and how to fix it; the command line prints it as one line and exits with 2.  Any other
exception is a bug and keeps its traceback.  It subclasses ValueError so that library callers catching
ValueError keep working.
"""


class UsageError(ValueError):
    """Bad input from the user: the message names the input and the fix, in one line."""


class MissingFile(UsageError, FileNotFoundError):
    """A file or folder the user named is not there.  Also a FileNotFoundError, so that library callers that
    catch that keep working."""
