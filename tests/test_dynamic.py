"""Dynamic trees (EAGLE-2, OPT-Tree) and Sequoia: exact decoding, optimal selection, the DP."""

from __future__ import annotations

import itertools
import json
import math

import pytest
import torch

from eagle_mdsd import drafting, dynamic, engine, head, sequoia, tree_specs, verification
from test_engine import P_VALUE, PROMPT, chi_square_p_value, empirical_first_three, exact_first_three
from tiny import tiny_target

SPECS = ["eagle2:total_tokens=7,depth=3,top_k=2", "eagle2:total_tokens=5,depth=4,top_k=3",
         "opt_tree:nodes=6,threshold=0.3,max_depth=4,top_k=3"]


@pytest.fixture(scope="module")
def tiny():
    # one layer: these tests are bound by the cost of a forward, and every layer's cache, mask and positions are
    # the first's
    target = tiny_target(layers=1)
    draft_head = head.random_head(target)
    with torch.no_grad():  # a sharp q that disagrees with p
        draft_head.fc.weight.mul_(20.0)
    return target, draft_head


@pytest.mark.parametrize("spec", SPECS)
def test_dynamic_trees_are_greedy_at_temperature_zero(tiny, spec):
    target, draft_head = tiny
    reference = engine.Decoder(target).generate(PROMPT, 14, method="baseline").token_ids
    result = engine.Decoder(target, draft_head, tree_specs.load(spec)).generate(PROMPT, 14, 0.0)
    assert result.token_ids == reference
    assert all(-1 <= rank < 3 for rank in result.accepted_ranks)


def test_opt_tree_follows_the_target_exactly_at_temperature_one(tiny):
    target, draft_head = tiny
    decoder = engine.Decoder(target, draft_head, tree_specs.load(SPECS[2]))
    assert chi_square_p_value(empirical_first_three(decoder, 1.0), exact_first_three(target, 1.0)) > P_VALUE


# Every pair in EAGLE-2 trees: small budgets, so sampled children are often pruned.
SAMPLED = [("greedy", "greedy", "eagle2:total_tokens=5,depth=3,top_k=3"),
           ("greedy", "topk", "eagle2:total_tokens=7,depth=3,top_k=2"),
           ("without_replacement", "rrs_wo", "eagle2:total_tokens=5,depth=3,top_k=3"),
           ("without_replacement", "topk", "eagle2:total_tokens=5,depth=3,top_k=3"),
           ("with_replacement", "rrs_w", "eagle2:total_tokens=5,depth=3,top_k=3"),
           ("with_replacement", "kseq", "eagle2:total_tokens=6,depth=2,top_k=3"),
           ("with_replacement", "topk", "eagle2:total_tokens=6,depth=2,top_k=3"),
           ("spechub", "spechub", "eagle2:total_tokens=6,depth=3,top_k=2"),
           ("spechub", "topk", "eagle2:total_tokens=6,depth=3,top_k=2"),
           ("topk", "topk", SPECS[0])]
assert {pair[:2] for pair in SAMPLED} == set(verification.pairs())


@pytest.mark.parametrize("drafter, verifier, spec", SAMPLED, ids=[f"{d}-{v}" for d, v, _ in SAMPLED])
def test_sampled_children_follow_the_target_exactly_at_temperature_one(tiny, drafter, verifier, spec):
    target, draft_head = tiny
    decoder = engine.Decoder(target, draft_head, tree_specs.load(spec), drafter, verifier)
    assert chi_square_p_value(empirical_first_three(decoder, 1.0), exact_first_three(target, 1.0)) > P_VALUE


def test_sampled_children_are_greedy_at_temperature_zero(tiny):
    target, draft_head = tiny
    reference = engine.Decoder(target).generate(PROMPT, 14, method="baseline").token_ids
    decoder = engine.Decoder(target, draft_head, tree_specs.load(SAMPLED[0][2]), "greedy", "greedy")
    assert decoder.generate(PROMPT, 14, 0.0).token_ids == reference


@pytest.mark.parametrize("spec, drafter, verifier, message", [
    ("opt_tree", "greedy", "greedy", "opt_tree stops growing by the scores of drawn children"),
    ("eagle2:top_k=3", "spechub", "spechub", "spechub draws 2 children per node"),
    ("eagle2", "with_replacement", "rrs_wo", "not lossless for 'with_replacement'"),
])
def test_dynamic_trees_refuse_pairs_that_would_not_be_exact(tiny, spec, drafter, verifier, message):
    target, draft_head = tiny
    with pytest.raises(ValueError, match=message):
        engine.Decoder(target, draft_head, tree_specs.load(spec), drafter, verifier)


@pytest.mark.parametrize("spec", ["eagle2:total_tokens=5,depth=2,top_k=5", "opt_tree:nodes=4,max_depth=2,top_k=5"])
def test_more_children_a_node_than_the_vocabulary_holds_is_a_one_line_error(tiny, spec):
    target, draft_head = tiny  # a vocabulary of 4 tokens
    with pytest.raises(ValueError, match=r"cannot fill tree .*cannot draw 5 distinct drafts from a vocabulary of 4"):
        engine.Decoder(target, draft_head, tree_specs.load(spec))


@pytest.mark.parametrize("spec, message", [
    ("eagle2:top_k=0", "top-k must be at least 1"),
    ("eagle2:total_tokens=1", "total_tokens.*must be at least 2, got 1"),
    ("opt_tree:threshold=-1", "--threshold must be a number >= 0"),
    ("opt_tree:depth=3", "unknown option 'depth'"),
    ("eagle2:depth=two", "depth must be a number"),
    # a growth's candidates and q rows scale with top_k^2 x depth: refused before any is allocated
    ("eagle2:top_k=20000", r"top_k \(--top-k\) 20000 x depth \(--depth\) 3 = 60000 .* at most 1024"),
    ("opt_tree:max_depth=5000,top_k=1", r"top_k \(--top-k\) 1 x max_depth \(--max-depth\) 5000 = 5000"),
])
def test_bad_dynamic_trees_are_one_line_errors(spec, message):
    with pytest.raises(ValueError, match=message):
        tree_specs.load(spec)


@pytest.mark.parametrize("spec, overrides, message", [
    ("eagle_default", {"total_tokens": 16}, r"--total-tokens shape dynamic trees .*not tree 'eagle_default': drop it"),
    ("chain2+lookup", {"depth": 3, "top_k": 4}, r"--depth, --top-k shape dynamic trees .*not tree 'chain2': drop them"),
    ("eagle2", {"nodes": 8}, r"eagle2 does not take --nodes \(it takes --total-tokens, --depth, --top-k\)"),
    ("opt_tree", {"total_tokens": 8, "nodes": 8}, r"opt_tree does not take --total-tokens"),
])
def test_dynamic_tree_flags_that_do_not_shape_the_tree_are_refused(spec, overrides, message):
    """A flag the tree does not take is an error, not dropped unseen."""
    with pytest.raises(ValueError, match=message):
        tree_specs.load(spec, **overrides)
    unset = dict.fromkeys(overrides)  # the CLI passes None for flags it was not given: no error then
    assert repr(tree_specs.load(spec, **unset)) == repr(tree_specs.load(spec))


def test_flags_shape_the_dynamic_tree_they_belong_to():
    assert tree_specs.load("eagle2", "cuda", total_tokens=9, depth=3, top_k=None) == dynamic.make("eagle2", 8, 3, 10)
    assert tree_specs.load("opt_tree", "cuda", nodes=12, threshold=0.5) == dynamic.make("opt_tree", 12, 10, 8, 0.5)


def test_a_gpu_grows_eagle2s_own_trees_and_a_cpu_its_measured_ones():
    """EAGLE-2's released shape on a GPU ('auto' spreads a target over GPUs); the CPU's from its own table."""
    for device in ("cuda", "cuda:1", "auto"):
        assert tree_specs.load("eagle2", device) == dynamic.make("eagle2", 59, 6, 10)
        assert tree_specs.load("opt_tree", device) == dynamic.make("opt_tree", 40, 10, 8, 0.1)
    cpu = tree_specs.DEFAULTS["cpu"]
    assert tree_specs.load("eagle2") == tree_specs.load("eagle2", "cpu") == dynamic.make(
        "eagle2", cpu["eagle2"]["total_tokens"] - 1, cpu["eagle2"]["depth"], cpu["eagle2"]["top_k"])
    assert tree_specs.load("opt_tree:top_k=3", "cpu").nodes == cpu["opt_tree"]["nodes"]
    assert tree_specs.load("eagle2+lookup", "cpu").base == tree_specs.load("eagle2", "cpu")


def _grown(seed: int, spec: dynamic.DynamicTree, vocab: int = 6, eager: bool = False, keep_q: bool = True):
    """Candidates grown from random q's (the expand callback stands in for the head)."""
    gen = torch.Generator().manual_seed(seed)

    def random_q(rows):
        return torch.softmax(3 * torch.randn(rows, vocab, generator=gen, dtype=torch.float64), -1)

    return dynamic.grow(spec, random_q(1), None, lambda depth, frontier, parents: random_q(len(frontier)),
                        eager=eager, keep_q=keep_q)


@pytest.mark.parametrize("seed", range(6))
def test_the_chosen_tree_maximises_expected_length_among_the_candidates(seed):
    spec = dynamic.make("eagle2", 4, 3, 2)
    grown = _grown(seed, spec)
    chosen, tokens, parent, _, valid, row = dynamic.select(grown, spec.nodes)
    probability = [math.exp(s) for s in grown.score.tolist()]
    owner = grown.parent.tolist()
    best = 0.0
    for subset in itertools.combinations(range(len(owner)), spec.nodes):
        if all(owner[c] == -1 or owner[c] in subset for c in subset):
            best = max(best, sum(probability[c] for c in subset))
    assert bool(valid.all()) and sum(probability[c] for c in chosen.tolist()) == pytest.approx(best, abs=1e-12)
    tokens, parent = [0] + tokens.tolist(), parent.tolist()
    for node in range(spec.nodes + 1):  # topk children: the parent's most probable tokens, in order
        kids = [tokens[n] for n in range(1, len(parent)) if parent[n] == node]
        if kids:
            q = grown.q[row[node]]
            assert kids == torch.sort(q, descending=True, stable=True).indices[: len(kids)].tolist()


def test_opt_tree_stops_growing_below_the_threshold():
    def grown(threshold, eager=False):
        return _grown(0, dynamic.make("opt_tree", 8, 6, 2, threshold=threshold), eager=eager)

    def deepest(candidates):
        return int(candidates.depth[candidates.score > -math.inf].max())

    deep, shallow = grown(0.0), grown(0.99)
    assert deepest(deep) == 6 and deepest(shallow) < 6
    skipped = grown(0.99, eager=True)  # the depths after the stop not grown at all: the same candidates kept
    assert torch.equal(skipped.score, shallow.score) and torch.equal(skipped.row, shallow.row)


@pytest.mark.parametrize("name", ["eagle2", "opt_tree"])
def test_a_growth_that_keeps_no_q_grows_the_same_candidates(name):
    # At T = 0 the cycle keeps no q for the verifier (keep_q=False): the candidates are the same, the q left empty.
    spec = dynamic.make(name, 8, 4, 2, threshold=0.5 if name == "opt_tree" else 0.0)
    kept, bare = _grown(3, spec), _grown(3, spec, keep_q=False)
    for field in ("token", "parent", "depth", "score", "row"):
        assert torch.equal(getattr(kept, field), getattr(bare, field)), field
    assert len(kept.q) == 7 and len(bare.q) == 0 and len(bare.drafts) == 0


def _all_trees(n: int, levels: int):
    """Every tree with n nodes on at most `levels` levels whose siblings take ranks 0, 1, ... (brute force)."""
    if n == 1:
        return [[]]
    if levels == 1:
        return []

    def compositions(m):
        if m == 0:
            yield []
            return
        for size in range(1, m + 1):
            for rest in compositions(m - size):
                yield [size] + rest

    trees = []
    for sizes in compositions(n - 1):
        for subtrees in itertools.product(*[_all_trees(size, levels - 1) for size in sizes]):
            paths = []
            for rank, sub in enumerate(subtrees):
                paths += [[rank]] + [[rank] + path for path in sub]
            trees.append(paths)
    return trees


def _expected(paths, acceptance):
    return 1.0 + sum(math.prod(acceptance[r] for r in path) for path in paths)


def test_sequoia_dynamic_programme_matches_brute_force():
    acceptance = [0.5, 0.2, 0.1]
    value, paths = sequoia.best_trees(acceptance, 7, 4)
    for n in range(1, 8):
        for levels in range(1, 5):
            feasible = [t for t in _all_trees(n, levels) if all(r < 3 for path in t for r in path)]
            if not feasible:
                assert value[n, levels] == float("-inf")
                continue
            best = max(_expected(t, acceptance) for t in feasible)
            assert value[n, levels] == pytest.approx(best, abs=1e-12)
            assert _expected(paths(n, levels), acceptance) == pytest.approx(best, abs=1e-12)
            assert len(paths(n, levels)) == n - 1


def test_sequoia_writes_only_a_plain_name_and_never_over_a_hand_written_tree(tmp_path):
    """A bad --name is refused before minutes of measuring; a shipped tree or a tree written by hand is kept."""
    for name in ("a/b", "../up", ".hidden", ""):
        with pytest.raises(ValueError, match="must be a plain file name"):
            sequoia.output_path(name, tmp_path)
    (tmp_path / "mine.json").write_text(json.dumps({"paths": [[0]], "description": "by hand"}))
    with pytest.raises(ValueError, match="mine.json is a tree Sequoia did not write: pick another --name"):
        sequoia.output_path("mine", tmp_path)
    (tmp_path / "measured.json").write_text(json.dumps({"paths": [[0]], "hardware_aware": False}))
    assert sequoia.output_path("measured", tmp_path) == tmp_path / "measured.json"  # a rerun replaces its own
    assert sequoia.output_path("new", tmp_path) == tmp_path / "new.json"
    for shipped in ("eagle_default", "sequoia_cpu"):
        with pytest.raises(ValueError, match=f"--name {shipped} is the name of a shipped tree"):
            sequoia.output_path(shipped, tmp_path)


def test_hardware_aware_choice_trades_tokens_for_time():
    acceptance = [0.6, 0.2, 0.1, 0.05]
    largest = sequoia.choose(acceptance, 20, 6)
    assert largest["nodes"] == 20
    # every extra verified token costs a tenth of a one-token forward: stay small
    timings = {"target_s": {1: 1.0, 64: 7.3}, "head_step_s": 0.2}
    small = sequoia.choose(acceptance, 20, 6, timings)
    largest_rate = largest["expected_tokens"] / (sequoia._target_seconds(timings, 21) + largest["depth"] * 0.2)
    assert small["nodes"] < 20 and small["score"] > largest_rate


def test_cycle_parts_are_timed_on_the_decoder_s_kernels_and_the_verify_rest_leaves_the_forward_out(tiny, monkeypatch):
    """The hardware-aware choice adds a target forward over the tree and a head step a level to the rest of a
    cycle: time_cycle_parts times both (the head step kept), on the kernels generate runs; the verify phase's rest
    is the profiled phase less that forward, so no cycle pays for two."""
    from eagle_mdsd import kernels

    target, draft_head = tiny
    decoder = engine.Decoder(target, draft_head, sequoia.measuring_tree(3, 2))
    seen, forward = set(), decoder.target_forward

    def watched(*args, **kwargs):
        seen.add(kernels.PackedLinear.active)
        return forward(*args, **kwargs)

    monkeypatch.setattr(decoder, "target_forward", watched)
    timings = sequoia.time_cycle_parts(decoder, PROMPT, sizes=(1, 4), repeats=1)
    assert seen == {decoder.packed} and timings["head_step_s"] > 0 and set(timings["target_s"]) == {1, 4}
    profile = type("Profile", (), {"profile": {"verify": 3.0}, "cycles": 2})()
    timings = {"target_s": {1: 0.5, 5: 1.0}, "head_step_s": 0.1}
    assert sequoia.verification_rest(profile, timings, 3) == pytest.approx(1.5 - 0.875)  # 4 rows: 0.875 s


def test_measured_acceptance_comes_from_the_walks(tiny):
    target, draft_head = tiny
    decoder = engine.Decoder(target, draft_head, sequoia.measuring_tree(3, 2))
    acceptance, visits = sequoia.measure_acceptance(decoder, [PROMPT, PROMPT[:3]], 12, 1.0)
    assert len(acceptance) == 3 and visits > 0 and sum(acceptance) <= 1.0 + 1e-12


class Scripted(drafting.DraftScheme):
    """A scheme whose draws are given: the root's tuple, then each expanded node's by its q row."""

    def __init__(self, name: str, root: tuple, by_row: list):
        self.name, self.root, self.by_row = name, root, by_row

    def sample_batch(self, q, n, generator=None):
        if self.root is not None:
            drafts, self.root = [self.root], None
        else:
            drafts = [next(tuple_ for row, tuple_ in self.by_row if torch.equal(row, q_row)) for q_row in q]
        return torch.tensor(drafts)


def exact_first_two_error(drafter: str, verifier: str, rule) -> float:
    """The largest error of the first two tokens' joint distribution out of an EAGLE-2 tree (3 tokens, top_k 2,
    depth 2: one depth-1 node's children are kept or not by its own draws), grown and selected by the engine's
    dynamic.grow and dynamic.select, by enumerating every draw in float64.  rule(tokens, parent, valid, row,
    grown) -> {node: the drafts its verifier sees}; a node's output is the verifier's plan there, else p (at a
    node without drafts, and the next cycle's draw when the first token is not a kept child)."""
    vocab, spec = 3, dynamic.make("eagle2", 2, 2, 2)
    gen = torch.Generator().manual_seed(3)

    def random_p(rows):
        return torch.softmax(2.5 * torch.randn(rows, vocab, generator=gen, dtype=torch.float64), -1)

    q_root, p_root, q_next, p_next = random_p(1)[0], random_p(1)[0], random_p(vocab), random_p(vocab)
    scheme, check = drafting.get(drafter), verification.get(verifier)

    def output(p, q, drafts):
        return p if drafts is None else check.plan(p, q, drafts)

    tuples = list(itertools.product(range(vocab), repeat=spec.top_k))
    joint = torch.zeros(vocab, vocab, dtype=torch.float64)
    for root_tuple in tuples:
        weight = scheme.probabilities(q_root, torch.tensor(root_tuple))
        tokens = list(dict.fromkeys(root_tuple))  # the depth-1 candidates that can be kept: repeats score -inf
        for assigned in itertools.product(tuples, repeat=len(tokens)):
            node_weight = weight * math.prod(scheme.probabilities(q_next[x], torch.tensor(t))
                                             for x, t in zip(tokens, assigned))
            if node_weight == 0:
                continue
            scripted = Scripted(drafter, root_tuple, [(q_next[x], t) for x, t in zip(tokens, assigned)])
            grown = dynamic.grow(spec, q_root[None], None, lambda depth, frontier, parents: q_next[frontier], scripted)
            _, node_tokens, parent, _, valid, row = dynamic.select(grown, spec.nodes)
            node_tokens = [0] + node_tokens.tolist()
            seen = rule(node_tokens, parent.tolist(), valid.tolist(), row.tolist(), grown)
            first = output(p_root, q_root, seen.get(0))
            for token in range(vocab):
                node = next((n for n in range(1, len(parent)) if parent[n] == 0 and valid[n]
                             and node_tokens[n] == token), None)
                second = output(p_next[token], q_next[token], seen.get(node))
                joint[token] += node_weight * first[token] * second
    return float((joint - p_root[:, None] * p_next).abs().max())


def the_engines_rule(tokens, parent, valid, row, grown):
    """Every expanded node against its whole draft tuple (cycle.Cycle._verified)."""
    return {node: grown.drafts[r] for node, r in enumerate(row) if r >= 0}


def kept_children_only(tokens, parent, valid, row, grown):
    """Wrong (this engine's before): verify only the nodes whose children were kept, draw p at the rest."""
    kept = {parent[n] for n in range(1, len(parent)) if valid[n]}
    return {node: drafts for node, drafts in the_engines_rule(tokens, parent, valid, row, grown).items()
            if node in kept}


def the_pruned_tuple(tokens, parent, valid, row, grown):
    """Wrong: verify the kept children, as if they were all that was drawn."""
    kids = {}
    for n in range(1, len(parent)):
        if valid[n]:
            kids.setdefault(parent[n], []).append(tokens[n])
    return {node: torch.tensor(drafts) for node, drafts in kids.items()}


@pytest.mark.parametrize("drafter, verifier", verification.pairs())
def test_every_pair_in_a_grown_tree_is_exact_by_enumeration(drafter, verifier):
    assert exact_first_two_error(drafter, verifier, the_engines_rule) < 1e-12


@pytest.mark.parametrize("rule, drafter, verifier", [
    (kept_children_only, "with_replacement", "rrs_w"), (kept_children_only, "without_replacement", "rrs_wo"),
    (the_pruned_tuple, "greedy", "greedy"), (the_pruned_tuple, "with_replacement", "rrs_w")])
def test_the_enumeration_catches_a_wrong_rule(rule, drafter, verifier):
    assert exact_first_two_error(drafter, verifier, rule) > 1e-6  # the exact rule's is within 1e-12


def test_held_out_prompts_are_as_many_as_asked_none_for_zero_and_the_pool_at_most(monkeypatch):
    """count 0 took the whole pool (pool[-0:]); a count past the pool's size takes all of it."""
    from eagle_mdsd import models, sequoia

    monkeypatch.setattr(models, "chat_prompt_ids", lambda tokenizer, text: [len(text)])
    everything = sequoia.held_out_prompts(None, 10**9)
    assert len(sequoia.held_out_prompts(None, 0)) == 0 and len(sequoia.held_out_prompts(None, 3)) == 3
    assert sequoia.held_out_prompts(None, 3) == everything[-3:] and len(everything) > 1000
