"""`eagle-mdsd bench-core`: time one node's drafting and verification, and alpha*, on this machine."""

from __future__ import annotations

from pathlib import Path

from . import options


def add_parser(sub) -> None:
    parser = sub.add_parser("bench-core", help="time one node's drafting/verification and alpha* on this machine")
    parser.add_argument("--out", type=options.output_folder, default="runs/bench-core", help="results folder")
    parser.add_argument("--max-drafts", type=options.count(2), default=8, help="largest n timed, from 2 (default 8)")
    parser.set_defaults(fn=run)


def run(args) -> None:
    from .. import theory
    from ..benchmarks import run_core_benchmark

    theory.check_drafts(args.max_drafts, "max-drafts")
    result = run_core_benchmark(Path(args.out), draft_counts=tuple(range(2, args.max_drafts + 1)))
    print(f"wrote {Path(args.out) / ('core_bench_' + result['date'])}.{{json,md}}")
    for line in result["summary"]:
        print(line)
