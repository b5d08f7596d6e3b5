"""Tau on MT-Bench with long answers, and how much of it the target's repeating itself gives.

The main benchmark and the goal's tau stop every answer turn at 128 new
tokens.  EAGLE's and Spec-Bench's evaluations allow 1024.  This runs (or
resumes) the shipped head on all 80 MT-Bench questions, both turns, T = 0,
eagle_default, bf16, with up to --max-new-tokens (default 1024) a turn, then
writes evaluation/results/long_answers_<date>.md: tau overall and per
category beside the 128-token run's answer file, tau by position in the
answer turn, and tau of the cycles that start inside a repeat (the token
there closes an n-gram, default 8 tokens, that the turn already holds)
against the other cycles.  Answer files keep text, not ids, so the turns are
re-tokenised with the target's tokenizer; the page says how many re-tokenised
turns have exactly the turn's token count (the others are left out of the
repeat split, whose positions they would shift).

    .venv/bin/python lab/long_answers.py
"""

from __future__ import annotations

import argparse
from pathlib import Path

import harness
from eagle_mdsd import bench, benchmarks, cli, models, report

SHORT = harness.ANSWERS / "draft_vocab_head13" / "8192-eagle_default-t0.jsonl"  # 128 tokens a turn, 2026-11-24
NGRAM = 8  # a token is inside a repeat when the NGRAM tokens ending at it occurred earlier in the turn


def repeats(ids: list[int], n: int) -> list[bool]:
    """For each position: whether the n tokens ending there already occurred, in that order, earlier in ids."""
    seen, flags = set(), [False] * min(n - 1, len(ids))
    for i in range(n - 1, len(ids)):
        gram = tuple(ids[i - n + 1 : i + 1])
        flags.append(gram in seen)
        seen.add(gram)
    return flags


def repeat_split(rows: list[dict], tokenizer, n: int, max_new_tokens: int) -> dict:
    """Tokens and cycles of the cycles whose first token closes a repeated n-gram ('repeat') and of the others
    ('fresh'), over the turns whose re-tokenised text has their new_tokens (one less where the turn stopped
    early: its end-of-sequence token is not in the text); and the turn counts."""
    split = {"repeat": [0, 0], "fresh": [0, 0], "turns": 0, "aligned": 0, "repeated_tokens": 0, "tokens": 0}
    for row in rows:
        choice = row["choices"][0]
        for text, new_tokens, lengths in zip(choice["turns"], choice["new_tokens"], bench.turn_lengths(choice)):
            split["turns"] += 1
            ids = tokenizer(text, add_special_tokens=False)["input_ids"]
            if len(ids) != new_tokens and not (len(ids) == new_tokens - 1 and new_tokens < max_new_tokens):
                continue
            split["aligned"] += 1
            flags = repeats(ids, n)
            split["repeated_tokens"] += sum(flags)
            split["tokens"] += len(flags)
            position = 1  # position 0 is the token sampled after the prefill
            for length in lengths:
                if position >= len(flags):
                    break
                kind = "repeat" if flags[position] else "fresh"
                split[kind][0] += length
                split[kind][1] += 1
                position += length
    return split


def same_start(short_rows: list[dict], long_rows: list[dict]) -> tuple[int, int]:
    """(questions whose long first turn begins as the short run's first turn, questions in both): the same
    accept lengths up to the short turn's last cycle (which max_new_tokens cut) and the same text up to its
    last few characters (the last token may decode differently once followed)."""
    short = {row["question_id"]: row["choices"][0] for row in short_rows}
    same = shared = 0
    for row in long_rows:
        if row["question_id"] not in short:
            continue
        shared += 1
        first, second = short[row["question_id"]], row["choices"][0]
        cycles = bench.turn_lengths(first)[0][:-1]
        same += (bench.turn_lengths(second)[0][: len(cycles)] == cycles
                 and second["turns"][0].startswith(first["turns"][0][:-8]))
    return same, shared


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--max-new-tokens", type=int, default=1024)
    parser.add_argument("--ngram", type=int, default=NGRAM, help="a token is inside a repeat when the n tokens ending "
                                                              "at it occurred earlier in the turn")
    parser.add_argument("--answers", default=str(harness.ANSWERS / "mt_bench_80_1024" /
                                                 "shipped-eagle_default-t0.jsonl"))
    args = parser.parse_args()
    if args.max_new_tokens < 1 or args.ngram < 1:
        parser.error("--max-new-tokens and --ngram must be 1 or more")
    long_file = Path(args.answers)
    code = cli.main(["bench", "--bench", "mt_bench", "--method", "eagle", "--tree", "eagle_default",
                     "--temperature", "0", "--dtype", "bfloat16", "--max-new-tokens", str(args.max_new_tokens),
                     "--model-id", f"shipped-{args.max_new_tokens}-eagle_default-t0", "--answer-file", str(long_file)])
    if code:
        raise SystemExit(code)
    files, labels = [long_file], [f"{args.max_new_tokens} new tokens a turn"]
    if SHORT.exists():
        files, labels = [SHORT, long_file], ["128 new tokens a turn (2026-11-24 run)", labels[0]]
    entries = report.compare(files, labels=labels, paired=len(files) > 1, window=128)
    _, tokenizer = models.load_target(None)
    rows = bench.read_rows(long_file)
    same, shared = same_start(bench.read_rows(SHORT), rows) if SHORT.exists() else (0, 0)
    split = repeat_split(rows, tokenizer, args.ngram, args.max_new_tokens)
    table = report.markdown(entries).splitlines() + [
        "", f"Cycles of the {args.max_new_tokens}-token run by where they start ({split['aligned']} of "
        f"{split['turns']} turns re-tokenise to their token count, less the end-of-sequence token where they "
        "stopped early, and are counted; in them "
        f"{split['repeated_tokens']} of {split['tokens']} tokens "
        f"({100 * split['repeated_tokens'] / max(split['tokens'], 1):.1f}%) close an {args.ngram}-gram the turn "
        "already held):", "", "| cycles starting | cycles | tokens | tau |", "|---|---|---|---|"]
    for kind, what in (("repeat", f"inside a repeat (the token closes an earlier {args.ngram}-gram)"),
                       ("fresh", "elsewhere")):
        tokens, cycles = split[kind]
        table.append(f"| {what} | {cycles} | {tokens} | {tokens / cycles if cycles else float('nan'):.2f} |")
    page = benchmarks.write_page(
        harness.RESULTS, "long_answers", "Tau on MT-Bench with long answers",
        f"Embedded default (SmolLM2-135M-Instruct), shipped head, bf16, T = 0, eagle_default, topk/topk, draft "
        f"vocabulary auto; all 80 MT-Bench questions, both turns, at most {args.max_new_tokens} new tokens a turn "
        "(EAGLE's and Spec-Bench's limit; the main benchmark and the goal's tau use 128). Tau = new tokens / "
        "target cycles. The 128-token row is the 2026-11-24 run on another AMD EPYC host (its tokens/s are not "
        f"comparable); {same} of {shared} long first turns begin with its first turn's cycles and text. Command: "
        "`.venv/bin/python lab/long_answers.py`.", table)
    print(page.read_text())


if __name__ == "__main__":
    main()
