"""Multi-draft drafting schemes: how the n sibling drafts of a tree node are drawn.

Every scheme is sequential: draft j is drawn from a *conditional* distribution
q_j(. | x_1..x_{j-1}) derived from the node's draft distribution q.  The joint
probability of an ordered draft tuple is the product of those conditionals, so
it is explicit and enumerable - which is what makes verifiers provable.

One convention covers distributions with fewer than n positive tokens (for
example a one-hot q at temperature 0): once q has no mass left outside the
tokens already drawn, the next draft is the lowest-index token not drawn yet,
deterministically.  `exclude` implements it; every scheme and verifier uses it.

All functions take q as a tensor [..., V] (a batch of nodes) and drafts as a
LongTensor [..., n].
"""

from __future__ import annotations

import torch

from .errors import UsageError

__all__ = [
    "DraftScheme", "SCHEMES", "get", "names", "exclude", "top_tokens", "draw", "pick",
]


def exclude(q: torch.Tensor, drawn: torch.Tensor) -> torch.Tensor:
    """q restricted to tokens not in the boolean mask `drawn`, renormalised.

    Where no mass is left, the result is one-hot on the lowest-index token
    that is not drawn (the fill convention of this module).
    """
    return _normalise_or_fill(q.masked_fill(drawn, 0.0), lambda: drawn)


def without_token(p: torch.Tensor, token) -> torch.Tensor:
    """p [..., V] without one token a row (an int, or a tensor of the batch shape; -1: none), renormalised: what a
    node's drafts are verified against once a one-point draft of that token (prompt lookup's) is rejected."""
    vocabulary = torch.arange(p.shape[-1], device=p.device)
    return exclude(p, (vocabulary == torch.as_tensor(token, device=p.device)[..., None]).expand(p.shape))


def _normalise_or_fill(rest: torch.Tensor, drawn) -> torch.Tensor:
    """rest / rest.sum(); rows without mass become one-hot on the first token not in drawn().  Tensor ops only:
    no row's mass is brought back to the host to pick a branch."""
    mass = rest.sum(-1, keepdim=True)
    first_free = (~drawn()).to(torch.int8).argmax(-1, keepdim=True)
    fill = torch.zeros_like(rest).scatter_(-1, first_free, 1.0)
    return torch.where(mass > 0, rest / mass.clamp_min(torch.finfo(rest.dtype).tiny), fill)


def without_drafts(q: torch.Tensor, drafts: torch.Tensor):
    """The conditionals q_1, q_2, ... of sequential drawing without replacement.

    Yields q_j = q without drafts[..., :j-1], renormalised, for j = 1..n,
    updating one token per step rather than re-masking the vocabulary.
    """
    rest = q.clone()
    for j in range(drafts.shape[-1]):
        yield _normalise_or_fill(rest, lambda: _mask_of(drafts[..., :j], q.shape[-1]))
        rest.scatter_(-1, drafts[..., j : j + 1], 0.0)


_INDEX_SPAN = 1 << 24  # vocabularies up to 16M tokens


def top_tokens(q: torch.Tensor, k: int) -> torch.Tensor:
    """The k most probable tokens in decreasing order, ties broken by lowest index."""
    if k == 0:
        return q.new_zeros(q.shape[:-1] + (0,), dtype=torch.long)
    index = torch.arange(q.shape[-1], device=q.device)
    if q.dtype != torch.float64:
        # The bits of a non-negative float32 order as its value: one integer key per token, the value first and
        # the lower index second, makes topk's order the rule's exactly, with no tie to resolve afterwards.
        bits = q.float().view(torch.int32).to(torch.int64)
        return torch.topk(bits * _INDEX_SPAN - index, k, dim=-1).indices
    # float64 (the exact reference computations): the same rule by two stable sorts over the tokens at or
    # above the k-th value (few, unless ties cross the cut).
    threshold = torch.topk(q, k, dim=-1).values[..., -1:]
    candidates = torch.where(q >= threshold, index, q.shape[-1])
    count = int((q >= threshold).sum(-1).max())
    key = torch.sort(candidates, dim=-1).values[..., :count]
    values = q.gather(-1, key.clamp_max(q.shape[-1] - 1)).masked_fill(key == q.shape[-1], -1.0)
    return key.gather(-1, torch.sort(values, dim=-1, descending=True, stable=True).indices[..., :k])


def _mask_of(tokens: torch.Tensor, vocab: int) -> torch.Tensor:
    mask = torch.zeros(tokens.shape[:-1] + (vocab,), dtype=torch.bool, device=tokens.device)
    return mask.scatter_(-1, tokens, True)


_BLOCK = 1024


def warp(logits: torch.Tensor, temperature: float) -> torch.Tensor:
    """Target distribution at `temperature`; one-hot argmax at 0 (float32).  The largest logit is taken off
    before dividing: at a tiny temperature the quotient of the others then goes to -inf, not inf - inf = nan."""
    if temperature == 0:
        return torch.zeros_like(logits, dtype=torch.float32).scatter_(-1, logits.argmax(-1, keepdim=True), 1.0)
    logits = logits.float()
    return torch.softmax((logits - logits.amax(-1, keepdim=True)) / temperature, -1)


def draw(dist: torch.Tensor, count: int = 1, generator: torch.Generator | None = None) -> torch.Tensor:
    """`count` i.i.d. tokens per row of dist [..., V] (need not be normalised): [..., count]."""
    uniform = torch.rand(dist.shape[:-1] + (count,), generator=generator, dtype=torch.float64, device=dist.device)
    return pick(dist, uniform)


def pick(dist: torch.Tensor, uniform: torch.Tensor) -> torch.Tensor:
    """The tokens [..., count] at the given float64 uniforms [..., count] of dist [..., V]'s inverse CDF.

    In two levels: pick a block of 1024 tokens by its mass, then a token inside it.  On a CPU this is an order
    of magnitude cheaper than torch.multinomial (which spends its time generating randomness over the whole
    row) and than a float64 cumulative sum over the whole vocabulary.
    """
    vocab = dist.shape[-1]
    if vocab <= 16 * _BLOCK:
        cdf = dist.to(torch.float64).cumsum(-1)
        return torch.searchsorted(cdf, uniform * cdf[..., -1:], right=True).clamp_max(vocab - 1)
    blocks = -(-vocab // _BLOCK)
    padded = torch.nn.functional.pad(dist, (0, blocks * _BLOCK - vocab)).unflatten(-1, (blocks, _BLOCK))
    block_cdf = padded.sum(-1, dtype=torch.float64).cumsum(-1)
    target = uniform * block_cdf[..., -1:]
    block = torch.searchsorted(block_cdf, target, right=True).clamp_max(blocks - 1)
    before = torch.where(block > 0, block_cdf.gather(-1, (block - 1).clamp_min(0)), 0.0)
    inside = padded.gather(-2, block.unsqueeze(-1).expand(block.shape + (_BLOCK,))).to(torch.float64)
    inner_cdf = inside.cumsum(-1)
    # Rescale to the block's own cumulative total so rounding cannot step past it.
    offset = ((target - before) / (block_cdf.gather(-1, block) - before) * inner_cdf[..., -1]).unsqueeze(-1)
    position = torch.searchsorted(inner_cdf, offset, right=True).squeeze(-1)
    last_positive = _BLOCK - 1 - (inside.flip(-1) > 0).to(torch.int8).argmax(-1)
    position = torch.minimum(position, last_positive)
    return block * _BLOCK + position


def _sample(dist: torch.Tensor, generator: torch.Generator | None) -> torch.Tensor:
    """One token per row of dist [..., V]."""
    return draw(dist, 1, generator).squeeze(-1)


def _check_n(n: int, vocab: int, distinct: bool) -> None:
    if n < 1:
        raise UsageError(f"number of drafts must be at least 1, got {n}")
    if distinct and n > vocab:
        raise UsageError(f"cannot draw {n} distinct drafts from a vocabulary of {vocab}: use n <= {vocab}")


class DraftScheme:
    """Interface: subclasses define `sample_batch` and `probabilities`."""

    name: str = ""
    distinct: bool = True  # drafts are distinct tokens
    reference: str = ""

    def sample_batch(self, q: torch.Tensor, n: int, generator=None) -> torch.Tensor:
        raise NotImplementedError

    def probabilities(self, q: torch.Tensor, drafts: torch.Tensor) -> torch.Tensor:
        raise NotImplementedError

    def check(self, n: int, vocab: int) -> None:
        _check_n(n, vocab, self.distinct)

    def sample(self, q: torch.Tensor, n: int, generator: torch.Generator | None = None) -> torch.Tensor:
        """An ordered draft tuple LongTensor[n] for one node's q [V]."""
        self.check(n, q.shape[-1])
        return self.sample_batch(q.unsqueeze(0), n, generator)[0]

    def probability(self, q: torch.Tensor, drafts) -> float:
        """Probability of the ordered tuple `drafts` under this scheme."""
        drafts = torch.as_tensor(drafts, dtype=torch.long, device=q.device)
        return float(self.probabilities(q.unsqueeze(0), drafts.unsqueeze(0))[0])

    def __repr__(self) -> str:
        return f"<drafting scheme {self.name}>"


class WithReplacement(DraftScheme):
    name = "with_replacement"
    distinct = False
    reference = "i.i.d. drafts from q (SpecTr, Sun et al. 2023; RRS, Chen et al. 2023)"

    def sample_batch(self, q, n, generator=None):
        self.check(n, q.shape[-1])
        return draw(q, n, generator)

    def probabilities(self, q, drafts):
        return q.gather(-1, drafts).prod(-1)


class WithoutReplacement(DraftScheme):
    name = "without_replacement"
    reference = "draws without replacement, as torch.multinomial(replacement=False), by Gumbel top-k (Jeon et al. 2024)"

    def sample_batch(self, q, n, generator=None):
        """Gumbel top-k: the n largest log q + Gumbel noise, in decreasing order, are an ordered sample without
        replacement with the sequential scheme's probabilities (`probabilities`), in one draw per row.  Tokens of
        no mass rank below every other, lowest id first: the fill convention."""
        self.check(n, q.shape[-1])
        uniform = torch.rand(q.shape, generator=generator, dtype=torch.float64, device=q.device)
        noise = -torch.log(-torch.log(uniform.clamp_min(torch.finfo(torch.float64).tiny)))
        index = torch.arange(q.shape[-1], device=q.device, dtype=torch.float64)
        key = torch.where(q > 0, q.double().clamp_min(torch.finfo(torch.float64).tiny).log() + noise, -1e9 - index)
        return torch.topk(key, n, dim=-1).indices

    def probabilities(self, q, drafts):
        prob = torch.ones(q.shape[:-1], dtype=q.dtype, device=q.device)
        for j, q_j in enumerate(without_drafts(q, drafts)):
            prob = prob * q_j.gather(-1, drafts[..., j : j + 1]).squeeze(-1)
        return prob


class Greedy(DraftScheme):
    name = "greedy"
    reference = "Top-(n-1) of q plus one draw from the rest (Hu et al. 2025, 'Towards Optimal MDSD', sec. 5)"

    def sample_batch(self, q, n, generator=None):
        self.check(n, q.shape[-1])
        top = top_tokens(q, n - 1)
        last = _sample(exclude(q, _mask_of(top, q.shape[-1])), generator)
        return torch.cat([top, last.unsqueeze(-1)], -1)

    def probabilities(self, q, drafts):
        n = drafts.shape[-1]
        top = top_tokens(q, n - 1)
        is_top = (drafts[..., : n - 1] == top).all(-1)
        rest = exclude(q, _mask_of(top, q.shape[-1]))
        return torch.where(is_top, rest.gather(-1, drafts[..., n - 1 :]).squeeze(-1), 0.0)


class SpecHub(DraftScheme):
    name = "spechub"
    reference = "SpecHub, Sun et al. 2024 (EMNLP): a = argmax q, x1 ~ q, x2 = a or a draw from q without a"

    def check(self, n, vocab):
        if n != 2:
            raise UsageError(f"spechub draws exactly 2 drafts per node, got n={n}: use a tree with 2 children per node")
        _check_n(n, vocab, True)

    def sample_batch(self, q, n, generator=None):
        self.check(n, q.shape[-1])
        a = top_tokens(q, 1).squeeze(-1)
        first = _sample(q, generator)
        other = _sample(exclude(q, _mask_of(a.unsqueeze(-1), q.shape[-1])), generator)
        second = torch.where(first == a, other, a)
        return torch.stack([first, second], -1)

    def probabilities(self, q, drafts):
        a = top_tokens(q, 1)
        rest = exclude(q, _mask_of(a, q.shape[-1]))
        a = a.squeeze(-1)
        x1, x2 = drafts[..., 0], drafts[..., 1]
        q_a = q.gather(-1, a.unsqueeze(-1)).squeeze(-1)
        first_is_a = q_a * rest.gather(-1, x2.unsqueeze(-1)).squeeze(-1)
        second_is_a = q.gather(-1, x1.unsqueeze(-1)).squeeze(-1)
        return torch.where(x1 == a, torch.where(x2 != a, first_is_a, 0.0),
                           torch.where(x2 == a, second_is_a, 0.0))


class TopK(DraftScheme):
    name = "topk"
    reference = "the n most probable tokens of q, deterministic (EAGLE at T=0, EAGLE-2, OPT-Tree)"

    def sample_batch(self, q, n, generator=None):
        self.check(n, q.shape[-1])
        return top_tokens(q, n)

    def probabilities(self, q, drafts):
        return (drafts == top_tokens(q, drafts.shape[-1])).all(-1).to(q.dtype)


SCHEMES: dict[str, DraftScheme] = {
    s.name: s for s in (WithReplacement(), WithoutReplacement(), Greedy(), SpecHub(), TopK())
}


def names() -> list[str]:
    return list(SCHEMES)


def get(name: str | DraftScheme) -> DraftScheme:
    """The drafting scheme called `name`."""
    if isinstance(name, DraftScheme):
        return name
    try:
        return SCHEMES[name]
    except KeyError:
        raise UsageError(f"unknown drafting scheme {name!r}: choose one of {', '.join(SCHEMES)}") from None
