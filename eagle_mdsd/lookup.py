"""Prompt-lookup drafts grafted onto the head's tree.

`TREE+lookup` (or `TREE+lookupN`) is TREE (static or dynamic) with one more
branch per cycle: find the first earlier occurrence of the context's last
two tokens (else of its last token), as transformers' prompt lookup does, and
propose the up to N (default 10) tokens that followed it.  The proposal joins
the drafted tree as a trie: it walks down the drafted children while its
tokens agree with theirs and hangs the rest below as a chain, so no token is
checked twice.  At T = 0 a node is accepted when its token is its parent's
argmax and its ancestors are accepted, and the deepest such node ends the path:
any tree reproduces greedy decoding that way.

At T > 0 a lookup draft is a draft whose distribution is one point (q = 1 on
the token): at a node on the lookup branch the engine first samples y from p
and takes the lookup child if y is its token (probability p(l)); otherwise
the node's head drafts are verified as usual against p without l,
renormalised - or y itself is the output when the node has no head drafts.
The output is l with probability p(l) and any other token t with
(1 - p(l)) p(t) / (1 - p(l)) = p(t): exact for every lossless verifier, as
tests/test_lookup.py checks statistically on a tiny target.  The other exact
order (the verifier on the head drafts first) enters the lookup branch, usually
the deeper one, less often (docs/benchmarks.md).

On the device (cycle.py) the context lives in a buffer, the n-gram search is a
comparison over it, and the proposal fills node slots reserved after the
drafted tree; the slots it does not need are marked not valid, so no walk
enters them.  Every node's one-point draft is a token or -1; the rule above is
a `torch.where` over draws made up front under graphs (cycle.node_outputs),
and the eager walk applies it at the nodes it visits (cycle.Cycle._walk).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch


SUFFIX = "+lookup"
DEFAULT_TOKENS = 10
NGRAM = 2  # transformers' max_matching_ngram_size default


@dataclass(frozen=True)
class LookupTree:
    base: object  # a tree.Tree or a dynamic.DynamicTree
    tokens: int = DEFAULT_TOKENS

    @property
    def label(self) -> str:
        base = getattr(self.base, "label", None) or self.base.name
        return f"{base}{SUFFIX}{self.tokens}"

    @property
    def size(self) -> int:
        return self.base.size + self.tokens

    @property
    def max_depth(self) -> int:
        return self.base.max_depth + self.tokens

    # The topology interface of tree.Tree.
    @property
    def fill(self) -> int:
        return self.base.fill

    @property
    def static(self) -> bool:
        return self.base.static

    @property
    def grafted(self) -> int:
        return self.tokens

    def check_scheme(self, scheme, vocab: int = 1 << 30) -> None:
        self.base.check_scheme(scheme, vocab)


def propose(context: torch.Tensor, length: torch.Tensor, tokens: int, ngram: int = NGRAM) -> tuple:
    """(proposal [tokens], count [1]): the up to `tokens` tokens after the first earlier occurrence of the last
    n-gram of context[:length] (n from `ngram` down to 1, the longest match wins), by tensor ops over the whole
    buffer context [C]; the proposal's first `count` tokens are real."""
    positions = torch.arange(len(context), device=context.device)
    start, found = torch.zeros_like(length), torch.zeros_like(length, dtype=torch.bool)
    for n in range(1, ngram + 1):  # the longest last: it overrides
        match = positions < length - n
        for i in range(n):  # context[s + i] == context[length - n + i]
            ahead = context.roll(-i) if i else context
            match = match & (ahead == context.index_select(0, (length - n + i).clamp_min(0)))
        hit = match.any().reshape(1)
        start = torch.where(hit, match.to(torch.int8).argmax().reshape(1) + n, start)
        found = found | hit
    offsets = torch.arange(tokens, device=context.device)
    proposal = context.index_select(0, (start + offsets).clamp_max(len(context) - 1))
    return proposal, torch.where(found, (length - start).clamp(0, tokens), 0)


def graft(parent, depth, tokens, valid, proposal, count, eager: bool = False) -> tuple:
    """A drafted tree's (parent, depth, tokens, valid) [M] with the proposal's first `count` tokens added as a
    trie branch: it walks down the drafted children while their tokens agree with it, and the rest hangs below
    as a chain in len(proposal) node slots after the drafted ones (those it does not fill are not valid).
    Returns the new (parent, depth, tokens, valid) [M + len(proposal)] and each node's one-point draft: the
    token of its child on the branch, or -1.  Once the walk leaves the drafted children every later step changes
    nothing: `eager` stops there, one host check a step."""
    nodes = torch.arange(len(parent), device=parent.device)
    node, going = nodes[:1], torch.ones(1, dtype=torch.bool, device=parent.device)
    point, steps = torch.full_like(tokens, -1), torch.zeros_like(nodes[:1])
    for j in range(len(proposal)):
        live = going & (j < count)
        point = point.index_copy(0, node, torch.where(live, proposal[j : j + 1], point.index_select(0, node)))
        hit = (parent == node) & (nodes > 0) & valid & (tokens == proposal[j])
        going = live & hit.any()
        if eager and not bool(going):
            break
        node = torch.where(going, hit.to(torch.int8).argmax().reshape(1), node)
        steps = steps + going.long()
    slots = torch.arange(len(proposal), device=parent.device)
    taken = steps + slots  # which proposal token each slot holds
    last = len(proposal) - 1
    return (torch.cat([parent, torch.where(slots == 0, node, len(parent) + slots - 1)]),
            torch.cat([depth, depth.index_select(0, node) + 1 + slots]),
            torch.cat([tokens, proposal.index_select(0, taken.clamp_max(last))]),
            torch.cat([valid, taken < count]),
            torch.cat([point, torch.where(taken + 1 < count, proposal.index_select(0, (taken + 1).clamp_max(last)),
                                          -1)]))
