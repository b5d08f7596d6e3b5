"""Each dynamic tree's default shape for a device, from a cost model measured on it.

A dynamic tree's cycle costs one target forward over the tree's tokens and the head's passes over the rows it
expands.  On a GPU the forward barely grows with the tokens, and EAGLE-2's own shapes stand; on a CPU it grows
with them, so a smaller tree that accepts a little less can decode faster.

For every candidate shape (eagle2: total tokens, depth, top-k; opt_tree: nodes, threshold, top-k) the script
decodes held-out training prompts (never benchmark questions) at T = 0 on this device, shapes in a shuffled
order, and records

- tau, which is exact at T = 0 (no timing in it);
- per cycle: the wall seconds, the tree's tokens, and the head's passes and rows (counted at the head's forward).

The cost model is the least-squares fit, over every shape's cycles,

    seconds a cycle = a + b * tree tokens + c * head passes + d * head rows,

and a shape's predicted tokens/s is tau / its predicted cycle seconds: the fit pools every run's timing, so one
noisy run does not pick the default.  The best predicted shape of each tree kind is its default on this device
(`tree_specs.DEFAULTS`).  eagle_default and chain2 run alongside as references, first and last.

    .venv/bin/python evaluation/dynamic_defaults.py [--device cpu] [--prompts 4] [--max-new-tokens 64] [--out DIR]

Writes DIR/dynamic_defaults_DATE.md (default runs/dynamic_defaults/DATE_HOST_TIME/).
"""

from __future__ import annotations

import itertools
import random
import socket
import sys
import time
from pathlib import Path

import numpy

from eagle_mdsd import benchmarks, dynamic, engine, head, models, sequoia, tree_specs
from eagle_mdsd import validate
from eagle_mdsd.cli.options import count, output_folder
from eagle_mdsd.errors import UsageError

# The shapes tried: from a chain's size to well past eagle_default's cost on a CPU; a depth beyond the drafted
# tokens only adds head passes, so such shapes are left out.
EAGLE2 = [f"eagle2:total_tokens={tokens},depth={depth},top_k={k}"
          for tokens, depth, k in itertools.product((3, 4, 6, 8, 12), (2, 3, 4, 6), (2, 3, 4)) if depth < tokens]
OPT_TREE = [f"opt_tree:nodes={nodes},threshold={threshold},top_k={k}"
            for nodes, threshold, k in itertools.product((2, 3, 5, 8, 12), (0.1, 0.4), (2, 3, 4))]
REFERENCES = ["eagle_default", "chain2"]


def counted(draft_model) -> list[int]:
    """The rows of every head forward from now on (the list grows as the head runs)."""
    rows, forward = [], draft_model.forward

    def counting(cache, features, tokens, positions, mask):
        rows.append(len(tokens))
        return forward(cache, features, tokens, positions, mask)

    draft_model.forward = counting
    return rows


def measure(decoder, prompts, max_new_tokens: int) -> dict:
    """Totals over the prompts at T = 0: new tokens, cycles, seconds, tree tokens, head passes and rows (the
    prefill's head pass left out)."""
    rows = counted(decoder.draft_model)
    total = dict(tokens=0, cycles=0, seconds=0.0, tree_tokens=0, passes=0, rows=0)
    for prompt in prompts:
        rows.clear()
        result = decoder.generate(prompt, max_new_tokens, 0.0)
        total["tokens"] += result.new_tokens
        total["cycles"] += result.cycles
        total["seconds"] += result.wall_time_s
        total["tree_tokens"] += result.cycles * (1 + getattr(decoder.tree, "nodes", decoder.tree.size))
        total["passes"] += len(rows) - 1
        total["rows"] += sum(rows[1:])
    return total


def fit(runs: dict) -> numpy.ndarray:
    """(a, b, c, d) of seconds a cycle = a + b tree tokens + c head passes + d head rows, every cycle weighed
    alike."""
    features, seconds = [], []
    for run in runs.values():
        weight = run["cycles"] ** 0.5  # a run's per-cycle means, weighed by its cycles
        features.append([weight * x for x in (1.0, *per_cycle(run))])
        seconds.append(weight * run["seconds"] / run["cycles"])
    return numpy.linalg.lstsq(numpy.array(features), numpy.array(seconds), rcond=None)[0]


def per_cycle(run: dict) -> tuple[float, float, float]:
    return tuple(run[key] / run["cycles"] for key in ("tree_tokens", "passes", "rows"))


def predicted_seconds(coefficients, run: dict) -> float:
    return float(coefficients @ numpy.array([1.0, *per_cycle(run)]))


def setup(args, shapes: int, seconds: float) -> str:
    return (f"Embedded default in {args.dtype} with the shipped head, draft vocabulary auto, T = 0; {args.prompts} "
            f"held-out training prompts (`sequoia.held_out_prompts`), at most {args.max_new_tokens} new tokens each; "
            f"{shapes} shapes in {seconds / 60:.1f} min.\n\nCommand: `.venv/bin/python evaluation/dynamic_defaults.py "
            f"--device {args.device} --dtype {args.dtype} --prompts {args.prompts} --max-new-tokens "
            f"{args.max_new_tokens}" + (f" --shapes {args.shapes}" if args.shapes else "") + "`")


def page(runs: dict, coefficients, best: dict) -> list[str]:
    a, b, c, d = (1000 * x for x in coefficients)
    rows = []
    for spec, run in sorted(runs.items(), key=lambda item: -item[1]["predicted"]):
        tokens, passes, head_rows = per_cycle(run)
        rows.append(f"| {spec} | {run['tokens'] / run['cycles']:.2f} | {tokens:.1f} | {passes:.2f} | "
                    f"{head_rows:.1f} | {1000 * run['seconds'] / run['cycles']:.2f} | "
                    f"{1000 * predicted_seconds(coefficients, run):.2f} | {run['tokens'] / run['seconds']:.1f} | "
                    f"{run['predicted']:.1f} |")
    reference = runs["eagle_default"]["predicted"]
    chosen = [f"| {kind} | {spec} | {runs[spec]['predicted']:.1f} | {runs[spec]['predicted'] / reference:.2f}x |"
              for kind, spec in best.items()]
    return [
        f"Cost model (least squares over every shape): ms a cycle = {a:.2f} + {b:.3f} x tree tokens + {c:.2f} x "
        f"head passes + {d:.3f} x head rows.", "",
        "| tree kind | default on this device | predicted tokens/s | against eagle_default |", "|---|---|---|---|",
        *chosen, "",
        "| shape | tau | tree tokens a cycle | head passes a cycle | head rows a cycle | ms a cycle | predicted ms | "
        "tokens/s | predicted tokens/s |", "|---|---|---|---|---|---|---|---|---|", *rows]


def main() -> None:
    parser = validate.Parser(prog="dynamic_defaults.py", description=__doc__.split("\n")[0])
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--dtype", default="bfloat16")
    parser.add_argument("--prompts", type=count(1), default=4)
    parser.add_argument("--max-new-tokens", type=count(2), default=64)
    parser.add_argument("--shapes", type=count(0), default=0,
                        help="only this many shapes of each kind (a quick check; 0: all)")
    parser.add_argument("--out", type=output_folder)
    args = parser.parse_args()
    models.check_device(args.device)
    dtype = models.parse_dtype(args.dtype)  # bad options: one line, before the model loads
    out = Path(args.out or Path("runs/dynamic_defaults") / time.strftime(f"%Y-%m-%d_{socket.gethostname()}_%H%M%S"))
    target, tokenizer = models.load_target(None, dtype, args.device)
    draft_head = head.load_head(models.DEFAULT_HEAD, target)
    eos = models.eos_token_ids(target, tokenizer)
    prompts = sequoia.held_out_prompts(tokenizer, args.prompts)
    shapes = EAGLE2[: args.shapes or None] + OPT_TREE[: args.shapes or None]
    random.Random(0).shuffle(shapes)
    started, runs = time.perf_counter(), {}
    for spec in [REFERENCES[0], *shapes, REFERENCES[1]]:
        decoder = engine.Decoder(target, draft_head, tree_specs.load(spec, device=args.device), eos_token_ids=eos,
                                 draft_vocab="auto")
        decoder.generate(prompts[0], 16, 0.0)  # warm-up
        runs[spec] = measure(decoder, prompts, args.max_new_tokens)
        print(f"{spec}: tau {runs[spec]['tokens'] / runs[spec]['cycles']:.2f}, "
              f"{runs[spec]['tokens'] / runs[spec]['seconds']:.1f} tokens/s", flush=True)
    coefficients = fit(runs)
    for run in runs.values():
        run["predicted"] = run["tokens"] / run["cycles"] / predicted_seconds(coefficients, run)
    best = {kind: max((spec for spec in runs if spec.startswith(kind)), key=lambda spec: runs[spec]["predicted"])
            for kind in dynamic.NAMES}
    facts = benchmarks.machine(args.device)
    written = benchmarks.write_page(out, "dynamic_defaults", f"Dynamic trees' defaults on {args.device}",
                                    setup(args, len(runs), time.perf_counter() - started),
                                    page(runs, coefficients, best), facts)
    print(f"wrote {written}")


if __name__ == "__main__":
    try:
        main()
    except UsageError as error:  # one line, exit 2, as the command's own errors
        print(f"dynamic_defaults.py: error: {error}", file=sys.stderr)
        raise SystemExit(2) from None
