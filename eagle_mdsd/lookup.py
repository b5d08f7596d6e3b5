"""Prompt-lookup drafts grafted onto the head's tree, at temperature 0.

`TREE+lookup` (or `TREE+lookupN`) is TREE (static or dynamic) with one more
branch per cycle: find the first earlier occurrence of the context's last
two tokens (else of its last token), as transformers' prompt lookup does, and
propose the up to N (default 10) tokens that followed it.  The proposal joins
the drafted tree as a trie: it walks down the drafted children while its
tokens agree with theirs and hangs the rest below as a chain, so no token is
checked twice.  The walk then takes the target's argmax at every node and
goes on while a child holds it: any tree reproduces greedy decoding that way.
Lookup drafts come with no draft distribution, so temperatures above 0 are
refused rather than verified approximately.

While the answer copies a span (a cycle accepted COPY_MIN or more lookup
drafts), the next cycle is a copy cycle: the target checks the lookup chain
alone and the head does not run - its pairs wait and the head catches up on
them at the next full cycle.  That makes a copying cycle as cheap as plain
prompt lookup's; the first cycle that accepts fewer goes back to full cycles.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

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


def split(spec: str) -> tuple[str, int | None]:
    """'eagle_default+lookup7' -> ('eagle_default', 7); no suffix -> (spec, None)."""
    base, found, count = spec.rpartition(SUFFIX)
    if not found:
        return spec, None
    tokens = int(count) if count.isdigit() else DEFAULT_TOKENS if not count else 0
    if not base or tokens < 1:
        raise ValueError(f"tree {spec!r}: write TREE{SUFFIX} or TREE{SUFFIX}N with N >= 1 lookup tokens, "
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


def graft(tree: Tree, node_tokens: torch.Tensor, proposal: list[int]) -> tuple[Tree, torch.Tensor]:
    """`tree` with `proposal` (tokens after the root) added as a trie branch; new nodes go last."""
    tokens = node_tokens.tolist()
    node, rest = 0, list(proposal)
    while rest:
        child = next((c for c in tree.children[node] if tokens[c] == rest[0]), None)
        if child is None:
            break
        node, rest = child, rest[1:]
    if not rest:
        return tree, node_tokens
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
        node = new
    ancestors = torch.zeros(len(parent), len(parent), dtype=torch.bool)
    ancestors[:first, :first] = tree.ancestors.cpu()
    for new in range(first, len(parent)):
        ancestors[new] = ancestors[parent[new]]
        ancestors[new, new] = True
    grafted = Tree(tree.name, tuple(paths), tuple(parent), tuple(depth), tuple(tuple(c) for c in children),
                   ancestors)
    return grafted, torch.cat([node_tokens, node_tokens.new_tensor(rest)])
