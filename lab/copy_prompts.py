"""Prompts whose answers copy from their context, for training a head that can copy.

The self-written prompts the shipped head was trained on are short single turns, so its answers
seldom repeat anything from the context; MT-Bench's do (second turns that revise the first answer,
extraction from a given text), and prompt-lookup drafts lift tau there from 2.74 to 3.54
(evaluation/results/lookup_graft_2026-11-24_bfloat16_head13.md).  This writes a prompt file for
`eagle-mdsd train-head data --prompts` from the GPTeacher and Alpaca files of the training prompts:

- revisions: a conversation (the dataset's instruction, its reference response as the assistant's
  answer, then a request to rewrite that answer), as a second turn of MT-Bench asks;
- documents: a request about a text (a reference response, or an input) given in the message.

The requests are our own generic wordings, none of them a benchmark question (the data stage drops
those anyway).  Deterministic for a seed.

    .venv/bin/python lab/copy_prompts.py --out runs/copy/prompts.jsonl --count 2048

`--copy-rate RUN` instead reports how much the answers of a data run copy: the share of answer 3-grams (token
ids) that occur in their prompt.
"""

from __future__ import annotations

import argparse
import json
import random
from pathlib import Path

REVISIONS = [
    "Rewrite your previous answer so that it is more concise.",
    "Please give the same answer again, with a short title at the top.",
    "Rewrite your answer in a more formal tone.",
    "Rewrite your previous response as a bulleted list.",
    "Can you rewrite that so a ten-year-old could follow it?",
    "Fix any mistakes in your answer and write it out again in full.",
    "Repeat your answer, but end it with a one-sentence summary.",
    "Rewrite your answer in the first person.",
    "Make your answer friendlier and write it out again.",
    "Write your answer again, splitting it into short paragraphs.",
]
DOCUMENTS = [
    "Summarize the following text in two sentences.",
    "Proofread the following text and return the corrected version.",
    "List the key points of the following text as bullets.",
    "Rewrite the following text in a more formal tone.",
    "Extract every name, number and date mentioned in the following text.",
    "What is the main point of the following text? Quote the sentence that states it.",
    "Turn the following text into a short email to a colleague.",
    "Give the following text a title, then repeat the text below it.",
]
CODE = [
    "Add comments to the following code and return it in full.",
    "Explain the following code line by line.",
    "Rename the variables in the following code to more descriptive names.",
    "Find any bugs in the following code and return a corrected version.",
]


def records(folder: Path) -> list[dict]:
    """(instruction, response) pairs of the GPTeacher codegen and roleplay files and the Alpaca seed tasks."""
    if not (folder / "alpaca-seed-tasks.jsonl").exists():
        raise FileNotFoundError(f"no alpaca-seed-tasks.jsonl in {folder}: pass the training prompts folder "
                                f"with --train-prompts")
    out = []
    for path in sorted(folder.glob("gpteacher-*-instruct.json")):  # not toolformer: tool-call notation
        kind = "code" if "codegen" in path.name else "text"
        for r in json.loads(path.read_text()):
            instruction = f"{r['instruction']}\n\n{r['input']}".strip() if r.get("input") else r["instruction"]
            out.append({"instruction": instruction, "response": r.get("response", ""), "kind": kind})
    for line in (folder / "alpaca-seed-tasks.jsonl").read_text().splitlines():
        r = json.loads(line)
        inst = r["instances"][0]
        instruction = f"{r['instruction']}\n\n{inst['input']}".strip() if inst.get("input") else r["instruction"]
        out.append({"instruction": instruction, "response": inst.get("output", ""), "kind": "text"})
    return [r for r in out if 80 <= len(r["response"]) <= 1200 and r["instruction"].strip()]


def build(folder: Path, count: int, seed: int = 0) -> list[dict]:
    rng = random.Random(seed)
    pool = records(folder)
    rng.shuffle(pool)
    prompts = []
    for i, r in enumerate(pool[:count]):
        if i % 2 == 0:  # a revision of the dataset's answer
            prompts.append({"messages": [{"role": "user", "content": r["instruction"]},
                                         {"role": "assistant", "content": r["response"]},
                                         {"role": "user", "content": rng.choice(REVISIONS)}]})
        else:  # a request about a text given in the message
            request = rng.choice(CODE if r["kind"] == "code" else DOCUMENTS)
            prompts.append({"prompt": f"{request}\n\n{r['response']}"})
    return prompts


def copy_rate(shards) -> float:
    """The share of answer 3-grams, over the samples of data shards, that occur in their own prompt."""
    import torch

    hits = total = 0
    for shard in shards:
        for sample in torch.load(shard, weights_only=True):
            ids, start = sample["ids"].tolist(), sample["start"]
            prompt = {tuple(ids[i : i + 3]) for i in range(start - 2)}
            grams = [tuple(ids[i : i + 3]) for i in range(start, len(ids) - 2)]
            hits += sum(gram in prompt for gram in grams)
            total += len(grams)
    return hits / max(total, 1)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--train-prompts", default="../shared/data/train_prompts")
    parser.add_argument("--out", help="the prompt file to write")
    parser.add_argument("--copy-rate", metavar="RUN", help="report the copy rate of a data run's answers instead")
    parser.add_argument("--count", type=int, default=2048)
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()
    if args.copy_rate:
        from eagle_mdsd.training import data_shards

        try:
            shards = data_shards(Path(args.copy_rate))
        except FileNotFoundError as error:
            parser.error(str(error))
        print(f"{args.copy_rate}: {copy_rate(shards):.3f} of answer 3-grams occur in their prompt "
              f"({len(shards)} shards)")
        return
    if not args.out:
        parser.error("give --out (the prompt file to write) or --copy-rate RUN")
    try:
        prompts = build(Path(args.train_prompts), args.count, args.seed)
    except FileNotFoundError as error:
        parser.error(str(error))
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text("".join(json.dumps(p) + "\n" for p in prompts))
    print(f"wrote {len(prompts)} prompts to {args.out}")


if __name__ == "__main__":
    main()
