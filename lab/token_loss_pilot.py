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

import copy
from pathlib import Path

import torch

import harness
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


def main() -> None:
    parser = harness.pilot_parser(__doc__, "token_loss_pilot", epochs=2.0)
    args, shards, work = harness.pilot_setup(parser, 2)
    if not Path(args.mt_bench).exists():
        parser.error(f"no MT-Bench set at {args.mt_bench}: run lab/fused_features_pilot.py first")
    held_out = [found[-1] for found in shards.values()]
    train_files = [shard for found in shards.values() for shard in found[:-1]]
    target, shipped, draft_rows = harness.frozen_target_and_shipped_head()
    held = [torch.load(shard, weights_only=True) for shard in held_out]
    mt = torch.load(args.mt_bench, weights_only=True)

    def train_arm(arm):
        loss = ARMS[arm]
        if loss is None:
            return shipped, 0, {"token_loss": "-"}
        draft, steps = harness.train(copy.deepcopy(shipped), target, train_files, draft_rows, args.epochs, LR,
                                     token_loss=loss[0], token_weight=loss[1])
        harness.export(draft, work / arm)
        return draft, steps, {"token_loss": f"{loss[0]} x {loss[1]:g}"}

    def score_arm(arm, draft):
        return {"held_accept": [acceptance(draft, target, samples, draft_rows) for samples in held],
                "mt_accept": acceptance(draft, target, mt, draft_rows),
                **harness.depth1_scores(draft, target, held[0], mt)}

    done = harness.arms_in_turn(ARMS, work / "results.jsonl", train_arm, score_arm)
    facts = harness.run_facts(list(shards), train_files, [harness.shard_name(shard) for shard in held_out])
    first, last = facts["held_out"][0], facts["held_out"][-1]
    lines = ["| head | token loss | steps | training min | held-out top-1 | top-4 | accept | held-out sampled accept "
             "| MT-Bench top-1 | top-4 | accept |", "|---|---|---|---|---|---|---|---|---|---|---|"]
    for r in (done[arm] for arm in ARMS):
        lines.append(f"| {r['arm']} | {r['token_loss']} | {r['steps']} | {r['train_s'] / 60:.1f} | "
                     f"{r['held_top1']:.3f} | {r['held_top4']:.3f} | {r['held_accept'][0]:.3f} | "
                     f"{r['held_accept'][-1]:.3f} | {r['mt_top1']:.3f} | {r['mt_top4']:.3f} | {r['mt_accept']:.3f} |")
    harness.write_pilot_page(
        args.out, "Total variation against cross-entropy as the head's token loss", facts,
        harness.command("token_loss_pilot", args, "data", "mt_bench", "epochs"),
        f"The shipped head fine-tuned on {facts['train_shards']} shards ({facts['train_sequences']:,} sequences) "
        f"per arm, same batches of 4,096 tokens, steps, lr {LR:g} with warm-up and cosine, and seed: the `ce` arms "
        f"with EAGLE's loss (SmoothL1 on features + cross-entropy against the target's distribution; `ce` at "
        f"EAGLE's weight 0.1), the `tv` arms with the cross-entropy replaced by the total variation distance 1/2 "
        f"sum |p - q|, each at the weight in the token loss column. Scored teacher-forced at depth 1: top-1 / top-4 "
        f"= the target's greedy token as the head's top-1 / within its top 4 (full vocabulary), on the held-out "
        f"shard `{first}` and on the target's greedy answers to the 80 MT-Bench first turns (128 tokens; "
        f"evaluation only); accept = the mean of sum min(p, q) at T = 1 with q over the decoder's 8,192-token draft "
        f"vocabulary (one sampled draft's acceptance rate), on `{first}`, on `{last}` and on the MT-Bench answers. "
        f"The held-out shards hold the same 256 prompts, none of them trained on; the shipped head's earlier "
        f"versions saw the default prompts, so its held-out columns are not held out.", lines)


if __name__ == "__main__":
    main()
