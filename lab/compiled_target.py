"""The engine's target forward as it runs (eager, packed kernels) against the same forward compiled by inductor.

A decoding cycle is mostly one target forward over the tree, and on a small
target much of an eager forward is not the products: norms, rotary
embeddings, residual adds and attention, a few small ops each per layer.
Would compiling the forward, which fuses those ops, make the engine much
faster?  For 1 row (a plain step), 3 rows (chain2's tree) and 26 rows
(eagle_default's) after a context of C tokens, this times the decoder's
target call (`Decoder.target_forward`: features after the final norm, the tree's
mask) on two copies of the embedded default in bf16, taking turns, median of
N calls: (a) as the engine runs it, transformers' eager modules on packed
weights; (b) the model compiled by inductor (`torch.compile`, dynamic
shapes, freezing on: its own oneDNN weight packing and fused pointwise
kernels), stock weights. The compiled arm's first call per shape (the
compile) is reported apart, with the largest difference between the arms'
features. Writes evaluation/results/compiled_target_<date>.md.

    .venv/bin/python lab/compiled_target.py [--contexts 300,600] [--calls 30]
"""

from __future__ import annotations

import argparse
import statistics
import time

import torch

import harness
from eagle_mdsd import benchmarks, engine, kernels, models
from eagle_mdsd.cache import KVCache
from eagle_mdsd.tree import additive_mask

ROWS = {1: "plain step", 3: "chain2", 26: "eagle_default"}


class Forward:
    """One copy of the target and its decoder, timed on tree-shaped calls after a fixed context."""

    def __init__(self, target, compiled: bool):
        self.decoder = engine.Decoder(target, kernels_choice="stock" if compiled else "auto")
        self.eager_model = self.decoder.decoder_model
        self.model = torch.compile(self.eager_model, dynamic=True) if compiled else self.eager_model

    def prefill(self, context_ids: torch.Tensor, capacity: int) -> None:
        """The context goes in eagerly (both arms the same way), so that only the timed calls differ."""
        self.cache = KVCache(len(self.decoder.decoder_model.layers), capacity)
        self.context = len(context_ids)
        self.decoder.decoder_model = self.eager_model
        with torch.inference_mode(), kernels.packed(self.decoder.packed):
            self.decoder.target_forward(self.cache, context_ids, torch.arange(self.context))
        self.decoder.decoder_model = self.model

    def call(self, tokens: torch.Tensor) -> tuple[torch.Tensor, float]:
        """(features, seconds) of one call over `tokens` as a chain after the context (a tree's mask; one row
        without a mask, as the engine's plain step); the context is left as it was."""
        rows = len(tokens)
        visible = None if rows == 1 else additive_mask(torch.ones(rows, self.context + rows, dtype=torch.bool)
                                                       .tril(self.context), self.decoder.target.dtype)
        positions = torch.arange(self.context, self.context + rows)
        with torch.inference_mode(), kernels.packed(self.decoder.packed):
            start = time.perf_counter()
            features = self.decoder.target_forward(self.cache, tokens, positions, visible)
            seconds = time.perf_counter() - start
        self.cache.truncate(self.context)
        return features, seconds


def compare(eager: Forward, compiled: Forward, context_ids: torch.Tensor, tokens: torch.Tensor, calls: int) -> dict:
    """Medians of `calls` calls of each arm, taking turns, after each arm's first call (timed apart)."""
    capacity = len(context_ids) + len(tokens) + 1
    for arm in (eager, compiled):
        arm.prefill(context_ids, capacity)
    reference, _ = eager.call(tokens)
    features, first_call = compiled.call(tokens)
    times = {"eager": [], "compiled": []}
    for _ in range(calls):
        times["eager"].append(eager.call(tokens)[1])
        times["compiled"].append(compiled.call(tokens)[1])
    return {"eager_ms": 1000 * statistics.median(times["eager"]),
            "compiled_ms": 1000 * statistics.median(times["compiled"]),
            "first_call_s": first_call, "max_difference": float((features.float() - reference.float()).abs().max())}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--contexts", default="300,600", help="context lengths, comma-separated")
    parser.add_argument("--calls", type=int, default=30)
    args = parser.parse_args()
    contexts = [int(c) for c in args.contexts.split(",")]
    if args.calls < 1 or min(contexts) < 1:
        parser.error("--calls and every --contexts entry must be at least 1")
    torch._inductor.config.freezing = True
    eager = Forward(models.load_target(None, torch.bfloat16)[0], compiled=False)
    compiled = Forward(models.load_target(None, torch.bfloat16)[0], compiled=True)
    generator = torch.Generator().manual_seed(0)
    vocab = eager.decoder.lm_head.weight.shape[0]
    table = []
    for context in contexts:
        context_ids = torch.randint(vocab, (context,), generator=generator)
        for rows, tree_name in ROWS.items():
            result = compare(eager, compiled, context_ids, torch.randint(vocab, (rows,), generator=generator),
                             args.calls)
            table.append(f"| {context} | {rows} ({tree_name}) | {result['eager_ms']:.2f} | {result['compiled_ms']:.2f}"
                         f" | {result['eager_ms'] / result['compiled_ms']:.2f}x | {result['first_call_s']:.1f} | "
                         f"{result['max_difference']:.3g} |")
            print(table[-1], flush=True)
    page = benchmarks.write_page(
        harness.RESULTS, "compiled_target",
        "The engine's target forward, eager on packed kernels and compiled by inductor",
        f"Embedded default (SmolLM2-135M-Instruct), bf16; random context and row tokens; a call of R rows is the "
        f"engine's target call over a chain of R tokens after the context (its tree mask; 1 row without a mask, as "
        f"a plain step). Eager: the engine's arm (`--kernels auto`: packed weights, sibling layers together). "
        f"Compiled: `torch.compile(dynamic=True)` of the decoder, inductor freezing on, stock weights; first call "
        f"per row count = its compile (the shapes after it reuse or recompile). Median of {args.calls} calls per "
        f"arm, the arms taking turns. Max difference: the largest |feature| difference between the arms (bf16 "
        f"features of magnitude up to ~10). Command: `.venv/bin/python lab/compiled_target.py --contexts "
        f"{args.contexts} --calls {args.calls}`.",
        ["| context | rows (tree) | eager ms | compiled ms | eager / compiled | first compiled call, s | "
         "max difference |", "|---|---|---|---|---|---|---|", *table])
    print(f"wrote {page}")


if __name__ == "__main__":
    main()
