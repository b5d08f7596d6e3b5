"""`eagle-mdsd study`: every verifier's acceptance against alpha* on the target's real p and q, resumably."""

from __future__ import annotations

from pathlib import Path

from .. import errors
from . import options


def add_parser(sub) -> None:
    parser = sub.add_parser("study", help="acceptance of every verifier against alpha* on real p and q (resumable)")
    parser.add_argument("stage", choices=["collect", "analyse", "all"])
    parser.add_argument("--run", type=options.output_folder, default="runs/study",
                        help="folder for the collected logits and cached rates")
    parser.add_argument("--positions", type=options.count(1), default=1024, help="answer positions per task")
    parser.add_argument("--max-new-tokens", type=options.count(1), default=128)
    options.add_dtype(parser)
    parser.add_argument("--temperature", type=float, default=0.7)
    parser.add_argument("--n", type=options.count(1), default=3, help="drafts per node for the table")
    parser.add_argument("--draws", type=options.count(1), default=8, help="sampled draft tuples per position")
    parser.add_argument("--sweep-positions", type=options.count(2), default=48,
                        help="positions per task in the sweeps (at least 2: an interval needs two)")
    parser.add_argument("--table-positions", type=options.count(2), default=None,
                        help="positions per task in the table (default: all collected; at least 2)")
    parser.add_argument("--out", type=options.output_folder, default="runs/study")
    parser.set_defaults(fn=run)


def run(args) -> None:
    from .. import study, theory

    if args.stage in ("analyse", "all"):  # before a collect that can run for long
        errors.check_temperature(args.temperature, "--temperature")
        theory.check_drafts(args.n, "n")
    if args.stage in ("collect", "all"):
        files = study.collect(Path(args.run), args.positions, args.max_new_tokens, args.dtype)
        print(f"{len(files)} tasks collected in {args.run}")
    if args.stage in ("analyse", "all"):
        md = study.analyse(Path(args.run), Path(args.out), args.temperature, args.n, args.draws, args.sweep_positions,
                           table_positions=args.table_positions)
        print(md.read_text())
