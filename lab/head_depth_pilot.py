"""Pilot: does a second decoder layer help the shipped head on the embedded default?

The shipped head is fine-tuned on the given data runs twice, with the same batches, steps, learning rate and seed:
`tuned` as it is (one layer), `grown` with a second stock Llama decoder layer appended whose output projections
(attention o_proj, MLP down_proj) start at zero, so it starts as the shipped head exactly and can only add to it.
Then two heads from scratch, `scratch1` with one layer and `scratch2` with two, on the same data for
--scratch-epochs (the one-layer head is `fused_features_pilot.py`'s eagle1 arm, but with the shipped head's draft
vocabulary in the cross-entropy).
Scored as `fused_features_pilot.py` scores (teacher-forced at draft depth 1: the target's greedy token as the
head's top-1 / within its top 4), on a held-out shard and on the target's greedy answers to the 80 MT-Bench first
turns; the shipped head is scored alongside.  A fine-tuned head is also exported (`--work`/ARM, the compact format
with the shipped draft vocabulary), so `eagle-mdsd bench --ea-model` can measure its tau.

    python lab/head_depth_pilot.py --data runs/data-t0 runs/data-t1 --mt-bench runs/fused/mt_bench_first_turns.pt

`--mt-bench`: the MT-Bench set `fused_features_pilot.py` writes (made here when missing).  The first run's last shard
is held out.  One result line per arm in --work/results.jsonl; a rerun skips finished arms, then writes the page.
"""

from __future__ import annotations

import copy
from pathlib import Path

import torch

import harness
from eagle_mdsd import head as head_module

ARMS = ("shipped", "tuned", "grown", "scratch1", "scratch2")
LR = 3e-4  # the fine-tuning rate of the shipped head's recipe
SCRATCH_LR = 5e-4  # fused_features_pilot.py's, whose eagle1 arm scratch1 is


def grown(draft: head_module.EagleHead) -> head_module.EagleHead:
    """`draft` with one more decoder layer that adds nothing yet (zero o_proj and down_proj)."""
    from transformers.models.llama.modeling_llama import LlamaDecoderLayer

    deeper = copy.deepcopy(draft)
    deeper.config.num_hidden_layers = len(draft.layers) + 1
    torch.manual_seed(0)
    layer = LlamaDecoderLayer(deeper.config, layer_idx=len(draft.layers))
    for module in layer.modules():
        if isinstance(module, torch.nn.Linear):
            torch.nn.init.normal_(module.weight, std=0.02)
    torch.nn.init.zeros_(layer.self_attn.o_proj.weight)
    torch.nn.init.zeros_(layer.mlp.down_proj.weight)
    deeper.layers.append(layer.to(dtype=next(draft.parameters()).dtype))
    return deeper


def main() -> None:
    parser = harness.pilot_parser(__doc__, "head_depth_pilot", epochs=2.0, epochs_help="of the fine-tuned arms")
    parser.add_argument("--scratch-epochs", type=float, default=4.0, help="of the arms from scratch")
    args, shards, work = harness.pilot_setup(parser)
    train_files, held_out, held, mt = harness.held_out_sets(shards, Path(args.mt_bench), work)
    target, shipped, draft_rows = harness.frozen_target_and_shipped_head()

    def train_arm(arm):
        if arm == "shipped":
            draft, steps = shipped, 0
        elif arm.startswith("scratch"):
            start = head_module.random_head(target, seed=0, layers=int(arm[-1])).float()
            draft, steps = harness.train(start, target, train_files, draft_rows, args.scratch_epochs, SCRATCH_LR)
        else:
            start = copy.deepcopy(shipped) if arm == "tuned" else grown(shipped)
            draft, steps = harness.train(start, target, train_files, draft_rows, args.epochs, LR)
            harness.export(draft, work / arm)
        return draft, steps, {"layers": len(draft.layers)}

    done = harness.arms_in_turn(ARMS, work / "results.jsonl", train_arm,
                                lambda arm, draft: harness.depth1_scores(draft, target, held, mt))
    facts = harness.run_facts(list(shards), train_files, harness.shard_name(held_out))
    harness.write_pilot_page(
        args.out, "A second decoder layer for the shipped head", facts,
        harness.command("head_depth_pilot", args, "data", "mt_bench", "epochs", "scratch_epochs"),
        f"`tuned`: the shipped (one-layer) head fine-tuned on {facts['train_shards']} shards "
        f"({facts['train_sequences']:,} sequences); `grown`: the shipped head with a second Llama decoder layer whose "
        f"output projections start at zero, fine-tuned the same (same batches of 4,096 tokens, steps, lr {LR:g} "
        f"with warm-up and cosine, seed). `scratch1` / `scratch2`: one- / two-layer heads from scratch on the same "
        f"data, lr {SCRATCH_LR:g}. {harness.scoring_note(facts)} The shipped head's earlier versions also saw the "
        f"default prompts, so its held-out column is not held out.",
        harness.table([done[arm] for arm in ARMS], ("layers",)))


if __name__ == "__main__":
    main()
