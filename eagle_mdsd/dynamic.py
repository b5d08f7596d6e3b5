"""Dynamic draft trees, grown anew every cycle from the head's own probabilities.

EAGLE-2 (Li et al. 2024): expand the tree depth by depth; at each depth the
`top_k` candidates with the highest path score (the product of the head's
probabilities along the path, kept as a sum of logs) are expanded into their
`top_k` children; after `depth` levels every candidate is ranked by path
score and the best `nodes` become the tree the target checks.  A child's
score never exceeds its parent's, so the chosen set always holds its
ancestors.

OPT-Tree (Wang et al. 2024) asks for the tree that maximises the expected
accepted length sum_v prod_{path} q under a node budget: the top-`nodes`
candidates by path score are that tree for the candidates grown so far, and
growing stops once a depth's expanded candidates carry less expected length
(the sum of their path probabilities) than `threshold`, or at `max_depth`.

Children are drawn per expanded node by any drafting scheme: `topk` (the
most probable tokens, deterministic; EAGLE-2's and OPT-Tree's choice, with
the `topk` verifier) or a sampled one such as `greedy` (Top-(k-1) plus one
draw from the rest).  A child's score is its log-probability under q; the
greedy scheme's sampled child stands for all the mass outside the top k-1
and scores log of that mass, whatever token it drew.

Why verification stays exact with sampled children: the verifier at an
expanded node sees the node's whole draft tuple (as drawn, pruned children
included, and also where none was kept: `verified`), so its output token is
distributed as p there whatever the selection kept; a kept child only lets
the walk go on when the output equals it.  What must
not happen is that reaching a node depends on the node's own draws.  Scores
never grow along a path and ties go to the shallower candidate, so no
descendant of a node ranks above it, and (by induction over depths) every
candidate that does rank above it was grown whatever the node drew: whether
a node is kept never depends on its subtree.  EAGLE-2 grows a fixed number
of levels, so this holds; OPT-Tree's stopping rule sums the scores of drawn
children, so a node's draws could decide whether deeper, better candidates
exist and push it out: OPT-Tree takes deterministic children only.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch

from . import tree as static_trees
from . import drafting, lookup
from .errors import UsageError

NAMES = ("eagle2", "opt_tree")


@dataclass(frozen=True)
class DynamicTree:
    name: str
    nodes: int                # draft tokens the target checks per cycle
    max_depth: int
    top_k: int                # children per expanded node, and nodes expanded per depth
    threshold: float = 0.0    # opt_tree: stop growing below this expected gain

    @property
    def label(self) -> str:
        if self.name == "eagle2":
            return f"eagle2:total_tokens={self.nodes + 1},depth={self.max_depth},top_k={self.top_k}"
        return f"opt_tree:nodes={self.nodes},threshold={self.threshold:g},max_depth={self.max_depth},top_k={self.top_k}"

    @property
    def size(self) -> int:
        """Most entries a cycle adds to a cache: the tree, or the head's expansions."""
        return max(self.nodes, self.top_k * self.max_depth)

    # The topology interface of tree.Tree.
    @property
    def fill(self) -> int:
        return self.top_k

    static = False
    grafted = 0

    def check_scheme(self, scheme, vocab: int = 1 << 30) -> None:
        check_pair(self, scheme)


# EAGLE-2's released defaults (total_token 60, depth 5 after the first level, top_k 10); OPT-Tree's budget.
DEFAULTS = {"eagle2": {"total_tokens": 60, "depth": 6, "top_k": 10},
            "opt_tree": {"nodes": 40, "threshold": 0.1, "max_depth": 10, "top_k": 8}}


def _flags(options) -> str:
    """The CLI flags of options: ['total_tokens', 'top_k'] -> '--total-tokens, --top-k'."""
    return ", ".join("--" + option.replace("_", "-") for option in options)


def load(spec: str, **overrides):
    """A static tree (tree.load) or a dynamic one: 'eagle2', 'opt_tree', or with options such as
    'eagle2:total_tokens=16,depth=5,top_k=4'; `overrides` (CLI flags, None = unset) apply first.
    Any of them + 'lookup' or 'lookupN': prompt-lookup drafts grafted on at temperature 0 (lookup.py)."""
    base, tokens = lookup.split(spec)
    if tokens is not None:
        return lookup.LookupTree(load(base, **overrides), tokens)
    name, _, options = spec.partition(":")
    given = {key: value for key, value in overrides.items() if value is not None}
    if name not in NAMES:
        if given:
            raise UsageError(f"{_flags(given)} shape dynamic trees ({', '.join(NAMES)}), not tree {spec!r}: drop "
                             f"{'it' if len(given) == 1 else 'them'} or pick a dynamic tree")
        return static_trees.load(spec)
    values = dict(DEFAULTS[name])
    unused = [key for key in given if key not in values]
    if unused:
        raise UsageError(f"{name} does not take {_flags(unused)} (it takes {_flags(values)}): drop "
                         f"{'it' if len(unused) == 1 else 'them'}")
    values.update(given)
    for item in filter(None, options.split(",")):
        key, _, raw = item.partition("=")
        if key not in values:
            raise UsageError(f"tree {spec!r}: unknown option {key!r}; {name} takes {', '.join(values)}")
        try:
            values[key] = type(values[key])(raw)
        except ValueError:
            raise UsageError(f"tree {spec!r}: {key} must be a number, got {raw!r}") from None
    if name == "eagle2":
        if values["total_tokens"] < 2:
            raise UsageError(f"eagle2: --total-tokens (total_tokens) counts the root and its drafts, so it must be "
                             f"at least 2, got {values['total_tokens']}")
        return make(name, values["total_tokens"] - 1, values["depth"], values["top_k"])
    return make(name, values["nodes"], values["max_depth"], values["top_k"], values["threshold"])


def make(name: str, nodes: int, max_depth: int, top_k: int, threshold: float = 0.0) -> DynamicTree:
    """A dynamic tree spec; every bad value is a one-line error."""
    if name not in NAMES:
        raise UsageError(f"unknown dynamic tree {name!r}: use one of {', '.join(NAMES)}")
    for label, value in (("nodes (--nodes)", nodes), ("depth", max_depth), ("top-k", top_k)):
        if value < 1:
            raise UsageError(f"{name}: {label} must be at least 1, got {value}")
    if nodes > static_trees.MAX_NODES:
        raise UsageError(f"{name}: at most {static_trees.MAX_NODES} nodes are supported, got {nodes}")
    if threshold < 0:
        raise UsageError(f"{name}: --threshold must be >= 0, got {threshold}")
    return DynamicTree(name, nodes, max_depth, top_k, threshold)


def check_pair(spec: DynamicTree, drafter: str) -> None:
    """One-line error unless a lossless pair (verification.check_pair) also stays exact in this tree."""
    scheme = drafting.get(drafter)
    if spec.name == "opt_tree" and scheme.name != "topk":
        raise UsageError(f"opt_tree stops growing by the scores of drawn children, which is exact only for "
                         f"deterministic ones: use --drafter topk --verifier topk, or --tree eagle2 for "
                         f"{scheme.name} children")
    if scheme.name == "spechub" and spec.top_k != 2:
        raise UsageError(f"spechub draws 2 children per node: use --top-k 2 with it (got {spec.top_k})")


def draw_children(q: torch.Tensor, k: int, scheme, generator=None, ids=None) -> tuple[torch.Tensor, torch.Tensor]:
    """Each row's k drafts [F, k] and their scores [F, k] (log q; -inf for a repeated draft, never kept).

    ids: the vocabulary id of each column of q, when q covers only part of the vocabulary."""
    scheme = drafting.get(scheme)
    drafts = scheme.sample_batch(q, min(k, q.shape[-1]) if scheme.name == "topk" else k, generator)
    probs = q.gather(-1, drafts)
    if ids is not None:
        drafts = ids[drafts]
    if scheme.name == "greedy":  # the sampled child stands for all the mass outside the top k-1
        probs[:, -1] = (1.0 - probs[:, :-1].sum(-1)).clamp_min(0.0)
    repeated = (drafts.unsqueeze(-1) == drafts.unsqueeze(-2)).tril(-1).any(-1)
    return drafts, probs.clamp_min(1e-30).log().masked_fill(repeated, -math.inf)


class Candidates:
    """The grown candidate tree: parallel lists, index 0 the root."""

    def __init__(self, root: int):
        self.token, self.parent, self.depth, self.score = [root], [-1], [0], [0.0]
        self.path: list[tuple[int, ...]] = [()]

    def add(self, parent: int, tokens: list[int], scores: list[float]) -> list[int]:
        """Children of `parent` in draft order; repeated drafts (score -inf) are left out."""
        first = len(self.token)
        for token, score in zip(tokens, scores):
            if score == -math.inf:
                continue
            self.path.append(self.path[parent] + (len(self.token) - first,))
            self.token.append(token)
            self.parent.append(parent)
            self.depth.append(self.depth[parent] + 1)
            self.score.append(self.score[parent] + score)
        return list(range(first, len(self.token)))

    def best(self, among: list[int], count: int) -> list[int]:
        """The `count` highest-scoring of `among`; ties: shallower, then earlier."""
        return sorted(among, key=lambda c: (-self.score[c], self.depth[c], c))[:count]

    def is_ancestor(self, ancestor: int, node: int) -> bool:
        """Ancestor or self: a path of sibling ranks names one candidate."""
        path = self.path[ancestor]
        return self.path[node][: len(path)] == path


def select(candidates: Candidates, nodes: int) -> tuple[static_trees.Tree, list[int]]:
    """The tree of the best `nodes` candidates, and the candidate behind each tree node (root first).

    The kept children of a node need not be its first drafts (a sampled child can outscore a top
    one), so siblings are renumbered 0, 1, ... in draft order.
    """
    chosen = sorted(candidates.best(list(range(1, len(candidates.token))), nodes),
                    key=lambda c: (candidates.depth[c], c))  # parents first, siblings in draft order
    path, kids = {0: ()}, {}
    for c in chosen:
        parent = candidates.parent[c]
        path[c] = path[parent] + (kids.get(parent, 0),)
        kids[parent] = kids.get(parent, 0) + 1
    tree = static_trees.compile_tree([list(path[c]) for c in chosen], "dynamic")
    by_path = {path[c]: c for c in chosen}
    return tree, [0] + [by_path[p] for p in tree.paths]


def verified(chosen: list[int], drafted: dict) -> dict:
    """Tree node -> its candidate, for the nodes the verifier checks against their whole draft tuple: every
    expanded one, whether or not the selection kept any of its children.  Whether it keeps them depends on the
    node's own draws, so a draw of p at the nodes left childless would mix two rules, and that mixture is not p;
    the nodes never expanded draw p."""
    return {node: c for node, c in enumerate(chosen) if c in drafted}


def grow(spec: DynamicTree, root: int, root_q: tuple, expand, scheme="topk", generator=None):
    """Grow the candidates; expand(frontier, candidates) -> (q [F, D], ids): the draft distributions of
    the frontier's children over the tokens `ids` [D] (None: the whole vocabulary); root_q: the
    root's (q [D], ids).

    Returns the candidates, (q, ids) of every expanded candidate and its full draft tuple (for the
    verifier).
    """
    candidates = Candidates(root)
    expanded, drafted = {0: root_q}, {}
    frontier, (q, ids) = [0], (root_q[0][None], root_q[1])
    for depth in range(spec.max_depth):
        if depth > 0:
            q, ids = expand(frontier, candidates)
            expanded.update((node, (row, ids)) for node, row in zip(frontier, q))
        drafts, scores = draw_children(q, spec.top_k, scheme, generator, ids)
        children = []
        tokens, logs = drafts.tolist(), scores.tolist()  # two transfers a level, whatever its width
        for row, parent in enumerate(frontier):
            drafted[parent] = drafts[row]
            children += candidates.add(parent, tokens[row], logs[row])
        frontier = candidates.best(children, spec.top_k)
        gain = sum(math.exp(candidates.score[c]) for c in frontier)  # expected length they would add
        if spec.name == "opt_tree" and gain < spec.threshold:
            break
    return candidates, expanded, drafted
