"""lab/head_depth_pilot.py: the grown head starts as the head it grew from, and its new layer learns."""

from __future__ import annotations

import torch

from eagle_mdsd import head, training
from eagle_mdsd.cache import KVCache
from eagle_mdsd.tree import additive_mask as mask_of

def additive_mask(visible, dtype):  # the [1, 1, q, kv] form a model call takes
    return mask_of(visible, dtype)[None, None]

import evaluation_scripts
from tiny import tiny_target

pilot = evaluation_scripts.load("head_depth_pilot")


def test_the_grown_head_starts_as_the_head_it_grew_from():
    target = tiny_target(vocab=32).float()
    one = head.random_head(target, seed=1).float()
    two = pilot.grown(one)
    assert len(one.layers) == 1 and len(two.layers) == 2 and two.config.num_hidden_layers == 2
    torch.manual_seed(0)
    features, embedded = torch.randn(1, 6, 32), torch.randn(1, 6, 32)
    mask = additive_mask(torch.ones(6, 6, dtype=torch.bool).tril(), torch.float32)
    with torch.no_grad():
        assert torch.equal(one(features, embedded, torch.arange(6)[None], mask, KVCache(1, 8)),
                           two(features, embedded, torch.arange(6)[None], mask, KVCache(2, 8)))


def test_the_new_layer_learns_and_lowers_the_loss():
    target = tiny_target(vocab=32).float()
    two = pilot.grown(head.random_head(target, seed=1).float())
    for parameter in list(two.fc.parameters()) + list(two.layers[0].parameters()):
        parameter.requires_grad_(False)  # only the new layer trains: the loss can fall through it alone
    generator = torch.Generator().manual_seed(3)
    features = torch.randn(2, 7, 32, generator=generator)
    tokens = torch.randint(32, (2, 7), generator=generator)
    targets, mask = torch.randn(2, 7, 32, generator=generator), torch.ones(2, 7, dtype=torch.bool)
    optimizer = torch.optim.AdamW([p for p in two.parameters() if p.requires_grad], lr=1e-2)
    losses = []
    for _ in range(20):
        loss, _ = training.head_loss(two, target.get_input_embeddings(), target.get_output_embeddings(), features,
                                     tokens, targets, mask, noise=0.0)
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        losses.append(loss.item())
    assert losses[-1] < 0.7 * losses[0]
    assert two.layers[1].self_attn.o_proj.weight.abs().sum() > 0
