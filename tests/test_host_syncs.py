"""The decoding cycle waits on its device at most once per static-tree cycle at T = 0.

Counted on the CPU with hostsync.syncs(), which wraps the tensor methods that bring values back to the
host (item, tolist, nonzero, bool(), int(), ...).  Before the cycle was resolved on the device, the loop
made 25 such transfers per eagle_default cycle at T = 0 by this count (37-38 by the profiler's
item/nonzero events, the figure of the engine issue), 46 at T = 1 with without_replacement/rrs_wo, and
7.6 per chain2 cycle; these tests fail on that loop.  A sampled cycle walked from the root with one transfer a
visited node (2.6 to 6.1 a cycle by pair) until every node's output was drawn before the walk.
"""

from __future__ import annotations

import pytest
import torch

from eagle_mdsd import dynamic, engine, head, hostsync, tree

from tiny import tiny_family

PROMPT = [1, 2, 3, 0]


@pytest.fixture(scope="module")
def target_and_head():
    target = tiny_family("llama")
    draft_head = head.random_head(target)
    with torch.no_grad():  # a sharp head gets drafts accepted, so that paths of several nodes are committed
        draft_head.fc.weight.mul_(20.0)
    return target, draft_head


def per_step(decoder, step: str, temperature: float, tokens: int = 24, method: str = "eagle"):
    """(device-to-host transfers, tensors made from host data) of every cycle or plain step of one call."""
    counts = []
    original = getattr(decoder, step)

    def counted(*args, **kwargs):
        with hostsync.syncs() as count:
            emitted = original(*args, **kwargs)
        counts.append((hostsync.transfers(count), count["to_device"], len(emitted)))
        return emitted

    setattr(decoder, step, counted)
    try:
        decoder.generate(PROMPT, tokens, temperature, seed=3, method=method)
    finally:
        delattr(decoder, step)
    return counts


def test_a_static_tree_cycle_transfers_once_at_temperature_zero(target_and_head):
    target, draft_head = target_and_head
    emitted = []
    for tree_name in ("eagle_default", "chain2", "binary_depth4"):
        decoder = engine.Decoder(target, draft_head, dynamic.load(tree_name))
        counts = per_step(decoder, "_cycle", 0.0)
        assert counts and all(count[:2] == (1, 0) for count in counts), (tree_name, counts)
        emitted += [count[2] for count in counts]
    assert max(emitted) > 1  # drafts were accepted and committed


@pytest.mark.parametrize("pair", [("without_replacement", "rrs_wo"), ("greedy", "greedy"), ("topk", "topk"),
                                  ("with_replacement", "rrs_w")])
def test_a_sampled_static_tree_cycle_transfers_once(target_and_head, pair):
    # Every node's output is drawn before the walk, which is tensor ops: one transfer, whatever the path's depth.
    target, draft_head = target_and_head
    decoder = engine.Decoder(target, draft_head, tree.load("eagle_default"), *pair)
    counts = per_step(decoder, "_cycle", 1.0)
    assert counts and all(count[:2] == (1, 0) for count in counts), counts
    assert max(emitted for *_, emitted in counts) > 1  # drafts were accepted and committed


def test_a_plain_step_transfers_once(target_and_head):
    target, _ = target_and_head
    decoder = engine.Decoder(target)
    for temperature in (0.0, 1.0):
        counts = per_step(decoder, "_plain_step", temperature, method="baseline")
        assert len(counts) == 23 and all(count[:2] == (1, 0) for count in counts)


def test_the_counter_sees_each_kind_of_transfer():
    x = torch.arange(4)
    with hostsync.syncs() as count:
        int(x[0]), bool(x[1]), float(x[2]), x.tolist(), x.nonzero(), x[3].item(), [0, 1][x[1]]
        torch.tensor([1, 2])
    assert hostsync.transfers(count) == 7 and count["to_device"] == 1
