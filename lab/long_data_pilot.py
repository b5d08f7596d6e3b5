"""Pilot: a finishing epoch on long answers, where the target repeats itself, against the same answers cut at 128.

In long MT-Bench answers the target soon repeats itself, and the shipped head
drafts those repeats far below a copier's tau (lab/long_answers.py).
Its training answers stop at 128 tokens, where repeats are rare.  This takes
a data run whose answers go on longer (`train-head data --max-new-tokens
512`), copies it with every answer cut at its first 128 tokens (the same
prompts and, greedy, the same first tokens), gives the shipped head one more
epoch of its last epoch's recipe on each (total variation at weight 2, lr
3e-4), and runs both on all 80 MT-Bench questions, both turns, T = 0,
eagle_default, 128 new tokens a turn (the goal's setting), after the shipped
head itself, one after the other in one process.  Writes
evaluation/results/long_data_pilot_<date>.md with tau, tau per question
against the shipped head, and tau of the cycles that start inside a repeat
against the others (lab/long_answers.py).

    eagle-mdsd train-head data --run runs/long_pilot --max-prompts 768 --max-new-tokens 512 --batch-size 128 --seed 3
    .venv/bin/python lab/long_data_pilot.py --data runs/long_pilot --work runs/long_data_pilot
"""

from __future__ import annotations

import argparse
import os
import shutil
from pathlib import Path

import torch

import harness
import long_answers
from eagle_mdsd import bench, cli, models, report

FINISHING_EPOCH = ["--epochs", "1", "--lr", "3e-4", "--tokens-per-batch", "4096", "--draft-vocab", "8192",
                   "--token-loss", "tv", "--token-weight", "2"]  # the shipped head's last epoch
BENCH = ["--bench", "mt_bench", "--method", "eagle", "--tree", "eagle_default", "--temperature", "0", "--dtype",
         "bfloat16", "--max-new-tokens", "128"]  # the goal's setting


def cut_answers(source: Path, destination: Path, answer_tokens: int) -> list[Path]:
    """Copy a data run's shards into destination/data with every answer cut at its first answer_tokens tokens
    (ids and features alike); shards already there are kept, each is written atomically."""
    shards = sorted((source / "data").glob("shard_*.pt"))
    if not shards:
        raise FileNotFoundError(f"no data shards in {source / 'data'}: run `eagle-mdsd train-head data` there first")
    (destination / "data").mkdir(parents=True, exist_ok=True)
    shutil.copy(source / "data" / "prompts.json", destination / "data" / "prompts.json")
    written = []
    for shard in shards:
        target = destination / "data" / shard.name
        if not target.exists():
            samples = [{"ids": s["ids"][: s["start"] + answer_tokens].clone(), "start": s["start"],
                        "features": s["features"][: s["start"] + answer_tokens].clone()}
                       for s in torch.load(shard)]
            staging = target.with_suffix(".tmp")
            torch.save(samples, staging)
            os.replace(staging, target)
        written.append(target)
    return written


def answer_tokens(shards: list[Path]) -> int:
    """How many answer tokens (ids after each sample's start) the shards hold."""
    return sum(len(s["ids"]) - s["start"] for shard in shards for s in torch.load(shard))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--data", required=True, help="a data run with long answers (train-head data --max-new-tokens 512)")
    parser.add_argument("--work", default="runs/long_data_pilot", help="folder for the cut data and the two heads")
    parser.add_argument("--cut", type=int, default=128, help="answer tokens kept in the control arm")
    args = parser.parse_args()
    if args.cut < 1:
        parser.error(f"--cut is {args.cut}: pass 1 or more answer tokens")
    data, work = Path(args.data), Path(args.work)
    long_shards = sorted((data / "data").glob("shard_*.pt"))
    if not long_shards:
        parser.error(f"no data shards in {data / 'data'}: run `eagle-mdsd train-head data --run {data} "
                     "--max-new-tokens 512` first")
    cut_shards = cut_answers(data, work / f"cut{args.cut}", args.cut)
    arms = {"long": data, f"cut{args.cut}": work / f"cut{args.cut}"}
    answers = harness.ANSWERS / "long_data_pilot"
    shipped = answers / "shipped-eagle_default-t0.jsonl"
    files = [shipped]
    if cli.main(["bench", *BENCH, "--model-id", "shipped-eagle_default-t0", "--answer-file", str(shipped)]):
        raise SystemExit("the shipped head's benchmark run failed")
    for name, run in arms.items():
        head_run = work / f"head_{name}"
        for command in (["train-head", "train", "--run", str(head_run), "--init-from", str(models.DEFAULT_HEAD),
                         "--data-from", str(run), *FINISHING_EPOCH],
                        ["train-head", "export", "--run", str(head_run)],
                        ["bench", *BENCH, "--ea-model", str(head_run / "head"), "--model-id",
                         f"{name}-eagle_default-t0", "--answer-file", str(answers / f"{name}-eagle_default-t0.jsonl")]):
            if cli.main(command):
                raise SystemExit(f"`eagle-mdsd {' '.join(command)}` failed")
        files.append(answers / f"{name}-eagle_default-t0.jsonl")
    labels = ["shipped head", "+ epoch on long answers", f"+ epoch on the same cut at {args.cut}"]
    table = report.markdown(report.compare(files, labels=labels, paired=True, window=32)).splitlines()
    _, tokenizer = models.load_target(None)
    table += ["", "Cycles by where they start (turns that re-tokenise to their token count; a repeat: the token "
              f"closes an {long_answers.NGRAM}-gram the turn already held):", "",
              "| head | cycles in repeats | tau there | other cycles | tau there |", "|---|---|---|---|---|"]
    for label, path in zip(labels, files):
        split = long_answers.repeat_split(bench.read_rows(path), tokenizer, long_answers.NGRAM, 128)
        (rt, rc), (ft, fc) = split["repeat"], split["fresh"]
        table.append(f"| {label} | {rc} | {rt / rc:.2f} | {fc} | {ft / fc:.2f} |")
    long_count, cut_count = answer_tokens(long_shards), answer_tokens(cut_shards)
    page = harness.write_page(
        "long_data_pilot", "Pilot: a finishing epoch on long answers",
        f"Embedded default, bf16. Data: `{data.name}`, {len(long_shards)} shards, {long_count} answer tokens "
        f"(answers up to 512 tokens); the control keeps each answer's first {args.cut}: {cut_count} answer tokens. "
        "Each arm: the shipped head plus one epoch of its last epoch's recipe (`train-head train --init-from "
        f"{models.DEFAULT_HEAD.name} {' '.join(FINISHING_EPOCH)}`). Tau on all 80 MT-Bench questions, both "
        "turns, T = 0, eagle_default, topk/topk, draft vocabulary auto, at most 128 new tokens a turn; the three "
        "heads ran one after the other. Command: "
        "`.venv/bin/python lab/long_data_pilot.py --data runs/long_pilot`.", table)
    print(page.read_text())


if __name__ == "__main__":
    main()
