"""The data stage's answer generation as it batches prompts, against three ways to make it cheaper.

`train-head data` answers prompts in batches of 128 taken in their shuffled order, each left-padded to its
longest prompt, with transformers' `generate` (greedy, bf16, dynamic cache); it is the slowest stage of a head's
pipeline on a CPU (about 110 s a shard of 256 prompts). This answers one shard's prompts (the default training
prompts shuffled with seed 0, as the data stage does, those over 384 tokens dropped, as it does) four ways, one
after the other: (a) as the data stage batches them; (b) sorted by prompt length within the shard, so that a
batch pads less; (c) sorted, with a static cache (`cache_implementation="static"`); (d) sorted, on the engine's
packed bf16 kernels (`kernels.pack`). Reported: seconds, answer tokens, and how many answers are token for token
(a)'s - bf16 rounding depends on the padding, so a greedy answer can change with the batch it is in. Writes
evaluation/results/data_stage_ab_<date>.md.

    .venv/bin/python lab/data_stage_ab.py [--shard 1] [--batch-size 128] [--max-new-tokens 128] [--rounds 2]
"""

from __future__ import annotations

import argparse
import random
import time

import torch

import harness
from eagle_mdsd import kernels, models, training

ARMS = {"data stage": "as `train-head data` batches them", "sorted": "sorted by prompt length",
        "sorted, static cache": "sorted, `cache_implementation=\"static\"`",
        "sorted, packed kernels": "sorted, `kernels.pack` (bf16 on oneDNN)"}


def answer(target, prompts: list[list[int]], arm: str, batch_size: int, max_new_tokens: int,
           pad_id: int) -> tuple[list[list[int]], float]:
    """(answers in the prompts' order, seconds) of one arm."""
    order = list(range(len(prompts)))
    if arm != "data stage":
        order.sort(key=lambda i: len(prompts[i]))
    options = {"cache_implementation": "static"} if arm == "sorted, static cache" else {}
    answers = [None] * len(prompts)
    start = time.perf_counter()
    with torch.inference_mode(), kernels.packed(arm == "sorted, packed kernels"):
        for first in range(0, len(order), batch_size):
            batch = order[first : first + batch_size]
            responses = training._generate(target, [prompts[i] for i in batch], max_new_tokens, pad_id, **options)
            for index, response in zip(batch, responses):
                answers[index] = response
    return answers, time.perf_counter() - start


def padding(prompts: list[list[int]], order: list[int], batch_size: int) -> float:
    """Prompt tokens a left-padded batching computes over, per real prompt token."""
    lengths = [len(prompts[i]) for i in order]
    batches = [lengths[first : first + batch_size] for first in range(0, len(lengths), batch_size)]
    return sum(max(b) * len(b) for b in batches) / sum(lengths)


def compare(target, prompts: list[list[int]], batch_size: int, max_new_tokens: int, pad_id: int,
            rounds: int = 1) -> dict:
    """Every arm's seconds (one per round, the arms in turn), answer tokens and answers identical to the data
    stage's."""
    kernels.pack(target)  # packed layers compute as before outside `kernels.packed()`
    results, reference = {arm: {"seconds": []} for arm in ARMS}, None
    for _ in range(rounds):
        for arm in ARMS:
            answers, seconds = answer(target, prompts, arm, batch_size, max_new_tokens, pad_id)
            reference = reference or answers
            identical = sum(answer == first for answer, first in zip(answers, reference))
            results[arm].update(tokens=sum(map(len, answers)), identical=identical)
            results[arm]["seconds"].append(seconds)
    return results


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--shard", type=int, default=1, help="which 256 prompts of the shuffled default prompts")
    parser.add_argument("--batch-size", type=int, default=128)
    parser.add_argument("--max-new-tokens", type=int, default=128)
    parser.add_argument("--rounds", type=int, default=2, help="times each arm runs, the arms in turn")
    args = parser.parse_args()
    if args.shard < 0 or min(args.batch_size, args.max_new_tokens, args.rounds) < 1:
        parser.error("--shard must be at least 0, --batch-size, --max-new-tokens and --rounds at least 1")
    target, tokenizer, pad_id = harness.load_default()
    records = training.load_prompts([training.DEFAULT_PROMPTS])
    random.Random(0).shuffle(records)  # the data stage's order at its default --seed
    shard = records[256 * args.shard : 256 * (args.shard + 1)]
    prompts = [models.chat_prompt_ids(tokenizer, record["prompt"]) for record in shard]
    prompts = [p for p in prompts if len(p) <= training.DataRecipe().max_prompt_tokens]
    results = compare(target, prompts, args.batch_size, args.max_new_tokens, pad_id, args.rounds)
    first = results["data stage"]["seconds"]
    table = [f"| {arm} | {', '.join(f'{s:.1f}' for s in r['seconds'])} | "
             f"{', '.join(f'{f / s:.2f}x' for f, s in zip(first, r['seconds']))} | {r['tokens']} | "
             f"{r['identical']} of {len(prompts)} |" for arm, r in results.items()]
    print("\n".join(table))
    shuffled, by_length = list(range(len(prompts))), sorted(range(len(prompts)), key=lambda i: len(prompts[i]))
    harness.write_page(
        "data_stage_ab", "The data stage's answer generation, four ways",
        f"Embedded default (SmolLM2-135M-Instruct), bf16; shard {args.shard} of the default training prompts "
        f"shuffled with seed 0 ({len(prompts)} prompts of at most 384 tokens, mean "
        f"{sum(map(len, prompts)) / len(prompts):.0f} tokens; left-padded batches compute over "
        f"{padding(prompts, shuffled, args.batch_size):.2f}x the prompt tokens in the data stage's order, "
        f"{padding(prompts, by_length, args.batch_size):.2f}x sorted), greedy answers of at most "
        f"{args.max_new_tokens} tokens in batches of {args.batch_size}; {args.rounds} rounds, the arms in turn: "
        f"{'; '.join(f'{arm}: {how}' for arm, how in ARMS.items())}. Identical: answers token for token "
        f"the data stage arm's. Command: `.venv/bin/python lab/data_stage_ab.py --shard {args.shard} "
        f"--batch-size {args.batch_size} --max-new-tokens {args.max_new_tokens} --rounds {args.rounds}`.",
        ["| arm | seconds, each round | speed over the data stage, each round | answer tokens | identical answers |",
         "|---|---|---|---|---|", *table])


if __name__ == "__main__":
    main()
