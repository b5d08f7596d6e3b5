"""`eagle-mdsd report`: tokens/s, speedup and tau per category from answer files, as markdown and a chart."""

from __future__ import annotations

from pathlib import Path

from .. import validate
from ..errors import UsageError
from . import options


def add_parser(sub) -> None:
    parser = sub.add_parser("report", help="tokens/s, speedup, tau per category from answer files: markdown + PNG")
    parser.add_argument("answer_files", nargs="+")
    parser.add_argument("--baseline", default=None, help="answer file of the baseline the speedups are against")
    parser.add_argument("--out", type=options.output_file, default="runs/report/report",
                        help="writes OUT.md and OUT.png")
    parser.add_argument("--title", default="")
    parser.add_argument("--labels", default=None,
                        help="comma-separated row names, one per answer file (default: each file's model_id)")
    parser.add_argument("--paired", action="store_true",
                        help="also each drafting file's tau per question against the first one's (two heads compared)")
    parser.add_argument("--window", type=int, default=None,
                        help="also tau by position in the answer turn, N tokens a column")
    parser.add_argument("--mixed-settings", action="store_true",
                        help="average the rows of a file even where they record different settings")
    parser.add_argument("--across", default="", metavar="SETTING,...",
                        help="compare with --baseline (or --paired) answers that differ in these: base_model, "
                             "dtype, temperature, max_new_tokens, turns, bench; the page says so")
    parser.set_defaults(fn=run)


def run(args) -> None:
    from .. import report

    baseline = Path(args.baseline) if args.baseline else None
    labels = args.labels.split(",") if args.labels else None
    if labels and not all(label.strip() and validate.is_cell_text(label) for label in labels):
        raise UsageError(f"--labels {args.labels!r}: each label is a table row's name: no blank one, no '|' and no "
                         f"line break")
    if labels and len(labels) != len(args.answer_files):
        raise UsageError(f"--labels names {len(labels)} rows for {len(args.answer_files)} answer files: give one each")
    md, png = report.write([Path(f) for f in args.answer_files], Path(args.out), baseline, args.title, labels,
                           args.paired, args.window, args.mixed_settings,
                           tuple(key.strip() for key in args.across.split(",") if key.strip()))
    print(md.read_text())
    print(f"wrote {md} and {png}")
