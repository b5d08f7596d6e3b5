"""lab/fused_features_pilot.py: the two heads read what they should, and train with EAGLE-1's loss."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from eagle_mdsd import training

import evaluation_scripts
from tiny import tiny_target

pilot = evaluation_scripts.load("fused_features_pilot")


def _sample(length=7, hidden=32, start=3, seed=0):
    generator = torch.Generator().manual_seed(seed)
    states = {name: torch.randn(length, hidden, generator=generator) * scale
              for name, scale in (("features", 1.0), ("low", 5.0), ("mid", 20.0))}
    return {"ids": torch.randint(32, (length,), generator=generator, dtype=torch.int32), "start": start, **states}


@pytest.mark.parametrize("arm", ["eagle1", "fused"])
def test_each_arm_reads_its_input_and_predicts_the_next_final_feature(arm):
    sample = _sample()
    inputs, tokens, targets, mask = pilot.collate([sample], arm)
    final, hidden = sample["features"], (32,)
    expected = final if arm == "eagle1" else torch.cat(
        [F.rms_norm(sample["low"], hidden), F.rms_norm(sample["mid"], hidden), final], -1)
    assert torch.equal(inputs[0], expected[:-1])
    assert torch.equal(targets[0], final[1:]) and torch.equal(tokens[0], sample["ids"][1:].long())
    assert mask[0].tolist() == [False, False, True, True, True, True]  # answer positions only, as _collate


def test_the_fused_head_trains_with_eagle_1s_loss():
    target = tiny_target(vocab=32, hidden=32).float()
    draft = pilot.new_head("fused", target)
    assert draft.fc.in_features == 4 * 32
    batch = pilot.collate([_sample(seed=1), _sample(length=5, seed=2)], "fused")
    optimizer = torch.optim.AdamW(draft.parameters(), lr=1e-2)
    losses = []
    for _ in range(15):
        loss, _ = training.head_loss(draft, target.get_input_embeddings(), target.get_output_embeddings(), *batch,
                                     noise=0.0)
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        losses.append(loss.item())
    assert losses[-1] < 0.5 * losses[0]
