"""Pilot: is the frozen output layer what holds the shipped head back on MT-Bench?

An EAGLE-1 head drafts through the target's own output layer (over the decoder's 8,192-token draft vocabulary);
EAGLE-3 trains a draft output layer of its own. This pilot asks whether one would help here before building it
into `train-head`: the shipped head is frozen, its teacher-forced predicted features at draft depths 1 and 2
(`training.unrolled_predictions`) are computed once on a data run's shards, and only a new output layer over the
draft rows (started from the target's rows) is trained on them, per arm: `ce`, EAGLE's token term (cross-entropy
against the target's distribution over the draft rows) on depth-1 predictions; `top1`, the cross-entropy of the
target's greedy token on depth-1 and depth-2 predictions. Scored after each epoch: top-1 at depths 1 and 2 (the
target's greedy token as the argmax over the draft rows) on the run's held-out last shard and on the target's greedy
answers to the 80 MT-Bench first turns (evaluation only), against the frozen layer.

    python lab/output_layer_pilot.py --data runs/data-t0

Writes evaluation/results/output_layer_pilot_<date>.md.
"""

from __future__ import annotations

import argparse
import time

import torch

import harness
from eagle_mdsd import training

ARMS = {"ce": ("ce", 1e-4, 1), "top1": ("top1", 3e-4, 2)}  # token loss, learning rate, depths trained on
CHUNK = 4096  # positions a step


def predictions(draft, target, samples: list[dict]) -> dict:
    """The head's predicted features at depths 1 and 2 (passes of `training.unrolled_predictions`) at every answer
    position, the true next features there, and which positions have a depth-2 prediction (not a sequence's
    first input)."""
    embed, found = target.get_input_embeddings(), {"depth1": [], "depth2": [], "truth": [], "has_depth2": []}
    for start in range(0, len(samples), 16):
        batch = [s for s in samples[start : start + 16] if len(s["ids"]) - s["start"] >= 2]
        if not batch:
            continue
        features, tokens, targets, mask = training._collate(batch, target.config.hidden_size)
        with torch.inference_mode(), torch.autocast("cpu", dtype=torch.bfloat16):
            depth1, depth2 = training.unrolled_predictions(draft, features, embed(tokens), 2)
        second = mask.clone()
        second[:, 0] = False
        found["depth1"].append(depth1[mask].bfloat16())
        found["depth2"].append(depth2[mask].bfloat16())
        found["truth"].append(targets[mask].bfloat16())
        found["has_depth2"].append(second[mask])
    return {name: torch.cat(parts) for name, parts in found.items()}


def greedy_tokens(lm_weight: torch.Tensor, features: torch.Tensor) -> torch.Tensor:
    """The target's greedy next token (over its whole vocabulary) from its features."""
    return torch.cat([(chunk.float() @ lm_weight.T).argmax(-1) for chunk in features.split(CHUNK)])


def top1(weight: torch.Tensor, rows: torch.Tensor, predicted: torch.Tensor, truth: torch.Tensor) -> float:
    """The share of positions whose argmax over the draft rows (output layer `weight`) is the target's token."""
    drafted = torch.cat([rows[(chunk.float() @ weight.T).argmax(-1)] for chunk in predicted.split(CHUNK)])
    return float((drafted == truth).float().mean())


def train_layer(weight: torch.Tensor, predicted: torch.Tensor, truth: torch.Tensor, token_loss: str, lr: float,
                epochs: int, seed: int = 0):
    """Train a copy of `weight` (draft rows x hidden) to map the predicted features to the target's tokens; yields
    (epoch, its weight, last step's loss) after each epoch. The target's distribution over the rows comes from
    the true features through the starting weight (the target's own rows)."""
    trained = torch.nn.Parameter(weight.clone())
    optimizer = torch.optim.AdamW([trained], lr=lr, betas=(0.9, 0.95), weight_decay=0.0)
    generator = torch.Generator().manual_seed(seed)
    for epoch in range(1, epochs + 1):
        order = torch.randperm(len(predicted), generator=generator)
        for step in order.split(CHUNK):
            with torch.autocast("cpu", dtype=torch.bfloat16):
                logits = predicted[step].float() @ trained.T
            with torch.no_grad():
                p = torch.softmax(truth[step].float() @ weight.T, -1)
            loss = training.TOKEN_LOSSES[token_loss](p, torch.log_softmax(logits.float(), -1)).mean()
            optimizer.zero_grad(set_to_none=True)
            loss.backward()
            optimizer.step()
        yield epoch, trained.detach().clone(), loss.item()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--data", required=True, help="a run of `eagle-mdsd train-head data` (its last shard held out)")
    parser.add_argument("--mt-bench", default="runs/output_layer_pilot/mt_bench_first_turns.pt",
                        help="the target's greedy answers to the MT-Bench first turns (made here when missing)")
    parser.add_argument("--epochs", type=int, default=3)
    parser.add_argument("--work", default="runs/output_layer_pilot")
    args, shards, work = harness.pilot_setup(parser, 2)
    if args.epochs < 1:
        parser.error(f"--epochs is {args.epochs}: pass 1 or more")
    train_files, held_out, held, mt = harness.held_out_sets(shards, args.mt_bench, work)
    target, draft, rows = harness.frozen_target_and_shipped_head()
    draft.eval()
    found = {"held_out": predictions(draft, target, held), "mt_bench": predictions(draft, target, mt)}
    parts = [predictions(draft, target, torch.load(shard, weights_only=True)) for shard in train_files]
    found["train"] = {name: torch.cat([part[name] for part in parts]) for name in parts[0]}
    lm_weight = target.get_output_embeddings().weight.detach()
    start = lm_weight[rows].clone()
    truths = {name: greedy_tokens(lm_weight, found[name]["truth"]) for name in ("held_out", "mt_bench")}

    def scores(weight) -> list[str]:
        cells = []
        for name in ("held_out", "mt_bench"):
            part, deep = found[name], found[name]["has_depth2"]
            cells += [f"{top1(weight, rows, part['depth1'], truths[name]):.3f}",
                      f"{top1(weight, rows, part['depth2'][deep], truths[name][deep]):.3f}"]
        return cells

    lines = ["| output layer | epoch | loss | held-out depth 1 | held-out depth 2 | MT-Bench depth 1 "
             "| MT-Bench depth 2 |", "|---|---|---|---|---|---|---|",
             "| the target's rows (frozen, as shipped) | - | - | " + " | ".join(scores(start)) + " |"]
    print(lines[-1], flush=True)
    train = found["train"]
    for arm, (token_loss, lr, depths) in ARMS.items():
        inputs, truth = train["depth1"], train["truth"]
        if depths == 2:
            inputs = torch.cat([inputs, train["depth2"][train["has_depth2"]]])
            truth = torch.cat([truth, train["truth"][train["has_depth2"]]])
        started = time.monotonic()
        for epoch, weight, loss in train_layer(start, inputs, truth, token_loss, lr, args.epochs):
            lines.append(f"| `{arm}` (lr {lr:g}, depth{'s 1-2' if depths == 2 else ' 1'}) | {epoch} | {loss:.3f} | "
                         + " | ".join(scores(weight)) + " |")
            print(lines[-1], f"{time.monotonic() - started:.0f} s", flush=True)
    positions = len(train["depth1"])
    harness.write_page(
        "output_layer_pilot", "A trained draft output layer on the shipped head's features: a pilot",
        f"bfloat16 autocast. The shipped head frozen; its teacher-forced predictions at draft depths 1 and 2 on "
        f"{len(train_files)} shards of `{args.data}` ({positions:,} answer positions) train a new output layer over "
        f"the decoder's {len(rows):,} draft rows, started from the target's rows, {args.epochs} epochs of "
        f"{CHUNK:,} positions a step (AdamW 0.9, 0.95, constant rate): `ce` = EAGLE's token term on depth-1 "
        "predictions, `top1` = the cross-entropy of the target's greedy token on depth-1 and depth-2 predictions. "
        "Top-1 = the target's greedy token (whole vocabulary) is the argmax over the draft rows, teacher-forced, "
        f"on the held-out shard `{held_out.name}` and on the target's greedy answers (128 tokens) to the 80 "
        f"MT-Bench first turns (evaluation only). Command: `python lab/output_layer_pilot.py --data "
        f"{args.data} --epochs {args.epochs}`.", lines)


if __name__ == "__main__":
    main()
