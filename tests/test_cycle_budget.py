"""What a cycle issues from the host with CUDA graphs on, emulated on the CPU (graphs.Emulated): ops issued one
by one outside graphs, graph replays and transfers to the host, per cycle at T = 0 (hostsync.per_cycle).

Before the cycle ran on the device (cycle.py) these counts were, per cycle: our plain step 14 ops, 1 replay,
1 transfer; chain2 80, 3, 1; eagle_default 186, 6, 1; eagle2 at its defaults 382, 7, 13.  These tests fail on
that loop.
"""

from __future__ import annotations

import pytest
import torch

from eagle_mdsd import dynamic, engine, head, hostsync

from tiny import tiny_family

PROMPT = [1, 2, 3, 0]
TOKENS = 40

BUDGETS = {  # tree (None: our plain step) -> most ops, most replays, transfers
    None: (13, 1, 1),
    "chain2": (20, 3, 1),
    "eagle_default": (20, 3, 1),
    "eagle2": (30, 3, 1),
    "eagle2:total_tokens=16,depth=5,top_k=4": (30, 3, 1),
}


@pytest.fixture(scope="module")
def target_and_head():
    target = tiny_family("llama").float()
    target.generation_config.eos_token_id = None
    draft_head = head.random_head(target)
    with torch.no_grad():  # a sharp head gets drafts accepted, so that paths of several nodes are committed
        draft_head.fc.weight.mul_(20.0)
    return target, draft_head


@pytest.mark.parametrize("spec", list(BUDGETS))
def test_a_greedy_cycle_with_graphs_stays_within_its_host_budget(target_and_head, spec):
    target, draft_head = target_and_head
    method = "baseline" if spec is None else "eagle"
    decoder = engine.Decoder(target, draft_head if spec else None, dynamic.load(spec) if spec else None,
                             cuda_graphs="emulate")

    def call(tokens):
        return decoder.generate(PROMPT, tokens, 0.0, method=method).cycles or 1

    call(TOKENS)  # captures the graphs
    counts = hostsync.per_cycle(call, TOKENS)
    ops, replays, transfers = BUDGETS[spec]
    assert counts["ops"] <= ops and counts["replays"] <= replays and counts["transfers"] == transfers, counts
    assert counts["uploads"] == 0, counts
    assert decoder.graphs.entries and decoder.graphs.refused is None


@pytest.mark.parametrize("spec", ["chain2", "eagle_default", "eagle2", "eagle2:total_tokens=16,depth=5,top_k=4"])
def test_the_device_cycle_decodes_as_the_host_cycle(target_and_head, spec):
    # Greedy tokens, accept lengths and the child ranks of the walk (sequoia.py reads them) are the host loop's.
    target, draft_head = target_and_head
    host = engine.Decoder(target, draft_head, dynamic.load(spec)).generate(PROMPT, TOKENS, 0.0)
    device = engine.Decoder(target, draft_head, dynamic.load(spec), cuda_graphs="emulate")
    reference = engine.Decoder(target).generate(PROMPT, TOKENS, method="baseline").token_ids
    for _ in range(2):  # the second call replays the graphs of the first
        result = device.generate(PROMPT, TOKENS, 0.0)
        assert result.token_ids == host.token_ids == reference
        assert result.accept_lengths == host.accept_lengths and result.accepted_ranks == host.accepted_ranks
    if spec != "chain2":  # the wide trees' drafts are accepted on this random head (a chain's two seldom are)
        assert max(host.accept_lengths) > 1
    assert len(device.device_cycles) == 1


def test_a_token_budget_inside_a_path_cuts_the_device_cycle_there(target_and_head):
    # The loop queues a cycle ahead only where the budget cannot end the call; any budget gives the prefix.
    target, draft_head = target_and_head
    device = engine.Decoder(target, draft_head, dynamic.load("eagle2"), cuda_graphs="emulate")
    full = device.generate(PROMPT, TOKENS, 0.0).token_ids
    for tokens in (1, 2, 3, 7, 11):
        assert device.generate(PROMPT, tokens, 0.0).token_ids == full[:tokens]
