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

import argparse
import datetime
import json
import math
import random
import time
from pathlib import Path

import torch
import torch.nn.functional as F

from eagle_mdsd import head as head_module
from eagle_mdsd import models, questions, training
from eagle_mdsd.benchmarks import machine
from eagle_mdsd.engine import additive_mask

LOW, MID = 2, 15  # EAGLE-3 takes layers 2, L/2 and L-3; SmolLM2-135M has 30, and we keep the final feature too
ARMS = ("shipped", "eagle1", "fused")


def inner_states(target):
    """Forward hooks that keep the outputs of layers LOW and MID of the last forward."""
    kept = {}
    for name, index in (("low", LOW), ("mid", MID)):
        def hook(module, args, output, name=name):
            kept[name] = output[0] if isinstance(output, tuple) else output
        target.model.layers[index].register_forward_hook(hook)
    return kept


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


def mt_bench_set(work: Path, target, kept: dict, tokenizer, pad_id: int) -> Path:
    """The target's greedy answers (128 tokens) to the 80 MT-Bench first turns, with all three states."""
    dest = work / "mt_bench_first_turns.pt"
    if dest.exists():
        return dest
    samples = []
    prompts = [models.chat_prompt_ids(tokenizer, q["turns"][0]) for q in questions.load("mt_bench")]
    for start in range(0, len(prompts), 20):
        with torch.inference_mode():
            answers = training._generate(target, prompts[start : start + 20], 128, pad_id)
            for prompt, answer in zip(prompts[start : start + 20], answers):
                ids = torch.tensor([prompt + answer])
                final = target.model(input_ids=ids).last_hidden_state[0]
                samples.append({"ids": ids[0].to(torch.int32), "start": len(prompt), "features": final.clone(),
                                "low": kept["low"][0].clone(), "mid": kept["mid"][0].clone()})
    torch.save(samples, dest)
    return dest


def held_out_sets(shards: dict, mt_bench: Path, work: Path) -> tuple[list[Path], Path, list[dict], list[dict]]:
    """(training shards, held-out shard, its samples, the MT-Bench samples) for the pilots that build on this one:
    `shards` {run: its shard files}, the first run's last shard held out; the MT-Bench set read from `mt_bench`, or
    made under `work` when missing."""
    if not Path(mt_bench).exists():
        target, tokenizer = models.load_target(None, torch.bfloat16)
        pad_id = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else tokenizer.eos_token_id
        mt_bench = mt_bench_set(work, target, inner_states(target), tokenizer, pad_id)
    held_out = next(iter(shards.values()))[-1]
    train_files = [shard for found in shards.values() for shard in found if shard != held_out]
    return train_files, held_out, torch.load(held_out, weights_only=True), torch.load(mt_bench, weights_only=True)


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


def collate(batch: list[dict], arm: str):
    """training._collate with the arm's input: inputs at i, tokens i + 1, target features i + 1, answer mask."""
    width, hidden = head_input(batch[0], arm).shape[-1], batch[0]["features"].shape[-1]
    length = max(len(s["ids"]) for s in batch) - 1
    inputs, targets = torch.zeros(len(batch), length, width), torch.zeros(len(batch), length, hidden)
    tokens, mask = torch.zeros(len(batch), length, dtype=torch.long), torch.zeros(len(batch), length, dtype=torch.bool)
    for row, sample in enumerate(batch):
        n = len(sample["ids"]) - 1
        inputs[row, :n], tokens[row, :n] = head_input(sample, arm)[:-1], sample["ids"][1:].long()
        targets[row, :n] = sample["features"][1:].float()
        mask[row, max(sample["start"] - 1, 0) : n] = True
    return inputs, tokens, targets, mask


def new_head(arm: str, target):
    torch.manual_seed(0)
    config = head_module.head_config_for(target.config)
    draft = FusedInputHead(config) if arm == "fused" else head_module.EagleHead(config)
    for module in draft.modules():
        if isinstance(module, torch.nn.Linear):
            torch.nn.init.normal_(module.weight, std=0.02)
            if module.bias is not None:
                torch.nn.init.zeros_(module.bias)
    return draft.float()


def train(arm: str, target, files: list[Path], draft_rows: torch.Tensor, epochs: float, lr: float = 5e-4,
          draft=None, **loss_options):
    """training.train's loop in brief (AdamW 0.9/0.95, warm-up and cosine, clip 0.5, bf16 autocast, seed 0), from
    a new head for `arm` or from `draft` (fp32); `loss_options` go to training.head_loss."""
    draft = (new_head(arm, target) if draft is None else draft).train()
    embed = target.get_input_embeddings()
    lm_head = training.draft_vocab_lm_head(target.get_output_embeddings(), draft_rows)
    total = int(sum(1 for _ in training._batches(files, 4096, random.Random(0))) * epochs)
    optimizer = torch.optim.AdamW(draft.parameters(), lr=lr, betas=(0.9, 0.95), weight_decay=0.0)
    step, epoch = 0, 0
    while step < total:
        for batch in training._batches(files, 4096, random.Random(epoch)):
            if step >= total:
                break
            for group in optimizer.param_groups:
                group["lr"] = lr * min(1.0, (step + 1) / 50) * 0.5 * (1 + math.cos(math.pi * step / total))
            inputs, tokens, targets, mask = collate(batch, arm)
            with torch.autocast("cpu", dtype=torch.bfloat16):
                loss, _ = training.head_loss(draft, embed, lm_head, inputs, tokens, targets, mask, **loss_options)
            optimizer.zero_grad(set_to_none=True)
            loss.backward()
            torch.nn.utils.clip_grad_norm_(draft.parameters(), 0.5)
            optimizer.step()
            step += 1
            if step % 100 == 0:
                print(f"{arm}: step {step}/{total}, loss {loss.item():.4f}", flush=True)
        epoch += 1
    return draft.eval(), total


@torch.no_grad()
def score(draft, arm: str, target, samples: list[dict]) -> tuple[float, float, int]:
    """(top-1, top-4, positions): the target's greedy next token among the head's best 1 / 4, teacher-forced."""
    lm_head, embed = target.get_output_embeddings(), target.get_input_embeddings()
    top1 = top4 = count = 0
    for sample in samples:
        if len(sample["ids"]) - sample["start"] < 2:
            continue
        inputs, tokens, targets, mask = collate([sample], arm)
        length = inputs.shape[1]
        causal = additive_mask(torch.ones(length, length, dtype=torch.bool).tril(), torch.float32)
        predicted = draft(inputs, embed(tokens), torch.arange(1, length + 1)[None], causal, None)
        truth = lm_head(targets[mask]).argmax(-1)
        best = lm_head(predicted[mask]).topk(4, -1).indices
        top1 += int((best[:, 0] == truth).sum())
        top4 += int((best == truth[:, None]).any(-1).sum())
        count += len(truth)
    return top1 / count, top4 / count, count


def frozen_target_and_shipped_head():
    """(target, shipped head, draft rows) for fine-tuning pilots: the target in fp32 with frozen weights (training
    as `train-head train` does: fp32 + autocast), the shipped head in fp32, and the decoder's draft vocabulary."""
    target, _ = models.load_target(None, torch.float32)
    for parameter in target.parameters():
        parameter.requires_grad_(False)
    shipped = head_module.load_head(models.DEFAULT_HEAD, target).float()
    return target, shipped, torch.tensor(sorted(shipped.draft_vocab[:8192]))


def finished(record: Path) -> dict:
    """The result lines of the arms a run has finished, by arm."""
    return {json.loads(line)["arm"]: json.loads(line) for line in record.read_text().splitlines()} \
        if record.exists() else {}


def score_and_record(result: dict, draft, arm: str, target, held: list[dict], mt: list[dict], record: Path) -> dict:
    """`result` with the head's scores on the held-out and MT-Bench sets, appended to `record` as one line."""
    result["held_top1"], result["held_top4"], result["held_tokens"] = score(draft, arm, target, held)
    result["mt_top1"], result["mt_top4"], result["mt_tokens"] = score(draft, arm, target, mt)
    print(json.dumps(result), flush=True)
    with record.open("a") as out:
        out.write(json.dumps(result) + "\n")
    return result


def run_facts(runs: list[Path], train_shards: list[Path]) -> dict:
    """What a page states about its run: date, machine, the data runs and the training shards."""
    return {"date": datetime.date.today().isoformat(),
            "runs": {run.name: json.loads((run / "data" / "prompts.json").read_text()) for run in runs},
            "machine": f"{machine()['cpu']}, {machine()['threads']} threads, torch {torch.__version__}",
            "train_shards": len(train_shards),
            "train_sequences": sum(len(torch.load(f, weights_only=True)) for f in train_shards)}


def scoring_note(facts: dict) -> str:
    return (f"Scored teacher-forced at depth 1 (full vocabulary): the target's greedy token as the head's top-1 / "
            f"within its top 4, on the held-out shard `{facts['held_out']}` and on the target's greedy answers to "
            f"the 80 MT-Bench first turns (128 tokens; evaluation only).")


def data_note(facts: dict) -> str:
    return "Data (`eagle-mdsd train-head data`, each run's data/prompts.json): " + "; ".join(
        f"`{run}`: {made['count']:,} prompts, answers at temperature {made.get('temperature', 0.0):g}"
        for run, made in facts["runs"].items()) + "."


def table(results: list[dict], extra: tuple[str, ...] = ()) -> list[str]:
    """The results table: head, the `extra` result fields, steps, training minutes and the four scores."""
    lines = ["| head | " + "".join(f"{field} | " for field in extra) + "steps | training min | held-out top-1 | "
             "top-4 | MT-Bench top-1 | top-4 |", "|---|" + "---|" * (len(extra) + 6)]
    for r in results:
        lines.append(f"| {r['arm']} | " + "".join(f"{r[field]} | " for field in extra) + f"{r['steps']} | "
                     f"{r['train_s'] / 60:.1f} | {r['held_top1']:.3f} | {r['held_top4']:.3f} | {r['mt_top1']:.3f} | "
                     f"{r['mt_top4']:.3f} |")
    return lines


def page(results: list[dict], args, facts: dict) -> str:
    lines = [f"# EAGLE-3's fused input against EAGLE-1's on the embedded default: a pilot, {facts['date']}", "",
             f"Machine: {facts['machine']}. Command: `python lab/fused_features_pilot.py --data "
             f"{' '.join(args.data)} --epochs {args.epochs:g}`. Both heads from scratch, same "
             f"{facts['train_shards']} training shards ({facts['train_sequences']:,} sequences), batches (4,096 "
             f"tokens), steps, lr 5e-4 and seed; `fused` adds the outputs of target layers {LOW} and {MID} "
             f"(RMS-normalised) to `eagle1`'s input. {scoring_note(facts)} `shipped`: the shipped head, trained on "
             f"far more data (its earlier versions also saw the default prompts, so its held-out column is not held "
             f"out).", "",
             data_note(facts), ""] + table(results)
    return "\n".join(lines) + "\n"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--data", nargs="+", required=True, help="runs of `eagle-mdsd train-head data`")
    parser.add_argument("--epochs", type=float, default=4.0)
    parser.add_argument("--work", default="runs/fused_features_pilot")
    parser.add_argument("--out", default=f"evaluation/results/fused_features_pilot_{datetime.date.today()}"
                                         f"_bfloat16.md")
    args = parser.parse_args()
    runs = [Path(run) for run in args.data]
    for run in runs:
        if not sorted((run / "data").glob("shard_*.pt")):
            parser.error(f"no data shards in {run / 'data'}: run `eagle-mdsd train-head data --run {run}` first")
    work = Path(args.work)
    work.mkdir(parents=True, exist_ok=True)
    target, tokenizer = models.load_target(None, torch.bfloat16)
    pad_id = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else tokenizer.eos_token_id
    kept = inner_states(target)
    pairs = featurise(runs, work, target, kept, pad_id)
    mt_file = mt_bench_set(work, target, kept, tokenizer, pad_id)
    held_out = [copy for shard, copy in pairs if shard.parent.parent == runs[0]][-1]
    train_pairs = [(shard, copy) for shard, copy in pairs if copy != held_out]
    train_files = [copy for _, copy in train_pairs]
    target, _ = models.load_target(None, torch.float32)  # training as `train-head train` does: fp32 + autocast
    for parameter in target.parameters():
        parameter.requires_grad_(False)
    raw = [shard for shard, _ in train_pairs]  # the draft vocabulary: the 8,192 most frequent training answer tokens
    draft_rows = torch.tensor(sorted(training.rank_tokens(raw, target.config.vocab_size)[:8192]))
    record = work / "results.jsonl"
    done = finished(record)
    held = torch.load(held_out, weights_only=True)
    mt = torch.load(mt_file, weights_only=True)
    for arm in ARMS:
        if arm in done:
            continue
        started = time.monotonic()
        if arm == "shipped":
            draft, steps = head_module.load_head(models.DEFAULT_HEAD, target).float(), 0
        else:
            draft, steps = train(arm, target, train_files, draft_rows, args.epochs)
        result = {"arm": arm, "steps": steps, "train_s": round(time.monotonic() - started) if steps else 0}
        done[arm] = score_and_record(result, draft, arm, target, held, mt, record)
    facts = {**run_facts(runs, raw), "held_out": f"{held_out.name}"}
    Path(args.out).write_text(page([done[arm] for arm in ARMS], args, facts))
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
