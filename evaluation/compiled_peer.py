"""transformers `generate` with a static cache and torch.compile, as a peer beside the stock one and the engine.

A user who wants transformers to run faster on a CPU can compile it:
`generate(..., cache_implementation="static", compile_config=...)` compiles
the model's forward with inductor (the benchmark's `hf_compiled` method,
peers.CompiledPeer). Is the engine's lead over `generate` just that?  On
the first turns of N MT-Bench questions spread over the categories (the main
benchmark's pick, default 8), 128 new tokens, bf16, T = 0 (greedy)
and T = 1 (plain sampling, seeded by question), these arms answer question by
question in turn: stock `generate`, compiled `generate`, the engine's plain
decoding (`baseline`) and EAGLE with the shipped head on chain2 and (T = 0)
eagle_default, as the main benchmark runs them.  The compiled arm compiles
and allocates its static cache for the longest prompt first, then answers
three other prompts; that warm-up time is reported, not counted.
Writes evaluation/results/compiled_peer_<date>.md.

    .venv/bin/python evaluation/compiled_peer.py [--questions 8] [--freezing]

`--freezing` also turns on inductor's freezing pass (its own oneDNN weight
packing), which can stop the compiled forward in its fused cache update
(evaluation/results/compiled_peer_*.md).
"""

from __future__ import annotations

import argparse
import time
from pathlib import Path

import torch

from eagle_mdsd import benchmarks, models, peers, questions, tree
from eagle_mdsd.benchmark import plans, runners, selection
from eagle_mdsd import head as head_module

STOCK, COMPILED = "transformers `generate`", "`generate`, static cache + torch.compile"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--questions", type=int, default=8)
    parser.add_argument("--max-new-tokens", type=int, default=128)
    parser.add_argument("--freezing", action="store_true")
    args = parser.parse_args()
    if args.questions < 1:
        parser.error(f"--questions is {args.questions}: pass 1 or more")
    torch._inductor.config.freezing = args.freezing
    target, tokenizer = models.load_target(None, torch.bfloat16)
    draft_head = head_module.load_head(models.DEFAULT_HEAD, target)
    mt_bench = questions.load("mt_bench")
    chosen = selection.spread(mt_bench, args.questions)
    prompts = [models.chat_prompt_ids(tokenizer, q["turns"][0]) for q in chosen]
    warmup_prompts = [models.chat_prompt_ids(tokenizer, q["turns"][0]) for q in mt_bench if q not in chosen][-3:]
    stock = runners.make_runner("hf_generate", target, tokenizer)
    compiled = runners.make_runner(peers.COMPILED, target, tokenizer)
    baseline = runners.make_runner("baseline", target, tokenizer)
    chain2, default = (runners.make_runner("eagle", target, tokenizer, draft_head, tree.load(name))
                       for name in ("chain2", "eagle_default"))
    sampler = runners.make_runner("eagle", target, tokenizer, draft_head, tree.load("chain2"),
                                  *plans.SAMPLING_PAIR.split("/"))
    common = [(STOCK, stock, "hf_generate"), (COMPILED, compiled, peers.COMPILED),
              ("baseline (our loop)", baseline, "baseline")]
    arms = {0.0: common + [("EAGLE chain2 (top-k drafts)", chain2, "eagle"),
                           ("EAGLE eagle_default (top-k drafts)", default, "eagle")],
            1.0: common + [("EAGLE chain2 (sampled drafts, rrs_wo)", sampler, "eagle")]}

    start = time.perf_counter()
    compiled.prepare(max(map(len, prompts + warmup_prompts)) + args.max_new_tokens)
    for prompt in warmup_prompts:
        compiled.generate(prompt, args.max_new_tokens, 0.0, 0)
    warmup = time.perf_counter() - start
    print(f"compiled generate warm-up: {warmup:.0f} s", flush=True)
    for runner, method in dict.fromkeys((runner, method) for _, runner, method in arms[0.0] + arms[1.0]):
        runner.generate(warmup_prompts[0], 16, 0.0, 0, method)  # first calls set up kernels

    rows = []
    for temperature, runs in arms.items():
        tokens, seconds = {}, {}
        for index, prompt in enumerate(prompts):
            for label, runner, method in runs:
                result = runner.generate(prompt, args.max_new_tokens, temperature, index, method)
                new, wall = result.new_tokens, result.wall_time_s
                tokens[label] = tokens.get(label, 0) + new
                seconds[label] = seconds.get(label, 0.0) + wall
        stock_speed, compiled_speed = (tokens[label] / seconds[label] for label in (STOCK, COMPILED))
        for label, _, _ in runs:
            speed = tokens[label] / seconds[label]
            rows.append(f"| {temperature:g} | {label} | {tokens[label]} | {speed:.1f} | {speed / stock_speed:.2f}x | "
                        f"{speed / compiled_speed:.2f}x |")
            print(rows[-1], flush=True)
    page = benchmarks.write_page(
        Path(__file__).resolve().parent / "results", "compiled_peer",
        "transformers generate compiled, beside the stock one and the engine",
        f"Embedded default, bf16, first turns of {args.questions} MT-Bench questions (the main benchmark's), at most "
        f"{args.max_new_tokens} new tokens, T = 1 seeded by question; arms question by question in turn. Compiled "
        f"arm: `generate(cache_implementation='static', compile_config=CompileConfig(mode='default'))`, inductor "
        f"freezing {'on' if args.freezing else 'off'}, warmed up on three other prompts first ({warmup:.0f} s, not "
        f"counted). The engine's arms run on its packed bf16 kernels (`--kernels auto`), as the main benchmark "
        f"does. Command: `.venv/bin/python evaluation/compiled_peer.py --questions {args.questions}"
        f"{' --freezing' if args.freezing else ''}`.",
        ["| T | arm | new tokens | tokens/s | x stock `generate` | x compiled `generate` |", "|---|---|---|---|---|---|",
         *rows])
    print(f"wrote {page}")


if __name__ == "__main__":
    main()
