"""The acceptance study's arithmetic against the core's exact values, on tiny synthetic inputs."""

from __future__ import annotations

import pytest
import torch

from eagle_mdsd import study, theory, verification


def _pair(seed: int, vocab: int):
    gen = torch.Generator().manual_seed(seed)
    p = torch.softmax(2 * torch.randn(vocab, generator=gen, dtype=torch.float64), -1)
    q = torch.softmax(2 * torch.randn(vocab, generator=gen, dtype=torch.float64), -1)
    return p, q


@pytest.mark.parametrize("seed, n", [(0, 2), (1, 3), (2, 3)])
def test_position_rates_match_the_exact_values(seed, n):
    p, q = _pair(seed, 5)
    rates = study.position_rates(p, q, n, torch.Generator().manual_seed(seed), draws=6000)
    for scheme in study.ALPHAS:
        assert rates[f"alpha*:{scheme}"] == pytest.approx(theory.optimal_acceptance(p, q, n, scheme), abs=1e-12)
    assert rates["kseq"] == pytest.approx(float(verification.kseq_acceptance(p, q, n)), abs=1e-12)
    for name, (scheme, _) in study.VERIFIERS.items():
        if name == "kseq":
            continue
        count = 2 if name == "spechub" else n
        exact = theory.acceptance_rate(scheme, name, p, q, count)  # enumeration at V = 5
        assert exact.half_width == 0.0
        assert rates[name] == pytest.approx(float(exact), abs=0.02), name


def test_truncation_keeps_everything_at_epsilon_zero_and_little_otherwise():
    p, q = _pair(3, 7)
    kept_p, kept_q = study.truncate(p, q, 3, epsilon=0.0, min_size=7)
    assert torch.allclose(kept_p[:-1], p, atol=1e-15) and kept_p[-1] < 1e-12 and len(kept_p) == 8
    # a peaked large vocabulary: truncated alpha* within (n + 1) epsilon of the full one
    gen = torch.Generator().manual_seed(4)
    logits = torch.randn(20000, generator=gen, dtype=torch.float64) * 2
    logits[:6] += 25  # language-model-like: a few tokens carry all but ~1e-7 of the mass
    p = torch.softmax(logits, -1)
    q = torch.softmax(logits + torch.randn(20000, generator=gen, dtype=torch.float64), -1)
    small_p, small_q = study.truncate(p, q, 3)
    assert len(small_p) < 2000
    for scheme in ("with_replacement", "without_replacement", "greedy"):
        full = theory.optimal_acceptance(p, q, 3, scheme)
        assert theory.optimal_acceptance(small_p, small_q, 3, scheme) == pytest.approx(full, abs=4 * study.EPSILON)
    # q on one token but 4e-11, as at a low temperature, and p elsewhere too: the later draws without replacement
    # and greedy drafting's sample see q's tail, which one bucket would stand for (off by 1.5e-3 and 2e-3)
    base = torch.randn(5000, generator=gen, dtype=torch.float64) * 2
    logits_q, logits_p = base + torch.randn(5000, generator=gen, dtype=torch.float64), base.clone()
    logits_q[0] += 24
    logits_p[0] += 20
    logits_p[1:4] += 19.5
    p, q = torch.softmax(logits_p / 0.7, -1), torch.softmax(logits_q / 0.7, -1)
    small_p, small_q = study.truncate(p, q, 3)
    for scheme in ("with_replacement", "without_replacement", "greedy"):
        full = theory.optimal_acceptance(p, q, 3, scheme)
        assert theory.optimal_acceptance(small_p, small_q, 3, scheme) == pytest.approx(full, abs=4 * study.EPSILON)
    assert len(study.truncate(p, q, 12)[0]) >= 13  # n drafts without replacement exist for any n


def test_summaries_are_means_with_paired_gaps():
    rates = {"alpha*:with_replacement": torch.tensor([0.9, 0.8, 0.7, 0.6], dtype=torch.float64),
             "rrs_w": torch.tensor([0.8, 0.8, 0.6, 0.6], dtype=torch.float64)}
    summary = study.summarise(rates)
    assert summary["rrs_w"]["mean"] == pytest.approx(0.7)
    assert summary["rrs_w"]["gap"] == pytest.approx(0.05)
    gaps = torch.tensor([0.1, 0.0, 0.1, 0.0], dtype=torch.float64)
    assert summary["rrs_w"]["gap_ci95"] == pytest.approx(1.96 * float(gaps.std()) / 2)
    assert "gap" not in summary["alpha*:with_replacement"]


def test_rates_over_logit_rows_use_the_temperature():
    logits_p = torch.tensor([[2.0, 1.0, 0.0, -1.0]]).half()
    logits_q = torch.tensor([[0.0, 2.0, 1.0, -1.0]]).half()
    hot = study.rates_for(logits_p, logits_q, 1.0, 2, draws=2)
    cold = study.rates_for(logits_p, logits_q, 0.0, 2, draws=2)
    p = torch.softmax(logits_p[0].double(), -1)
    q = torch.softmax(logits_q[0].double(), -1)
    assert float(hot["alpha*:greedy"][0]) == pytest.approx(theory.optimal_acceptance(p, q, 2, "greedy"), abs=1e-3)
    # T = 0: one-hot p on token 0, q one-hot on token 1; greedy drafting's top-1 misses, its sample is the fill
    assert float(cold["alpha*:greedy"][0]) == pytest.approx(1.0)


@pytest.mark.parametrize("option, least", [("--positions", 1), ("--n", 1), ("--draws", 1), ("--sweep-positions", 2),
                                           ("--table-positions", 2)])
def test_study_counts_below_their_least_are_refused_by_the_parser(option, least, capsys):
    from eagle_mdsd import cli

    # a count of 0 would collect nothing to score; one position a task has no interval (its JSON was NaN)
    with pytest.raises(SystemExit) as stop:
        cli.build_parser().parse_args(["study", "all", option, str(least - 1)])
    assert stop.value.code == 2 and f"argument {option}: must be at least {least}, got {least - 1}" in \
        capsys.readouterr().err
