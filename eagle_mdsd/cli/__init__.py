"""The `eagle-mdsd` command: one module per subcommand, each adding its parser with `add_parser`.

Bad input raises `errors.UsageError`, which `main` prints as one line with exit status 2 (the parser's own errors
are one line too, `validate.Parser`); Ctrl-C ends in one line saying what was kept, with exit status 130, and so
does SIGTERM (how Slurm, Kubernetes and `timeout` stop a job); running out of memory is one line with exit status
2 as well; any other exception is a bug and keeps its traceback.
"""

from __future__ import annotations

import argparse
import os
import shlex
import signal
import sys
import threading

# torch's CPU allocator asks for transparent huge pages for tensors of 2 MB and more, read once before the first
# allocation: head training allocates large logits every step, whose page faults on 4 KB pages cost a large
# share of a CPU step (docs/training.md).
os.environ.setdefault("THP_MEM_ALLOC_ENABLE", "1")


def _check_hub_endpoint() -> None:
    """HF_ENDPOINT is parsed as huggingface_hub is imported (by the subcommands' imports, before `main`): one
    that is no URL is a one-line error here, not that import's traceback."""
    from urllib.parse import urlparse

    endpoint = os.environ.get("HF_ENDPOINT")
    try:
        if endpoint:
            urlparse(endpoint).port
    except ValueError as error:
        print(f"eagle-mdsd: error: HF_ENDPOINT {endpoint!r} is no URL ({error}): unset it, or give one such as "
              f"https://huggingface.co", file=sys.stderr)
        raise SystemExit(2) from None


_check_hub_endpoint()

from .. import errors, validate  # noqa: E402
from . import (acceptance, bench, bench_core, benchmark, check_greedy, generate, pairs, report,  # noqa: E402
               sequoia, study, sweep, train_head)  # (imports torch)
from .options import METHODS  # noqa: E402,F401  (the methods every subcommand offers, defined in benchmark.plans)

SUBCOMMANDS = (pairs, acceptance, generate, check_greedy, train_head, bench, report, benchmark, sweep, sequoia, study,
               bench_core)


def build_parser() -> argparse.ArgumentParser:
    parser = validate.Parser(prog="eagle-mdsd", description="Tree-based speculative decoding with EAGLE draft heads.")
    sub = parser.add_subparsers(dest="command", required=True)
    for subcommand in SUBCOMMANDS:
        subcommand.add_parser(sub)
    return parser


def _terminated(signum, frame):
    """SIGTERM stops the command where Ctrl-C would, with the same line; a second one waits for that line."""
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    raise KeyboardInterrupt


def check_utf8(argv: list[str]) -> None:
    """A one-line error naming the first argument that holds bytes that are not UTF-8 (a prompt, a label, a file
    name): a tokenizer, a page or a JSON record could not take it."""
    for index, word in enumerate(argv):
        fault = validate.not_utf8(word)
        if fault:
            option = argv[index - 1] if index and argv[index - 1].startswith("-") else f"argument {index + 1}"
            shown = word.encode("utf-8", "surrogateescape")
            raise errors.UsageError(f"{option} {shown!r} holds {fault}, which is not UTF-8: give UTF-8 text (file "
                                    f"names too)")


def main(argv=None) -> int:
    argv = sys.argv[1:] if argv is None else list(argv)
    try:
        check_utf8(argv)
    except errors.UsageError as error:
        print(f"eagle-mdsd: error: {error}", file=sys.stderr)
        return 2
    args = build_parser().parse_args(argv)
    args.command_line = "eagle-mdsd " + shlex.join(argv)  # what pages name
    on_main_thread = threading.current_thread() is threading.main_thread()  # (only it may set a handler)
    previous = signal.signal(signal.SIGTERM, _terminated) if on_main_thread else None
    try:
        args.fn(args)
    except errors.UsageError as error:
        print(f"eagle-mdsd: error: {error}", file=sys.stderr)
        return 2
    except (MemoryError, RuntimeError) as error:
        line = errors.out_of_memory(error)
        if line is None:
            raise
        print(f"eagle-mdsd: error: {line}", file=sys.stderr)
        return 2
    except KeyboardInterrupt as stop:  # Ctrl-C: one line (errors.Interrupted says what was kept), no traceback
        print(f"eagle-mdsd: interrupted: {errors.interrupted_message(stop, args.command)}", file=sys.stderr)
        return 130
    finally:
        if on_main_thread:
            signal.signal(signal.SIGTERM, signal.SIG_DFL if previous is None else previous)
    return 0
