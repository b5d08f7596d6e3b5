"""Optimal acceptance alpha*, its LP reference, and verifiers' acceptance rates.

alpha* = 1 + min over token subsets H of [P(H) - Q(H)], where P(H) = p(H) and
Q(H) is the probability that all n drafts fall in H (Hu et al. 2025,
"Towards Optimal Multi-Draft Speculative Decoding").  The minimiser is a
prefix of the tokens sorted by q/p in decreasing order, so one scan over V+1
prefixes suffices once Q is known on every prefix:

* with replacement:   Q(H) = q(H)^n;
* without replacement (sequential draws): an exponential race.  Token i
  arrives at an Exp(q_i) time and draws are arrival order, so with
  lam = 1 - q(H)
      Q(H) = 1 - lam * sum_{m<n} I_m(H),
      I_m(H) = int_0^inf e^{-t} e_m({e^{q_i t} - 1}_{i in H}) dt,
  e_m the elementary symmetric polynomial.  Along the sorted prefixes e_m
  obeys e_m(k) = sum_{i<=k} g_i e_{m-1}(i-1): a cumulative sum of positive
  terms, so all prefixes cost O(V) per quadrature node, without cancellation.
  The seed paper's ratio of symmetric polynomials is *not* this probability.
* greedy (and SpecHub, whose draft sets have the same law at n = 2):
  alpha* = p(Top_{n-1}) + sum_x min(p(x), q'(x)), q' = q without Top_{n-1};
* top-k (deterministic): alpha* = p(drafts).
"""

from __future__ import annotations

import itertools
import math

import numpy as np
import torch

from . import drafting, verification
from .errors import UsageError

__all__ = ["optimal_acceptance", "lp_optimal_acceptance", "acceptance_rate", "joint_distribution",
           "prefix_all_drafts_in", "Estimate"]

MAX_DRAFTS = 16  # alpha* without replacement sums 2^(n-1) heavy subsets: 45 s a node at n = 16, V = 50
_SCHEMES_WITH_ALPHA = ("with_replacement", "without_replacement", "greedy", "spechub", "topk")


def _as_numpy(x) -> np.ndarray:
    if isinstance(x, torch.Tensor):
        return x.detach().to("cpu", torch.float64).numpy()
    return np.asarray(x, dtype=np.float64)


def _log_time_rule(slowest: float, step: float = 0.25, low: float = -25.0):
    """Nodes and weights for integrals over (0, inf) in the variable u = log t.

    int f(t) dt = int f(e^u) e^u du, and the trapezoidal rule in u integrates
    every e^{-c t} with error ~ exp(-pi^2 / step) whatever the scale c (the
    integrand is analytic in the strip |Im u| < pi/2).  Decay rates 1 - q(T)
    can be tiny when q is peaked (1e-22 and below once a token holds nearly
    all of q), so the nodes reach t = 50 / `slowest` (the smallest rate), at
    least e^45 and at most e^700, float64's range.
    """
    high = min(700.0, max(45.0, math.log(50.0 / slowest)))
    u = np.arange(low, high + step / 2, step)
    t = np.exp(u)
    return t, step * t


def prefix_all_drafts_in(q_scan: np.ndarray, n: int, chunk: int = 16) -> np.ndarray:
    """Q(H_k) for sequential drafting without replacement, k = 0..V.

    H_k is the first k tokens of `q_scan` (q in scan order).  Requires at
    least n tokens with q > 0 (otherwise the drafts are deterministic); then
    every draft has q > 0, and Q(H_k) = 0 while H_k holds fewer than n of them.
    """
    q_scan = np.asarray(q_scan, dtype=np.float64)
    q_scan = q_scan / q_scan.sum()
    vocab = len(q_scan)
    outside = np.concatenate([np.cumsum(q_scan[::-1])[::-1], [0.0]])  # lam_k = q(H_k^c)
    total = np.zeros(vocab + 1)
    if n > 1:
        # I_1(H) = sum_{i in H} q_i / (1 - q_i); 1 - q_i of the heaviest token
        # loses its digits, so it is taken as the sum of the others.
        others = 1.0 - q_scan
        heaviest = int(np.argmax(q_scan))
        others[heaviest] = np.sort(np.delete(q_scan, heaviest)).sum()
        total[1:] = np.cumsum(q_scan / np.maximum(others, 1e-300))
    if n > 2:
        total += _quadrature_terms(q_scan, n, chunk)
    room = np.concatenate([[0], np.cumsum(q_scan > 0)]) >= n
    return np.where(room, np.clip(1.0 - outside * (1.0 + total), 0.0, 1.0), 0.0)


def _tail_sums(sorted_ascending: np.ndarray, count: int) -> np.ndarray:
    """tail[j] = sum of all but the j largest values, j = 0..count-1, summed from the small end."""
    sums = np.concatenate([[0.0], np.cumsum(sorted_ascending)])
    return sums[np.maximum(len(sorted_ascending) - np.arange(count), 0)]


def _quadrature_terms(q_scan: np.ndarray, n: int, chunk: int) -> np.ndarray:
    """sum_{m=2}^{n-1} I_m(H_k) for every prefix k, by quadrature in log t.

    The n-1 heaviest tokens are split off: e_m(H) = sum over the heavy subsets
    A inside H of prod_{i in A} g_i * e_{m-|A|}(light part of H).  Then every
    decay rate, 1 - q(A) - (the j largest light q), is a tail sum computed
    without cancellation, and the light recursion only ever meets exponents
    t * q_light that stay small where the integrand matters.
    """
    vocab = len(q_scan)
    heavy = np.argsort(-q_scan, kind="stable")[: n - 1]  # scan positions
    heavy_q = q_scan[heavy]
    light = np.ones(vocab, dtype=bool)
    light[heavy] = False
    light &= q_scan > 0
    light_sorted = np.sort(q_scan[light])
    light_top = np.concatenate([light_sorted[::-1][: n - 1], np.zeros(n - 1)])[: n - 1]
    light_tail = _tail_sums(light_sorted, n)
    # (heavy subset A, m): rate of e^{-t} prod_A g e_j(light) with j = m - |A|,
    # and the first prefix length that contains A.
    terms = []
    for m in range(2, n):
        for size in range(0, min(m, n - 1) + 1):
            for subset in itertools.combinations(range(n - 1), size):
                rest_heavy = np.sort(np.delete(heavy_q, list(subset))).sum()
                first = int(heavy[list(subset)].max()) + 1 if subset else 0
                terms.append((list(subset), m - size, rest_heavy + light_tail[m - size], first))
    nodes, weights = _kept_nodes(q_scan, n)
    q_light = torch.from_numpy(np.where(light, q_scan, 0.0))
    light_t = torch.from_numpy(light)
    total = torch.zeros(vocab + 1, dtype=torch.float64)
    for start in range(0, len(nodes), chunk):
        t = torch.from_numpy(nodes[start : start + chunk]).unsqueeze(1)
        w = torch.from_numpy(weights[start : start + chunk])
        arrived = -torch.expm1(-torch.from_numpy(heavy_q) * t)  # [G, n-1]: 1 - e^{-q_i t}
        log_arrived = torch.log(-torch.expm1(-q_light * t)).masked_fill(~light_t, -math.inf)
        # scaled[j][:, k] = e_j(light part of H_k) * exp(-t * light_top[:j].sum()), k = 0..V,
        # at most C(k, j); built in logs because a prefix without the larger
        # light tokens lies far below the float range while later terms need it.
        scaled = [torch.ones(len(t), vocab + 1, dtype=torch.float64)]
        log_prev = torch.zeros(len(t), vocab, dtype=torch.float64)
        for j in range(1, n):
            log_terms = t * (q_light - float(light_top[j - 1])) + log_arrived
            if j > 1:
                log_terms[:, 1:] += log_prev[:, :-1]
                log_terms[:, 0] = -math.inf
            log_prev = torch.logcumsumexp(log_terms, dim=1)
            scaled.append(torch.nn.functional.pad(torch.exp(log_prev), (1, 0)))
        grouped = {}  # terms sharing (j, first) share one product with scaled[j]
        for subset, j, rate, first in terms:
            coef = w * torch.exp(-t.squeeze(1) * rate)
            if subset:
                coef = coef * arrived[:, subset].prod(1)
            grouped[j, first] = grouped.get((j, first), 0.0) + coef
        for (j, first), coef in grouped.items():
            total[first:] += (coef @ scaled[j])[first:]
    return total.numpy()


def _kept_nodes(q_scan: np.ndarray, n: int):
    """Quadrature nodes whose contribution can exceed 1e-18 for some prefix.

    e^{-t} e_m <= e^{-t} expm1(t)^m / m!  and  <= C(V, m) e^{-t (1 - T_m)}.
    """
    vocab = len(q_scan)
    rest = _tail_sums(np.sort(q_scan), n)
    nodes, weights = _log_time_rule(slowest=rest[n - 1])
    log_bound = np.full_like(nodes, -np.inf)
    log_expm1 = nodes + np.log(-np.expm1(-nodes))
    for m in range(2, n):
        small_t = -nodes + m * log_expm1 - math.lgamma(m + 1)
        large_t = math.log(math.comb(vocab, m)) - nodes * rest[m]
        log_bound = np.maximum(log_bound, np.log(weights) + np.minimum(small_t, large_t))
    keep = log_bound > math.log(1e-18)
    return nodes[keep], weights[keep]


def _scan(p: np.ndarray, q: np.ndarray):
    """Tokens in decreasing q/p (p = 0 first: they only add to Q) and P(H_k)."""
    with np.errstate(divide="ignore", invalid="ignore"):
        key = np.where(p > 0, q / np.where(p > 0, p, 1.0), np.inf)
    order = np.argsort(-key, kind="stable")
    return order, np.concatenate([[0.0], np.cumsum(p[order])])


def _normalise(x: np.ndarray, what: str) -> np.ndarray:
    if x.ndim != 1 or (x < 0).any() or not np.isfinite(x).all() or x.sum() <= 0:
        raise ValueError(f"{what} must be a finite, non-negative 1-D distribution")
    return x / x.sum()


def optimal_acceptance(p, q, n: int, scheme: str) -> float:
    """alpha*: the best acceptance any lossless verifier reaches for `scheme`'s drafts."""
    scheme = drafting.get(scheme)
    if scheme.name not in _SCHEMES_WITH_ALPHA:
        raise ValueError(f"no alpha* for scheme {scheme.name!r}")
    p, q = _normalise(_as_numpy(p), "p"), _normalise(_as_numpy(q), "q")
    scheme.check(n, len(q))
    if scheme.name == "topk":
        return float(p[drafting.top_tokens(torch.from_numpy(q), n).numpy()].sum())
    if scheme.name in ("greedy", "spechub"):
        top = drafting.top_tokens(torch.from_numpy(q), n - 1)
        mask = torch.zeros(len(q), dtype=torch.bool).scatter_(0, top, True)
        rest = drafting.exclude(torch.from_numpy(q), mask).numpy()
        return float(p[mask.numpy()].sum() + np.minimum(p, rest)[~mask.numpy()].sum())
    if scheme.name == "without_replacement" and (q > 0).sum() < n:
        # Fewer positive tokens than drafts: the draft set is deterministic.
        support = np.flatnonzero(q > 0)
        fill = np.flatnonzero(q == 0)[: n - len(support)]
        return float(p[support].sum() + p[fill].sum())
    order, p_prefix = _scan(p, q)
    if scheme.name == "with_replacement":
        q_prefix = np.concatenate([[0.0], np.cumsum(q[order])]) ** n
    else:
        check_drafts(n, "n")
        q_prefix = prefix_all_drafts_in(q[order], n)
    return float(np.clip(1.0 + np.min(p_prefix - q_prefix), 0.0, 1.0))


def check_drafts(n: int, option: str) -> None:
    """One-line error for more drafts than alpha* can be computed for in reasonable time."""
    if n > MAX_DRAFTS:
        raise UsageError(f"--{option} {n}: at most {MAX_DRAFTS} drafts (alpha* without replacement sums 2^(n-1) "
                         f"terms a node, hours beyond that)")


def joint_distribution(scheme, q, n: int) -> dict[tuple[int, ...], float]:
    """Every ordered draft tuple with positive probability (small V only)."""
    scheme = drafting.get(scheme)
    q = torch.as_tensor(_as_numpy(q))
    scheme.check(n, len(q))
    tuples = _all_tuples(len(q), n)
    probs = scheme.probabilities(q.expand(len(tuples), -1), tuples)
    keep = probs > 0
    return {tuple(t): float(pr) for t, pr in zip(tuples[keep].tolist(), probs[keep].tolist())}


def _all_tuples(vocab: int, n: int) -> torch.Tensor:
    return torch.tensor(list(itertools.product(range(vocab), repeat=n)), dtype=torch.long).reshape(-1, n)


def lp_optimal_acceptance(p, joint: dict) -> float:
    """The optimal transport LP between p and the draft-set law, solved by HiGHS.

    Variables pi(S, x) >= 0 for each draft set S and token x; row sums are
    P(S), column sums p(x); maximise the mass where x is in S.  The reference
    for small vocabularies.
    """
    from scipy.optimize import linprog
    from scipy.sparse import coo_matrix

    p = _normalise(_as_numpy(p), "p")
    vocab = len(p)
    sets: dict[frozenset, float] = {}
    for drafts, prob in joint.items():
        key = frozenset(int(x) for x in drafts)
        sets[key] = sets.get(key, 0.0) + float(prob)
    set_list = list(sets)
    n_vars = len(set_list) * vocab
    # Row sums equal P(S); column sums at most p(x), which is the same polytope
    # since both total 1, and stays feasible under rounding.
    variables = np.arange(n_vars)
    rows_eq = variables // vocab
    a_eq = coo_matrix((np.ones(n_vars), (rows_eq, variables)), shape=(len(set_list), n_vars))
    a_ub = coo_matrix((np.ones(n_vars), (variables % vocab, variables)), shape=(vocab, n_vars))
    b_eq = np.array([sets[s] for s in set_list])
    b_eq /= b_eq.sum()
    gain = np.zeros(n_vars)
    for s, members in enumerate(set_list):
        for x in members:
            gain[s * vocab + x] = 1.0
    result = linprog(-gain, A_ub=a_ub.tocsr(), b_ub=p, A_eq=a_eq.tocsr(), b_eq=b_eq, bounds=(0, None),
                     method="highs-ds", options={"primal_feasibility_tolerance": 1e-10,
                                                 "dual_feasibility_tolerance": 1e-10})
    if not result.success:
        raise RuntimeError(f"the transport LP failed: {result.message}")
    return float(-result.fun)


class Estimate(float):
    """A float with the half-width of its 95% confidence interval (0 when exact)."""

    def __new__(cls, value: float, half_width: float = 0.0, method: str = "exact"):
        obj = super().__new__(cls, value)
        obj.half_width, obj.method = float(half_width), method
        return obj

    def __repr__(self) -> str:
        return f"{float(self):.6f}" + (f" +- {self.half_width:.6f} ({self.method})" if self.half_width else "")


def _accepted_mass(plans: torch.Tensor, drafts: torch.Tensor) -> torch.Tensor:
    in_drafts = torch.zeros_like(plans, dtype=torch.bool).scatter_(-1, drafts, True)
    return (plans * in_drafts).sum(-1)


def acceptance_rate(scheme, verifier, p, q, n: int, *, samples: int = 20000, max_tuples: int = 50000,
                    generator: torch.Generator | None = None, chunk: int = 256) -> Estimate:
    """Probability that the verifier outputs one of the drafts.

    Exact by enumerating the ordered tuples when V^n <= max_tuples (`chunk` at a time); K-SEQ,
    greedy/SpecHub and top-k drafts have closed forms at any V; otherwise a
    Monte Carlo mean of P(accept | drafts) over `samples` draft tuples with a
    95% normal confidence interval.
    """
    scheme, verifier = drafting.get(scheme), verification.get(verifier)
    verification.check_pair(scheme, verifier)
    p_t = torch.as_tensor(_normalise(_as_numpy(p), "p"))
    q_t = torch.as_tensor(_normalise(_as_numpy(q), "q"))
    vocab = len(p_t)
    scheme.check(n, vocab)
    if verifier.name == "kseq":
        return Estimate(float(verification.kseq_acceptance(p_t, q_t, n)))
    if verifier.name in ("greedy", "spechub") or scheme.name == "topk":
        return Estimate(optimal_acceptance(p_t, q_t, n, scheme.name))
    if vocab**n <= max_tuples:  # `chunk` tuples at a time: their plans are [chunk, V], not [V^n, V]
        tuples, total = _all_tuples(vocab, n), 0.0
        for part in tuples.split(chunk):
            probs = scheme.probabilities(q_t.expand(len(part), -1), part)
            keep = probs > 0
            total += float((probs[keep] * _accepted_mass(verifier.plan(p_t, q_t, part[keep]), part[keep])).sum())
        return Estimate(total)
    values = []
    for start in range(0, samples, chunk):
        size = min(chunk, samples - start)
        drafts = scheme.sample_batch(q_t.expand(size, -1), n, generator)
        values.append(_accepted_mass(verifier.plan(p_t, q_t, drafts), drafts))
    values = torch.cat(values)
    half = 1.96 * float(values.std()) / math.sqrt(len(values))
    return Estimate(float(values.mean()), half, f"monte carlo, {len(values)} samples")
