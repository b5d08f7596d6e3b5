"""Pilot: does EAGLE-3's fused input (low, middle and final target features) help a head on the embedded default?

Two heads are trained from scratch on the same data, batches, steps, learning rate and seed, and differ only in
their input: `eagle1` reads (token embedding, final feature) as the shipped head does; `fused` reads (token
embedding, layer-2 output, layer-15 output, final feature), the two inner states RMS-normalised, through a wider fc
(EAGLE-3 fuses three layers' states the same way).  Both predict the next final feature with EAGLE-1's loss
(`training.head_loss`, unroll 1).  Scored teacher-forced at draft depth 1, where the fused input is what the
decoder would have: the share of answer positions where the target's greedy token is the head's top-1 and in its
top 4 (eagle_default drafts 4 children at the root), on a held-out shard of the training data and on the target's
greedy answers to the 80 MT-Bench first turns (evaluation only).  The shipped head is scored alongside.

    python lab/fused_features_pilot.py --data runs/data-t0 runs/data-t1 --epochs 4

`--data`: runs of `eagle-mdsd train-head data` (their shards get the inner states added under --work); the first
run's last shard is held out.  Every stage resumes: featurised shards, the MT-Bench set, and one result line per
head in --work/results.jsonl; then the page is written to --out.
"""

from __future__ import annotations

from pathlib import Path

import torch
import torch.nn.functional as F

import harness
from eagle_mdsd import head as head_module
from eagle_mdsd import models, training

ARMS = ("shipped", "eagle1", "fused")


def featurise(runs: list[Path], work: Path, target, kept: dict, pad_id: int) -> list[tuple[Path, Path]]:
    """(shard, copy) pairs: copies of the runs' shards with each sample's 'low' and 'mid' states (bf16)."""
    made = []
    for run in runs:
        for shard in sorted((run / "data").glob("shard_*.pt")):
            dest = work / f"{run.name}_{shard.name}"
            made.append((shard, dest))
            if dest.exists():
                continue
            samples = torch.load(shard, weights_only=True)
            for start in range(0, len(samples), 16):
                batch = samples[start : start + 16]
                length = max(len(s["ids"]) for s in batch)
                ids = torch.full((len(batch), length), pad_id, dtype=torch.long)
                mask = torch.zeros(len(batch), length, dtype=torch.long)
                for row, sample in enumerate(batch):
                    ids[row, : len(sample["ids"])], mask[row, : len(sample["ids"])] = sample["ids"].long(), 1
                with torch.inference_mode():
                    target.model(input_ids=ids, attention_mask=mask)
                for row, sample in enumerate(batch):
                    sample["low"] = kept["low"][row, : len(sample["ids"])].clone()
                    sample["mid"] = kept["mid"][row, : len(sample["ids"])].clone()
            staging = dest.with_suffix(".tmp")
            torch.save(samples, staging)
            staging.replace(dest)
            print(f"featurised {dest.name}", flush=True)
    return made


class FusedInputHead(head_module.EagleHead):
    """The EAGLE-1 head with fc over (embedding, low, mid, final) instead of (embedding, final)."""

    def __init__(self, config):
        super().__init__(config)
        self.fc = torch.nn.Linear(4 * config.hidden_size, config.hidden_size, bias=True)


def head_input(sample: dict, arm: str) -> torch.Tensor:
    final = sample["features"].float()
    if arm != "fused":
        return final
    hidden = (final.shape[-1],)
    return torch.cat([F.rms_norm(sample["low"].float(), hidden), F.rms_norm(sample["mid"].float(), hidden), final], -1)


def arm_input(arm: str):
    return lambda sample: head_input(sample, arm)


def collate(batch: list[dict], arm: str):
    """harness.collate with the arm's input."""
    return harness.collate(batch, arm_input(arm))


def new_head(arm: str, target):
    return harness.new_head(target, FusedInputHead if arm == "fused" else head_module.EagleHead)


def main() -> None:
    parser = harness.pilot_parser(__doc__, "fused_features_pilot", epochs=4.0, mt_bench=False)
    args, shards, work = harness.pilot_setup(parser)
    runs = list(shards)
    target, tokenizer, pad_id = harness.load_default()
    kept = harness.inner_states(target)
    pairs = featurise(runs, work, target, kept, pad_id)
    mt_file = harness.mt_bench_set(work, target, kept, tokenizer, pad_id)
    held_out = [copy for shard, copy in pairs if shard.parent.parent == runs[0]][-1]
    train_pairs = [(shard, copy) for shard, copy in pairs if copy != held_out]
    train_files = [copy for _, copy in train_pairs]
    target = harness.frozen_target()
    raw = [shard for shard, _ in train_pairs]  # the draft vocabulary: the 8,192 most frequent training answer tokens
    draft_rows = torch.tensor(sorted(training.rank_tokens(raw, target.config.vocab_size)[:8192]))
    held = torch.load(held_out, weights_only=True)
    mt = torch.load(mt_file, weights_only=True)

    def train_arm(arm):
        if arm == "shipped":
            return head_module.load_head(models.DEFAULT_HEAD, target).float(), 0, {}
        draft, steps = harness.train(new_head(arm, target), target, train_files, draft_rows, args.epochs,
                                     head_input=arm_input(arm), label=arm)
        return draft, steps, {}

    done = harness.arms_in_turn(ARMS, work / "results.jsonl", train_arm,
                                lambda arm, draft: harness.depth1_scores(draft, target, held, mt, arm_input(arm)))
    facts = harness.run_facts(runs, raw, held_out.name)
    harness.write_pilot_page(
        args.out, "EAGLE-3's fused input against EAGLE-1's on the embedded default", facts,
        harness.command("fused_features_pilot", args, "data", "epochs"),
        f"Both heads from scratch, same {facts['train_shards']} training shards ({facts['train_sequences']:,} "
        f"sequences), batches (4,096 tokens), steps, lr 5e-4 and seed; `fused` adds the outputs of target layers "
        f"{harness.LOW} and {harness.MID} (RMS-normalised) to `eagle1`'s input. {harness.scoring_note(facts)} "
        f"`shipped`: the shipped head, trained on far more data (its earlier versions also saw the default prompts, "
        f"so its held-out column is not held out).", harness.table([done[arm] for arm in ARMS]))


if __name__ == "__main__":
    main()
