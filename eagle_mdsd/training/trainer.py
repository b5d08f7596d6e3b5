"""Training EAGLE-1 and EAGLE-3 heads: data, train and export stages, each resumable.

0. prompts (optional): the target writes instructions itself - sampled
   from its chat template right after the user-turn header, as Magpie
   (Xu et al. 2024) does - for a prompt mix closer to what the target was
   tuned on than the shipped instruction files.
1. data: the target answers instruction prompts through its chat template
   (self-distillation, greedy, batched); optionally the datasets' reference
   responses are mixed in.  Token ids, the response start and the target's
   features (last hidden state after the final norm) are written in shards
   of `shard_size` samples; an existing shard is skipped, so a rerun resumes.
   Spec-Bench / MT-Bench questions are never used: prompts equal to one of
   them (after normalising case and spaces) are dropped.
2. train: EAGLE's recipe - SmoothL1 between the predicted and the true next
   feature + 0.1 x cross-entropy of the head's token distribution against
   the target's, U(-0.1, 0.1) noise on input features, AdamW (0.9, 0.95),
   gradient clipping 0.5.  Checkpoints every `save_every` steps and at the
   end of a time budget; a rerun continues from the last one.
   EAGLE-3 (`format="eagle3"`, eagle3.py): the head reads three target layers'
   hidden states, is trained on its own outputs at every draft depth (the
   training-time test, `unroll` passes) with the token loss alone, over its
   draft vocabulary; no feature term, no input noise.
3. export: the EAGLE-1 format (with the embedding copy) and a compact form
   (fp16 safetensors without it), which `head.load_head` reads alike; an
   EAGLE-3 head in the released layout (eagle3.save).
"""

from __future__ import annotations

import collections
import dataclasses
import json
import math
import os
import random
import re
import time
from pathlib import Path

import torch
from tqdm import tqdm

from . import eagle3
from . import head as head_module
from . import jsonl, models, questions

FORMATS = ("eagle1", "eagle3")

DEFAULT_PROMPTS = Path(__file__).resolve().parent.parent.parent / "shared" / "data" / "train_prompts"


def _normalise(text: str) -> str:
    return re.sub(r"\s+", " ", text).strip().lower()


def benchmark_texts() -> set[str]:
    return {_normalise(turn) for q in questions.load("spec_bench") for turn in q["turns"]}


def _records(path: Path):
    """The records of a JSONL file (one a line) or a JSON file (a list, or {"data": [...]}); a line or file that
    is not JSON is a one-line error naming it."""
    text = path.read_text()
    if path.suffix == ".jsonl":
        numbered = [(number, line) for number, line in enumerate(text.splitlines(), 1) if line.strip()]
        return jsonl.decode(numbered, f"prompt file {path}", "write one JSON object a line")
    try:
        data = json.loads(text)
    except json.JSONDecodeError as error:
        raise ValueError(f"prompt file {path} is not JSON ({error.msg} at line {error.lineno}): give a JSON list "
                         f"of records, or a .jsonl file of one record a line") from None
    return data if isinstance(data, list) else data.get("data", []) if isinstance(data, dict) else []


def _conversation(messages, file) -> list[dict]:
    roles = [m.get("role") if isinstance(m, dict) else None for m in messages]
    if (not messages or roles[-1] != "user" or any(r not in ("system", "user", "assistant") for r in roles)
            or any(not isinstance(m.get("content"), str) for m in messages)):
        raise ValueError(f"{file}: a 'messages' list must hold {{role, content}} turns (system, user, assistant) "
                         f"and end with a user turn, got roles {roles}")
    return [{"role": m["role"], "content": m["content"]} for m in messages]


def load_prompts(paths) -> list[dict]:
    """{"prompt", "reference"} from JSON/JSONL files or folders of them.

    Understands instruction/input/response (GPTeacher, Alpaca), Alpaca seed
    tasks (instruction + instances), plain prompt/text fields, and conversations
    ("messages": [{"role", "content"}, ...] ending with a user turn, e.g. a request
    to revise an earlier answer), kept as the list.
    Benchmark questions are removed.
    """
    files = []
    for p in paths:
        p = Path(p)
        if not p.exists():
            raise FileNotFoundError(f"prompt file or folder {p} does not exist")
        files += sorted(p.glob("*.json*")) if p.is_dir() else [p]
    banned = benchmark_texts()
    prompts, seen = [], set()
    for file in files:
        for record in _records(file):
            if not isinstance(record, dict):
                continue
            if isinstance(record.get("messages"), list):  # a conversation ending with a user turn
                prompt = _conversation(record["messages"], file)
                users = [m["content"] for m in prompt if m["role"] == "user"]
                key = "\n".join(_normalise(m["content"]) for m in prompt)
                reference = record.get("response") or ""
            else:
                instruction = record.get("instruction") or record.get("prompt") or record.get("text") or ""
                extra = record.get("input") or ""
                reference = record.get("response") or record.get("output") or ""
                if not extra and not reference and record.get("instances"):
                    extra = record["instances"][0].get("input", "")
                    reference = record["instances"][0].get("output", "")
                prompt = f"{instruction}\n\n{extra}".strip() if extra else instruction.strip()
                users, key = [prompt], _normalise(prompt)
            if not prompt or key in seen or any(_normalise(u) in banned for u in users):
                continue
            seen.add(key)
            prompts.append({"prompt": prompt, "reference": reference})
    if not prompts:
        raise ValueError(f"no usable prompts in {', '.join(str(p) for p in paths)}")
    return prompts


# -- stage 0: prompts written by the target ------------------------------------------------


def user_turn_prefix(tokenizer) -> list[int]:
    """The chat template's tokens up to where a user message starts."""
    marker = "\u2603MESSAGE\u2603"
    text = tokenizer.decode(models.chat_prompt_ids(tokenizer, marker))
    if marker not in text:
        raise ValueError("the tokenizer's chat template does not show the user message verbatim: "
                         "self-written prompts need a chat template")
    return tokenizer(text[: text.index(marker)], add_special_tokens=False)["input_ids"]


def self_prompts(out_dir: Path, count: int, base_model=None, dtype: str = "bfloat16", batch_size: int = 64,
                 max_tokens: int = 96, seed: int = 0, max_minutes: float | None = None,
                 openers: list[str] | None = None, device: str = "cpu") -> Path:
    """Append instructions the target writes itself to RUN/self_prompts.jsonl until `count` are there.

    Batch b samples at temperature 1 with the seed (seed, b), so a rerun continues with the same
    prompts.  With `openers`, batch b's messages start with openers[b % len(openers)] (e.g. "Write a
    Python function"), which steers what kind of task the target writes.  Kept: messages the target
    ended itself (no length cut), with at least three words of its own, not seen before and not a
    Spec-Bench / MT-Bench question.
    """
    path = Path(out_dir) / "self_prompts.jsonl"
    path.parent.mkdir(parents=True, exist_ok=True)
    jsonl.drop_cut_short_line(path)
    records = jsonl.records(path)
    seen = {_normalise(r["prompt"]) for r in records} | benchmark_texts()
    next_batch = max((r["batch"] for r in records), default=-1) + 1
    target, tokenizer = models.load_target(base_model, models.parse_dtype(dtype), device)
    header = user_turn_prefix(tokenizer)
    stop = set(models.eos_token_ids(target, tokenizer))
    pad_id = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else tokenizer.eos_token_id
    deadline = time.monotonic() + 60 * max_minutes if max_minutes else None
    written = len(records)
    progress = tqdm(total=count, initial=min(written, count), desc="self-written prompts")
    barren = 0  # batches in a row that kept nothing
    started, tried = time.monotonic(), 0
    while written < count:
        if barren == 20:
            raise ValueError(f"the target ended none of its last 20 x {batch_size} messages within {max_tokens} "
                               f"tokens or all were duplicates: this model cannot write its own prompts")
        if deadline and time.monotonic() > deadline:
            print(f"time budget reached: {written} prompts written; rerun to continue")
            break
        opener = openers[next_batch % len(openers)] if openers else ""
        prefix = torch.tensor([header + tokenizer(opener, add_special_tokens=False)["input_ids"]] * batch_size,
                              device=target.device)
        torch.manual_seed(seed * 1_000_003 + next_batch)
        with torch.inference_mode():
            out = target.generate(prefix, attention_mask=torch.ones_like(prefix), do_sample=True, temperature=1.0,
                                  top_k=0, top_p=1.0, max_new_tokens=max_tokens, eos_token_id=sorted(stop),
                                  pad_token_id=pad_id)
        lines = []
        for row in out[:, prefix.shape[1]:].tolist():
            end = next((i for i, t in enumerate(row) if t in stop), None)
            own = tokenizer.decode(row[:end]) if end is not None else ""
            text = (opener + own).strip()
            if len(own.split()) < 3 or _normalise(text) in seen:
                continue
            seen.add(_normalise(text))
            lines.append(json.dumps({"prompt": text, "batch": next_batch}) + "\n")
        with path.open("a") as handle:  # one write per batch
            handle.write("".join(lines))
        written += len(lines)
        tried += batch_size
        barren = 0 if lines else barren + 1
        progress.update(len(lines))
        next_batch += 1
    progress.close()
    if tried:  # what sizes a run on another machine or batch size
        seconds = time.monotonic() - started
        print(f"prompts stage: {written - len(records)} kept of {tried} messages in {seconds:.0f} s: "
              f"{tried / seconds:.1f} messages/s at batch size {batch_size} on {device}")
    return path


# -- stage 1: data -------------------------------------------------------------------------


def _right_padded(sequences, pad_id: int, device) -> tuple[torch.Tensor, torch.Tensor]:
    """(ids, attention mask) [B, L] of token sequences, right-padded with `pad_id`."""
    length = max(len(s) for s in sequences)
    ids = torch.full((len(sequences), length), pad_id, dtype=torch.long)
    mask = torch.zeros(len(sequences), length, dtype=torch.long)
    for row, seq in enumerate(sequences):
        ids[row, : len(seq)] = torch.as_tensor(seq)
        mask[row, : len(seq)] = 1
    return ids.to(device), mask.to(device)


def target_features(target, ids, mask=None, layers=None) -> torch.Tensor:
    """The target's features [B, L, W]: its final-norm hidden states (W = H), then for an EAGLE-3 head the
    hidden states of its three `layers` (W = 4H), as the decoder reads them (engine.Decoder.target_forward)."""
    out = target.get_decoder()(input_ids=ids, attention_mask=mask, output_hidden_states=layers is not None)
    if layers is None:
        return out.last_hidden_state
    return torch.cat([out.last_hidden_state, *(out.hidden_states[i] for i in layers)], -1)


def _features(target, sequences: list[list[int]], pad_id: int, layers=None) -> list[torch.Tensor]:
    """`target_features` of each sequence (one right-padded batch), in bf16 on the CPU."""
    ids, mask = _right_padded(sequences, pad_id, target.device)
    out = target_features(target, ids, mask, layers)
    return [out[row, : len(seq)].to("cpu", torch.bfloat16) for row, seq in enumerate(sequences)]


def _generate(target, prompts: list[list[int]], max_new_tokens: int, pad_id: int, temperature: float = 0.0,
              seed: int = 0, **generate_options) -> list[list[int]]:
    """Responses, batched with left padding: greedy, or sampled at `temperature` (plain sampling, no top-k or
    top-p) from torch's generator seeded with `seed`; `generate_options` go to `target.generate` as they are."""
    length = max(len(p) for p in prompts)
    ids = torch.full((len(prompts), length), pad_id, dtype=torch.long)
    mask = torch.zeros(len(prompts), length, dtype=torch.long)
    for row, prompt in enumerate(prompts):
        ids[row, length - len(prompt):] = torch.tensor(prompt)
        mask[row, length - len(prompt):] = 1
    sampling = {"do_sample": False}
    if temperature > 0:
        sampling = {"do_sample": True, "temperature": temperature, "top_k": 0, "top_p": 1.0}
        torch.manual_seed(seed)
    out = target.generate(ids.to(target.device), attention_mask=mask.to(target.device), **sampling,
                          max_new_tokens=max_new_tokens, pad_token_id=pad_id, **generate_options)
    eos = set(models.eos_token_ids(target))
    rows = out[:, length:].tolist()
    return [row[: next((i + 1 for i, t in enumerate(row) if t in eos), len(row))] for row in rows]


@dataclasses.dataclass(frozen=True)
class DataRecipe:
    """How `make_data` answers prompts: greedy, or sampled at `temperature` > 0 (seeded per batch, so a rerun
    repeats the answers), in batches of `batch_size`, into shards of `shard_size` prompts; prompts are shuffled
    with `seed` and cut to `max_prompts`, those longer than `max_prompt_tokens` skipped; `mix_reference` adds the
    datasets' own responses.  `sort_by_length` batches a shard's prompts in order of length, so a left-padded
    batch pads less and answers faster (lab/data_stage_ab.py); off by default, because in bf16 an
    answer depends on its batch's padding and the documented heads' data were made without it.  `features`
    False keeps the token ids alone: the train stage then computes the target's features itself, on its device
    (a token's id takes 4 bytes where its bf16 features take 2 x the hidden size: 1,152 on the embedded default)."""

    max_prompts: int | None = None
    max_new_tokens: int = 128
    batch_size: int = 128
    shard_size: int = 256
    mix_reference: bool = False
    max_prompt_tokens: int = 384
    seed: int = 0
    temperature: float = 0.0
    sort_by_length: bool = False
    features: bool = True

    def __post_init__(self):
        from .engine import check_temperature

        check_temperature(self.temperature, "--temperature")


def make_data(out_dir: Path, prompt_paths, recipe: DataRecipe = DataRecipe(), base_model=None,
              dtype: str = "bfloat16", max_minutes: float | None = None, device: str = "cpu") -> list[Path]:
    """The target's answers to the prompts in `prompt_paths` and its features, made by `recipe`, in shards under
    out_dir/data; a rerun continues (stopping cleanly when `max_minutes` have passed)."""
    prompts = load_prompts(prompt_paths)  # bad prompt files fail before the run folder is made
    data_dir = Path(out_dir) / "data"
    data_dir.mkdir(parents=True, exist_ok=True)
    record = data_dir / "prompts.json"
    if record.exists():  # a rerun continues only the shards made the same way
        made = {"temperature": 0.0, "sort_by_length": False, "features": True} | json.loads(record.read_text())
        for option, key, now in (("--temperature", "temperature", recipe.temperature),
                                 ("--seed", "seed", recipe.seed), ("--shard-size", "shard_size", recipe.shard_size)):
            if made.get(key, now) != now:
                raise ValueError(f"{data_dir} holds answers made with {option} {made[key]}: pass that {option}, "
                                 f"or another --run")
        if made["sort_by_length"] != recipe.sort_by_length:
            raise ValueError(f"{data_dir} holds answers made {'with' if made['sort_by_length'] else 'without'} "
                             f"--sort-by-length: {'pass' if made['sort_by_length'] else 'leave out'} "
                             f"--sort-by-length, or use another --run")
        if made["features"] != recipe.features:
            raise ValueError(f"{data_dir} holds answers made {'without' if made['features'] else 'with'} "
                             f"--no-features: {'leave out' if made['features'] else 'pass'} --no-features, "
                             f"or use another --run")
    random.Random(recipe.seed).shuffle(prompts)
    prompts = prompts[:recipe.max_prompts] if recipe.max_prompts else prompts
    record.write_text(json.dumps({"count": len(prompts), "seed": recipe.seed, "shard_size": recipe.shard_size,
                                  "sources": [str(p) for p in prompt_paths], "temperature": recipe.temperature,
                                  "sort_by_length": recipe.sort_by_length, "features": recipe.features,
                                  "dtype": dtype}))
    target, tokenizer = models.load_target(base_model, models.parse_dtype(dtype), device)
    pad_id = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else tokenizer.eos_token_id
    shards = []
    deadline = time.monotonic() + 60 * max_minutes if max_minutes else None
    started, answers, answer_tokens = time.monotonic(), 0, 0
    for start in tqdm(range(0, len(prompts), recipe.shard_size), desc="data shards"):
        shard = data_dir / f"shard_{start // recipe.shard_size:05d}.pt"
        shards.append(shard)
        if shard.exists():
            continue
        if deadline and time.monotonic() > deadline:
            print(f"time budget reached: {len(list(data_dir.glob('shard_*.pt')))} shards done; rerun to continue")
            break
        samples = []
        for batch_start, encoded in _shard_batches(prompts[start : start + recipe.shard_size], tokenizer, recipe):
            prompt_ids, batch = [ids for ids, _ in encoded], [item for _, item in encoded]
            with torch.inference_mode():
                responses = _generate(target, prompt_ids, recipe.max_new_tokens, pad_id, recipe.temperature,
                                      seed=recipe.seed * 1_000_003 + start + batch_start)  # a rerun repeats it
                sequences = [p + r for p, r in zip(prompt_ids, responses)]
                starts = [len(p) for p in prompt_ids]
                if recipe.mix_reference:
                    for p, item in zip(prompt_ids, batch):
                        if item["reference"]:
                            ref = tokenizer(item["reference"], add_special_tokens=False)["input_ids"]
                            sequences.append(p + ref[: 2 * recipe.max_new_tokens])
                            starts.append(len(p))
                answers, answer_tokens = answers + len(responses), answer_tokens + sum(map(len, responses))
                if not recipe.features:
                    samples += [{"ids": torch.tensor(s, dtype=torch.int32), "start": st}
                                for s, st in zip(sequences, starts)]
                    continue
                features = _features(target, sequences, pad_id)
            samples += [{"ids": torch.tensor(s, dtype=torch.int32), "start": st, "features": f}
                        for s, st, f in zip(sequences, starts, features)]
        staging = shard.with_suffix(".tmp")
        torch.save(samples, staging)
        os.replace(staging, shard)  # atomic: an interrupt never leaves half a shard
    seconds = time.monotonic() - started
    if answers:  # what sizes a run on another machine or batch size
        print(f"data stage: {answers} answers, {answer_tokens} answer tokens in {seconds:.0f} s: "
              f"{answers / seconds:.1f} answers/s, {answer_tokens / seconds:.0f} answer tokens/s at batch size "
              f"{recipe.batch_size} on {device}")
    return [s for s in shards if s.exists()]


def _shard_batches(chunk: list[dict], tokenizer, recipe: DataRecipe):
    """(first index, [(prompt ids, record)]) for each batch of a shard's prompts that `make_data` answers: batches of
    `batch_size` in the shard's order, less the prompts over `max_prompt_tokens`; with `sort_by_length`, the shard's
    prompts that fit, shortest first (ties in the shard's order), cut into batches."""
    def fitting(records):
        encoded = [(models.chat_prompt_ids(tokenizer, item["prompt"]), item) for item in records]
        return [(ids, item) for ids, item in encoded if len(ids) <= recipe.max_prompt_tokens]

    if recipe.sort_by_length:
        ordered = sorted(fitting(chunk), key=lambda pair: len(pair[0]))
        return [(first, ordered[first : first + recipe.batch_size])
                for first in range(0, len(ordered), recipe.batch_size)]
    batches = [(first, fitting(chunk[first : first + recipe.batch_size]))
               for first in range(0, len(chunk), recipe.batch_size)]
    return [(first, batch) for first, batch in batches if batch]


# -- stage 2: train ------------------------------------------------------------------------


def data_shards(out_dir: Path, data_from=()) -> list[Path]:
    """The data shards of a run and of the runs it also trains on, in a fixed order."""
    shards = []
    for run in [Path(out_dir), *map(Path, data_from)]:
        found = sorted((run / "data").glob("shard_*.pt"))
        if not found and run == Path(out_dir) and data_from:
            continue  # a run may train on other runs' data only
        if not found:
            raise FileNotFoundError(f"no data shards in {run / 'data'}: run the data stage there first")
        shards += found
    return shards


def _batches(shards: list[Path], tokens_per_batch: int, rng: random.Random):
    """Batches of samples (lists), shard by shard in a shuffled order."""
    order = list(shards)
    rng.shuffle(order)
    for shard in order:
        samples = torch.load(shard, weights_only=True)
        for sample in samples:
            sample["shard"] = shard  # computed features come from the target its data stage ran
        rng.shuffle(samples)
        batch, tokens = [], 0
        for sample in samples:
            if len(sample["ids"]) - sample["start"] < 2:
                continue
            batch.append(sample)
            tokens += len(sample["ids"])
            if tokens >= tokens_per_batch:
                yield batch
                batch, tokens = [], 0
        if batch:
            yield batch


def _training_batch(batch, feature_target, hidden: int, device, layers=None):
    """A batch's `_collate` tensors on `device`.  Samples without stored features (data made with --no-features)
    or trained for an EAGLE-3 head (`layers`: it reads three layers the data stage does not store) get the
    target's features, computed on the device (`feature_target(shard)`: the target in the dtype that shard's
    data stage ran in) and rounded to bf16 as stored ones are."""
    computed = [s for s in batch if layers is not None or "features" not in s]
    by_target = collections.defaultdict(list)
    for sample in computed:
        by_target[feature_target(sample["shard"])].append(sample)
    if len(computed) == len(batch) and len(by_target) == 1:  # the whole batch in one forward, collated in place
        (target, samples), = by_target.items()
        ids, attention = _right_padded([s["ids"] for s in samples], 0, device)
        with torch.no_grad():
            features = target_features(target, ids, attention, layers).to(torch.bfloat16).float()
        lengths = attention.sum(1, keepdim=True) - 1
        starts = torch.tensor([max(s["start"] - 1, 0) for s in samples], device=device)[:, None]
        index = torch.arange(ids.shape[1] - 1, device=device)[None]
        return features[:, :-1], ids[:, 1:], features[:, 1:], (index >= starts) & (index < lengths)
    for target, samples in by_target.items():
        with torch.no_grad():
            features = _features(target, [s["ids"].tolist() for s in samples], 0, layers)  # masked, right-padded
        for sample, feature in zip(samples, features):
            sample["features"] = feature
    width = hidden if layers is None else 4 * hidden
    return tuple(t.to(device) for t in _collate(batch, width))


def _collate(batch, hidden: int):
    """Inputs (f_i, x_{i+1}) and targets f_{i+1} for i = 0..T-2, with a response mask."""
    length = max(len(s["ids"]) for s in batch) - 1
    features = torch.zeros(len(batch), length, hidden)
    tokens = torch.zeros(len(batch), length, dtype=torch.long)
    targets = torch.zeros(len(batch), length, hidden)
    mask = torch.zeros(len(batch), length, dtype=torch.bool)
    for row, sample in enumerate(batch):
        n = len(sample["ids"]) - 1
        features[row, :n] = sample["features"][:-1].float()
        tokens[row, :n] = sample["ids"][1:].long()
        targets[row, :n] = sample["features"][1:].float()
        mask[row, max(sample["start"] - 1, 0) : n] = True  # predict response features only
    return features, tokens, targets, mask


def _unrolled_mask(length: int, step: int) -> torch.Tensor:
    """Which cached head entries the step-s pass at position i sees, as the decoder would (s = 1, 2, ...).

    At draft depth s - 1 (pass s) the query at position i sees the true pairs up to position i - s + 1 and
    the path's entries of passes 2..s at positions i - s + 2 .. i (itself last); the keys are the s passes
    laid side by side.
    """
    index = torch.arange(length)
    blocks = [index[None, :] <= index[:, None] - (step - 1)]
    blocks += [index[None, :] == index[:, None] - (step - r) for r in range(2, step + 1)]
    return torch.cat(blocks, 1)


def unrolled_predictions(draft_head, features, embedded, unroll: int = 1) -> list[torch.Tensor]:
    """The head's predicted features [B, T, H] of passes 1..unroll over (f_i, x_{i+1}) pairs.

    Pass 1 reads the true features; pass r reads pass r - 1's predictions shifted by one position (the
    input at position i is its prediction of f_i, or for an EAGLE-3 head its output there) and attends,
    through the cached keys of the earlier passes, to what the decoder's head sees at draft depth r: the
    true pairs and one entry per earlier depth on the path.  Position 0 of pass r > 1 has no such input
    and must not be scored.
    """
    from transformers import DynamicCache

    from .engine import additive_mask

    batch, length, _ = features.shape
    positions = torch.arange(1, length + 1, device=features.device)[None].expand(batch, -1)
    cache = DynamicCache() if unroll > 1 else None
    passes, inputs = [], features
    for step in range(1, unroll + 1):
        visible = _unrolled_mask(length, step).to(features.device)
        attention = additive_mask(visible, torch.float32).to(features.dtype).expand(batch, -1, -1, -1)
        passes.append(draft_head(inputs, embedded, positions, attention, cache))
        if step < unroll:  # (position 0, never scored, reads the true feature, or zeros at another width)
            first = features[:, :1] if features.shape[-1] == passes[-1].shape[-1] else \
                torch.zeros_like(passes[-1][:, :1])
            inputs = torch.cat([first, passes[-1][:, :-1]], 1)
    return passes


TOKEN_LOSSES = {  # token term per position, from the target's p and the head's log q
    "ce": lambda p, logq: -(p * logq).sum(-1),
    "tv": lambda p, logq: 0.5 * (p - logq.exp()).abs().sum(-1),
    "top1": lambda p, logq: -logq.gather(-1, p.argmax(-1, keepdim=True))[..., 0],
}


def head_loss(draft_head, embed, lm_head, features, tokens, targets, mask, noise: float = 0.1, unroll: int = 1,
              token_weight: float = 0.1, token_loss: str = "ce"):
    """(loss, top-1 accuracy of pass 1): SmoothL1 on features + token_weight x a token term comparing the head's
    distribution q with the target's p (EAGLE's recipe: cross-entropy, 0.1).

    token_loss "ce" is EAGLE's cross-entropy; "tv" is the total variation distance 1/2 sum |p - q|, which is
    1 - the acceptance rate sum min(p, q) of one sampled draft (DistillSpec, Zhou et al. 2024); "top1" is the
    cross-entropy against the target's most probable token alone, the token a draft must match at T = 0.
    unroll = 1 is EAGLE-1's recipe.  unroll = s > 1 also trains the head on its own predictions, as it is
    used at draft depths 2..s (HASS, Zhang et al. 2025; EAGLE-3's training-time test); pass r's loss is
    weighted 0.8^(r-1).

    An EAGLE-3 head (eagle3.Eagle3Head) is scored by the token term alone (weight 1), its own logits over its
    draft vocabulary against the target's p there (`lm_head` gives the target's logits over those tokens in
    draft-id order); features are [final | three layers] (4H), targets' final part gives p; no input noise.
    """
    if token_loss not in TOKEN_LOSSES:
        raise ValueError(f"unknown token loss {token_loss!r}: use ce, tv or top1")
    eagle3_head = isinstance(draft_head, eagle3.Eagle3Head)
    if eagle3_head:
        noise, targets = 0.0, targets[..., : draft_head.target_hidden]  # p comes from the final features
    if noise:
        features = features + (torch.rand_like(features) * 2 - 1) * noise
    passes = unrolled_predictions(draft_head, features, embed(tokens).to(features.dtype), unroll)
    with torch.no_grad():
        target_probs = torch.softmax(lm_head(targets[mask]).float(), -1)
    head_logits = draft_head.logits if eagle3_head else lm_head
    total, accuracy = 0.0, 0.0
    for step, predicted in enumerate(passes, start=1):
        kept = mask & (torch.arange(mask.shape[1], device=mask.device) >= step - 1)
        head_logp = torch.log_softmax(head_logits(predicted[kept]).float(), -1)
        p = target_probs[kept[mask]]
        term = TOKEN_LOSSES[token_loss](p, head_logp).mean()
        if not eagle3_head:  # EAGLE-1: the feature term, and the token term weighed against it
            term = torch.nn.functional.smooth_l1_loss(predicted[kept].float(), targets[kept].float()) \
                + token_weight * term
        total = total + 0.8 ** (step - 1) * term
        if step == 1:
            accuracy = float((head_logp.argmax(-1) == p.argmax(-1)).float().mean())
    return total, accuracy


def new_eagle3_head(target, rows: torch.Tensor, seed: int = 0) -> eagle3.Eagle3Head:
    """A float32 EAGLE-3 head to train for `target`, drafting over the target tokens `rows` (sorted): random
    layers (eagle3.random_head's), d2t/t2d for those tokens, and lm_head started from the target's output rows
    for them (its input is normed, as the target's final features are)."""
    draft_head = eagle3.random_head(target, len(rows), seed).float()
    rows = rows.to(draft_head.d2t.device)
    draft_head.d2t.copy_(rows - torch.arange(len(rows), device=rows.device))
    draft_head.t2d.zero_()
    draft_head.t2d[rows] = True
    with torch.no_grad():
        draft_head.lm_head.weight.copy_(target.get_output_embeddings().weight[rows].float())
    return draft_head.float()


def draft_vocab_lm_head(lm_head, rows: torch.Tensor):
    """The target's output layer over `rows` only: logits over the draft vocabulary the decoder drafts from.

    With it the cross-entropy term compares the head with the target's distribution renormalised over those
    tokens (the decoder's q is 0 outside them anyway), and skips most of the full-vocabulary logits that
    dominate a training step on a small target."""
    weight = lm_head.weight[rows].detach()
    bias = None if getattr(lm_head, "bias", None) is None else lm_head.bias[rows].detach()
    return lambda hidden: torch.nn.functional.linear(hidden, weight, bias)


@dataclasses.dataclass(frozen=True)
class TrainRecipe:
    """How `train` trains a head.  unroll > 1 adds the multi-step loss of `head_loss`; init_from starts from
    another run's checkpoint or an exported head instead of a random one; token_loss is the token term ("ce":
    EAGLE's cross-entropy; "tv": total variation, 1 - the acceptance rate of one sampled draft; "top1":
    cross-entropy against the target's most probable token) and token_weight weighs it against the feature term
    (EAGLE's 0.1); draft_vocab = N scores it over the N most frequent answer tokens of the data only (the ranking
    `export` ships; None: the full vocabulary); data_from: other runs whose shards are trained on too.
    format "eagle3" trains an EAGLE-3 head (eagle3.py) by `head_loss`: unroll passes of the token term alone
    (token_weight does not apply), over the draft_vocab most frequent answer tokens, which become its vocabulary."""

    epochs: float = 1.0
    lr: float = 5e-4
    tokens_per_batch: int = 4096
    seed: int = 0
    data_from: tuple = ()
    unroll: int = 1
    init_from: str | None = None
    token_weight: float = 0.1
    draft_vocab: int | None = None
    token_loss: str = "ce"
    bf16: bool = True
    format: str = "eagle1"

    # The options a resumed run must share with its checkpoint (`saved`), as older checkpoints that did not record
    # one were trained.
    CHECKPOINT_DEFAULTS = {"seed": 0, "data_from": [], "unroll": 1, "init_from": None, "token_weight": 0.1,
                        "draft_vocab": "full", "token_loss": "ce", "format": "eagle1"}

    def __post_init__(self):
        if self.draft_vocab is not None and self.draft_vocab < 1:
            raise ValueError(f"--draft-vocab is {self.draft_vocab}: pass a token count of 1 or more, or 'full'")
        if self.unroll < 1:
            raise ValueError(f"--unroll is {self.unroll}: pass 1 (EAGLE-1's loss) or more (draft depths trained)")
        if self.token_weight < 0:
            raise ValueError(f"--token-weight is {self.token_weight}: pass 0 or more (EAGLE's recipe: 0.1)")
        if self.token_loss not in TOKEN_LOSSES:
            raise ValueError(f"--token-loss is {self.token_loss!r}: pass ce (EAGLE's cross-entropy), tv or top1")
        if self.format not in FORMATS:
            raise ValueError(f"--format is {self.format!r}: pass eagle1 or eagle3")
        if self.format == "eagle3" and self.token_weight != 0.1:
            raise ValueError(f"--token-weight {self.token_weight} weighs EAGLE-1's feature term, which an EAGLE-3 "
                             f"head does not have: leave it out with --format eagle3")
        object.__setattr__(self, "data_from", tuple(str(Path(run)) for run in self.data_from))
        object.__setattr__(self, "init_from", str(Path(self.init_from)) if self.init_from else None)

    def saved(self) -> dict:
        """The options a checkpoint records, as it records them."""
        return {"seed": self.seed, "data_from": list(self.data_from), "unroll": self.unroll,
                "init_from": self.init_from, "token_weight": self.token_weight,
                "draft_vocab": "full" if self.draft_vocab is None else self.draft_vocab,
                "token_loss": self.token_loss, "format": self.format}


def train(out_dir: Path, recipe: TrainRecipe = TrainRecipe(), base_model=None, device: str = "cpu",
          max_minutes: float | None = None, save_every: int = 100, schedule_minutes: float | None = None) -> dict:
    """Train (or resume) the run's head by `recipe`; checkpoints every `save_every` steps and when `max_minutes`
    have passed, so a rerun continues where this one stopped.  The learning rate warms up over 50 steps and decays
    on a cosine over the epochs; with `schedule_minutes`, over whichever ends first, the epochs or that many minutes
    of this call (a run boxed in time, on a lent GPU, still ends at a learning rate of 0, and stops there)."""
    out_dir = Path(out_dir)
    shards = data_shards(out_dir, recipe.data_from)
    out_dir.mkdir(parents=True, exist_ok=True)
    target, _ = models.load_target(base_model, torch.float32, device)
    for parameter in target.parameters():
        parameter.requires_grad_(False)
    embed, lm_head = target.get_input_embeddings(), target.get_output_embeddings()
    rows = torch.arange(target.config.vocab_size, device=device)
    if recipe.draft_vocab is not None and recipe.draft_vocab < target.config.vocab_size:
        rows = torch.tensor(sorted(rank_tokens(shards, target.config.vocab_size)[: recipe.draft_vocab]),
                            device=device)
        lm_head = draft_vocab_lm_head(lm_head, rows)
    layers = None
    if recipe.format == "eagle3":
        draft_head = new_eagle3_head(target, rows, recipe.seed).train()
        layers = draft_head.feature_layers
        if max(layers) > target.config.num_hidden_layers or min(layers) < 1:
            raise ValueError(f"--format eagle3 reads the target's layers {layers}; the base model has "
                             f"{target.config.num_hidden_layers}: EAGLE-3 needs a target of 4 layers or more")
    else:
        draft_head = head_module.random_head(target, recipe.seed).float().train()
    if recipe.init_from:
        weights = _trained_weights(Path(recipe.init_from), target)
        d2t = weights.get("d2t")
        if layers is not None and (d2t is None or not torch.equal(torch.arange(len(d2t)) + d2t.cpu(), rows.cpu())):
            raise ValueError(f"--init-from {recipe.init_from} is no EAGLE-3 head that drafts over the --draft-vocab "
                             f"{recipe.draft_vocab or 'full'} of this data: pass the --draft-vocab and data it "
                             f"was trained with")
        draft_head.load_state_dict(weights)
    optimizer = torch.optim.AdamW(draft_head.parameters(), lr=recipe.lr, betas=(0.9, 0.95), weight_decay=0.0)
    checkpoint = out_dir / "checkpoint.pt"
    state = {"step": 0, "epoch": 0, "batch_in_epoch": 0, **recipe.saved(), "log": []}
    if checkpoint.exists():
        saved = torch.load(checkpoint, weights_only=False)
        for name, value in recipe.saved().items():
            trained_with = saved["state"].get(name, TrainRecipe.CHECKPOINT_DEFAULTS[name])
            if trained_with != value:
                option = "--" + name.replace("_", "-")
                raise ValueError(f"{checkpoint} was trained with {option} {_option_text(trained_with)}, not "
                                 f"{_option_text(value)}: pass the same to resume it, or use another --run")
        draft_head.load_state_dict(saved["head"])
        if layers is not None and not torch.equal(draft_head.target_ids(), rows):
            raise ValueError(f"{checkpoint} drafts over the --draft-vocab most frequent answer tokens of its data "
                             f"then, which the data's shards no longer give: resume it on the same shards, or use "
                             f"another --run")
        optimizer.load_state_dict(saved["optimizer"])
        state = saved["state"]
        if "rng" in saved:  # the feature noise continues as if never interrupted
            torch.set_rng_state(saved["rng"])
    total_batches = sum(1 for _ in _batches(shards, recipe.tokens_per_batch, random.Random(recipe.seed)))
    total_steps = max(1, int(total_batches * recipe.epochs))
    deadline = time.monotonic() + 60 * max_minutes if max_minutes else None

    def save():
        staging = checkpoint.with_suffix(".tmp")
        torch.save({"head": draft_head.state_dict(), "optimizer": optimizer.state_dict(), "state": state,
                    "rng": torch.get_rng_state()}, staging)
        os.replace(staging, checkpoint)

    progress = tqdm(total=total_steps, initial=state["step"], desc="train head")
    started, tokens_seen, scheduled = time.monotonic(), 0, state.get("scheduled_s", 0.0)
    feature_targets = {}

    def feature_target(shard: Path):
        """The target in the dtype the shard's data stage ran in (bf16 for runs that did not record it)."""
        record = shard.parent / "prompts.json"
        dtype = json.loads(record.read_text()).get("dtype", "bfloat16") if record.exists() else "bfloat16"
        if dtype not in feature_targets:
            feature_targets[dtype] = target if models.parse_dtype(dtype) == torch.float32 else \
                models.load_target(base_model, models.parse_dtype(dtype), device)[0]
        return feature_targets[dtype]

    while state["step"] < total_steps:
        batches = _batches(shards, recipe.tokens_per_batch, random.Random(recipe.seed + state["epoch"]))
        for index, batch in enumerate(batches):
            if index < state["batch_in_epoch"]:
                continue  # resume inside the epoch
            along = state["step"] / total_steps  # how far along the schedule
            if schedule_minutes:  # (the minutes of earlier calls of the run count: a rerun continues the decay)
                state["scheduled_s"] = scheduled + time.monotonic() - started
                along = max(along, state["scheduled_s"] / (60 * schedule_minutes))
            if along >= 1 or (deadline and time.monotonic() > deadline):
                break
            for group in optimizer.param_groups:  # linear warm-up, cosine decay
                warm = min(1.0, (state["step"] + 1) / 50)
                group["lr"] = recipe.lr * warm * 0.5 * (1 + math.cos(math.pi * along))
            tokens_seen += sum(len(sample["ids"]) for sample in batch)
            features, tokens, targets, mask = _training_batch(batch, feature_target, target.config.hidden_size,
                                                              device, layers)
            with torch.autocast(device_type=device.split(":")[0], dtype=torch.bfloat16, enabled=recipe.bf16):
                loss, accuracy = head_loss(draft_head, embed, lm_head, features, tokens, targets, mask,
                                           unroll=recipe.unroll, token_weight=recipe.token_weight,
                                           token_loss=recipe.token_loss)
            optimizer.zero_grad(set_to_none=True)
            loss.backward()
            torch.nn.utils.clip_grad_norm_(draft_head.parameters(), 0.5)
            optimizer.step()
            state["step"] += 1
            state["batch_in_epoch"] = index + 1
            state["log"].append({"step": state["step"], "loss": loss.item(), "top1": accuracy})
            progress.update(1)
            progress.set_postfix(loss=f"{loss.item():.4f}", top1=f"{accuracy:.3f}")
            if state["step"] % save_every == 0:
                save()
        else:
            state["epoch"] += 1
            state["batch_in_epoch"] = 0
            continue
        break
    progress.close()
    seconds = time.monotonic() - started
    state["wall_time_s"] = state.get("wall_time_s", 0.0) + seconds
    if tokens_seen:  # what sizes a run on another machine or batch
        print(f"train stage: {tokens_seen} tokens in {seconds:.0f} s: {tokens_seen / seconds:.0f} training "
              f"tokens/s at {recipe.tokens_per_batch} tokens a batch on {device}")
    save()
    return state


def _option_text(value) -> str:
    """How a training option stored in a checkpoint reads on the command line."""
    if isinstance(value, list):
        return " ".join(value) or "(none)"
    return "(none)" if value is None else str(value)


def _trained_weights(source: Path, target) -> dict:
    """A head's weights from a training run (its checkpoint) or an exported head folder."""
    if (source / "checkpoint.pt").exists():
        return torch.load(source / "checkpoint.pt", weights_only=False)["head"]
    if (source / "config.json").exists():
        return {k: v.float() if v.is_floating_point() else v
                for k, v in head_module.load_head(str(source), target).state_dict().items()}
    raise FileNotFoundError(f"--init-from {source}: neither a run with checkpoint.pt nor a head folder "
                            f"with config.json")


# -- evaluation ---------------------------------------------------------------------------


def depth1_scores(draft_head, target, sample: dict, rows: torch.Tensor | None = None) -> tuple[int, float, int]:
    """(argmax hits, summed acceptance, positions): the head teacher-forced at draft depth 1 on one sample
    (ids, start, features) over its answer positions.  A hit: the head's argmax is the target's; acceptance:
    sum min(p, q) at T = 1, the rate at which one sampled draft is accepted, with q over `rows` (the decoder's
    draft vocabulary, 0 outside; None: the whole vocabulary)."""
    from .engine import additive_mask

    hidden = target.config.hidden_size
    inputs, tokens, targets, mask = _collate([sample], sample["features"].shape[-1])
    length, dtype = inputs.shape[1], next(draft_head.parameters()).dtype
    attention = additive_mask(torch.ones(length, length, dtype=torch.bool).tril(), dtype)
    with torch.inference_mode():
        predicted = draft_head(inputs.to(dtype), target.get_input_embeddings()(tokens).to(dtype),
                               torch.arange(1, length + 1)[None], attention, None)[mask]
        lm_head = target.get_output_embeddings()
        truth = lm_head(targets[mask][..., :hidden].to(lm_head.weight.dtype)).float()
        p = torch.softmax(truth, -1)
        if isinstance(draft_head, eagle3.Eagle3Head):  # q over its own vocabulary, as the decoder drafts
            rows = draft_head.target_ids()
            logits = draft_head.logits(predicted).float()
            drafted = rows[logits.argmax(-1)]
        else:
            predicted = predicted.to(lm_head.weight.dtype)
            weight = lm_head.weight if rows is None else lm_head.weight[rows]
            logits = torch.nn.functional.linear(predicted, weight).float()
            drafted = lm_head(predicted).argmax(-1)
        q = torch.softmax(logits, -1)
        p = p if rows is None else p[:, rows]
        hits = int((drafted == truth.argmax(-1)).sum())
    return hits, float(torch.minimum(p, q).sum()), len(truth)


def teacher_forced(draft_head, target, tokenizer, prompts: list[str], max_new_tokens: int = 64) -> tuple[float, float]:
    """(top-1, acceptance) of `depth1_scores` on the target's own greedy answers to the prompts, q over the draft
    vocabulary the decoder uses by default."""
    from .engine import resolve_draft_vocab

    size = resolve_draft_vocab(draft_head, "auto")
    rows = None if size is None else torch.tensor(sorted(draft_head.draft_vocab[:size]))
    layers = getattr(draft_head, "feature_layers", None)
    hits = accepted = total = 0
    for prompt in prompts:
        ids = models.chat_prompt_ids(tokenizer, prompt)
        with torch.inference_mode():
            sequence = target.generate(torch.tensor([ids]), max_new_tokens=max_new_tokens, do_sample=False)[0]
            features = target_features(target, sequence[None], layers=layers)[0]
        scores = depth1_scores(draft_head, target, {"ids": sequence, "start": len(ids), "features": features}, rows)
        hits, accepted, total = hits + scores[0], accepted + scores[1], total + scores[2]
    return hits / max(total, 1), accepted / max(total, 1)


# Three short prompts a shipped head must accept drafts on (tests/test_shipped_head.py).
GUARD_PROMPTS = ["Write a short poem about the sea.", "Explain what a prime number is.",
                 "Give three tips for staying focused while studying."]


def guard_tau(draft_head, target, tokenizer, max_new_tokens: int = 64) -> float:
    """tau at T = 0 with the eagle_default tree over the guard prompts (new tokens / cycles, pooled)."""
    from . import engine, tree

    decoder = engine.Decoder(target, draft_head, tree.load("eagle_default"),
                             eos_token_ids=models.eos_token_ids(target, tokenizer))
    tokens = cycles = 0
    for prompt in GUARD_PROMPTS:
        result = decoder.generate(models.chat_prompt_ids(tokenizer, prompt), max_new_tokens, 0.0)
        tokens, cycles = tokens + result.new_tokens, cycles + result.cycles
    return tokens / cycles


def _prompt_data(out_dir: Path) -> Path:
    """The data folder whose prompt list the held-out prompts come from: the run's own, else that of
    the first run it trained on with --data-from."""
    candidates = [out_dir / "data"]
    if (out_dir / "checkpoint.pt").exists():
        state = torch.load(out_dir / "checkpoint.pt", weights_only=False)["state"]
        candidates += [Path(run) / "data" for run in state.get("data_from", [])]
    for data in candidates:
        if (data / "prompts.json").exists():
            return data
    raise FileNotFoundError(f"no data stage in {out_dir}: evaluate needs a run with data shards (or trained on one)")


def held_out_prompts(data: Path, count: int) -> list[str]:
    """Up to `count` prompts of a data stage's shuffled list after those its shards answered (none when
    it answered them all, as for a file of self-written prompts)."""
    info = json.loads((data / "prompts.json").read_text())
    used = len(list(data.glob("shard_*.pt"))) * info.get("shard_size", 256)
    prompts = load_prompts([Path(p) for p in info["sources"]])
    random.Random(info["seed"]).shuffle(prompts)
    return [p["prompt"] for p in prompts[used : used + count]]


def evaluate(out_dir: Path, head_spec, base_model=None, count: int = 16) -> dict:
    """Teacher-forced top-1 and sampled-draft acceptance (`teacher_forced`) on held-out training prompts (never
    used by the data stage) and MT-Bench, and tau on the guard prompts."""
    held_out = held_out_prompts(_prompt_data(Path(out_dir)), count)
    target, tokenizer = models.load_target(base_model, torch.bfloat16)
    draft_head = head_module.load_head(head_spec, target)
    mt_bench = [q["turns"][0] for q in questions.load("mt_bench")[:count]]
    held = teacher_forced(draft_head, target, tokenizer, held_out) if held_out else (None, None)
    mt = teacher_forced(draft_head, target, tokenizer, mt_bench)
    return {"held_out_prompts": len(held_out), "top1_held_out": held[0], "top1_mt_bench": mt[0],
            "accept_held_out": held[1], "accept_mt_bench": mt[1],
            "tau_guard_prompts": guard_tau(draft_head, target, tokenizer)}


# -- stage 3: export -----------------------------------------------------------------------


def rank_tokens(shards: list[Path], vocab_size: int) -> list[int]:
    """Every token id, the answer tokens of the data shards first by frequency (ties: lower id first),
    then the unseen ones by id (a BPE vocabulary's lower ids were merged earlier, i.e. are more common)."""
    counts = collections.Counter()
    for shard in shards:
        for sample in torch.load(shard, weights_only=True):
            counts.update(sample["ids"][sample["start"]:].tolist())
    seen = [token for token, _ in sorted(counts.items(), key=lambda item: (-item[1], item[0]))]
    return seen + sorted(set(range(vocab_size)) - set(seen))


def export(out_dir: Path, destination: Path, base_model=None, compact: bool = True) -> Path:
    """Write the trained head: compact (fp16 safetensors, no embedding) or the full EAGLE-1 format.

    Both carry draft_vocab.json, the answer tokens of the training data ranked by frequency.  An EAGLE-3 head
    is written in its released layout (bf16 safetensors; its draft vocabulary is d2t/t2d).
    """
    checkpoint = Path(out_dir) / "checkpoint.pt"
    if not checkpoint.exists():
        raise FileNotFoundError(f"no checkpoint.pt in {out_dir}: run `eagle-mdsd train-head train --run {out_dir}` "
                                f"first")
    saved = torch.load(checkpoint, weights_only=False)
    target, _ = models.load_target(base_model, torch.float32)
    if saved["state"].get("format", "eagle1") == "eagle3":
        if not compact:
            raise ValueError(f"--eagle1-format writes EAGLE-1's layout, but {out_dir} trained an EAGLE-3 head: "
                             f"leave it out (the head is written in EAGLE-3's released layout)")
        draft_head = eagle3.random_head(target, saved["head"]["lm_head.weight"].shape[0]).float()
        draft_head.load_state_dict(saved["head"])
        return eagle3.save(draft_head.to(torch.bfloat16), destination)
    draft_head = head_module.random_head(target).float()
    draft_head.load_state_dict(saved["head"])
    shards = data_shards(out_dir, saved["state"].get("data_from", []))
    draft_head.draft_vocab = rank_tokens(shards, target.config.vocab_size)
    if compact:
        return head_module.save_head(draft_head.half(), destination, safetensors=True)
    return head_module.save_head(draft_head, destination, target=target)
