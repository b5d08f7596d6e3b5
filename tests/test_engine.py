"""End-to-end losslessness of the decoding engine on a tiny random Llama."""

from __future__ import annotations

import itertools

import pytest
import torch
from scipy import stats

from eagle_mdsd import drafting, engine, graphs, head, tree, tree_specs, verification
from eagle_mdsd.errors import MIN_TEMPERATURE, UsageError

from instances import SkipsDuplicateUpdate
from tiny import tiny_family, tiny_target

PROMPT = [1, 2, 3, 0]
P_VALUE = 1e-3  # fixed seeds: a lossless engine fails a test with probability 0.1%
# The joint-distribution tests are sized by their power.  Over the 64 sequences of three tokens (63 degrees of
# freedom), RUNS draws reject, at P_VALUE, any distribution at chi-square distance w >= DISTANCE from the
# target's (w^2 = sum (r - p)^2 / p) with probability >= POWER (the noncentral chi-square with RUNS w^2: checked
# below).  Bugs these tests were made against, on the one-layer target of `tiny` (estimated from 3,000-4,000 runs
# as (chi^2 - 63) / runs): a lookup draft verified against p instead of its residual, w = 0.52 (test_lookup.py);
# a residual not updated after a repeated draft, w = 0.26 on "wide" and 0.33 with four drafts at the root ("four",
# where its test runs).
RUNS, DISTANCE, POWER = 1000, 0.3, 0.99

TREES = {
    "wide": [[0], [1], [2], [0, 0], [0, 1], [1, 0]],          # 3, 2 and 1 children
    "binary2": [[0], [1], [0, 0], [0, 1], [1, 0], [1, 1]],
    "binary_left": [[0], [1], [0, 0], [0, 1], [0, 0, 0], [0, 0, 1]],
    "four": [[0], [1], [2], [3], [0, 0], [0, 1], [1, 0], [1, 1]],  # four drafts of 4 tokens: repeats are common
}


def trees_for(scheme):
    # SpecHub drafts exactly two children per node.
    return ["binary2", "binary_left"] if scheme == "spechub" else ["wide"]


# Every pair on wide (1, 2 and 3 drafts a node, each level's parents drawn a group at a time) or, for SpecHub, on
# two binary trees; one sampled pair besides on binary2, whose second level draws both parents' drafts in one
# batch (the dynamic trees' tests draw every scheme's children in batches of top_k rows).
CASES = [(s, v, t) for s, v in verification.pairs() for t in trees_for(s)] + [
    ("without_replacement", "rrs_wo", "binary2")]


@pytest.fixture(scope="module")
def tiny():
    # one layer: these tests are bound by the cost of a forward, and every layer's cache, mask and positions are
    # the first's
    target = tiny_target(layers=1)
    draft_head = head.random_head(target)
    with torch.no_grad():  # a sharp q that disagrees with p: biases show up in few samples
        draft_head.fc.weight.mul_(20.0)
    return target, draft_head


@pytest.fixture(scope="module")
def sharp_llama():
    """A 16-token Llama and a sharp random head, whose drafts get accepted on eagle_default."""
    target = tiny_family("llama")
    draft_head = head.random_head(target)
    with torch.no_grad():
        draft_head.fc.weight.mul_(20.0)
    return target, draft_head


def exact_first_three(target, temperature):
    """The target's joint distribution of the first 3 generated tokens, by enumeration."""
    vocab = target.config.vocab_size
    pairs = torch.tensor(list(itertools.product(range(vocab), repeat=2)))
    inputs = torch.cat([torch.tensor(PROMPT).expand(len(pairs), -1), pairs], 1)
    with torch.no_grad():
        logits = target(inputs).logits[:, -3:].double()
    probs = drafting.warp(logits, temperature).double() if temperature == 0 else torch.softmax(logits / temperature, -1)
    joint = probs[:, 0, pairs[:, 0]].diagonal() * probs[:, 1, pairs[:, 1]].diagonal()  # p(x1) p(x2|x1)
    return (joint.unsqueeze(-1) * probs[:, 2]).reshape(-1)  # index x1*V^2 + x2*V + x3


def empirical_first_three(decoder, temperature, runs=RUNS):
    vocab = decoder.lm_head.weight.shape[0]
    counts = torch.zeros(vocab**3)
    for seed in range(runs):
        x1, x2, x3 = decoder.generate(PROMPT, 3, temperature, seed=seed).token_ids
        counts[x1 * vocab**2 + x2 * vocab + x3] += 1
    return counts


def chi_square_p_value(counts, exact):
    keep = exact > 0
    assert counts[~keep].sum() == 0, "a sequence of target probability 0 was generated"
    return stats.chisquare(counts[keep].numpy(), (exact[keep] * counts.sum()).numpy()).pvalue


@pytest.mark.parametrize("scheme, verifier, tree_name", CASES, ids=["-".join(c) for c in CASES])
def test_first_three_tokens_follow_the_target_exactly(tiny, scheme, verifier, tree_name):
    target, draft_head = tiny
    decoder = engine.Decoder(target, draft_head, tree.compile_tree(TREES[tree_name], tree_name), scheme, verifier)
    exact = exact_first_three(target, 1.0)
    assert chi_square_p_value(empirical_first_three(decoder, 1.0), exact) > P_VALUE


# Away from T = 1, where a temperature applied twice (T^2) would pass unseen.
OTHER_TEMPERATURES = [("without_replacement", "rrs_wo", "wide", 0.5), ("with_replacement", "kseq", "wide", 2.0),
                      ("greedy", "greedy", "binary2", 0.5)]


@pytest.mark.parametrize("scheme, verifier, tree_name, temperature", OTHER_TEMPERATURES,
                         ids=[f"{s}-{v}-{t}-T{x:g}" for s, v, t, x in OTHER_TEMPERATURES])
def test_first_three_tokens_follow_the_target_exactly_at_other_temperatures(tiny, scheme, verifier, tree_name,
                                                                              temperature):
    target, draft_head = tiny
    decoder = engine.Decoder(target, draft_head, tree.compile_tree(TREES[tree_name], tree_name), scheme, verifier)
    exact = exact_first_three(target, temperature)
    assert chi_square_p_value(empirical_first_three(decoder, temperature), exact) > P_VALUE


# The reduced vocabulary changes the draft phase (what q is, the fill), which the verifiers of a scheme share;
# a q with zeros is verified exactly by every pair (test_core.py's enumeration).
REDUCED = [("with_replacement", "rrs_w", "wide"), ("without_replacement", "rrs_wo", "wide"),
           ("greedy", "greedy", "wide"), ("with_replacement", "rrs_w", "binary2"),
           ("without_replacement", "rrs_wo", "binary2")]


@pytest.mark.parametrize("scheme, verifier, tree_name", REDUCED, ids=["-".join(c) for c in REDUCED])
def test_a_reduced_draft_vocabulary_stays_exact(tiny, scheme, verifier, tree_name):
    # q lives on 2 of the 4 tokens.  wide: the root's 3 drafts need the fill convention (the lowest ids not yet
    # drawn), which the compact q reaches through the lowest ids it carries at q = 0; binary2: 2 drafts a node.
    target, draft_head = tiny
    draft_head.draft_vocab = [2, 0, 3, 1]
    try:
        decoder = engine.Decoder(target, draft_head, tree.compile_tree(TREES[tree_name]), scheme, verifier,
                                 draft_vocab=2)
        model = decoder.draft_model
        q, ids = model.distribution(torch.randn(3, target.config.hidden_size, dtype=target.dtype), 1.0)
        assert ids.tolist() == [0, 1, 2] and torch.equal(q[:, 1], torch.zeros(3))  # token 1: fill only
        q = model.vocabulary_q(q, ids)
        assert torch.equal(q[:, [1, 3]], torch.zeros(3, 2)) and torch.allclose(q.sum(-1), torch.ones(3))
        exact = exact_first_three(target, 1.0)
        assert chi_square_p_value(empirical_first_three(decoder, 1.0), exact) > P_VALUE
    finally:
        draft_head.draft_vocab = None


def test_draft_vocabulary_needs_the_heads_token_ranking(tiny):
    target, draft_head = tiny
    with pytest.raises(ValueError, match="draft_vocab.json"):
        engine.Decoder(target, draft_head, tree.compile_tree(TREES["wide"]), draft_vocab=2)
    draft_head.draft_vocab = [2, 0]  # a ranking of two tokens drafts over two, whatever number is recorded
    try:
        with pytest.raises(ValueError, match=r"--draft-vocab 3 is more than the head's draft_vocab.json ranks \(2"):
            engine.Decoder(target, draft_head, tree.compile_tree(TREES["wide"]), draft_vocab=3)
    finally:
        draft_head.draft_vocab = None


def test_the_joint_distribution_tests_have_their_stated_power():
    degrees = 4**3 - 1
    critical = stats.chi2.isf(P_VALUE, degrees)
    assert stats.ncx2.sf(critical, degrees, RUNS * DISTANCE**2) >= POWER


def test_the_statistical_test_catches_a_biased_verifier(tiny):
    target, draft_head = tiny
    broken = SkipsDuplicateUpdate()
    decoder = engine.Decoder(target, draft_head, tree.compile_tree(TREES["four"]), "with_replacement", broken)
    assert chi_square_p_value(empirical_first_three(decoder, 1.0), exact_first_three(target, 1.0)) < P_VALUE


def test_temperature_zero_is_greedy_for_every_pair(tiny):
    target, draft_head = tiny
    sequence = list(PROMPT)
    with torch.no_grad():  # greedy decoding by full forwards: no cache, no generation config
        for _ in range(12):
            sequence.append(int(target(torch.tensor([sequence])).logits[0, -1].argmax()))
    reference = torch.tensor(sequence[len(PROMPT):])
    for scheme, verifier, tree_name in CASES:
        decoder = engine.Decoder(target, draft_head, tree.compile_tree(TREES[tree_name]), scheme, verifier)
        assert decoder.generate(PROMPT, 12, 0.0).token_ids == reference.tolist(), (scheme, verifier, tree_name)
    # the smallest temperature samples p and q one-hot on their argmax; a smaller one is refused in one line
    decoder = engine.Decoder(target, draft_head, tree.compile_tree(TREES["wide"]), "with_replacement", "kseq")
    assert decoder.generate(PROMPT, 12, MIN_TEMPERATURE, seed=3).token_ids == reference.tolist()
    with pytest.raises(UsageError, match="temperature 1e-40 is too small to sample at: use 0"):
        decoder.generate(PROMPT, 12, 1e-40)
    # warp itself: logits / T overflows float32, the largest logit taken off first keeps it one-hot, not nan
    assert drafting.warp(torch.tensor([2.0, 1.0, 0.0, -1.0]), 1e-40).tolist() == [1.0, 0.0, 0.0, 0.0]


def test_a_two_layer_head_drafts_through_its_own_cache_and_stays_greedy(tiny):
    target, _ = tiny
    draft_head = head.random_head(target, seed=5, layers=2)
    sequence = list(PROMPT)
    with torch.no_grad():
        for _ in range(12):
            sequence.append(int(target(torch.tensor([sequence])).logits[0, -1].argmax()))
    for scheme, verifier in (("topk", "topk"), ("without_replacement", "rrs_wo")):
        decoder = engine.Decoder(target, draft_head, tree.compile_tree(TREES["wide"]), scheme, verifier)
        call, prompt = decoder.start(PROMPT, 12, 0.0)
        with torch.inference_mode():
            assert decoder.run(call, prompt, 12).token_ids == sequence[len(PROMPT):]
        assert len(call.head_cache.layers) == 2 and call.head_cache.buffer.shape[0] == 2


def test_baseline_and_stats(tiny):
    target, draft_head = tiny
    decoder = engine.Decoder(target, draft_head, tree.compile_tree(TREES["wide"]))
    result = decoder.generate(PROMPT, 10, 0.0)
    baseline = decoder.generate(PROMPT, 10, 0.0, method="baseline")
    assert result.token_ids == baseline.token_ids and baseline.cycles == 9 and baseline.tau == pytest.approx(10 / 9)
    # the token after the prefill plus every cycle's tokens, cut at max_new_tokens
    assert result.new_tokens == 10 == min(1 + sum(result.accept_lengths), 10)
    assert 1 + sum(result.accept_lengths[:-1]) < 10  # the last cycle was needed
    assert result.tau == result.new_tokens / result.cycles and result.tokens_per_s > 0


def test_profile_splits_the_loop_into_phases(tiny):
    target, draft_head = tiny
    decoder = engine.Decoder(target, draft_head, tree.compile_tree(TREES["wide"]))
    plain = decoder.generate(PROMPT, 10, 1.0, seed=5)
    timed = decoder.generate(PROMPT, 10, 1.0, seed=5, profile=True)
    assert timed.token_ids == plain.token_ids and plain.profile == {}
    assert set(timed.profile) == {"draft", "verify"}
    assert 0 < sum(timed.profile.values()) <= timed.wall_time_s - timed.prefill_time_s
    baseline = decoder.generate(PROMPT, 10, 1.0, method="baseline", profile=True)
    assert set(baseline.profile) == {"verify"}


def test_generation_stops_at_eos(tiny):
    target, draft_head = tiny
    plain = engine.Decoder(target, draft_head, tree.compile_tree(TREES["wide"])).generate(PROMPT, 12, 0.0)
    eos = plain.token_ids[4]
    stopped = engine.Decoder(target, draft_head, tree.compile_tree(TREES["wide"]), eos_token_ids=[eos])
    tokens = stopped.generate(PROMPT, 12, 0.0).token_ids
    assert tokens == plain.token_ids[: plain.token_ids.index(eos) + 1]


def test_bad_generation_arguments_are_refused(tiny):
    target, draft_head = tiny
    decoder = engine.Decoder(target, draft_head, tree.compile_tree(TREES["wide"]))
    with pytest.raises(ValueError, match="temperature must be >= 0"):
        decoder.generate(PROMPT, 4, -0.5)
    for value in (float("nan"), float("inf")):  # NaN passed `< 0` and sampled garbage
        with pytest.raises(ValueError, match=r"temperature must be >= 0 \(a finite number\)"):
            decoder.generate(PROMPT, 4, value)
    with pytest.raises(ValueError, match=r"exceed the model's context of 64 tokens"):
        decoder.generate(PROMPT * 10, 30, 0.0)
    with pytest.raises(ValueError, match="cannot fill tree"):
        engine.Decoder(target, draft_head, tree.compile_tree(TREES["wide"]), "spechub", "spechub")
    with pytest.raises(ValueError, match="not lossless"):
        engine.Decoder(target, draft_head, tree.compile_tree(TREES["wide"]), "greedy", "rrs_wo")


@pytest.mark.parametrize("family", ["llama", "qwen2", "mistral"])
def test_other_architectures_decode_greedily_and_losslessly(family):
    from tiny import tiny_family

    target = tiny_family(family)
    draft_head = head.random_head(target)
    with torch.no_grad():
        draft_head.fc.weight.mul_(20.0)
    sequence = list(PROMPT)
    with torch.no_grad():
        for _ in range(16):
            sequence.append(int(target(torch.tensor([sequence])).logits[0, -1].argmax()))
    decoder = engine.Decoder(target, draft_head, tree.load("eagle_default"))
    result = decoder.generate(PROMPT, 16, 0.0)
    assert result.token_ids == sequence[len(PROMPT):]
    assert result.cycles < 16  # the sharp random head gets drafts accepted: the tree path is exercised


def test_draft_vocabulary_takes_full_and_refuses_other_words(tiny):
    target, draft_head = tiny
    assert head.resolve_draft_vocab(draft_head, "full") is None and head.resolve_draft_vocab(draft_head, None) is None
    with pytest.raises(ValueError, match="number of tokens, 'full' or 'auto'"):
        engine.Decoder(target, draft_head, tree.compile_tree(TREES["wide"]), draft_vocab="8192")


def test_auto_draft_vocabulary_follows_the_head(tiny):
    _, draft_head = tiny
    assert head.resolve_draft_vocab(draft_head, "auto") is None and head.resolve_draft_vocab(None, "auto") is None
    draft_head.draft_vocab = list(range(4))
    try:
        assert head.resolve_draft_vocab(draft_head, "auto") == 4 and head.resolve_draft_vocab(draft_head, 2) == 2
    finally:
        draft_head.draft_vocab = None


KINDS = ["eagle_default", "eagle_default+lookup", "sequoia_cpu", "eagle2:total_tokens=9,depth=4,top_k=3",
         "eagle2:depth=3+lookup4", "opt_tree:nodes=8,threshold=0.1,max_depth=3,top_k=3",
         "opt_tree:nodes=8,threshold=0.1,max_depth=3,top_k=3+lookup"]


@pytest.mark.parametrize("spec", KINDS)
def test_every_kind_of_tree_stays_greedy(sharp_llama, spec):
    # Every pair the tree takes (sequoia_cpu: 4 and 6 drafts a node; with_replacement draws repeats, which a grown
    # tree scores -inf): at T = 0 a drafting scheme's draws decide what is accepted, never what is output.
    target, draft_head = sharp_llama
    reference = engine.Decoder(target).generate(PROMPT, 24, method="baseline").token_ids
    ran = []
    for pair in verification.pairs():
        try:
            decoder = engine.Decoder(target, draft_head, tree_specs.load(spec), *pair)
        except ValueError:  # a pair the tree cannot take (spechub's two drafts a node; opt_tree's topk)
            continue
        result = decoder.generate(PROMPT, 24, 0.0)
        assert result.token_ids == reference and result.cycles < 23, (spec, pair)
        ran.append(pair)
    assert ("topk", "topk") in ran and (spec.startswith("opt_tree") or len(ran) >= 8), ran


def test_cuda_graphs_are_asked_for_by_name():
    from eagle_mdsd import graphs

    assert graphs.resolve("auto", torch.device("cpu")) is False and graphs.resolve("off", torch.device("cuda")) is False
    assert graphs.resolve("auto", torch.device("cuda")) is True
    with pytest.raises(ValueError, match="unknown --cuda-graphs 'on': use one of auto, off"):
        graphs.resolve("on", torch.device("cpu"))


def test_an_eos_inside_an_accepted_path_ends_the_count_there(sharp_llama):
    # At T = 0 the tree is resolved at once, so a path can run on past an accepted EOS: the tokens, the accept
    # lengths and the walk's child ranks stop at the EOS all the same.
    target, draft_head = sharp_llama
    plain = engine.Decoder(target, draft_head, tree_specs.load("eagle_default")).generate(PROMPT, 24, 0.0)
    assert plain.accept_lengths[0] > 1  # the first cycle accepts a draft: an EOS there sits inside a path
    eos = plain.token_ids[1]
    stopped = engine.Decoder(target, draft_head, tree_specs.load("eagle_default"), eos_token_ids=[eos])
    result = stopped.generate(PROMPT, 24, 0.0)
    assert result.token_ids == plain.token_ids[:2] and result.accept_lengths == [1]
    assert result.accepted_ranks == plain.accepted_ranks[:1]


@pytest.mark.parametrize("spec", KINDS)
def test_graphs_emulated_decode_as_eager_calls(sharp_llama, spec):
    # Phases captured and replayed as a CUDA graph replays them (graphs.Emulated: inputs from a graph's own buffers,
    # outputs written into the capture's, one graph per phase, parity, temperature and span bucket, caches kept
    # across calls), against the same cycle run eagerly: the same tokens, accept lengths and child ranks at T = 0
    # and T = 1, so every test of the eager cycle certifies the replayed one.
    target, draft_head = sharp_llama
    pair = ("topk", "topk") if spec.startswith("opt_tree") else ("without_replacement", "rrs_wo")
    eager = engine.Decoder(target, draft_head, tree_specs.load(spec), *pair)
    replayed = engine.Decoder(target, draft_head, tree_specs.load(spec), *pair, cuda_graphs="emulate")
    replayed.graphs = graphs.Checked()  # and every replay does what its capture did
    for seed, temperature in ((0, 0.0), (1, 1.0), (2, 1.0)):
        expected = eager.generate(PROMPT, 20, temperature, seed=seed)
        result = replayed.generate(PROMPT, 20, temperature, seed=seed)
        assert result.token_ids == expected.token_ids and result.accept_lengths == expected.accept_lengths
        assert result.accepted_ranks == expected.accepted_ranks
    assert {key[0] for key in replayed.graphs.entries} == {"draft", "verify"}
    assert replayed.graphs.seconds > 0
