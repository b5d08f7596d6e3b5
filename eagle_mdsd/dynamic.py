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
included, and also where none was kept: `Grown.drafts` at its row), so its
output token is distributed as p there whatever the selection kept; a kept child only lets
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
from . import drafting
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
        check_pair(self, scheme, vocab)


def make(name: str, nodes: int, max_depth: int, top_k: int, threshold: float = 0.0) -> DynamicTree:
    """A dynamic tree spec; every bad value is a one-line error."""
    if name not in NAMES:
        raise UsageError(f"unknown dynamic tree {name!r}: use one of {', '.join(NAMES)}")
    for label, value in (("nodes (--nodes)", nodes), ("depth", max_depth), ("top-k", top_k)):
        if value < 1:
            raise UsageError(f"{name}: {label} must be at least 1, got {value}")
    if nodes > static_trees.MAX_NODES:
        raise UsageError(f"{name}: at most {static_trees.MAX_NODES} nodes are supported, got {nodes}")
    if not threshold >= 0:  # (NaN too)
        raise UsageError(f"{name}: --threshold must be a number >= 0, got {threshold}")
    return DynamicTree(name, nodes, max_depth, top_k, threshold)


def check_pair(spec: DynamicTree, drafter: str, vocab: int = 1 << 30) -> None:
    """One-line error unless the scheme draws top_k children here and its lossless pair stays exact here."""
    scheme = drafting.get(drafter)
    if scheme.distinct and spec.top_k > vocab:
        raise UsageError(f"drafter {scheme.name!r} cannot fill tree {spec.label!r}: cannot draw {spec.top_k} "
                         f"distinct drafts from a vocabulary of {vocab}: use --top-k {vocab} or less")
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


def candidates(spec: DynamicTree) -> int:
    """Candidates a growth makes: top_k children of the root, then top_k of each of top_k nodes a depth."""
    return spec.top_k + (spec.max_depth - 1) * spec.top_k ** 2


@dataclass(frozen=True)
class Grown:
    """A growth's candidates in fixed-size buffers, numbered depth by depth (a parent before its children), and
    what the verifier reads at each expanded candidate at T > 0."""

    token: torch.Tensor   # [C] vocabulary ids
    parent: torch.Tensor  # [C] the parent candidate, -1 the root
    depth: torch.Tensor   # [C]
    score: torch.Tensor   # [C] float32 sum of log q along the path; -inf: never kept (a repeated draft, or grown
                          # after OPT-Tree's stop)
    row: torch.Tensor     # [C] the candidate's expanded row, -1 where it was not expanded
    q: torch.Tensor       # [E, D] each expanded row's q, row 0 the root's (E = 0 where grow's keep_q is False)
    drafts: torch.Tensor  # [E, k] each expanded row's whole draft tuple, as drawn (E = 0 likewise)


def grow(spec: DynamicTree, q_root: torch.Tensor, ids, expand, scheme="topk", generator=None,
         eager: bool = False, keep_q: bool = True) -> Grown:
    """Grow the candidates by tensor ops of fixed shapes.  Each depth expands the best top_k candidates of the
    last (ties: the lower number, so a parent ranks before its children) into top_k children drawn by the scheme.
    OPT-Tree stops once a depth's best candidates carry less expected length than the threshold: the depths after
    the stop score -inf (under graphs they are grown all the same; `eager` skips them, one host check a depth).

    q_root: [1, D] the root's q over the columns `ids` (None: the whole vocabulary); expand(depth, tokens [k],
    parents [k] or None) -> q [k, D] of the frontier's children, where parents are the rows of the last frontier
    each frontier candidate descends from (None at depth 1: the root's children).  keep_q False: Grown.q and
    Grown.drafts stay empty (at T = 0 no verifier reads them)."""
    k, device = spec.top_k, q_root.device
    count, kept = candidates(spec), 1 + (spec.max_depth - 1) * k if keep_q else 0  # kept: expanded rows' q
    long = dict(dtype=torch.long, device=device)
    token, parent = torch.zeros(count, **long), torch.full((count,), -1, **long)
    depth, row = torch.ones(count, **long), torch.full((count,), -1, **long)
    score = torch.full((count,), -math.inf, device=device)
    q_rows, draft_rows = torch.zeros(kept, q_root.shape[-1], device=device), torch.zeros(kept, k, **long)
    drafts, logs = draw_children(q_root, k, scheme, generator, ids)
    token[:k], score[:k] = drafts[0], logs[0]
    if keep_q:
        q_rows[:1], draft_rows[:1] = q_root, drafts
    frontier, parents = torch.sort(score[:k], descending=True, stable=True).indices, None
    going, stops = torch.ones((), dtype=torch.bool, device=device), spec.name == "opt_tree"
    own = torch.arange(k, device=device)
    for level in range(1, spec.max_depth):
        if stops:
            going = going & (score.index_select(0, frontier).exp().sum() >= spec.threshold)
            if eager and not bool(going):
                break  # every later candidate keeps its -inf: the tree growing on would give
        q = expand(level, token.index_select(0, frontier), parents)
        drafts, logs = draw_children(q, k, scheme, generator, ids)
        first, start = 1 + (level - 1) * k, k + (level - 1) * k * k
        if keep_q:
            q_rows[first : first + k], draft_rows[first : first + k] = q, drafts
        scores = score.index_select(0, frontier)[:, None] + logs
        expanded = first + own
        if stops:
            scores, expanded = scores.masked_fill(~going, -math.inf), torch.where(going, expanded, -1)
        row.index_copy_(0, frontier, expanded)
        block = slice(start, start + k * k)
        token[block], score[block] = drafts.reshape(-1), scores.reshape(-1)
        parent[block], depth[block] = frontier.repeat_interleave(k), level + 1
        best = torch.sort(score[block], descending=True, stable=True).indices[:k]
        frontier, parents = start + best, best // k
    return Grown(token, parent, depth, score, row, q_rows, draft_rows)


def select(grown: Grown, nodes: int) -> tuple[torch.Tensor, ...]:
    """The best `nodes` candidates as a tree, nodes in candidate order (parents first, siblings in draft order)
    after the root 0: (the candidates [nodes], their tokens [nodes], parent [nodes + 1], depth [nodes + 1], valid
    [nodes + 1], expanded row [nodes + 1], the root's 0).  A node scored -inf is chosen only where too few others
    exist; it is not valid, so no walk enters it.  Whether a node is kept never depends on its own draws: scores
    never grow along a path, and every candidate ranking above it was grown whatever it drew."""
    count = len(grown.token)
    chosen = torch.sort(torch.sort(grown.score, descending=True, stable=True).indices[:nodes]).values
    rows = torch.arange(nodes + 1, device=chosen.device)
    node_of = torch.zeros(count + 1, dtype=torch.long, device=chosen.device)
    node_of[chosen + 1] = rows[1:]
    parent = torch.cat([rows[:1], node_of.index_select(0, grown.parent.index_select(0, chosen) + 1)])
    depth = torch.cat([rows[:1], grown.depth.index_select(0, chosen)])
    valid = torch.cat([rows[:1] == 0, grown.score.index_select(0, chosen) > -math.inf])
    expanded = torch.cat([rows[:1], grown.row.index_select(0, chosen)])
    return chosen, grown.token.index_select(0, chosen), parent, depth, valid, expanded
