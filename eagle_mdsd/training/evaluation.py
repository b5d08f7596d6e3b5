"""Scoring a trained head: teacher-forced top-1 and sampled-draft acceptance at draft depth 1 on held-out
training prompts and MT-Bench, and tau on three guard prompts."""

from __future__ import annotations

import random
from pathlib import Path

import torch
from transformers import GenerationConfig

from ..errors import MissingFile
from .. import eagle3, models, peers, questions
from .. import head as head_module
from ..checkpoint import load_saved
from .batching import CHECKPOINT_FIX, _collate
from .data import read_record, target_features
from .prompts import load_prompts


def depth1_scores(draft_head, target, sample: dict, rows: torch.Tensor | None = None) -> tuple[int, float, int]:
    """(argmax hits, summed acceptance, positions): the head teacher-forced at draft depth 1 on one sample
    (ids, start, features) over its answer positions.  A hit: the head's argmax is the target's; acceptance:
    sum min(p, q) at T = 1, the rate at which one sampled draft is accepted, with q over `rows` (the decoder's
    draft vocabulary, 0 outside; None: the whole vocabulary)."""
    from ..tree import additive_mask

    hidden = target.config.hidden_size
    inputs, tokens, targets, mask = _collate([sample], sample["features"].shape[-1])
    length, dtype = inputs.shape[1], next(draft_head.parameters()).dtype
    attention = additive_mask(torch.ones(length, length, dtype=torch.bool).tril(), dtype)[None, None]
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
    from ..head import resolve_draft_vocab

    size = resolve_draft_vocab(draft_head, "auto")
    rows = None if size is None else torch.tensor(sorted(draft_head.draft_vocab[:size]))
    layers = getattr(draft_head, "feature_layers", None)
    eos = models.eos_token_ids(target, tokenizer)
    hits = accepted = total = 0
    for prompt in prompts:
        ids = models.chat_prompt_ids(tokenizer, prompt)
        with torch.inference_mode():
            sequence = peers.plain_generate(target, torch.tensor([ids]), GenerationConfig(
                max_new_tokens=max_new_tokens, do_sample=False, eos_token_id=eos or None))[0]
            features = target_features(target, sequence[None], layers=layers)[0]
        scores = depth1_scores(draft_head, target, {"ids": sequence, "start": len(ids), "features": features}, rows)
        hits, accepted, total = hits + scores[0], accepted + scores[1], total + scores[2]
    return hits / max(total, 1), accepted / max(total, 1)


# Three short prompts a shipped head must accept drafts on (tests/test_shipped_head.py).
GUARD_PROMPTS = ["Write a short poem about the sea.", "Explain what a prime number is.",
                 "Give three tips for staying focused while studying."]


def guard_tau(draft_head, target, tokenizer, max_new_tokens: int = 64) -> float:
    """tau at T = 0 with the eagle_default tree over the guard prompts (new tokens / cycles, pooled)."""
    from .. import engine, tree

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
        state = load_saved(out_dir / "checkpoint.pt", "checkpoint", CHECKPOINT_FIX, weights_only=False)["state"]
        candidates += [Path(run) / "data" for run in state.get("data_from", [])]
    for data in candidates:
        if (data / "prompts.json").exists():
            return data
    raise MissingFile(f"no data stage in {out_dir}: evaluate needs a run with data shards (or trained on one)")


def held_out_prompts(data: Path, count: int) -> list[str]:
    """Up to `count` prompts of a data stage's shuffled list after those its shards answered (none when
    it answered them all, as for a file of self-written prompts)."""
    info = read_record(data)
    used = len(list(data.glob("shard_*.pt"))) * info.get("shard_size", 256)
    prompts = load_prompts([Path(p) for p in info["sources"]])
    random.Random(info["seed"]).shuffle(prompts)
    return [p["prompt"] for p in prompts[used : used + count]]


def evaluate(out_dir: Path, head_spec, base_model=None, count: int = 16) -> dict:
    """Teacher-forced top-1 and sampled-draft acceptance (`teacher_forced`) on held-out training prompts (never
    used by the data stage) and MT-Bench, and tau on the guard prompts."""
    head_module.inspect(head_spec)  # a bad head's files before the model loads
    held_out = held_out_prompts(_prompt_data(Path(out_dir)), count)
    target, tokenizer = models.load_target(base_model, torch.bfloat16)
    draft_head = head_module.load_head(head_spec, target)
    mt_bench = [q["turns"][0] for q in questions.load("mt_bench")[:count]]
    held = teacher_forced(draft_head, target, tokenizer, held_out) if held_out else (None, None)
    mt = teacher_forced(draft_head, target, tokenizer, mt_bench)
    return {"held_out_prompts": len(held_out), "top1_held_out": held[0], "top1_mt_bench": mt[0],
            "accept_held_out": held[1], "accept_mt_bench": mt[1],
            "tau_guard_prompts": guard_tau(draft_head, target, tokenizer)}
