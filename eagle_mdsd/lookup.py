"""Prompt-lookup drafts grafted onto the head's tree.

`TREE+lookup` (or `TREE+lookupN`) is TREE (static or dynamic) with one more
branch per cycle: find the first earlier occurrence of the context's last
two tokens (else of its last token), as transformers' prompt lookup does, and
propose the up to N (default 10) tokens that followed it.  The proposal joins
the drafted tree as a trie: it walks down the drafted children while its
tokens agree with theirs and hangs the rest below as a chain, so no token is
checked twice.  At T = 0 the walk takes the target's argmax at every node and
goes on while a child holds it: any tree reproduces greedy decoding that way.

At T > 0 a lookup draft is a draft whose distribution is one point (q = 1 on
the token): at a node on the lookup branch the engine first samples y from p
and takes the lookup child if y is its token (probability p(l)); otherwise
the node's head drafts are verified as usual against p without l,
renormalised - or y itself is the output when the node has no head drafts.
The output is l with probability p(l) and any other token t with
(1 - p(l)) p(t) / (1 - p(l)) = p(t): exact for every lossless verifier, as
tests/test_lookup.py checks statistically on a tiny target.  The other order
(the verifier on the head drafts against p, then the walk into whichever child
holds its output, the lookup child too) is exact as well and accepts some
draft at a node at least as often (one draft x ~ q under rejection sampling:
sum_t min(p(t), q(t)) + (p(l) - q(l))_+ against p(l) + sum_{t != l}
min(p(t), (1 - p(l)) q(t))), but it enters the lookup branch, usually the
deeper one, less often: on 16 MT-Bench questions at T = 1 it gave tau 1.71
against 1.77 on chain2+lookup4 and 1.81 against 1.85 on chain3+lookup4
(evaluation/results/lookup_t1_verifier_first_2026-11-25_bfloat16.md).

While the answer copies a span (a cycle accepted COPY_MIN or more lookup
drafts), the next cycle is a copy cycle: the target checks the lookup chain
alone and the head does not run - its pairs wait and the head catches up on
them at the next full cycle.  That makes a copying cycle as cheap as plain
prompt lookup's; the first cycle that accepts fewer goes back to full cycles.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from .errors import UsageError
from .tree import Tree

SUFFIX = "+lookup"
COPY_MIN = 3  # a cycle that accepts this many lookup drafts makes the next one a copy cycle
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


def split(spec: str) -> tuple[str, int | None]:
    """'eagle_default+lookup7' -> ('eagle_default', 7); no suffix -> (spec, None)."""
    base, found, count = spec.rpartition(SUFFIX)
    if not found:
        return spec, None
    tokens = int(count) if count.isdigit() else DEFAULT_TOKENS if not count else 0
    if not base or tokens < 1:
        raise UsageError(f"tree {spec!r}: write TREE{SUFFIX} or TREE{SUFFIX}N with N >= 1 lookup tokens, "
                         f"e.g. eagle_default{SUFFIX}10")
    return base, tokens


def continuation(context: list[int], tokens: int, ngram: int = NGRAM) -> list[int]:
    """The up to `tokens` tokens after the first earlier occurrence of the context's last n-gram."""
    for n in range(min(ngram, len(context) - 1), 0, -1):
        suffix = context[-n:]
        for start in range(len(context) - n):
            if context[start : start + n] == suffix:
                return context[start + n : start + n + tokens]
    return []


def agreement(tokens: list[int], proposal: list[int]) -> int:
    """How many leading tokens agree with the proposal."""
    count = 0
    for token, proposed in zip(tokens, proposal):
        if token != proposed:
            break
        count += 1
    return count


def graft(tree: Tree, node_tokens: torch.Tensor, proposal: list[int]) -> tuple[Tree, torch.Tensor, dict[int, int]]:
    """`tree` with `proposal` (tokens after the root) added as a trie branch (new nodes go last), its tokens,
    and the branch as {node: its child that holds the next proposal token}."""
    tokens = node_tokens.tolist()
    node, rest, branch = 0, list(proposal), {}
    while rest:
        child = next((c for c in tree.children[node] if tokens[c] == rest[0]), None)
        if child is None:
            break
        branch[node] = child
        node, rest = child, rest[1:]
    if not rest:
        return tree, node_tokens, branch
    parent, depth, paths = list(tree.parent), list(tree.depth), list(tree.paths)
    children = [list(kids) for kids in tree.children]
    first = len(parent)
    for _ in rest:
        new = len(parent)
        paths.append((paths[node - 1] if node else ()) + (len(children[node]),))
        parent.append(node)
        depth.append(depth[node] + 1)
        children[node].append(new)
        children.append([])
        branch[node] = new
        node = new
    ancestors = torch.zeros(len(parent), len(parent), dtype=torch.bool)
    ancestors[:first, :first] = tree.ancestors.cpu()
    for new in range(first, len(parent)):
        ancestors[new] = ancestors[parent[new]]
        ancestors[new, new] = True
    grafted = Tree(tree.name, tuple(paths), tuple(parent), tuple(depth), tuple(tuple(c) for c in children),
                   ancestors)
    return grafted, torch.cat([node_tokens, node_tokens.new_tensor(rest)]), branch
