"""Random small (p, q, n) instances covering the cases that break verifiers."""

from __future__ import annotations

import itertools

import torch

from eagle_mdsd.verification import RecursiveRejection, _mix, _positive_part_normalised, _ratio, _take

KINDS = ("random", "equal", "disjoint", "onehot_p", "zeros_in_q", "ties_in_q", "peaked_q")


def _random(vocab, gen):
    x = torch.rand(vocab, generator=gen, dtype=torch.float64) ** 2
    return x / x.sum()


def instance(index: int, seed: int = 1234):
    """Instance number `index`: (p, q, n, kind), V in 2..7, n in 1..4."""
    gen = torch.Generator().manual_seed(seed + index)
    vocab = int(torch.randint(2, 8, (1,), generator=gen))
    n = int(torch.randint(1, 5, (1,), generator=gen))
    kind = KINDS[index % len(KINDS)]
    p, q = _random(vocab, gen), _random(vocab, gen)
    if kind == "equal":
        q = p.clone()
    elif kind == "disjoint":
        cut = max(1, vocab // 2)
        p[cut:] = 0
        q[:cut] = 0
        p, q = p / p.sum(), q / q.sum()
    elif kind == "onehot_p":
        p = torch.zeros(vocab, dtype=torch.float64)
        p[int(torch.randint(vocab, (1,), generator=gen))] = 1.0
    elif kind == "zeros_in_q":
        zero = torch.rand(vocab, generator=gen) < 0.5
        zero[int(torch.randint(vocab, (1,), generator=gen))] = False
        q = q.masked_fill(zero, 0.0)
        q = q / q.sum()
    elif kind == "ties_in_q":
        q = torch.tensor([float(int(x * 3)) + 1.0 for x in torch.rand(vocab, generator=gen)], dtype=torch.float64)
        q = q / q.sum()
    elif kind == "peaked_q":
        q = torch.full((vocab,), 1e-6, dtype=torch.float64)
        q[int(torch.randint(vocab, (1,), generator=gen))] = 1.0
        q = q / q.sum()
    return p, q, n, kind


def all_tuples(vocab: int, n: int) -> torch.Tensor:
    return torch.tensor(list(itertools.product(range(vocab), repeat=n)), dtype=torch.long).reshape(-1, n)


def mixture(scheme, verifier, p, q, n):
    """(sum_d P(d) pi(. | d), sum_d P(d), exact acceptance) by enumeration."""
    tuples = all_tuples(len(p), n)
    probs = scheme.probabilities(q.expand(len(tuples), -1), tuples)
    plans = verifier.plan(p, q, tuples)
    in_drafts = torch.zeros_like(plans, dtype=torch.bool).scatter_(-1, tuples, True)
    accepted = (probs * (plans * in_drafts).sum(-1)).sum()
    return (probs.unsqueeze(-1) * plans).sum(0), probs.sum(), float(accepted)


class SkipsDuplicateUpdate(RecursiveRejection):
    """RRS with replacement that skips the residual update of a repeated draft.

    That is the bug of skipping duplicate siblings; the tests must catch it.
    """

    def __init__(self):
        super().__init__("skips_duplicates", False, "")

    def _plan(self, p, q, drafts):
        residual, weights = p, []
        still = torch.ones(p.shape[:-1], dtype=p.dtype)
        for j in range(drafts.shape[-1]):
            x = drafts[..., j]
            seen = (drafts[..., :j] == x.unsqueeze(-1)).any(-1)
            accept = _ratio(_take(residual, x), _take(q, x))
            weights.append(still * accept)
            still = still * (1 - accept)
            updated = _positive_part_normalised(residual - q, residual)
            residual = torch.where(seen.unsqueeze(-1), residual, updated)
        return _mix(drafts, torch.stack(weights, -1), still, residual)
