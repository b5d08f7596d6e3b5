"""The `eagle-mdsd` command."""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from . import drafting, theory, verification


def _distribution(text: str, what: str) -> list[float]:
    try:
        values = json.loads(text)
    except json.JSONDecodeError:
        raise ValueError(f"--{what} must be a JSON list of probabilities such as [0.5, 0.3, 0.2]") from None
    if not isinstance(values, list) or not values or not all(isinstance(v, (int, float)) for v in values):
        raise ValueError(f"--{what} must be a JSON list of probabilities such as [0.5, 0.3, 0.2]")
    return [float(v) for v in values]


def cmd_pairs(args) -> None:
    print("drafting schemes:")
    for scheme in drafting.SCHEMES.values():
        print(f"  {scheme.name:20s} {scheme.reference}")
    print("verifiers:")
    for verifier in verification.VERIFIERS.values():
        print(f"  {verifier.name:20s} {verifier.reference}")
    print("compatible (scheme, verifier) pairs:")
    for scheme, verifier in verification.pairs():
        print(f"  {scheme} + {verifier}")


def cmd_acceptance(args) -> None:
    p, q = _distribution(args.p, "p"), _distribution(args.q, "q")
    if len(p) != len(q):
        raise ValueError(f"--p has {len(p)} tokens but --q has {len(q)}: give both over the same vocabulary")
    rows = []
    for scheme, verifier in verification.pairs():
        n = 2 if scheme == "spechub" else args.n
        if scheme == "spechub" and args.n != 2:
            continue
        try:
            drafting.get(scheme).check(n, len(p))
        except ValueError:
            continue
        rate = theory.acceptance_rate(scheme, verifier, p, q, n)
        rows.append({"scheme": scheme, "verifier": verifier, "n": n, "acceptance": float(rate),
                     "ci95_half_width": rate.half_width,
                     "alpha_star": theory.optimal_acceptance(p, q, n, scheme)})
    if args.json:
        print(json.dumps(rows))
        return
    print(f"{'scheme':20s} {'verifier':8s} {'acceptance':>10s} {'alpha*':>8s}")
    for row in rows:
        print(f"{row['scheme']:20s} {row['verifier']:8s} {row['acceptance']:10.6f} {row['alpha_star']:8.6f}")


def cmd_bench_core(args) -> None:
    from .benchmarks import run_core_benchmark

    result = run_core_benchmark(Path(args.out), draft_counts=tuple(range(2, args.max_drafts + 1)))
    print(f"wrote {Path(args.out) / ('core_bench_' + result['date'])}.{{json,md}}")
    for goal in result["goals"]:
        print(goal)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="eagle-mdsd", description=__doc__)
    sub = parser.add_subparsers(dest="command", required=True)
    sub.add_parser("pairs", help="list drafting schemes, verifiers and the lossless pairs").set_defaults(fn=cmd_pairs)
    acc = sub.add_parser("acceptance", help="acceptance of every pair and alpha* for one node's p and q")
    acc.add_argument("--p", required=True, help="target distribution, JSON list")
    acc.add_argument("--q", required=True, help="draft distribution, JSON list")
    acc.add_argument("--n", type=int, default=2, help="number of drafts (default 2)")
    acc.add_argument("--json", action="store_true")
    acc.set_defaults(fn=cmd_acceptance)
    bench = sub.add_parser("bench-core", help="time one node's drafting/verification and alpha* on this machine")
    bench.add_argument("--out", default="evaluation/results", help="results folder")
    bench.add_argument("--max-drafts", type=int, default=8, help="largest n timed (default 8)")
    bench.set_defaults(fn=cmd_bench_core)
    return parser


def main(argv=None) -> int:
    args = build_parser().parse_args(argv)
    try:
        args.fn(args)
    except (ValueError, FileNotFoundError) as error:
        print(f"eagle-mdsd: error: {error}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
