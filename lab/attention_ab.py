"""The decoder with transformers' SDPA attention and with eagle_mdsd.kernels.gqa_sdpa, in one process.

The embedded default with its shipped head, eagle_default tree, bf16, packed
linear layers and the main benchmark's settings (draft vocabulary 'auto'; T = 0
topk drafts, T = 1 drafts without replacement verified by rrs_wo); the first
turns of the first N MT-Bench questions (default 8), 128 new tokens, T = 1
seeded by question. The two attention functions take turns going first,
question by question, after an 8-token warm-up each. Writes
evaluation/results/attention_<date>.md with tokens/s per function, their
ratio and how many answers came out the same.

    .venv/bin/python lab/attention_ab.py [--questions 8]
"""

from __future__ import annotations

import argparse
from pathlib import Path

import torch

from eagle_mdsd import benchmarks, engine, head, kernels, models, questions, tree

ARMS = ("sdpa", kernels.GQA_SDPA)


def take_turns(arms, run, prompts) -> tuple[dict[str, float], int]:
    """Tokens/s of each arm over the prompts and how many answers all arms made the same; `run(arm, prompt,
    max_new_tokens, seed)` generates.  The arms take turns going first, question by question, after an
    8-token warm-up each; 128 new tokens, seeded by question."""
    tokens, seconds, answers = dict.fromkeys(arms, 0), dict.fromkeys(arms, 0.0), {arm: [] for arm in arms}
    for index, prompt in enumerate(prompts):
        for arm in arms if index % 2 == 0 else arms[::-1]:
            run(arm, prompt, 8, index)  # warm-up
            result = run(arm, prompt, 128, index)
            tokens[arm] += result.new_tokens
            seconds[arm] += result.wall_time_s
            answers[arm].append(result.token_ids)
    same = sum(len({tuple(answers[arm][i]) for arm in arms}) == 1 for i in range(len(prompts)))
    return {arm: tokens[arm] / seconds[arm] for arm in arms}, same


def question_count(description: str) -> int:
    """--questions N from the command line (default 8): how many MT-Bench first turns an A/B script answers."""
    parser = argparse.ArgumentParser(description=description)
    parser.add_argument("--questions", type=int, default=8)
    args = parser.parse_args()
    if args.questions < 1:
        parser.error(f"--questions is {args.questions}: pass 1 or more")
    return args.questions


def main() -> None:
    count = question_count(__doc__.splitlines()[0])
    target, tokenizer = models.load_target(None, torch.bfloat16)
    draft_head = head.load_head(models.DEFAULT_HEAD, target)
    eos = models.eos_token_ids(target, tokenizer)
    decoders = {temperature: engine.Decoder(target, draft_head, tree.load("eagle_default"), *pair, eos_token_ids=eos,
                                            draft_vocab="auto", kernels_choice="packed")
                for temperature, pair in ((0.0, ("topk", "topk")), (1.0, ("without_replacement", "rrs_wo")))}
    prompts = [models.chat_prompt_ids(tokenizer, q["turns"][0]) for q in questions.load("mt_bench")[:count]]
    rows = []
    for temperature, decoder in decoders.items():

        def run(arm, prompt, max_new_tokens, seed, decoder=decoder, temperature=temperature):
            target.config._attn_implementation = draft_head.config._attn_implementation = arm
            return decoder.generate(prompt, max_new_tokens, temperature, seed=seed)

        speed, same = take_turns(ARMS, run, prompts)
        rows.append(f"| {temperature:g} | {speed['sdpa']:.1f} | {speed[kernels.GQA_SDPA]:.1f} | "
                    f"{speed[kernels.GQA_SDPA] / speed['sdpa']:.3f} | {same} / {len(prompts)} |")
        print(rows[-1])
    target.config._attn_implementation = draft_head.config._attn_implementation = kernels.GQA_SDPA
    page = benchmarks.write_page(
        Path(__file__).resolve().parent / "results", "attention",
        "Decoder attention: transformers' SDPA against gqa_sdpa",
        f"Embedded default, shipped head, eagle_default, bf16, packed linear layers, draft vocabulary auto, T = 0 "
        f"topk/topk, T = 1 without_replacement/rrs_wo; first turns of MT-Bench questions 1-{len(prompts)} (ids "
        f"81-{80 + len(prompts)}), 128 new tokens, T = 1 seeded by question; the two take turns going first. "
        "Command: `.venv/bin/python lab/attention_ab.py`.",
        ["| T | sdpa: tokens/s | gqa_sdpa: tokens/s | ratio | same answers |", "|---|---|---|---|---|", *rows])
    print(f"wrote evaluation/results/{page.name}")


if __name__ == "__main__":
    main()
