"""`eagle-mdsd acceptance`: every lossless pair's acceptance rate and alpha* for one node's p and q."""

from __future__ import annotations

import json
import math
import sys

from .. import drafting, theory, verification
from ..errors import UsageError
from . import options


def add_parser(sub) -> None:
    parser = sub.add_parser("acceptance", help="acceptance of every pair and alpha* for one node's p and q")
    parser.add_argument("--p", required=True, help="target distribution, JSON list")
    parser.add_argument("--q", required=True, help="draft distribution, JSON list")
    parser.add_argument("--n", type=options.count(1), default=2, help="number of drafts (default 2)")
    parser.add_argument("--json", action="store_true")
    parser.set_defaults(fn=run)


def distribution(text: str, what: str) -> list[float]:
    """The probabilities of --p or --q; anything that is not a distribution is a usage error."""
    try:
        values = json.loads(text)
    except json.JSONDecodeError:
        raise UsageError(f"--{what} must be a JSON list of probabilities such as [0.5, 0.3, 0.2]") from None
    numbers = isinstance(values, list) and all(isinstance(v, (int, float)) and not isinstance(v, bool) for v in values)
    if not numbers or not values:
        raise UsageError(f"--{what} must be a JSON list of probabilities such as [0.5, 0.3, 0.2]")
    values = [float(v) for v in values]
    if not all(math.isfinite(v) and 0 <= v <= 1 for v in values):  # (also keeps fsum from overflowing)
        raise UsageError(f"--{what} must hold probabilities between 0 and 1, got {text}")
    tiny = next((v for v in values if 0 < v < sys.float_info.min), None)
    if tiny is not None:  # a ratio over a subnormal overflows: every rate would read 0
        raise UsageError(f"--{what} entry {tiny:g} is below the smallest normal float ({sys.float_info.min:.3g}): "
                         "round it to 0")
    total = math.fsum(values)
    if abs(total - 1) > 1e-6:  # a typo in one entry would otherwise be normalised away unseen
        raise UsageError(f"--{what} sums to {total:g}, not 1: give probabilities that add up to 1")
    return values


def run(args) -> None:
    theory.check_drafts(args.n, "n")
    p, q = distribution(args.p, "p"), distribution(args.q, "q")
    if len(p) != len(q):
        raise UsageError(f"--p has {len(p)} tokens but --q has {len(q)}: give both over the same vocabulary")
    rows, alpha = [], {}
    for scheme, verifier in verification.pairs():
        n = 2 if scheme == "spechub" else args.n
        if scheme == "spechub" and args.n != 2:
            continue
        try:
            drafting.get(scheme).check(n, len(p))
        except ValueError:
            continue  # the scheme cannot draw n drafts from this vocabulary: no row
        rate = theory.acceptance_rate(scheme, verifier, p, q, n)
        if scheme not in alpha:  # once a scheme, not a pair: without replacement at n = 16 it takes seconds
            alpha[scheme] = theory.optimal_acceptance(p, q, n, scheme)
        rows.append({"scheme": scheme, "verifier": verifier, "n": n, "acceptance": float(rate),
                     "ci95_half_width": rate.half_width, "alpha_star": alpha[scheme]})
    if args.json:
        print(json.dumps(rows))
        return
    print(f"{'scheme':20s} {'verifier':8s} {'acceptance':>10s} {'alpha*':>8s}")
    for row in rows:  # a Monte Carlo estimate (large V^n) carries its 95% interval
        spread = f"  +- {row['ci95_half_width']:.6f} (Monte Carlo)" if row["ci95_half_width"] else ""
        print(f"{row['scheme']:20s} {row['verifier']:8s} {row['acceptance']:10.6f} {row['alpha_star']:8.6f}{spread}")
