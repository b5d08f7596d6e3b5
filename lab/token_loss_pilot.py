"""Pilot: does training the head's token term on total variation instead of cross-entropy raise acceptance?

One sampled draft is accepted with probability sum min(p, q) = 1 - TV(p, q) (p the target's distribution, q the
head's), so a head trained on TV (DistillSpec, Zhou et al. 2024) aims straight at the acceptance rate at T > 0,
where EAGLE's cross-entropy only pulls q towards p.  The shipped head is fine-tuned on the given data runs with the
same batches, steps, learning rate and seed, once per arm: the `ce` arms with EAGLE's loss (SmoothL1 on features +
cross-entropy; `ce` at EAGLE's weight 0.1, `ce_w0.5` and `ce_w2` at 0.5 and 2), the `tv` arms with the cross-entropy
replaced by TV (`training.head_loss(token_loss="tv")`) at weight 0.1, 0.5, 2 and 5.  Scored teacher-forced at draft depth 1 over the decoder's draft
vocabulary: top-1 / top-4 of the target's greedy token (what T = 0 trees accept) and the mean of sum min(p, q) at
T = 1 (what a sampled draft is accepted with), on held-out shards and on the target's greedy answers to the 80
MT-Bench first turns (evaluation only).  Each fine-tuned head is exported (--work/ARM, compact), so `eagle-mdsd
bench --ea-model` can measure its tau.

    python lab/token_loss_pilot.py --data runs/data-t0 runs/data-t1 --mt-bench runs/fused/mt_bench_first_turns.pt

The last shard of every data run is held out (the runs answer the same prompts, so no held-out prompt is trained
on); greedy scores on the first run's, sum min(p, q) on every held-out shard.  One result line per arm in
--work/results.jsonl; a rerun skips finished arms, then writes the page.
"""

from __future__ import annotations

import argparse
import copy
import datetime
import time
from pathlib import Path

import torch

import fused_features_pilot as base
from eagle_mdsd import head as head_module
from eagle_mdsd import training

ARMS = {"shipped": None, "ce": ("ce", 0.1), "tv": ("tv", 0.1), "ce_w0.5": ("ce", 0.5), "tv_w0.5": ("tv", 0.5),
        "ce_w2": ("ce", 2.0), "tv_w2": ("tv", 2.0), "tv_w5": ("tv", 5.0)}
LR = 3e-4  # the fine-tuning rate of the shipped head's recipe


def acceptance(draft, target, samples: list[dict], draft_rows: torch.Tensor) -> float:
    """Mean over answer positions of sum min(p, q) at T = 1: p the target's next-token distribution, q the head's
    over the draft vocabulary (0 elsewhere, as the decoder drafts), teacher-forced at depth 1."""
    scores = [training.depth1_scores(draft, target, sample, draft_rows) for sample in samples
              if len(sample["ids"]) - sample["start"] >= 2]
    return sum(score[1] for score in scores) / sum(score[2] for score in scores)


def page(results: list[dict], args, facts: dict) -> str:
    held = facts["held_out"]
    lines = [f"# Total variation against cross-entropy as the head's token loss: a pilot, {facts['date']}", "",
             f"Machine: {facts['machine']}. Command: `python lab/token_loss_pilot.py --data "
             f"{' '.join(args.data)} --mt-bench {args.mt_bench} --epochs {args.epochs:g}`. The shipped head "
             f"fine-tuned on {facts['train_shards']} shards ({facts['train_sequences']:,} sequences) per arm, same "
             f"batches of 4,096 tokens, steps, lr {LR:g} with warm-up and cosine, and seed: the `ce` arms with EAGLE's "
             f"loss (SmoothL1 on features + cross-entropy against the target's distribution; `ce` at EAGLE's weight "
             f"0.1), the `tv` arms with the cross-entropy replaced by the total variation distance 1/2 sum |p - q|, "
             f"each at the weight in the token loss column. "
             f"Scored teacher-forced at depth 1: top-1 / top-4 = the target's greedy token as the head's top-1 / "
             f"within its top 4 (full vocabulary), on the held-out shard `{held[0]}` and on the target's greedy "
             f"answers to the 80 MT-Bench first turns (128 tokens; evaluation only); accept = the mean of sum "
             f"min(p, q) at T = 1 with q over the decoder's 8,192-token draft vocabulary (one sampled draft's "
             f"acceptance rate), on `{held[0]}`, on `{held[-1]}` and on the MT-Bench answers. The held-out shards "
             f"hold the same 256 prompts, none of them trained on; the shipped head's earlier versions saw the "
             f"default prompts, so its held-out columns are not held out.", "",
             base.data_note(facts), "",
             "| head | token loss | steps | training min | held-out top-1 | top-4 | accept | held-out sampled accept | "
             "MT-Bench top-1 | top-4 | accept |", "|---|---|---|---|---|---|---|---|---|---|---|"]
    for r in results:
        lines.append(f"| {r['arm']} | {r['token_loss']} | {r['steps']} | {r['train_s'] / 60:.1f} | "
                     f"{r['held_top1']:.3f} | {r['held_top4']:.3f} | {r['held_accept'][0]:.3f} | "
                     f"{r['held_accept'][-1]:.3f} | {r['mt_top1']:.3f} | {r['mt_top4']:.3f} | {r['mt_accept']:.3f} |")
    return "\n".join(lines) + "\n"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--data", nargs="+", required=True, help="runs of `eagle-mdsd train-head data`")
    parser.add_argument("--mt-bench", default="runs/fused/mt_bench_first_turns.pt",
                        help="the MT-Bench set fused_features_pilot.py writes")
    parser.add_argument("--epochs", type=float, default=2.0)
    parser.add_argument("--work", default="runs/token_loss_pilot")
    parser.add_argument("--out", default=f"evaluation/results/token_loss_pilot_{datetime.date.today()}_bfloat16.md")
    args = parser.parse_args()
    runs = [Path(run) for run in args.data]
    shards = {run: sorted((run / "data").glob("shard_*.pt")) for run in runs}
    for run, found in shards.items():
        if len(found) < 2:
            parser.error(f"{run / 'data'} has {len(found)} data shards, the pilot needs 2 or more: run "
                         f"`eagle-mdsd train-head data --run {run}` first")
    if not Path(args.mt_bench).exists():
        parser.error(f"no MT-Bench set at {args.mt_bench}: run lab/fused_features_pilot.py first")
    work = Path(args.work)
    work.mkdir(parents=True, exist_ok=True)
    held_out = [found[-1] for found in shards.values()]
    train_files = [shard for found in shards.values() for shard in found[:-1]]
    target, shipped, draft_rows = base.frozen_target_and_shipped_head()
    record = work / "results.jsonl"
    done = base.finished(record)
    held = [torch.load(shard, weights_only=True) for shard in held_out]
    mt = torch.load(args.mt_bench, weights_only=True)
    for arm, loss in ARMS.items():
        if arm in done:
            continue
        started = time.monotonic()
        if loss is None:
            draft, steps = shipped, 0
        else:
            draft, steps = base.train("eagle1", target, train_files, draft_rows, args.epochs, LR,
                                      draft=copy.deepcopy(shipped), token_loss=loss[0], token_weight=loss[1])
            head_module.save_head(copy.deepcopy(draft).half(), work / arm, safetensors=True)
        result = {"arm": arm, "token_loss": "-" if loss is None else f"{loss[0]} x {loss[1]:g}", "steps": steps,
                  "train_s": round(time.monotonic() - started) if steps else 0,
                  "held_accept": [acceptance(draft, target, samples, draft_rows) for samples in held],
                  "mt_accept": acceptance(draft, target, mt, draft_rows)}
        done[arm] = base.score_and_record(result, draft, "eagle1", target, held[0], mt, record)
    facts = {**base.run_facts(runs, train_files),
             "held_out": [f"{shard.parent.parent.name}/{shard.name}" for shard in held_out]}
    Path(args.out).write_text(page([done[arm] for arm in ARMS], args, facts))
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
