"""The data shards read back for training: the runs' shards, their answer-token ranking, and batches of the
tensors the loss takes, with the target's features computed where a shard does not store them."""

from __future__ import annotations

import collections
import random
from pathlib import Path

import torch

from ..checkpoint import load_saved
from ..errors import MissingFile
from .. import models
from .data import _features, _right_padded, read_record, target_features


def data_shards(out_dir: Path, data_from=()) -> list[Path]:
    """The data shards of a run and of the runs it also trains on, in a fixed order."""
    shards = []
    for run in [Path(out_dir), *map(Path, data_from)]:
        found = sorted((run / "data").glob("shard_*.pt"))
        if not found and run == Path(out_dir) and data_from:
            continue  # a run may train on other runs' data only
        if not found:
            raise MissingFile(f"no data shards in {run / 'data'}: run the data stage there first")
        shards += found
    return shards


SHARD_FIX = "delete it and run the data stage again, which makes it anew"
CHECKPOINT_FIX = "delete it to train from the start, or use another --run"


def rank_tokens(shards: list[Path], vocab_size: int) -> list[int]:
    """Every token id, the answer tokens of the data shards first by frequency (ties: lower id first),
    then the unseen ones by id (a BPE vocabulary's lower ids were merged earlier, i.e. are more common)."""
    counts = collections.Counter()
    for shard in shards:
        for sample in load_saved(shard, "data shard", SHARD_FIX):
            counts.update(sample["ids"][sample["start"]:].tolist())
    seen = [token for token, _ in sorted(counts.items(), key=lambda item: (-item[1], item[0]))]
    return seen + sorted(set(range(vocab_size)) - set(seen))


def _batches(shards: list[Path], tokens_per_batch: int, rng: random.Random):
    """Batches of samples (lists), shard by shard in a shuffled order."""
    order = list(shards)
    rng.shuffle(order)
    for shard in order:
        samples = load_saved(shard, "data shard", SHARD_FIX)
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


class FeatureTargets:
    """The target in the dtype each shard's data stage ran in (bf16 where the stage did not record it), loaded
    once per dtype: features computed for training are those the data stage would have stored."""

    def __init__(self, target, base_model, device):
        self.float32_target, self.base_model, self.device = target, base_model, device
        self.loaded = {}

    def __call__(self, shard: Path):
        record = Path(shard).parent / "prompts.json"
        dtype = read_record(record.parent).get("dtype", "bfloat16") if record.exists() else "bfloat16"
        if dtype not in self.loaded:
            self.loaded[dtype] = self.float32_target if models.parse_dtype(dtype) == torch.float32 else \
                models.load_target(self.base_model, models.parse_dtype(dtype), self.device)[0]
        return self.loaded[dtype]


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
