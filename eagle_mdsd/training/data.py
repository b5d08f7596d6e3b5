"""The data stage: the target answers instruction prompts through its chat template (self-distillation, greedy or
sampled, batched), and its token ids, the response start and its features are written in shards.

A shard of `shard_size` samples is written whole or not at all, and an existing one is skipped, so a rerun
resumes; it must make its answers the same way (`check_data_record`).
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import os
import random
import time
from pathlib import Path

import torch
from tqdm import tqdm
from transformers import GenerationConfig

from .. import models, outputs, peers
from ..errors import UsageError, read_json
from .budget import Budget, check_batch_memory
from .prompts import load_prompts


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
              seed: int = 0, eos=None, **generate_options) -> list[list[int]]:
    """Responses, batched with left padding: greedy, or sampled at `temperature` (plain sampling, no top-k or
    top-p) from torch's generator seeded with `seed`, each ended at its first id of `eos` (None: the model's own,
    `models.eos_token_ids` without a tokenizer); `generate_options` go to `target.generate` as they are."""
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
    eos = set(eos if eos is not None else models.eos_token_ids(target))
    config = GenerationConfig(**sampling, max_new_tokens=max_new_tokens, pad_token_id=pad_id,
                              eos_token_id=sorted(eos) or None)
    out = peers.plain_generate(target, ids.to(target.device), config, attention_mask=mask.to(target.device),
                               **generate_options)
    rows = out[:, length:].tolist()
    return [row[: next((i + 1 for i, t in enumerate(row) if t in eos), len(row))] for row in rows]


@dataclasses.dataclass(frozen=True)
class DataRecipe:
    """How `make_data` answers prompts: greedy, or sampled at `temperature` > 0 (seeded per batch, so a rerun
    repeats the answers), in batches of `batch_size`, into shards of `shard_size` prompts; prompts are shuffled
    with `seed` and cut to `max_prompts`, those longer than `max_prompt_tokens` skipped; `mix_reference` adds the
    datasets' own responses.  `sort_by_length` batches a shard's prompts in order of length, so a left-padded
    batch pads less and answers faster; off by default, because in bf16 an answer depends on its batch's
    padding.  `features` False keeps the token ids alone (4 bytes a token, where its bf16 features take twice
    the hidden size): the train stage then computes the target's features itself, on its device."""

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
        from ..errors import check_temperature

        check_temperature(self.temperature, "--temperature")


def check_data_record(data_dir: Path, made: dict, recipe: DataRecipe) -> None:
    """Refuse to continue the shards in `data_dir`, recorded as `made` (its prompts.json), with a recipe that
    would shuffle, split or answer its prompts otherwise: the finished shards would not fit the new ones."""
    made = {"temperature": 0.0, "sort_by_length": False, "features": True} | made  # what records without them were
    for option, key, now in (("--temperature", "temperature", recipe.temperature), ("--seed", "seed", recipe.seed),
                             ("--shard-size", "shard_size", recipe.shard_size)):
        if made.get(key, now) != now:
            raise UsageError(f"{data_dir} holds answers made with {option} {made[key]}: pass that {option}, "
                             f"or another --run")
    if made["sort_by_length"] != recipe.sort_by_length:
        raise UsageError(f"{data_dir} holds answers made {'with' if made['sort_by_length'] else 'without'} "
                         f"--sort-by-length: {'pass' if made['sort_by_length'] else 'leave out'} "
                         f"--sort-by-length, or use another --run")
    if made["features"] != recipe.features:
        raise UsageError(f"{data_dir} holds answers made {'without' if made['features'] else 'with'} "
                         f"--no-features: {'leave out' if made['features'] else 'pass'} --no-features, "
                         f"or use another --run")


def make_data(out_dir: Path, prompt_paths, recipe: DataRecipe = DataRecipe(), base_model=None,
              dtype: str = "bfloat16", max_minutes: float | None = None, device: str = "cpu") -> list[Path]:
    """The target's answers to the prompts in `prompt_paths` and its features, made by `recipe`, in shards under
    out_dir/data; a rerun continues (stopping cleanly when `max_minutes` have passed)."""
    budget = Budget(max_minutes)
    prompts = load_prompts(prompt_paths)  # bad prompt files fail before the run folder is made
    data_dir = Path(out_dir) / "data"
    prompts = _recorded_prompts(data_dir, prompts, prompt_paths, recipe, dtype)
    target, tokenizer = models.load_target(base_model, models.parse_dtype(dtype), device)
    shards = []
    started, answers, answer_tokens = time.monotonic(), 0, 0
    with tqdm(range(0, len(prompts), recipe.shard_size), desc="data shards") as bar:  # (closed on an error too)
        for start in bar:
            shard = data_dir / f"shard_{start // recipe.shard_size:05d}.pt"
            shards.append(shard)
            if shard.exists():
                continue
            if not budget.allows_step():
                print(f"time budget reached: {len(list(data_dir.glob('shard_*.pt')))} shards done; rerun to continue")
                break
            samples, responses = _shard_samples(target, tokenizer, prompts[start : start + recipe.shard_size], recipe,
                                                seed=recipe.seed * 1_000_003 + start)
            answers, answer_tokens = answers + len(responses), answer_tokens + sum(map(len, responses))
            staging = shard.with_suffix(".tmp")
            torch.save(samples, staging)
            os.replace(staging, shard)  # atomic: an interrupt never leaves half a shard
            budget.step_took()
    seconds = time.monotonic() - started
    if answers:  # the rate that sizes a run on another machine or batch size
        print(f"data stage: {answers} answers, {answer_tokens} answer tokens in {seconds:.0f} s: "
              f"{answers / seconds:.1f} answers/s, {answer_tokens / seconds:.0f} answer tokens/s at batch size "
              f"{recipe.batch_size} on {device}")
    return [s for s in shards if s.exists()]


def _recorded_prompts(data_dir: Path, prompts: list[dict], prompt_paths, recipe: DataRecipe, dtype: str) -> list:
    """The run's prompts in the order it answers them (shuffled by the recipe's seed, cut to its max_prompts), after
    checking a rerun's record against the recipe and writing the record."""
    data_dir.mkdir(parents=True, exist_ok=True)
    record = data_dir / "prompts.json"
    digest = hashlib.sha256(json.dumps(prompts, sort_keys=True).encode()).hexdigest()
    if record.exists():
        made = read_record(data_dir)
        check_data_record(data_dir, made, recipe)
        if made.get("digest", digest) != digest:  # the shuffle of another list: its shards would not continue these
            raise UsageError(f"{data_dir} answers the {made.get('pool', made['count'])} prompts its sources held "
                             f"when it began, and they now hold {len(prompts)} or others: answer them into "
                             f"another --run (train-head train takes both with --data-from)")
    random.Random(recipe.seed).shuffle(prompts)
    pool = len(prompts)
    prompts = prompts[:recipe.max_prompts] if recipe.max_prompts else prompts
    outputs.write_atomically(record, json.dumps({  # whole or not at all: a rerun reads it back
        "count": len(prompts), "pool": pool, "digest": digest, "seed": recipe.seed, "shard_size": recipe.shard_size,
        "sources": [str(p) for p in prompt_paths], "temperature": recipe.temperature,
        "sort_by_length": recipe.sort_by_length, "features": recipe.features, "dtype": dtype}))
    return prompts


def read_record(data_dir: Path) -> dict:
    """The data stage's record of how it made the shards in `data_dir` (its prompts.json); one that is not a
    JSON object is a one-line error, since without it the shards cannot be continued or read as made."""
    return read_json(Path(data_dir) / "prompts.json", "data record", "delete that data folder and run the data "
                     "stage again, or use another --run", kind=dict)


def _shard_samples(target, tokenizer, chunk: list[dict], recipe: DataRecipe, seed: int) -> tuple[list, list]:
    """One shard's samples (token ids, where the answer starts, and the features unless the recipe says not) and
    the target's answers; a batch's seed is `seed` plus its first index, so a rerun repeats it."""
    pad_id, eos = models.pad_token_id(tokenizer), models.eos_token_ids(target, tokenizer)
    samples, answers = [], []
    for batch_start, encoded in _shard_batches(chunk, tokenizer, recipe):
        prompt_ids, batch = [ids for ids, _ in encoded], [item for _, item in encoded]
        check_batch_memory(target, recipe.batch_size, max(map(len, prompt_ids)) + recipe.max_new_tokens,
                           batch=len(prompt_ids))  # (left-padded to its longest prompt)
        with torch.inference_mode():
            responses = _generate(target, prompt_ids, recipe.max_new_tokens, pad_id, recipe.temperature,
                                  seed=seed + batch_start, eos=eos)
            sequences = [p + r for p, r in zip(prompt_ids, responses)]
            starts = [len(p) for p in prompt_ids]
            if recipe.mix_reference:
                for p, item in zip(prompt_ids, batch):
                    if item["reference"]:
                        ref = tokenizer(item["reference"], add_special_tokens=False)["input_ids"]
                        sequences.append(p + ref[: 2 * recipe.max_new_tokens])
                        starts.append(len(p))
            answers += responses
            features = _features(target, sequences, pad_id) if recipe.features else [None] * len(sequences)
        samples += [{"ids": torch.tensor(s, dtype=torch.int32), "start": st} | ({} if f is None else {"features": f})
                    for s, st, f in zip(sequences, starts, features)]
    return samples, answers


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
