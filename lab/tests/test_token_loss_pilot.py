"""lab/token_loss_pilot.py: its acceptance score is a sampled draft's acceptance rate, as the decoder drafts."""

from __future__ import annotations

import pytest
import torch

from eagle_mdsd import head
from eagle_mdsd.tree import additive_mask

import evaluation_scripts
from tiny import tiny_target

pilot = evaluation_scripts.load("token_loss_pilot")


def test_acceptance_is_sum_min_p_q_over_the_draft_vocabulary():
    target = tiny_target(vocab=32, hidden=32).float()
    draft = head.random_head(target, seed=1).float()
    generator = torch.Generator().manual_seed(0)
    ids = torch.randint(32, (9,), generator=generator)
    with torch.no_grad():
        features = target.get_decoder()(ids[None]).last_hidden_state[0]
    sample = {"ids": ids.int(), "start": 4, "features": features}
    rows = torch.tensor([0, 3, 4, 8, 15, 16, 23, 31])
    lm_head, embed = target.get_output_embeddings(), target.get_input_embeddings()
    with torch.no_grad():  # by hand: inputs at i, token i + 1, the target's distribution after token i + 1
        predicted = draft(features[None, :-1], embed(ids[None, 1:]), torch.arange(1, 9)[None],
                          additive_mask(torch.ones(8, 8, dtype=torch.bool).tril(), torch.float32)[None, None], None)[0]
        p = torch.softmax(lm_head(features[1:]), -1)[3:]  # answer positions: the inputs from start - 1 on
        q = torch.zeros_like(p)
        q[:, rows] = torch.softmax(lm_head(predicted)[3:, rows], -1)  # the decoder's q: 0 outside the rows
    expected = float(torch.minimum(p, q).sum(-1).mean())
    assert pilot.acceptance(draft, target, [sample], rows) == pytest.approx(expected, rel=1e-5)
    full = torch.arange(32)
    with torch.no_grad():
        q_full = torch.softmax(lm_head(predicted)[3:], -1)
    assert pilot.acceptance(draft, target, [sample], full) == pytest.approx(
        float(1 - 0.5 * (p - q_full).abs().sum(-1).mean()), rel=1e-5)  # = 1 - TV(p, q)
