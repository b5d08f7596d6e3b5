"""How many answer tokens a head's draft vocabulary leaves out.

The decoder drafts over a head's N most frequent training-answer tokens
(`--draft-vocab N`, the ranking in the head's draft_vocab.json); a token the
target emits outside them cannot be drafted. This reads answer files,
re-tokenises each answer turn with the target's tokenizer (answer files keep the
text, not the ids) and prints, for each N, the share of those tokens outside the
N most frequent:

    .venv/bin/python lab/draft_vocab_coverage.py evaluation/answers/tv_head/tv-eagle_default-t0.jsonl
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from eagle_mdsd import bench, head, models


def outside_share(token_lists, ranking: list[int], sizes) -> dict[int, float]:
    """For each N in sizes: the share of all tokens in token_lists that are not among ranking[:N]."""
    tokens = [token for ids in token_lists for token in ids]
    shares = {}
    for size in sizes:
        kept = set(ranking[:size])
        shares[size] = sum(token not in kept for token in tokens) / max(len(tokens), 1)
    return shares


def _sizes(text: str) -> list[int]:
    try:
        sizes = [int(size) for size in text.split(",")]
    except ValueError:
        sizes = []
    if not sizes or min(sizes) < 1:
        raise argparse.ArgumentTypeError(f"{text!r}: pass comma-separated token counts of 1 or more, e.g. 8192,16384")
    return sizes


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("answer_files", nargs="+")
    parser.add_argument("--head", default=str(models.DEFAULT_HEAD), help="head folder with draft_vocab.json")
    parser.add_argument("--base-model", default=None, help="the target whose tokenizer re-tokenises the answers")
    parser.add_argument("--sizes", type=_sizes, default="4096,8192,16384",
                        help="comma-separated draft vocabulary sizes")
    args = parser.parse_args()
    ranked = Path(args.head, head.DRAFT_VOCAB_FILE)
    if not ranked.exists():
        parser.error(f"no {head.DRAFT_VOCAB_FILE} in {args.head}: pass a head folder that ships its ranking")
    rows = [row for path in args.answer_files for row in bench.read_rows(Path(path))]
    if not rows:
        parser.error(f"no answers in {', '.join(args.answer_files)}: run `eagle-mdsd bench` to write them")
    _, tokenizer = models.load_target(args.base_model)
    token_lists = [tokenizer(turn, add_special_tokens=False)["input_ids"]
                   for row in rows for turn in row["choices"][0]["turns"]]
    shares = outside_share(token_lists, json.loads(ranked.read_text())["token_ids"], args.sizes)
    print(f"{sum(map(len, token_lists))} answer tokens of {len(rows)} questions:")
    for size, share in shares.items():
        print(f"  outside the {size} most frequent: {100 * share:.1f}%")


if __name__ == "__main__":
    main()
