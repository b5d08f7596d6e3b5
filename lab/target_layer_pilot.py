"""Pilot: does a head learn more from the same data when its decoder layer starts as the target's last layer?

Heads from scratch on the embedded default are limited by data ("data separates heads at this size":
fused_features_pilot.py, head_depth_pilot.py).  A pretrained start is knowledge the data need not teach: here
the head's one decoder layer starts as a copy of the target's last decoder layer (its attention, with the input
norm's weight folded into the q/k/v projections since the EAGLE-1 layer has no input norm, its post-attention norm
and its MLP), and fc starts as [random for the token embedding | identity for the feature], so that the layer
first sees a normalised vector of the target's own width.  Heads trained from scratch on the same data,
batches and steps with EAGLE-1's loss (`training.head_loss`), at the same rate unless named:

- `random`: every linear layer random (normal, std 0.02), as fused_features_pilot.py's `eagle1` arm;
- `random_fc_identity`: the same, but fc as in `last_layer` (to tell the two changes apart);
- `last_layer`: fc as above and the decoder layer copied from the target; also at a fifth of the rate.

`_seed1` arms draw their random layers with another seed, to tell a start's effect from the seed's.

Scored as fused_features_pilot.py scores (teacher-forced at draft depth 1: the target's greedy token as the head's
top-1 / within its top 4), on a held-out shard and on the target's greedy answers to the 80 MT-Bench first turns;
the shipped head is scored alongside.

    python lab/target_layer_pilot.py --data runs/data-t0 --mt-bench runs/fused/mt_bench_first_turns.pt

The first run's last shard is held out.  One result line per arm in --work/results.jsonl; a rerun skips finished
arms, then writes the page.  Each trained head is exported (--work/ARM, the compact format with the shipped draft
vocabulary), so `eagle-mdsd bench --ea-model` can measure its tau.
"""

from __future__ import annotations

from pathlib import Path

import torch

import harness

LR = 5e-4  # fused_features_pilot.py's rate from scratch
# arm: (start, learning rate, initialisation seed); the seed-1 arms tell a start's effect from the seed's
ARMS = {"shipped": (None, 0.0, 0), "random": ("random", LR, 0), "random_fc_identity": ("random_fc_identity", LR, 0),
        "last_layer": ("last_layer", LR, 0), "last_layer_lr1e-4": ("last_layer", 1e-4, 0),
        "random_seed1": ("random", LR, 1), "random_fc_identity_seed1": ("random_fc_identity", LR, 1)}


def start_head(arm: str, target, seed: int = 0):
    """The untrained head (fp32) of start `arm` (random, random_fc_identity, last_layer)."""
    draft = harness.new_head(target)
    if seed:
        torch.manual_seed(seed)
        for module in draft.modules():
            if isinstance(module, torch.nn.Linear):
                torch.nn.init.normal_(module.weight, std=0.02)
    if arm == "random":
        return draft
    hidden = target.config.hidden_size
    with torch.no_grad():
        draft.fc.weight[:, hidden:].copy_(torch.eye(hidden))  # fc input: [embedding, feature]
        if arm == "last_layer":
            source, own = target.model.layers[-1], draft.layers[0]
            scale = source.input_layernorm.weight.float()
            for name in ("q_proj", "k_proj", "v_proj"):
                getattr(own.self_attn, name).weight.copy_(getattr(source.self_attn, name).weight.float() * scale)
            own.self_attn.o_proj.weight.copy_(source.self_attn.o_proj.weight.float())
            own.post_attention_layernorm.weight.copy_(source.post_attention_layernorm.weight.float())
            for name in ("gate_proj", "up_proj", "down_proj"):
                getattr(own.mlp, name).weight.copy_(getattr(source.mlp, name).weight.float())
    return draft


def main() -> None:
    args, shards, work = harness.pilot_setup(harness.pilot_parser(__doc__, "target_layer_pilot", epochs=4.0), 2)
    train_files, held_out, held, mt = harness.held_out_sets(shards, Path(args.mt_bench), work)
    target, shipped, draft_rows = harness.frozen_target_and_shipped_head()

    def train_arm(arm):
        start, lr, seed = ARMS[arm]
        if start is None:
            return shipped, 0, {"lr": lr, "seed": seed}
        draft, steps = harness.train(start_head(start, target, seed), target, train_files, draft_rows, args.epochs,
                                     lr)
        draft.draft_vocab = shipped.draft_vocab  # exported for `eagle-mdsd bench --ea-model WORK/ARM`
        harness.export(draft, work / arm)
        return draft, steps, {"lr": lr, "seed": seed}

    done = harness.arms_in_turn(ARMS, work / "results.jsonl", train_arm,
                                lambda arm, draft: harness.depth1_scores(draft, target, held, mt))
    facts = harness.run_facts(list(shards), train_files, harness.shard_name(held_out))
    trained = {arm: {"lr": f"{lr:g}", "seed": seed} if start else {"lr": "-", "seed": "-"}
               for arm, (start, lr, seed) in ARMS.items()}
    harness.write_pilot_page(
        args.out, "The target's last layer as the head's starting point", facts,
        harness.command("target_layer_pilot", args, "data", "mt_bench", "epochs"),
        f"Six heads from scratch on {facts['train_shards']} shards ({facts['train_sequences']:,} sequences), same "
        f"batches of 4,096 tokens, steps, learning rate schedule (warm-up and cosine) and batch order; EAGLE-1's "
        f"loss with the shipped head's draft vocabulary in the cross-entropy. `random`: every linear layer random "
        f"(std 0.02); `random_fc_identity`: fc's feature half the identity; `last_layer`: that fc and the decoder "
        f"layer copied from the target's last one (input norm weight folded into q/k/v); `_seed1`: the other linear "
        f"layers drawn with seed 1 instead of 0. {harness.scoring_note(facts)} `shipped`: the shipped head, trained "
        f"on far more data (its earlier versions also saw the default prompts, so its held-out column is not held "
        f"out).", harness.table([done[arm] | trained[arm] for arm in ARMS], ("lr", "seed")))


if __name__ == "__main__":
    main()
