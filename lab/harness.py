"""What the lab's scripts share, so that each script holds only its own question.

- Where things go: pages under evaluation/results/, answer files under evaluation/answers/.
- The embedded default: the target (with its pad id), the shipped head, the MT-Bench first turns.
- The head pilots: their command line, data shards and held-out sets, the training loop, the depth-1 scores,
  the arms run in turn with one result line each (a rerun skips finished arms), and their pages.
- The A/B scripts: --questions, and the arms taking turns question by question.
"""

from __future__ import annotations

import argparse
import copy
import datetime
import json
import math
import random
import time
from pathlib import Path
from typing import Callable

import torch

from eagle_mdsd import head as head_module
from eagle_mdsd import benchmarks, models, questions, training
from eagle_mdsd.tree import additive_mask

ROOT = Path(__file__).resolve().parent.parent
RESULTS = ROOT / "evaluation" / "results"
ANSWERS = ROOT / "evaluation" / "answers"

MT_BENCH = "runs/fused/mt_bench_first_turns.pt"  # the MT-Bench set fused_features_pilot.py writes
LOW, MID = 2, 15  # EAGLE-3 takes layers 2, L/2 and L-3; SmolLM2-135M has 30, and we keep the final feature too


# The embedded default

def load_default(dtype: torch.dtype = torch.bfloat16):
    """(target, tokenizer, pad id) of the embedded default."""
    target, tokenizer = models.load_target(None, dtype)
    pad_id = models.pad_token_id(tokenizer)
    return target, tokenizer, pad_id


def target_and_shipped_head(dtype: torch.dtype = torch.bfloat16):
    """(target, shipped head, tokenizer): the embedded default and its shipped head."""
    target, tokenizer = models.load_target(None, dtype)
    return target, head_module.load_head(models.DEFAULT_HEAD, target), tokenizer


def frozen_target():
    """The target in fp32 with frozen weights: training as `train-head train` does (fp32 + autocast)."""
    target, _ = models.load_target(None, torch.float32)
    for parameter in target.parameters():
        parameter.requires_grad_(False)
    return target


def frozen_target_and_shipped_head():
    """(target, shipped head, draft rows) for fine-tuning pilots: the frozen fp32 target, the shipped head in fp32,
    and the decoder's draft vocabulary."""
    target = frozen_target()
    shipped = head_module.load_head(models.DEFAULT_HEAD, target).float()
    return target, shipped, torch.tensor(sorted(shipped.draft_vocab[:8192]))


def first_turns(tokenizer, count: int | None = None) -> list[list[int]]:
    """The prompt ids of the first turns of the first `count` MT-Bench questions (all 80 by default)."""
    return [models.chat_prompt_ids(tokenizer, q["turns"][0]) for q in questions.load("mt_bench")[:count]]


def write_page(stem: str, title: str, setup: str, table: list[str]) -> Path:
    """evaluation/results/<stem>_<date>.md (benchmarks.write_page), said on stdout."""
    page = benchmarks.write_page(RESULTS, stem, title, setup, table)
    print(f"wrote {page}")
    return page


# The head pilots: command line and data

def pilot_parser(doc: str, name: str, epochs: float, mt_bench: bool = True,
                 epochs_help: str | None = None) -> argparse.ArgumentParser:
    """--data RUN..., --mt-bench (where `mt_bench`), --epochs, --work (runs/NAME) and --out
    (evaluation/results/NAME_<date>_bfloat16.md); a pilot adds its own options."""
    parser = argparse.ArgumentParser(description=doc.split("\n")[0])
    parser.add_argument("--data", nargs="+", required=True, help="runs of `eagle-mdsd train-head data`")
    if mt_bench:
        parser.add_argument("--mt-bench", default=MT_BENCH, help="the MT-Bench set fused_features_pilot.py writes")
    parser.add_argument("--epochs", type=float, default=epochs, help=epochs_help)
    parser.add_argument("--work", default=f"runs/{name}")
    parser.add_argument("--out", default=f"evaluation/results/{name}_{datetime.date.today()}_bfloat16.md")
    return parser


def data_shards(parser: argparse.ArgumentParser, runs: list[str], least: int = 1) -> dict[Path, list[Path]]:
    """{run: its shard files}; a run with fewer than `least` shards (the last is held out where 2) is a one-line
    error."""
    shards = {Path(run): sorted((Path(run) / "data").glob("shard_*.pt")) for run in runs}
    for run, found in shards.items():
        if not found and least == 1:
            parser.error(f"no data shards in {run / 'data'}: run `eagle-mdsd train-head data --run {run}` first")
        elif len(found) < least:
            parser.error(f"{run / 'data'} has {len(found)} data shards, the pilot needs {least} or more (the last "
                         f"is held out): run `eagle-mdsd train-head data --run {run}` with more prompts")
    return shards


def pilot_setup(parser: argparse.ArgumentParser, least: int = 1):
    """(arguments, {run: its shard files}, the --work folder, made)."""
    args = parser.parse_args()
    shards = data_shards(parser, args.data if isinstance(args.data, list) else [args.data], least)
    work = Path(args.work)
    work.mkdir(parents=True, exist_ok=True)
    return args, shards, work


def shard_name(shard: Path) -> str:
    return f"{shard.parent.parent.name}/{shard.name}"


def inner_states(target):
    """Forward hooks that keep the outputs of layers LOW and MID of the last forward."""
    kept = {}
    for name, index in (("low", LOW), ("mid", MID)):
        def hook(module, args, output, name=name):
            kept[name] = output[0] if isinstance(output, tuple) else output
        target.model.layers[index].register_forward_hook(hook)
    return kept


def mt_bench_set(work: Path, target, kept: dict, tokenizer, pad_id: int) -> Path:
    """The target's greedy answers (128 tokens) to the 80 MT-Bench first turns, with all three states."""
    dest = work / "mt_bench_first_turns.pt"
    if dest.exists():
        return dest
    samples = []
    prompts = first_turns(tokenizer)
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
    """(training shards, held-out shard, its samples, the MT-Bench samples): `shards` {run: its shard files}, the
    first run's last shard held out; the MT-Bench set read from `mt_bench`, or made under `work` when missing."""
    if not Path(mt_bench).exists():
        target, tokenizer, pad_id = load_default()
        mt_bench = mt_bench_set(work, target, inner_states(target), tokenizer, pad_id)
    held_out = next(iter(shards.values()))[-1]
    train_files = [shard for found in shards.values() for shard in found if shard != held_out]
    return train_files, held_out, torch.load(held_out, weights_only=True), torch.load(mt_bench, weights_only=True)


# The head pilots: training and scores

def final_feature(sample: dict) -> torch.Tensor:
    """EAGLE-1's head input: the target's final feature."""
    return sample["features"].float()


def collate(batch: list[dict], head_input: Callable = final_feature):
    """training._collate with the head input `head_input(sample)`: inputs at i, tokens i + 1, target features
    i + 1, answer mask."""
    width, hidden = head_input(batch[0]).shape[-1], batch[0]["features"].shape[-1]
    length = max(len(s["ids"]) for s in batch) - 1
    inputs, targets = torch.zeros(len(batch), length, width), torch.zeros(len(batch), length, hidden)
    tokens, mask = torch.zeros(len(batch), length, dtype=torch.long), torch.zeros(len(batch), length, dtype=torch.bool)
    for row, sample in enumerate(batch):
        n = len(sample["ids"]) - 1
        inputs[row, :n], tokens[row, :n] = head_input(sample)[:-1], sample["ids"][1:].long()
        targets[row, :n] = sample["features"][1:].float()
        mask[row, max(sample["start"] - 1, 0) : n] = True
    return inputs, tokens, targets, mask


def new_head(target, head_class=head_module.EagleHead):
    """A head from scratch (fp32): every linear layer normal with std 0.02 and zero bias, seed 0."""
    torch.manual_seed(0)
    draft = head_class(head_module.head_config_for(target.config))
    for module in draft.modules():
        if isinstance(module, torch.nn.Linear):
            torch.nn.init.normal_(module.weight, std=0.02)
            if module.bias is not None:
                torch.nn.init.zeros_(module.bias)
    return draft.float()


def train(draft, target, files: list[Path], draft_rows: torch.Tensor, epochs: float, lr: float = 5e-4,
          head_input: Callable = final_feature, label: str = "eagle1", **loss_options):
    """(trained head, steps): training.train's loop in brief (AdamW 0.9/0.95, warm-up and cosine, clip 0.5, bf16
    autocast, seed 0) on `draft` (fp32); `loss_options` go to training.head_loss."""
    draft = draft.train()
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
            inputs, tokens, targets, mask = collate(batch, head_input)
            with torch.autocast("cpu", dtype=torch.bfloat16):
                loss, _ = training.head_loss(draft, embed, lm_head, inputs, tokens, targets, mask, **loss_options)
            optimizer.zero_grad(set_to_none=True)
            loss.backward()
            torch.nn.utils.clip_grad_norm_(draft.parameters(), 0.5)
            optimizer.step()
            step += 1
            if step % 100 == 0:
                print(f"{label}: step {step}/{total}, loss {loss.item():.4f}", flush=True)
        epoch += 1
    return draft.eval(), total


def export(draft, folder: Path) -> None:
    """A trained head in the compact format (fp16, safetensors), for `eagle-mdsd bench --ea-model FOLDER`."""
    head_module.save_head(copy.deepcopy(draft).half(), folder, safetensors=True)


@torch.no_grad()
def score(draft, target, samples: list[dict], head_input: Callable = final_feature) -> tuple[float, float, int]:
    """(top-1, top-4, positions): the target's greedy next token among the head's best 1 / 4, teacher-forced."""
    lm_head, embed = target.get_output_embeddings(), target.get_input_embeddings()
    top1 = top4 = count = 0
    for sample in samples:
        if len(sample["ids"]) - sample["start"] < 2:
            continue
        inputs, tokens, targets, mask = collate([sample], head_input)
        length = inputs.shape[1]
        causal = additive_mask(torch.ones(length, length, dtype=torch.bool).tril(), torch.float32)[None, None]
        predicted = draft(inputs, embed(tokens), torch.arange(1, length + 1)[None], causal, None)
        truth = lm_head(targets[mask]).argmax(-1)
        best = lm_head(predicted[mask]).topk(4, -1).indices
        top1 += int((best[:, 0] == truth).sum())
        top4 += int((best == truth[:, None]).any(-1).sum())
        count += len(truth)
    return top1 / count, top4 / count, count


def depth1_scores(draft, target, held: list[dict], mt: list[dict], head_input: Callable = final_feature) -> dict:
    """The head's scores on the held-out and MT-Bench sets, as a result line names them."""
    found = {}
    for name, samples in (("held", held), ("mt", mt)):
        found[f"{name}_top1"], found[f"{name}_top4"], found[f"{name}_tokens"] = score(draft, target, samples,
                                                                                     head_input)
    return found


def finished(record: Path) -> dict:
    """The result lines of the arms a run has finished, by arm."""
    return {json.loads(line)["arm"]: json.loads(line) for line in record.read_text().splitlines()} \
        if record.exists() else {}


def arms_in_turn(arms, record: Path, train_arm: Callable, score_arm: Callable) -> dict:
    """{arm: its result line}: the lines `record` holds (a rerun skips finished arms), then for each other arm
    `train_arm(arm)` -> (head, steps, result fields), timed (train_s; 0 for an arm that trains nothing), and
    `score_arm(arm, head)` -> its scores; each line is printed and appended to `record` as it finishes."""
    done = finished(record)
    for arm in arms:
        if arm in done:
            continue
        started = time.monotonic()
        draft, steps, fields = train_arm(arm)
        result = {"arm": arm, **fields, "steps": steps, "train_s": round(time.monotonic() - started) if steps else 0}
        result.update(score_arm(arm, draft))
        print(json.dumps(result), flush=True)
        with record.open("a") as out:
            out.write(json.dumps(result) + "\n")
        done[arm] = result
    return done


# The head pilots: pages

def run_facts(runs: list[Path], train_shards: list[Path], held_out) -> dict:
    """What a page states about its run: date, machine, the data runs, the training shards and the held-out
    shard(s)."""
    machine = benchmarks.machine()
    return {"date": datetime.date.today().isoformat(),
            "runs": {run.name: json.loads((run / "data" / "prompts.json").read_text()) for run in runs},
            "machine": f"{machine['cpu']}, {machine['threads']} threads, torch {torch.__version__}",
            "train_shards": len(train_shards),
            "train_sequences": sum(len(torch.load(f, weights_only=True)) for f in train_shards),
            "held_out": held_out}


def command(script: str, args, *options: str) -> str:
    """The command line that made a page: `python lab/SCRIPT.py` and the named options' values."""
    words = ["python", f"lab/{script}.py"]
    for option in options:
        value = getattr(args, option)
        words.append(f"--{option.replace('_', '-')}")
        words += [f"{v:g}" if isinstance(v, float) else str(v) for v in (value if isinstance(value, list) else [value])]
    return " ".join(words)


def scoring_note(facts: dict) -> str:
    return (f"Scored teacher-forced at depth 1 (full vocabulary): the target's greedy token as the head's top-1 / "
            f"within its top 4, on the held-out shard `{facts['held_out']}` and on the target's greedy answers to "
            f"the 80 MT-Bench first turns (128 tokens; evaluation only).")


def table(results: list[dict], extra: tuple[str, ...] = ()) -> list[str]:
    """The results table: head, the `extra` result fields, steps, training minutes and the four scores."""
    lines = ["| head | " + "".join(f"{field} | " for field in extra) + "steps | training min | held-out top-1 | "
             "top-4 | MT-Bench top-1 | top-4 |", "|---|" + "---|" * (len(extra) + 6)]
    for r in results:
        lines.append(f"| {r['arm']} | " + "".join(f"{r[field]} | " for field in extra) + f"{r['steps']} | "
                     f"{r['train_s'] / 60:.1f} | {r['held_top1']:.3f} | {r['held_top4']:.3f} | {r['mt_top1']:.3f} | "
                     f"{r['mt_top4']:.3f} |")
    return lines


def write_pilot_page(out: str, title: str, facts: dict, run_command: str, setup: str, lines: list[str]) -> None:
    """A pilot's page at `out`: its title and date, the machine and command, `setup`, the data and the table."""
    data = "Data (`eagle-mdsd train-head data`, each run's data/prompts.json): " + "; ".join(
        f"`{run}`: {made['count']:,} prompts, answers at temperature {made.get('temperature', 0.0):g}"
        for run, made in facts["runs"].items()) + "."
    Path(out).write_text("\n".join([f"# {title}: a pilot, {facts['date']}", "",
                                    f"Machine: {facts['machine']}. Command: `{run_command}`. {setup}", "", data, "",
                                    *lines]) + "\n")
    print(f"wrote {out}")


# The A/B scripts

def question_count(description: str) -> int:
    """--questions N from the command line (default 8): how many MT-Bench first turns an A/B script answers."""
    parser = argparse.ArgumentParser(description=description)
    parser.add_argument("--questions", type=int, default=8)
    args = parser.parse_args()
    if args.questions < 1:
        parser.error(f"--questions is {args.questions}: pass 1 or more")
    return args.questions


def take_turns(arms, run, prompts) -> tuple[dict[str, float], int]:
    """Tokens/s of each arm over the prompts and how many answers all arms made the same; `run(arm, prompt,
    max_new_tokens, seed)` generates.  The arms take turns going first, question by question, after an
    8-token warm-up each; 128 new tokens, seeded by question."""
    tokens, seconds, answers = dict.fromkeys(arms, 0), dict.fromkeys(arms, 0.0), {arm: [] for arm in arms}
    for index, prompt in enumerate(prompts):
        for arm in arms if index % 2 == 0 else arms[::-1]:
            run(arm, prompt, 8, index)  # warm-up
            result = run(arm, prompt, 128, index)
            tokens[arm] += result.new_tokens
            seconds[arm] += result.wall_time_s
            answers[arm].append(result.token_ids)
    same = sum(len({tuple(answers[arm][i]) for arm in arms}) == 1 for i in range(len(prompts)))
    return {arm: tokens[arm] / seconds[arm] for arm in arms}, same
