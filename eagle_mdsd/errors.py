"""The one error class for bad input, and the one way a Ctrl-C ends.

A `UsageError` is raised where a user's input enters (an option, a file, a folder, a checkpoint, a device) and
names what is wrong and how to fix it; the command line prints it as one line and exits with 2.  Any other
exception is a bug and keeps its traceback.  It subclasses ValueError so that library callers catching
ValueError keep working.
"""


class UsageError(ValueError):
    """Bad input from the user: the message names the input and the fix, in one line."""


class Interrupted(KeyboardInterrupt):
    """A Ctrl-C caught where the command knows its state: the message says, in one line, what was finished,
    what was not, and the exact command that continues the work.  Only whole records were written."""


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
