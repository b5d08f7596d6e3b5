"""Multi-draft verifiers, each defined by its conditional output distribution.

A verifier is a transport plan: given the target distribution p, the draft
distribution q and the ordered drafts, `plan` returns pi(. | drafts) [..., V].
The output token is one draw from it; the node accepts draft j when that token
equals x_j.  Losslessness is the identity

    sum over draft tuples d of P_scheme(d) * pi(. | d) = p,

which tests/test_core.py checks by enumeration.  `sample` draws from the plan,
so the plan is the single source of truth for every verifier.

Batch convention: p, q are [..., V], drafts [..., n]; leading dims broadcast.
"""

from __future__ import annotations

import math

import torch

from . import drafting
from .drafting import exclude, top_tokens
from .errors import UsageError

__all__ = ["Verifier", "VERIFIERS", "get", "names", "compatible", "check_pair", "kseq_rho"]


def _positive_part_normalised(x: torch.Tensor, fallback: torch.Tensor) -> torch.Tensor:
    """norm((x)_+) where it has mass; `fallback` where it has none (that branch has probability 0)."""
    pos = x.clamp_min(0.0)
    mass = pos.sum(-1, keepdim=True)
    return torch.where(mass > 0, pos / mass.clamp_min(torch.finfo(x.dtype).tiny), fallback)


def _ratio(num: torch.Tensor, den: torch.Tensor) -> torch.Tensor:
    """min(1, num/den), with 0/0 = 0 and x/0 = 1: only reached on probability-0 tuples."""
    safe = torch.where(den > 0, den, torch.ones_like(den))
    return torch.where(den > 0, (num / safe).clamp(max=1.0), (num > 0).to(num.dtype))


def _take(x: torch.Tensor, tokens: torch.Tensor) -> torch.Tensor:
    return x.gather(-1, tokens.unsqueeze(-1)).squeeze(-1)


def _mix(drafts: torch.Tensor, weights: torch.Tensor, rest_weight: torch.Tensor, rest: torch.Tensor):
    """sum_j weights_j delta_{x_j} + rest_weight * rest: a plan from its parts.  A token drafted more than once
    (K-SEQ weighs each copy) takes its copies' weights summed in a fixed order and written once: scatter_add_ adds
    them atomically on CUDA, in no fixed order, so the plan and the token drawn from it could change run to run."""
    mixed = rest_weight.unsqueeze(-1) * rest
    same = drafts.unsqueeze(-1) == drafts.unsqueeze(-2)  # [..., n, n]: draft j's token is draft k's
    total = torch.where(same, weights.unsqueeze(-2), 0.0).sum(-1)  # [..., n]: the weight of draft j's token
    return mixed.scatter_(-1, drafts, mixed.gather(-1, drafts) + total)


def _broadcast(p, q, drafts):
    batch = torch.broadcast_shapes(p.shape[:-1], q.shape[:-1], drafts.shape[:-1])
    vocab = p.shape[-1]
    if q.shape[-1] != vocab:
        raise UsageError(f"p has {vocab} tokens but q has {q.shape[-1]}: both must cover the same vocabulary")
    return (p.expand(batch + (vocab,)), q.expand(batch + (vocab,)),
            drafts.expand(batch + drafts.shape[-1:]))


class Verifier:
    name: str = ""
    schemes: tuple[str, ...] = ()
    reference: str = ""

    def _plan(self, p, q, drafts):
        raise NotImplementedError

    def plan(self, p: torch.Tensor, q: torch.Tensor, drafts) -> torch.Tensor:
        """pi(. | drafts): the distribution of the token this verifier outputs."""
        drafts = torch.as_tensor(drafts, dtype=torch.long, device=p.device)
        return self._plan(*_broadcast(p, q, drafts))

    def sample_batch(self, p, q, drafts, generator=None) -> torch.Tensor:
        """One output token per node: a LongTensor with the batch shape."""
        return drafting.draw(self.plan(p, q, drafts), 1, generator).squeeze(-1)

    def sample(self, p, q, drafts, generator: torch.Generator | None = None) -> int:
        return int(self.sample_batch(p, q, drafts, generator).reshape(-1)[0])

    def __repr__(self) -> str:
        return f"<verifier {self.name}>"


class RecursiveRejection(Verifier):
    """RRS: test the drafts in order against the running residual p_j.

    Draft j is accepted with min(1, p_j(x_j) / q_j(x_j)); on rejection
    p_{j+1} = norm((p_j - q_j)_+).  q_j is the conditional draft distribution
    of position j: q itself with replacement, q without the earlier drafts
    without replacement.  A duplicate draft has p_j(x) = 0, is rejected, and
    its residual update is still applied - skipping it biases the output.
    """

    def __init__(self, name, without_replacement, reference):
        self.name = name
        self.without_replacement = without_replacement
        self.schemes = ("without_replacement",) if without_replacement else ("with_replacement",)
        self.reference = reference

    def _plan(self, p, q, drafts):
        n = drafts.shape[-1]
        conditionals = drafting.without_drafts(q, drafts) if self.without_replacement else (q for _ in range(n))
        residual = p
        weights = []
        still_rejected = torch.ones(p.shape[:-1], dtype=p.dtype, device=p.device)
        for j, q_j in enumerate(conditionals):
            x = drafts[..., j]
            accept = _ratio(_take(residual, x), _take(q_j, x))
            weights.append(still_rejected * accept)
            still_rejected = still_rejected * (1.0 - accept)
            residual = _positive_part_normalised(residual - q_j, residual)
        return _mix(drafts, torch.stack(weights, -1), still_rejected, residual)


# kseq_rho narrows [1, n] by 2**RHO_STEPS: the root is within (n - 1) / 2**RHO_STEPS of the returned rho, below
# float64's resolution for n < 2**10.  Each round evaluates h at 2**b - 1 points: b = 4 where the grid of beta
# [rows, points, V] holds at most RHO_GRID float64s, so small that an op's cost is its launch (16 rounds instead of
# 64 halvings), else 2 or plain bisection (b = 1), which a real vocabulary takes: there a wider grid reads the
# vocabulary more often than the halvings it saves.
RHO_STEPS, RHO_GRID = 64, 1 << 12


def kseq_rho(p: torch.Tensor, q: torch.Tensor, n: int) -> torch.Tensor:
    """rho* for every node of a batch (p, q: [..., V]); float64 tensor of the batch shape.  A search for the sign
    change of h(rho) = 1 - (1 - beta)^n - rho beta over [1, n] (h(1) >= 0 >= h(n), one sign change), all rows at
    once in float64: tensor ops only, no host decision, so it runs inside a CUDA graph."""
    p, q = p.detach().double(), q.detach().double()
    batch = torch.broadcast_shapes(p.shape[:-1], q.shape[:-1])
    lo = torch.ones(batch, dtype=torch.float64, device=p.device)
    if n == 1:
        return lo
    entries = math.prod(batch) * p.shape[-1]
    bits = next(b for b in (4, 2, 1) if entries << b <= RHO_GRID or b == 1)
    grid = torch.arange(1, 1 << bits, dtype=torch.float64, device=p.device) / (1 << bits)  # [points]
    width, p, q = torch.full_like(lo, float(n - 1)), p.unsqueeze(-2), q.unsqueeze(-2)
    for _ in range(RHO_STEPS // bits):
        points = lo.unsqueeze(-1) + width.unsqueeze(-1) * grid  # [..., points]
        beta = torch.minimum(q, p / points.unsqueeze(-1)).sum(-1)
        above = (1.0 - (1.0 - beta) ** n - points * beta >= 0).sum(-1)  # h >= 0 on the points up to the root
        width = width / (1 << bits)
        lo = lo + width * above
    return lo + 0.5 * width


def kseq_beta(p: torch.Tensor, q: torch.Tensor, rho: torch.Tensor) -> torch.Tensor:
    return torch.minimum(q, p / rho.unsqueeze(-1).to(p.dtype)).sum(-1)


class KSeq(Verifier):
    """K-SEQ (SpecTr, Sun et al. 2023): accept x_j with min(1, p(x_j) / (rho* q(x_j))).

    Every draft, duplicates included, is tested with its own independent coin
    against the same p; if all n fail, the output comes from norm((p - rho* q)_+).
    With rho* solving 1 - (1 - beta)^n = rho* beta the mixture is exactly p.
    """

    name = "kseq"
    schemes = ("with_replacement",)
    reference = "K-SEQ, SpecTr (Sun et al. 2023); residual as in Hu et al. 2025, appendix A.2"

    def _plan(self, p, q, drafts):
        batch = p.shape[:-1]
        if all(stride == 0 for stride in p.stride()[:-1] + q.stride()[:-1]):
            # One node verified against many draft tuples: solve rho once.
            single = (0,) * len(batch)
            rho = kseq_rho(p[single], q[single], drafts.shape[-1]).expand(batch).to(p.dtype)
        else:
            rho = kseq_rho(p, q, drafts.shape[-1]).to(p.dtype)
        scaled_q = rho.unsqueeze(-1) * q
        accept = _ratio(p.gather(-1, drafts), scaled_q.gather(-1, drafts))  # independent coins
        survive = torch.cumprod(1.0 - accept, -1)
        before = torch.cat([torch.ones_like(survive[..., :1]), survive[..., :-1]], -1)
        residual = _positive_part_normalised(p - scaled_q, p)
        return _mix(drafts, before * accept, survive[..., -1], residual)


class GreedyVerifier(Verifier):
    """For greedy drafts (Top-(n-1) of q, then x_n ~ q' = q without them).

    Single-draft optimal transport of x_n against p using q': output x_n with
    min(1, p(x_n)/q'(x_n)), else a draw from norm((p - q')_+).  That residual
    keeps p's mass on the top tokens, which are drafts too, so the acceptance
    is p(Top) + sum_x min(p, q') = alpha* of the scheme.
    """

    name = "greedy"
    schemes = ("greedy",)
    reference = "Greedy verifier, Hu et al. 2025 ('Towards Optimal MDSD'), sec. 5.2 / app. D"

    def _plan(self, p, q, drafts):
        top, last = drafts[..., :-1], drafts[..., -1]
        top_mask = torch.zeros_like(q, dtype=torch.bool).scatter_(-1, top, True)
        rest = exclude(q, top_mask)
        accept = _ratio(_take(p, last), _take(rest, last))
        residual = _positive_part_normalised(p - rest, p)
        return _mix(last.unsqueeze(-1), accept.unsqueeze(-1), 1.0 - accept, residual)


class SpecHubVerifier(Verifier):
    """SpecHub (n = 2, a = argmax q, q' = q without a).

    Draft pairs are (i, a) with probability q(i) and (a, i) with probability
    Q(a, i) = q(a) q'(i).  The non-top draft i is accepted with
    min(1, p(i)/q(i)) in the pair (i, a) and with min(1, p'(i)/Q(a, i)),
    p'(i) = (p(i) - q(i))_+, in the pair (a, i); then a is accepted with
    probability p(a)/R, R = 1 - sum_i min(p(i), q'(i)) being the mass still
    unassigned; the rest goes to norm((p - q')_+) off a.  Acceptance equals
    p(a) + sum_i min(p, q') = alpha* of its draft distribution.
    """

    name = "spechub"
    schemes = ("spechub",)
    reference = "SpecHub, Sun et al. 2024 (EMNLP)"

    def _plan(self, p, q, drafts):
        if drafts.shape[-1] != 2:
            raise UsageError(f"spechub verifies exactly 2 drafts per node, got {drafts.shape[-1]}")
        a = top_tokens(q, 1)
        a_mask = torch.zeros_like(q, dtype=torch.bool).scatter_(-1, a, True)
        rest = exclude(q, a_mask)
        a = a.squeeze(-1)
        x1, x2 = drafts[..., 0], drafts[..., 1]
        a_first = x1 == a
        i = torch.where(a_first, x2, x1)
        p_i, q_i, rest_i = _take(p, i), _take(q, i), _take(rest, i)
        pair_prob = torch.where(a_first, _take(q, a) * rest_i, q_i)
        need = torch.where(a_first, (p_i - q_i).clamp_min(0.0), p_i)
        accept_i = _ratio(need, pair_prob)
        unassigned = 1.0 - torch.minimum(p, rest).sum(-1)
        accept_a = _ratio(_take(p, a), unassigned)
        residual = _positive_part_normalised((p - rest).masked_fill(a_mask, 0.0), p)
        after_i = 1.0 - accept_i
        return _mix(torch.stack([i, a], -1), torch.stack([accept_i, after_i * accept_a], -1),
                    after_i * (1.0 - accept_a), residual)


class TopKVerifier(Verifier):
    """Draw y ~ p and accept it if it is a draft: pi(. | drafts) = p.

    Optimal for deterministic drafts (acceptance p(drafts)); EAGLE-2's
    'accept x with p(x), else zero it and renormalise' walks the same plan.
    Lossless for any scheme, since the output ignores the drafts.
    """

    name = "topk"
    schemes = ("topk", "with_replacement", "without_replacement", "greedy", "spechub")
    reference = "sample-and-match, optimal for deterministic drafts (Hu et al. 2025; EAGLE-2)"

    def _plan(self, p, q, drafts):
        return p.clone()


VERIFIERS: dict[str, Verifier] = {
    v.name: v
    for v in (
        RecursiveRejection("rrs_w", False, "recursive rejection sampling with replacement (Chen et al. 2023, SpecInfer)"),
        RecursiveRejection("rrs_wo", True, "recursive rejection sampling without replacement (Jeon et al. 2024)"),
        KSeq(),
        GreedyVerifier(),
        SpecHubVerifier(),
        TopKVerifier(),
    )
}


def names() -> list[str]:
    return list(VERIFIERS)


def get(name: str | Verifier) -> Verifier:
    """The verifier called `name`."""
    if isinstance(name, Verifier):
        return name
    try:
        return VERIFIERS[name]
    except KeyError:
        raise UsageError(f"unknown verifier {name!r}: choose one of {', '.join(VERIFIERS)}") from None


def compatible(scheme, verifier) -> bool:
    """Whether `verifier` is lossless for drafts drawn by `scheme`."""
    return drafting.get(scheme).name in get(verifier).schemes


def check_pair(scheme, verifier) -> None:
    """Raise a one-line ValueError when the pair is not lossless."""
    s, v = drafting.get(scheme), get(verifier)
    if s.name not in v.schemes:
        valid = [name for name, ver in VERIFIERS.items() if s.name in ver.schemes]
        raise UsageError(
            f"verifier {v.name!r} is not lossless for {s.name!r} drafts: use one of {', '.join(valid)}"
        )


def pairs() -> list[tuple[str, str]]:
    """Every compatible (scheme, verifier) pair."""
    return [(s, v) for s in drafting.names() for v in VERIFIERS if compatible(s, v)]


def kseq_acceptance(p: torch.Tensor, q: torch.Tensor, n: int) -> torch.Tensor:
    """K-SEQ's closed-form acceptance 1 - (1 - beta(rho*))^n."""
    rho = kseq_rho(p, q, n).to(p.dtype)
    return 1.0 - (1.0 - kseq_beta(p, q, rho)) ** n

