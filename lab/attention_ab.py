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

import harness
from eagle_mdsd import engine, kernels, models, tree

ARMS = ("sdpa", kernels.GQA_SDPA)


def main() -> None:
    count = harness.question_count(__doc__.splitlines()[0])
    target, draft_head, tokenizer = harness.target_and_shipped_head()
    eos = models.eos_token_ids(target, tokenizer)
    decoders = {temperature: engine.Decoder(target, draft_head, tree.load("eagle_default"), *pair, eos_token_ids=eos,
                                            draft_vocab="auto", kernels_choice="packed")
                for temperature, pair in ((0.0, ("topk", "topk")), (1.0, ("without_replacement", "rrs_wo")))}
    prompts = harness.first_turns(tokenizer, count)
    rows = []
    for temperature, decoder in decoders.items():

        def run(arm, prompt, max_new_tokens, seed, decoder=decoder, temperature=temperature):
            target.config._attn_implementation = draft_head.config._attn_implementation = arm
            return decoder.generate(prompt, max_new_tokens, temperature, seed=seed)

        speed, same = harness.take_turns(ARMS, run, prompts)
        rows.append(f"| {temperature:g} | {speed['sdpa']:.1f} | {speed[kernels.GQA_SDPA]:.1f} | "
                    f"{speed[kernels.GQA_SDPA] / speed['sdpa']:.3f} | {same} / {len(prompts)} |")
        print(rows[-1])
    target.config._attn_implementation = draft_head.config._attn_implementation = kernels.GQA_SDPA
    harness.write_page(
        "attention", "Decoder attention: transformers' SDPA against gqa_sdpa",
        f"Embedded default, shipped head, eagle_default, bf16, packed linear layers, draft vocabulary auto, T = 0 "
        f"topk/topk, T = 1 without_replacement/rrs_wo; first turns of MT-Bench questions 1-{len(prompts)} (ids "
        f"81-{80 + len(prompts)}), 128 new tokens, T = 1 seeded by question; the two take turns going first. "
        "Command: `.venv/bin/python lab/attention_ab.py`.",
        ["| T | sdpa: tokens/s | gqa_sdpa: tokens/s | ratio | same answers |", "|---|---|---|---|---|", *rows])


if __name__ == "__main__":
    main()
