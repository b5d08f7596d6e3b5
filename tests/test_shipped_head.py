"""The head shipped for the embedded default: present, small, and actually accepting drafts."""

from __future__ import annotations

import torch

from eagle_mdsd import head, models, training


def test_shipped_head_is_compact():
    files = list(models.DEFAULT_HEAD.iterdir())
    assert {"config.json", "model.safetensors"} <= {f.name for f in files}
    assert sum(f.stat().st_size for f in files) < 20 * 2**20


# A random head accepts almost nothing (tau near 1); a head that drafts usefully clears 2 on these prompts, with
# room for CPU rounding (the shipped head's own tau is on the pages that docs/training.md lists).
GUARD_TAU = 2.0


def test_shipped_head_accepts_drafts():
    target, tokenizer = models.load_target(None, torch.bfloat16)
    assert training.guard_tau(head.load_head(models.DEFAULT_HEAD, target), target, tokenizer) > GUARD_TAU
