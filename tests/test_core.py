"""Losslessness and optimality of every drafting scheme / verifier pair, exactly."""

from __future__ import annotations

import itertools

import numpy as np
import pytest
import torch
from scipy import stats

from eagle_mdsd import drafting, engine, theory, verification
from eagle_mdsd.verification import RecursiveRejection, _mix, _positive_part_normalised, _ratio, _take

from instances import SkipsDuplicateUpdate, all_tuples, instance, mixture

N_INSTANCES = 250
PAIRS = verification.pairs()


def _usable(scheme, vocab, n):
    try:
        scheme.check(n, vocab)
    except ValueError:
        return False
    return True


def _cases(pair):
    scheme = drafting.get(pair[0])
    for index in range(N_INSTANCES):
        p, q, n, kind = instance(index)
        if scheme.name == "spechub":
            n = 2
        if _usable(scheme, len(p), n):
            yield p, q, n, kind


@pytest.mark.parametrize("pair", PAIRS, ids=[f"{s}-{v}" for s, v in PAIRS])
def test_every_pair_is_lossless_by_enumeration(pair):
    scheme, verifier = drafting.get(pair[0]), verification.get(pair[1])
    count = 0
    for p, q, n, kind in _cases(pair):
        mix, total, _ = mixture(scheme, verifier, p, q, n)
        assert abs(float(total) - 1.0) < 1e-12, (kind, q, n)
        assert torch.allclose(mix, p, atol=1e-10, rtol=0), (kind, p, q, n, mix)
        count += 1
    assert count >= 200


class SkipsLastUpdate(RecursiveRejection):
    """RRS without replacement that forgets the residual update after the last draft."""

    def _plan(self, p, q, drafts):
        residual, weights = p, []
        drawn = torch.zeros_like(q, dtype=torch.bool)
        still = torch.ones(p.shape[:-1], dtype=p.dtype)
        for j in range(drafts.shape[-1]):
            x = drafts[..., j]
            q_j = drafting.exclude(q, drawn)
            accept = _ratio(_take(residual, x), _take(q_j, x))
            weights.append(still * accept)
            still = still * (1 - accept)
            if j + 1 < drafts.shape[-1]:
                residual = _positive_part_normalised(residual - q_j, residual)
            drawn = drawn.scatter(-1, x.unsqueeze(-1), True)
        return _mix(drafts, torch.stack(weights, -1), still, residual)


@pytest.mark.parametrize("broken, scheme", [
    (SkipsDuplicateUpdate(), "with_replacement"),
    (SkipsLastUpdate("broken_wo", True, ""), "without_replacement"),
])
def test_enumeration_catches_a_skipped_residual_update(broken, scheme):
    scheme = drafting.get(scheme)
    worst = 0.0
    for p, q, n, _ in _cases((scheme.name, "topk")):
        if n < 2:
            continue
        mix, _, _ = mixture(scheme, broken, p, q, n)
        worst = max(worst, float((mix - p).abs().max()))
    assert worst > 1e-3


ALPHA_SCHEMES = ["with_replacement", "without_replacement", "greedy", "spechub", "topk"]


@pytest.mark.parametrize("scheme", ALPHA_SCHEMES)
def test_optimal_acceptance_equals_the_lp(scheme):
    checked = 0
    for p, q, n, kind in _cases((scheme, "topk")):
        joint = theory.joint_distribution(scheme, q, n)
        lp = theory.lp_optimal_acceptance(p, joint)
        fast = theory.optimal_acceptance(p, q, n, scheme)
        assert abs(fast - lp) < 1e-9, (kind, p, q, n, fast, lp)
        checked += 1
    assert checked >= 150


@pytest.mark.parametrize("pair", PAIRS, ids=[f"{s}-{v}" for s, v in PAIRS])
def test_acceptance_is_at_most_alpha_star_and_greedy_spechub_reach_it(pair):
    scheme, verifier = drafting.get(pair[0]), verification.get(pair[1])
    for p, q, n, kind in _cases(pair):
        _, _, accepted = mixture(scheme, verifier, p, q, n)
        alpha = theory.optimal_acceptance(p, q, n, scheme.name)
        assert accepted <= alpha + 1e-12, (kind, p, q, n)
        if verifier.name in ("greedy", "spechub") or scheme.name == "topk":
            assert abs(accepted - alpha) < 1e-12, (kind, p, q, n)
        reported = theory.acceptance_rate(scheme, verifier, p, q, n)
        assert abs(float(reported) - accepted) < 1e-12 and reported.half_width == 0.0


def test_without_replacement_q_is_the_sequential_probability_not_the_seed_formula():
    q = np.array([0.5, 0.3, 0.2])
    exact = theory.prefix_all_drafts_in(q, 2)[2]  # H = {0, 1}
    assert abs(exact - 0.5142857142857143) < 1e-13
    # The generating-function ratio W_{2,H} / W_{2,Sigma} of the seed paper:
    seed_formula = (0.5 * 0.3) / (0.5 * 0.3 + 0.5 * 0.2 + 0.3 * 0.2)
    assert abs(seed_formula - 0.4839) < 1e-4 and abs(exact - seed_formula) > 0.03


@pytest.mark.parametrize("seed", range(40))
def test_prefix_probabilities_match_enumeration_including_peaked_q(seed):
    rng = np.random.default_rng(seed)
    vocab, n = int(rng.integers(3, 8)), int(rng.integers(2, 5))
    q = np.exp(rng.normal(0, 1 + seed % 5 * 3, vocab))  # from flat to extremely peaked
    q /= q.sum()
    if (q > 0).sum() < n:
        return
    order = rng.permutation(vocab)
    tuples = all_tuples(vocab, n)
    probs = drafting.get("without_replacement").probabilities(torch.tensor(q).expand(len(tuples), -1), tuples)
    got = theory.prefix_all_drafts_in(q[order], n)
    for k in range(vocab + 1):
        inside = torch.isin(tuples, torch.tensor(order[:k], dtype=torch.long)).all(-1)
        assert abs(got[k] - float(probs[inside].sum())) < 1e-12, (q, n, k)


def _all_drafts_in_exactly(q, n, inside) -> float:
    """P(all n drafts without replacement fall in `inside`), each draw's denominator summed from the tokens not yet
    drawn (not 1 - the drawn ones, which rounds to 0 once a token holds nearly all of q)."""
    total = 0.0
    for drafts in itertools.permutations(np.flatnonzero(inside), n):
        left, probability = np.ones(len(q), dtype=bool), 1.0
        for token in drafts:
            probability *= q[token] / q[left].sum()
            left[token] = False
        total += probability
    return total


@pytest.mark.parametrize("tail", [1e-17, 1e-22, 1e-60, 1e-250])
def test_prefix_probabilities_hold_when_one_token_holds_nearly_all_of_q(tail):
    """The decay rates of the race reach the tail's mass: the quadrature must reach t ~ 1 / tail (a rule that
    stopped at e^45 overstated Q below tails of 1e-19, and alpha* came out below a verifier's acceptance)."""
    q = np.array([1.0, 1.9, 1.3e-2, 8.8e-5, 5.9e-7, 3e-3]) * tail
    q[0] = 1.0
    q /= q.sum()
    for n in (2, 3, 4):
        got = theory.prefix_all_drafts_in(q, n)
        for k in range(len(q) + 1):
            inside = np.arange(len(q)) < k
            assert abs(got[k] - _all_drafts_in_exactly(q, n, inside)) < 1e-12, (tail, n, k)
    p = np.array([0.3, 0.3, 0.2, 0.1, 0.05, 0.05])
    alpha = theory.optimal_acceptance(p, q, 3, "without_replacement")
    scheme, verifier = drafting.get("without_replacement"), verification.get("rrs_wo")
    _, _, accepted = mixture(scheme, verifier, torch.tensor(p), torch.tensor(q), 3)
    assert accepted <= alpha + 1e-12


CHI_SQUARE_P_VALUE = 1e-3  # fixed seeds: a correct sampler fails with probability 0.1% per test


# q without ties; with a tie at the top and zeros (where a sampler's tie rule or fill can part from the
# probabilities the verifiers are proved with); one-hot.
SAMPLED_Q = {"distinct": [0.35, 0.25, 0.2, 0.15, 0.05], "tied": [0.4, 0.4, 0.2, 0.0, 0.0],
             "one-hot": [0.0, 1.0, 0.0, 0.0, 0.0]}


@pytest.mark.parametrize("q", SAMPLED_Q)
@pytest.mark.parametrize("scheme", drafting.names())
def test_scheme_samples_follow_probability(scheme, q):
    scheme = drafting.get(scheme)
    gen = torch.Generator().manual_seed(7)
    q = torch.tensor(SAMPLED_Q[q], dtype=torch.float64)
    n = 2 if scheme.name == "spechub" else 3
    draws = scheme.sample_batch(q.expand(40000, -1), n, gen)
    tuples = all_tuples(len(q), n)
    expected = scheme.probabilities(q.expand(len(tuples), -1), tuples)
    codes = (draws * (len(q) ** torch.arange(n - 1, -1, -1))).sum(-1)
    observed = torch.bincount(codes, minlength=len(tuples)).double()
    assert observed[expected == 0].sum() == 0
    keep = expected > 0
    if keep.sum() == 1:
        return
    result = stats.chisquare(observed[keep].numpy(), expected[keep].numpy() * len(draws))
    assert result.pvalue > CHI_SQUARE_P_VALUE
    assert scheme.sample(q, n, gen).shape == (n,)


@pytest.mark.parametrize("pair", PAIRS, ids=[f"{s}-{v}" for s, v in PAIRS])
def test_verifier_samples_follow_plan(pair):
    scheme, verifier = drafting.get(pair[0]), verification.get(pair[1])
    gen = torch.Generator().manual_seed(11)
    p = torch.tensor([0.1, 0.4, 0.05, 0.3, 0.15], dtype=torch.float64)
    q = torch.tensor([0.35, 0.25, 0.2, 0.15, 0.05], dtype=torch.float64)
    n = 2 if scheme.name == "spechub" else 3
    drafts = scheme.sample(q, n, gen)
    plan = verifier.plan(p, q, drafts)
    outputs = verifier.sample_batch(p, q, drafts.expand(40000, -1), gen)
    observed = torch.bincount(outputs, minlength=len(p)).double()
    assert observed[plan == 0].sum() == 0
    keep = plan > 0
    if keep.sum() > 1:
        result = stats.chisquare(observed[keep].numpy(), (plan[keep] * len(outputs)).numpy())
        assert result.pvalue > CHI_SQUARE_P_VALUE
    assert verifier.sample(p, q, drafts, gen) in range(len(p))


@pytest.mark.parametrize("index", range(60))
def test_kseq_rho_solves_its_equation(index):
    p, q, n, kind = instance(index)
    n = max(n, 2)
    rho = float(verification.kseq_rho(p, q, n))
    assert 1.0 <= rho <= n
    beta = float(torch.minimum(q, p / rho).sum())
    assert abs(1 - (1 - beta) ** n - rho * beta) < 1e-12, kind


@pytest.mark.parametrize("index", range(60))
def test_batched_kseq_rho_is_within_its_bound_of_the_root(index):
    # kseq_rho bisects RHO_STEPS times on the device: h changes sign within (n - 1) / 2**RHO_STEPS of its rho (where
    # h is flat to float64, as near rho = 1 when p = q, any rho there solves it as well).
    p, q, n, kind = instance(index)
    n = max(n, 2)
    rho = verification.kseq_rho(p[None].expand(3, -1), q, n)[1]
    bound = (n - 1) / 2**verification.RHO_STEPS

    def h(r):
        beta = float(torch.minimum(q, p / r).sum())
        return 1 - (1 - beta) ** n - r * beta

    assert abs(h(float(rho))) < 1e-12 and h(max(float(rho) - bound, 1.0)) >= -1e-12, kind
    assert h(min(float(rho) + bound, n)) <= 1e-12, kind


def test_monte_carlo_acceptance_covers_the_exact_value():
    gen = torch.Generator().manual_seed(3)
    p = torch.rand(12, generator=gen, dtype=torch.float64) ** 3
    q = torch.rand(12, generator=gen, dtype=torch.float64) ** 3
    p, q = p / p.sum(), q / q.sum()
    for scheme, verifier in [("with_replacement", "rrs_w"), ("without_replacement", "rrs_wo")]:
        exact = theory.acceptance_rate(scheme, verifier, p, q, 3)
        estimate = theory.acceptance_rate(scheme, verifier, p, q, 3, max_tuples=0, samples=20000, generator=gen)
        assert estimate.half_width > 0
        # 4 half-widths of a 95% interval: a correct estimator misses with probability < 1e-4.
        assert abs(float(estimate) - float(exact)) < 4 * estimate.half_width


def test_large_vocabulary_batch_plans_are_distributions():
    gen = torch.Generator().manual_seed(5)
    vocab, nodes = 32000, 6
    p = torch.softmax(torch.randn(nodes, vocab, generator=gen) * 3, -1)
    q = torch.softmax(torch.randn(nodes, vocab, generator=gen) * 3, -1)
    for scheme, verifier in PAIRS:
        scheme = drafting.get(scheme)
        n = 2 if scheme.name == "spechub" else 4
        drafts = scheme.sample_batch(q, n, gen)
        assert drafts.shape == (nodes, n)
        plan = verification.get(verifier).plan(p, q, drafts)
        assert plan.shape == (nodes, vocab) and (plan >= 0).all()
        assert torch.allclose(plan.sum(-1), torch.ones(nodes), atol=1e-5)
        tokens = verification.get(verifier).sample_batch(p, q, drafts, gen)
        assert tokens.shape == (nodes,)


def test_top_tokens_breaks_ties_by_lowest_index():
    q = torch.tensor([[0.1, 0.3, 0.1, 0.3, 0.2], [0.0, 0.0, 1.0, 0.0, 0.0]])
    assert drafting.top_tokens(q, 3).tolist() == [[1, 3, 4], [2, 0, 1]]
    assert drafting.get("without_replacement").sample(q[1], 3).tolist() == [2, 0, 1]


def test_top_tokens_matches_a_stable_sort_on_coarse_values():
    # bf16-like logits: many exact ties, crossing the cut in some rows but not all.
    gen = torch.Generator().manual_seed(0)
    q = torch.randint(0, 6, (3, 5, 50), generator=gen).float()
    for k in (1, 2, 4, 7):
        reference = torch.sort(q, dim=-1, descending=True, stable=True).indices[..., :k]
        assert torch.equal(drafting.top_tokens(q, k), reference)


def test_every_pair_not_declared_lossless_is_refused_before_the_engine_decodes():
    declared = set(verification.pairs())
    refused = [(s, v) for s in drafting.names() for v in verification.names() if (s, v) not in declared]
    assert len(declared) == 10 and len(refused) == 20
    for pair in refused:  # the decoder checks its pair first, before it reads the target
        with pytest.raises(ValueError, match=f"verifier '{pair[1]}' is not lossless for '{pair[0]}' drafts"):
            engine.Decoder(None, None, None, *pair)


def test_names_and_pairs_fail_with_one_line_errors():
    with pytest.raises(ValueError, match="unknown drafting scheme 'nope'.*with_replacement"):
        drafting.get("nope")
    with pytest.raises(ValueError, match="unknown verifier 'nope'.*rrs_w"):
        verification.get("nope")
    with pytest.raises(ValueError, match="not lossless for 'without_replacement' drafts: use one of rrs_wo, topk"):
        verification.check_pair("without_replacement", "rrs_w")
    with pytest.raises(ValueError, match="not lossless"):
        theory.acceptance_rate("greedy", "kseq", [0.5, 0.5], [0.5, 0.5], 2)
    with pytest.raises(ValueError, match="spechub draws exactly 2"):
        drafting.get("spechub").sample(torch.tensor([0.5, 0.3, 0.2]), 3)
    with pytest.raises(ValueError, match="cannot draw 4 distinct drafts"):
        theory.optimal_acceptance([0.5, 0.5], [0.5, 0.5], 4, "without_replacement")
    assert verification.compatible("with_replacement", "kseq")
    assert not verification.compatible("greedy", "rrs_w")


@pytest.mark.parametrize("vocab", [7, 40000])
def test_draw_follows_the_distribution_and_never_picks_a_zero(vocab):
    gen = torch.Generator().manual_seed(9)
    support = torch.randperm(vocab, generator=gen)[:7]
    dist = torch.zeros(vocab, dtype=torch.float64)
    dist[support] = torch.tensor([0.3, 0.2, 0.15, 0.15, 0.1, 0.07, 0.03], dtype=torch.float64)
    tokens = drafting.draw(dist.float(), 50000, gen)
    observed = torch.bincount(tokens, minlength=vocab).double()
    assert observed.sum() == observed[support].sum()
    result = stats.chisquare(observed[support].numpy(), (dist[support] * 50000).numpy())
    assert result.pvalue > CHI_SQUARE_P_VALUE
