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

import argparse
import copy
import datetime
import time
from pathlib import Path

import torch

import fused_features_pilot as base
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


def page(results: list[dict], args, facts: dict) -> str:
    lines = [f"# A second decoder layer for the shipped head: a pilot, {facts['date']}", "",
             f"Machine: {facts['machine']}. Command: `python lab/head_depth_pilot.py --data "
             f"{' '.join(args.data)} --mt-bench {args.mt_bench} --epochs {args.epochs:g} --scratch-epochs "
             f"{args.scratch_epochs:g}`. `tuned`: the shipped "
             f"(one-layer) head fine-tuned on {facts['train_shards']} shards ({facts['train_sequences']:,} "
             f"sequences); `grown`: the shipped head with a second Llama decoder layer whose output projections start "
             f"at zero, fine-tuned the same (same batches of 4,096 tokens, steps, lr {LR:g} with warm-up and cosine, "
             f"seed). `scratch1` / `scratch2`: one- / two-layer heads from scratch on the same data, lr "
             f"{SCRATCH_LR:g}. {base.scoring_note(facts)} The shipped head's earlier "
             f"versions also saw the default prompts, so its held-out column is not held out.", "",
             base.data_note(facts), ""] + base.table(results, ("layers",))
    return "\n".join(lines) + "\n"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--data", nargs="+", required=True, help="runs of `eagle-mdsd train-head data`")
    parser.add_argument("--mt-bench", default="runs/fused/mt_bench_first_turns.pt")
    parser.add_argument("--epochs", type=float, default=2.0, help="of the fine-tuned arms")
    parser.add_argument("--scratch-epochs", type=float, default=4.0, help="of the arms from scratch")
    parser.add_argument("--work", default="runs/head_depth_pilot")
    parser.add_argument("--out", default=f"evaluation/results/head_depth_pilot_{datetime.date.today()}_bfloat16.md")
    args = parser.parse_args()
    runs = [Path(run) for run in args.data]
    shards = {run: sorted((run / "data").glob("shard_*.pt")) for run in runs}
    for run, found in shards.items():
        if not found:
            parser.error(f"no data shards in {run / 'data'}: run `eagle-mdsd train-head data --run {run}` first")
    work = Path(args.work)
    work.mkdir(parents=True, exist_ok=True)
    train_files, held_out, held, mt = base.held_out_sets(shards, Path(args.mt_bench), work)
    target, shipped, draft_rows = base.frozen_target_and_shipped_head()
    record = work / "results.jsonl"
    done = base.finished(record)
    for arm in ARMS:
        if arm in done:
            continue
        started = time.monotonic()
        if arm == "shipped":
            draft, steps = shipped, 0
        elif arm.startswith("scratch"):
            start = head_module.random_head(target, seed=0, layers=int(arm[-1])).float()
            draft, steps = base.train("eagle1", target, train_files, draft_rows, args.scratch_epochs, SCRATCH_LR,
                                      draft=start)
        else:
            start = copy.deepcopy(shipped) if arm == "tuned" else grown(shipped)
            draft, steps = base.train("eagle1", target, train_files, draft_rows, args.epochs, LR, draft=start)
            head_module.save_head(copy.deepcopy(draft).half(), work / arm, safetensors=True)
        result = {"arm": arm, "layers": len(draft.layers), "steps": steps,
                  "train_s": round(time.monotonic() - started) if steps else 0}
        done[arm] = base.score_and_record(result, draft, "eagle1", target, held, mt, record)
    facts = {**base.run_facts(runs, train_files), "held_out": f"{held_out.parent.parent.name}/{held_out.name}"}
    Path(args.out).write_text(page([done[arm] for arm in ARMS], args, facts))
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
