"""The export stage: a trained run's head in the format the decoder and other servers load."""

from __future__ import annotations

from pathlib import Path

import torch

from .. import eagle3, models
from .. import head as head_module
from ..errors import MissingFile, UsageError
from ..checkpoint import load_saved
from .batching import data_shards, rank_tokens


def export(out_dir: Path, destination: Path, base_model=None, compact: bool = True) -> Path:
    """Write the trained head: compact (fp16 safetensors, no embedding) or the full EAGLE-1 format (with the
    embedding copy), which `head.load_head` reads alike.

    Both carry draft_vocab.json, the answer tokens of the training data ranked by frequency.  An EAGLE-3 head
    is written in its released layout (bf16 safetensors; its draft vocabulary is d2t/t2d).
    """
    checkpoint = Path(out_dir) / "checkpoint.pt"
    if not checkpoint.exists():
        raise MissingFile(f"no checkpoint.pt in {out_dir}: run `eagle-mdsd train-head train --run {out_dir}` "
                                f"first")
    saved = load_saved(checkpoint, "checkpoint", "train again from the start, or export another --run",
                       weights_only=False)
    target, _ = models.load_target(base_model, torch.float32)
    if saved["state"].get("format", "eagle1") == "eagle3":
        if not compact:
            raise UsageError(f"--eagle1-format writes EAGLE-1's layout, but {out_dir} trained an EAGLE-3 head: "
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
