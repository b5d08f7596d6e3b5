"""The decoder with each linear layer packed alone and with sibling layers packed together, in one process.

`kernels.pack` packs the layers a decoder layer calls on one input (q, k and v;
gate and up) as one weight, so one product call replaces three (two); with
`siblings=False` it packs each layer alone, as before 2026-11-24.  Two copies of
the embedded default and its shipped head are loaded, one packed each way;
bf16, draft vocabulary 'auto', the main benchmark's four runs of our loop:
plain decoding (baseline), EAGLE at T = 0 on eagle_default and on chain2 (topk
drafts), and at T = 1 on chain2 (drafts without replacement verified by
rrs_wo).  The first turns of the first N MT-Bench questions (default 8), 128
new tokens, T = 1 seeded by question; the two arms take turns going first,
question by question, after an 8-token warm-up each.  Writes
evaluation/results/siblings_<date>.md with tokens/s per arm, their ratio and
how many answers came out the same.

    .venv/bin/python lab/siblings_ab.py [--questions 8]
"""

from __future__ import annotations

import harness
from eagle_mdsd import engine, kernels, models, tree

ARMS = ("alone", "siblings")
RUNS = (  # label, method, tree, drafter, verifier, temperature
    ("baseline", "baseline", "chain2", "topk", "topk", 0.0),
    ("EAGLE eagle_default", "eagle", "eagle_default", "topk", "topk", 0.0),
    ("EAGLE chain2", "eagle", "chain2", "topk", "topk", 0.0),
    ("EAGLE chain2", "eagle", "chain2", "without_replacement", "rrs_wo", 1.0),
)


def load(siblings: bool):
    """The embedded default and its shipped head, packed with or without sibling layers together."""
    target, draft_head, tokenizer = harness.target_and_shipped_head()
    kernels.pack(target, siblings=siblings)
    kernels.pack(draft_head, siblings=siblings)
    return target, draft_head, tokenizer


def main() -> None:
    count = harness.question_count(__doc__.splitlines()[0])
    models_by_arm = {arm: load(siblings=arm == "siblings") for arm in ARMS}
    tokenizer = models_by_arm["alone"][2]
    eos = models.eos_token_ids(models_by_arm["alone"][0], tokenizer)
    prompts = harness.first_turns(tokenizer, count)
    rows = []
    for label, method, tree_name, drafter, verifier, temperature in RUNS:
        decoders = {arm: engine.Decoder(target, draft_head, tree.load(tree_name), drafter, verifier, eos_token_ids=eos,
                                        draft_vocab="auto", kernels_choice="packed")
                    for arm, (target, draft_head, _) in models_by_arm.items()}

        def run(arm, prompt, max_new_tokens, seed, decoders=decoders, method=method, temperature=temperature):
            return decoders[arm].generate(prompt, max_new_tokens, temperature, seed=seed, method=method)

        speed, same = harness.take_turns(ARMS, run, prompts)
        pair = "" if method == "baseline" else f" ({drafter}/{verifier})"
        rows.append(f"| {label}{pair} | {temperature:g} | {speed['alone']:.1f} | {speed['siblings']:.1f} | "
                    f"{speed['siblings'] / speed['alone']:.3f} | {same} / {len(prompts)} |")
        print(rows[-1], flush=True)
    harness.write_page(
        "siblings", "Packed linear layers: each alone against sibling layers together",
        f"Embedded default, shipped head, bf16, packed linear layers, draft vocabulary auto; first turns of MT-Bench "
        f"questions 1-{len(prompts)} (ids 81-{80 + len(prompts)}), 128 new tokens, T = 1 seeded by question; two "
        "copies of the model, one packed each way, take turns going first. "
        "Command: `.venv/bin/python lab/siblings_ab.py`.",
        ["| run | T | alone: tokens/s | siblings: tokens/s | ratio | same answers |", "|---|---|---|---|---|---|",
         *rows])


if __name__ == "__main__":
    main()
