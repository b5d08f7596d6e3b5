"""Prompt-lookup drafts grafted onto the head's tree: the search, the trie graft, greedy output, exact sampling."""

from __future__ import annotations

import itertools

import pytest
import torch

from eagle_mdsd import drafting, engine, graphs, head, lookup, tree, tree_specs, verification
from test_engine import P_VALUE, PROMPT, TREES, chi_square_p_value, empirical_first_three, exact_first_three
from tiny import tiny_target


def _sharp(layers: int):
    """A tiny target and a sharp random head: q disagrees with p, so the head alone accepts little."""
    target = tiny_target(layers=layers)
    draft_head = head.random_head(target)
    with torch.no_grad():
        draft_head.fc.weight.mul_(20.0)
    return target, draft_head


@pytest.fixture(scope="module")
def tiny():
    # one layer: these tests are bound by the cost of a forward, and every layer's cache, mask and positions are
    # the first's
    return _sharp(1)


@pytest.fixture(scope="module")
def repeating():
    """The two-layer tiny target, whose greedy output repeats with period 4, and a sharp head."""
    return _sharp(2)


def continuation(context: list[int], tokens: int) -> list[int]:
    """lookup.propose on a buffer with room past the context, as a list."""
    buffer = torch.tensor(context + [99] * 8)
    proposal, count = lookup.propose(buffer, torch.tensor([len(context)]), tokens)
    return proposal[: int(count)].tolist()


def test_the_proposal_follows_the_first_earlier_match_of_the_last_two_tokens():
    assert continuation([5, 6, 7, 8, 5, 6], 3) == [7, 8, 5]
    assert continuation([6, 1, 5, 6, 2, 5, 6], 2) == [2, 5]           # the two-token match wins
    assert continuation([4, 9, 1, 2, 9], 4) == [1, 2, 9]                # else the last token alone
    assert continuation([1, 2, 3], 4) == [] and continuation([7], 4) == []
    assert continuation([3, 3], 4) == [3]                               # a match may end at the context's end


@pytest.mark.parametrize("eager", [False, True])  # eager: stopped where the walk leaves the drafted children
def test_the_graft_shares_drafted_prefixes_and_hangs_the_rest_as_a_chain(eager):
    wide = tree.compile_tree(TREES["wide"])  # root -> 1, 2, 3; 1 -> 4, 5; 2 -> 6
    parent, depth = torch.tensor([0, *wide.parent[1:]]), torch.tensor(wide.depth)
    tokens, valid = torch.tensor([9, 10, 11, 12, 20, 21, 22]), torch.ones(7, dtype=torch.bool)

    def graft(proposal, count=None):
        proposal = torch.tensor(proposal + [0] * (4 - len(proposal)))
        count = torch.tensor([4 if count is None else count])
        return [x.tolist() for x in lookup.graft(parent, depth, tokens, valid, proposal, count, eager)]

    new_parent, new_depth, new_tokens, new_valid, point = graft([10, 21, 30, 31])
    assert new_parent[7:] == [5, 7, 8, 9] and new_depth[7:] == [3, 4, 5, 6] and new_tokens[7:9] == [30, 31]
    assert new_valid == [True] * 9 + [False] * 2  # two of the four slots hold the proposal's rest
    assert point == [10, 21, -1, -1, -1, 30, -1, 31, -1, -1, -1]  # the branch: root -> 1 -> 5 -> slot 7 -> slot 8
    *_, same_valid, point = graft([10, 21], count=2)  # all drafted already: no slot used
    assert same_valid[7:] == [False] * 4 and point[:6] == [10, 21, -1, -1, -1, -1]
    fresh_parent, _, _, fresh_valid, point = graft([40], count=1)
    assert fresh_parent[7] == 0 and fresh_valid[7:] == [True, False, False, False] and point[0] == 40


@pytest.mark.parametrize("spec", ["wide", "eagle2:total_tokens=7,depth=3,top_k=2"])
def test_lookup_trees_are_greedy_and_accept_the_repeats(repeating, spec):
    target, draft_head = repeating
    base = tree.compile_tree(TREES["wide"]) if spec == "wide" else tree_specs.load(spec)
    greedy = engine.Decoder(target).generate(PROMPT, 40, method="baseline").token_ids
    alone = engine.Decoder(target, draft_head, base).generate(PROMPT, 40, 0.0)
    with_lookup = engine.Decoder(target, draft_head, lookup.LookupTree(base, 6)).generate(PROMPT, 40, 0.0)
    assert alone.token_ids == greedy and with_lookup.token_ids == greedy
    # the tiny target's greedy output repeats (period 4): lookup drafts carry whole periods
    assert max(with_lookup.accept_lengths) == 7 and with_lookup.cycles < alone.cycles / 2


def test_eagerly_the_target_scores_no_unfilled_graft_slot(repeating):
    """Eagerly the verify forward stops at the last valid node: a short proposal's empty slots cost nothing.
    Under graphs every cycle scores all of them (one shape), and both decode alike."""
    target, draft_head = repeating
    rows, tokens = {}, {}
    for mode in ("off", "emulate"):
        decoder = engine.Decoder(target, draft_head, lookup.LookupTree(tree.compile_tree(TREES["wide"]), 6),
                                 cuda_graphs=mode)
        forward, rows[mode] = decoder.target_forward, []
        decoder.target_forward = lambda cache, ids, *args: rows[mode].append(len(ids)) or forward(cache, ids, *args)
        tokens[mode] = decoder.generate(PROMPT, 40, 0.0).token_ids
    assert tokens["off"] == tokens["emulate"]
    full = 1 + 6 + 6  # the root, wide's six drafts, six graft slots
    assert set(rows["emulate"][1:]) == {full}  # (after the prefill)
    assert all(7 <= count <= full for count in rows["off"][1:]) and min(rows["off"][1:]) < full


def test_lookup_trees_load_by_name():
    loaded = tree_specs.load("eagle_default+lookup")
    assert isinstance(loaded, lookup.LookupTree) and loaded.tokens == 10 and loaded.label == "eagle_default+lookup10"
    assert tree_specs.load("eagle2:depth=3+lookup4").base.max_depth == 3
    for bad in ("eagle_default+lookup0", "+lookup", "eagle_default+lookupx"):
        with pytest.raises(ValueError, match=r"write TREE\+lookup or TREE\+lookupN"):
            tree_specs.load(bad)


# The prompt holds every token of the 4-token vocabulary, so every cycle has a lookup proposal; with the wide
# tree some proposals share drafted children and some hang below them or the root.
SAMPLED = [("without_replacement", "rrs_wo", "wide"), ("with_replacement", "kseq", "wide"),
           ("greedy", "greedy", "wide"), ("without_replacement", "rrs_wo", "chain1"),
           ("topk", "topk", "eagle2:total_tokens=5,depth=2,top_k=2"), ("with_replacement", "rrs_w", "wide"),
           ("with_replacement", "topk", "wide"), ("without_replacement", "topk", "wide"), ("greedy", "topk", "wide"),
           ("spechub", "spechub", "binary2"), ("spechub", "topk", "eagle2:total_tokens=5,depth=2,top_k=2"),
           ("topk", "topk", "wide"), ("without_replacement", "rrs_wo", "eagle2:total_tokens=5,depth=2,top_k=2"),
           ("topk", "topk", "opt_tree:nodes=4,threshold=0.1,max_depth=2,top_k=2")]
assert {case[:2] for case in SAMPLED} == set(verification.pairs())


@pytest.mark.parametrize("scheme, verifier, spec", SAMPLED, ids=["-".join(c) for c in SAMPLED])
def test_sampling_with_lookup_drafts_follows_the_target_exactly(tiny, scheme, verifier, spec):
    target, draft_head = tiny
    base = tree.compile_tree(TREES[spec]) if spec in TREES else tree_specs.load(spec)
    decoder = engine.Decoder(target, draft_head, lookup.LookupTree(base, 3), scheme, verifier)
    assert chi_square_p_value(empirical_first_three(decoder, 1.0), exact_first_three(target, 1.0)) > P_VALUE


@pytest.mark.parametrize("drafter, verifier", verification.pairs())
def test_lookup_trees_decode_seed_for_seed_with_graphs_emulated(tiny, drafter, verifier):
    # Replayed (every node's output drawn, the walk by tensor ops) as eager (the walk's nodes' outputs alone):
    # the same tokens, so the joint-distribution tests above certify the replayed cycle for every pair.
    target, draft_head = tiny
    base = tree.compile_tree(TREES["binary2" if drafter == "spechub" else "wide"])
    eager = engine.Decoder(target, draft_head, lookup.LookupTree(base, 3), drafter, verifier)
    emulated = engine.Decoder(target, draft_head, lookup.LookupTree(base, 3), drafter, verifier,
                              cuda_graphs="emulate")
    emulated.graphs = graphs.Checked()  # and every replay does what its capture did
    for seed in range(3):
        assert emulated.generate(PROMPT, 8, 1.0, seed=seed).token_ids == eager.generate(PROMPT, 8, 1.0,
                                                                                      seed=seed).token_ids
    assert {key[0] for key in emulated.graphs.entries} == {"draft", "verify"}


def lookup_node_error(drafter: str, verifier: str, rest_of=drafting.without_token) -> float:
    """The largest error of the output distribution at a node with a lookup draft (cycle.node_outputs), by
    enumeration in float64 over every lookup token l and every draw of two head drafts (from q): l with
    probability p(l), else the verifier on the head drafts against rest_of(p, l)."""
    gen = torch.Generator().manual_seed(0)
    p, q = torch.softmax(2.0 * torch.randn(2, 4, generator=gen, dtype=torch.float64), -1)
    scheme, check = drafting.get(drafter), verification.get(verifier)
    error = 0.0
    for point in range(4):
        output = p[point] * torch.nn.functional.one_hot(torch.tensor(point), 4).double()
        for drafts in map(torch.tensor, itertools.product(range(4), repeat=2)):
            output += (1 - p[point]) * scheme.probabilities(q, drafts) * check.plan(rest_of(p, point), q, drafts)
        error = max(error, float((output - p).abs().max()))
    return error


@pytest.mark.parametrize("drafter, verifier", verification.pairs())
def test_a_node_with_a_lookup_draft_outputs_p_for_every_pair_by_enumeration(drafter, verifier):
    assert lookup_node_error(drafter, verifier) < 1e-12
    assert lookup_node_error(drafter, verifier, lambda p, token: p) > 1e-3  # the residual ignored: caught


def test_a_lookup_verifier_that_ignores_the_head_drafts_residual_is_caught(tiny, monkeypatch):
    # The check above can fail: verifying the head drafts against p instead of p without the lookup token
    # gives that token p(l) + (1 - p(l)) p(l) and the test sees it.
    target, draft_head = tiny
    monkeypatch.setattr(drafting, "without_token", lambda p, token: p)
    decoder = engine.Decoder(target, draft_head, lookup.LookupTree(tree.compile_tree(TREES["wide"]), 3),
                             "without_replacement", "rrs_wo")
    assert chi_square_p_value(empirical_first_three(decoder, 1.0), exact_first_three(target, 1.0)) < P_VALUE
