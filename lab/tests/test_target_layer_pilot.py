"""lab/target_layer_pilot.py: the last_layer head starts as the target's last decoder layer."""

from __future__ import annotations

import torch

import evaluation_scripts
from tiny import tiny_target

pilot = evaluation_scripts.load("target_layer_pilot")


def test_the_head_layer_computes_the_targets_last_layer_on_normalised_input():
    target = tiny_target(vocab=32).float()
    with torch.no_grad():  # a non-trivial input norm, so that folding it into q/k/v is tested
        target.model.layers[-1].input_layernorm.weight.uniform_(0.5, 1.5)
    draft = pilot.start_head("last_layer", target)
    torch.manual_seed(0)
    x = torch.nn.functional.rms_norm(torch.randn(1, 5, 32), (32,), eps=1e-12)  # RMS 1: the input norm's scale only
    positions = torch.arange(5)[None]
    source = target.model.layers[-1]
    with torch.no_grad():
        rope = target.model.rotary_emb(x, positions)
        expected = source(x, position_embeddings=rope, attention_mask=None, position_ids=positions)
        got = draft.layers[0](x, position_embeddings=draft.rotary_emb(x, positions), attention_mask=None,
                              position_ids=positions)
    expected, got = (out[0] if isinstance(out, tuple) else out for out in (expected, got))
    assert torch.allclose(got, expected, atol=1e-4)
    feature_half = draft.fc.weight[:, 32:]
    assert torch.equal(feature_half, torch.eye(32))
    assert torch.equal(pilot.start_head("random_fc_identity", target).fc.weight[:, 32:], torch.eye(32))
    assert not torch.equal(pilot.start_head("random", target).fc.weight[:, 32:], torch.eye(32))
