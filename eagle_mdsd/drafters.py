"""The draft model and the plan of a static tree: what the cycle (cycle.py) drafts with.

- DraftModel: the EAGLE head beside its target (the embedding and lm_head it shares) and the draft
  vocabulary its q covers.
- StaticPlan: a fixed topology compiled once into per-level index buffers, so that drafting a level is one
  head call and one draw per group of parents with the same number of children, and verifying it at T > 0 is
  one verifier call per such group.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F

from . import drafting, graphs, kernels
from .cache import KVCache
from .tree import Tree


class DraftModel:
    """The head beside its target: the embedding and lm_head it shares, and the draft vocabulary.

    With a draft vocabulary q covers the head's N most frequent tokens, plus the `fill` lowest token ids
    at q = 0: a scheme that runs out of mass fills with the lowest ids not yet drawn (drafting.py), and
    carrying them makes the compact q fill exactly as the whole vocabulary's would, so no row needs a
    check on the host.
    """

    def __init__(self, head, target, draft_vocab: int | None, fill: int, packed: bool, compiled: bool = False):
        self.head, self.dtype = head, target.dtype
        self.step = graphs.compiled(head) if compiled else head  # the head's forward, compiled or not
        self.embed, self.lm_head = target.get_input_embeddings(), target.get_output_embeddings()
        self.ids = self.outside = self.rows = None
        self.draft_lm_head = self.lm_head
        if hasattr(head, "target_ids"):  # EAGLE-3: the head's own output layer over its own vocabulary
            self._own_vocabulary(head, fill)
        elif draft_vocab is not None:
            device = self.lm_head.weight.device
            chosen = set(head.draft_vocab[:draft_vocab])
            self.rows = torch.tensor(sorted(chosen), device=device)  # the draft vocabulary itself, without the fill
            ids = sorted(chosen | set(range(min(fill, self.lm_head.weight.shape[0]))))
            self.ids = torch.tensor(ids, device=device)
            bias = getattr(self.lm_head, "bias", None)
            self.draft_lm_head = kernels.linear_over(self.lm_head.weight[self.ids].contiguous(),
                                                     None if bias is None else bias[self.ids].contiguous())
            if packed:
                kernels.pack(self.draft_lm_head)
            if len(ids) > len(chosen):
                self.outside = torch.tensor([token not in chosen for token in ids], device=device)

    def _own_vocabulary(self, head, fill: int) -> None:
        """q over the head's draft vocabulary (its target tokens, sorted) and the `fill` lowest ids at q = 0; the
        head's logits land in those columns."""
        device = self.lm_head.weight.device
        mine = head.target_ids().tolist()
        ids = sorted(set(mine) | set(range(min(fill, self.lm_head.weight.shape[0]))))
        self.ids = torch.tensor(ids, device=device)
        column = {token: k for k, token in enumerate(ids)}
        self.rows = torch.tensor(sorted(mine), device=device)
        columns = torch.tensor([column[token] for token in mine], device=device)
        width = len(ids)

        def draft_logits(outputs):
            own = head.logits(outputs)
            spread = torch.full(own.shape[:-1] + (width,), float("-inf"), dtype=own.dtype, device=own.device)
            return spread.index_copy_(-1, columns, own)

        self.draft_lm_head = draft_logits

    @property
    def width(self) -> int:
        """Columns of q: the draft vocabulary with its fill, or the whole vocabulary."""
        return len(self.ids) if self.ids is not None else self.lm_head.weight.shape[0]

    def new_cache(self, capacity: int) -> KVCache:
        return KVCache.for_attention(len(self.head.layers), capacity, self.head.layers[0].self_attn)

    def forward(self, cache: KVCache, features, tokens, positions, mask):
        """Predicted features [k, H] of k (feature, token) pairs; their entries go to the cache's slots and the
        additive mask [k, span] says what each sees."""
        return self.step(features[None], self.embed(tokens)[None], positions[None], mask[None, None], cache)[0]

    def run(self, cache: KVCache, features, tokens, positions, block):
        """Eagerly, k pairs appended after the cache's committed entries: they see all of those and, among
        themselves, what the additive `block` [k, k] says."""
        committed = cache.length
        cache.append(len(tokens), tokens.device)
        outputs = self.forward(cache, features, tokens, positions, F.pad(block, (committed, 0)))
        cache.truncate(committed + len(tokens))
        return outputs

    def distribution(self, predicted, temperature):
        """(q, ids): each row's draft distribution [F, D] and the vocabulary id of each column (ids None: q
        covers the whole vocabulary).  At T = 0 the drafts come from q at temperature 1."""
        scale = temperature if temperature > 0 else 1.0
        logits = self.draft_lm_head(predicted).float()
        if self.outside is not None:
            logits = logits.masked_fill(self.outside, float("-inf"))
        return drafting.warp(logits, scale), self.ids

    def vocabulary_q(self, q, ids):
        """A q from `distribution` over the whole vocabulary (0 outside the draft vocabulary)."""
        if ids is None:
            return q
        full = torch.zeros(q.shape[:-1] + self.lm_head.weight.shape[:1], device=q.device)
        return full.index_copy_(-1, ids, q)


@dataclass(frozen=True)
class Level:
    """The internal nodes at one depth: the head runs on them (below the root) and draws their children."""

    depth: int
    parents: torch.Tensor  # [P] node ids
    inputs: torch.Tensor  # [P] row of each parent's parent among the previous level's outputs
    offsets: torch.Tensor  # [P] each parent's head cache slot, after the committed entries (depth > 0)
    groups: tuple  # (count, rows [R] or None for all, children [R, count]) per number of children


@dataclass(frozen=True)
class StaticPlan:
    """A static tree compiled for the cycle: its levels; what each head slot's node sees among the tree's slots
    (its ancestors that hold slots, and itself) [S, S]; and for the verifier at T > 0, per child count the
    internal nodes with that many children [R], the rows of their q among the stacked q of every level [R] and
    their children [R, count]."""

    levels: tuple
    slot_seen: torch.Tensor
    groups: tuple
    internal: int  # rows of the stacked q

    @staticmethod
    def of(tree: Tree, device) -> "StaticPlan":
        levels, slot_nodes, previous, stacked = [], [], [0], []
        for depth in range(tree.max_depth):
            parents = tree.internal(depth)
            if not parents:
                break
            if depth > 0:
                slot_nodes += parents
            counts = [len(tree.children[node]) for node in parents]
            groups = []
            for count in sorted(set(counts)):
                rows = [i for i, c in enumerate(counts) if c == count]
                children = torch.tensor([tree.children[parents[i]] for i in rows], device=device)
                groups.append((count, None if len(rows) == len(parents) else torch.tensor(rows, device=device),
                               children))
            offsets = [slot_nodes.index(node) for node in parents] if depth else []
            levels.append(Level(depth, torch.tensor(parents, device=device),
                                torch.tensor([previous.index(tree.parent[node]) if depth else 0 for node in parents],
                                             device=device),
                                torch.tensor(offsets, dtype=torch.long, device=device), tuple(groups)))
            stacked += parents
            previous = parents
        seen = tree.ancestors[slot_nodes][:, slot_nodes] if slot_nodes else torch.zeros(1, 1, dtype=torch.bool)
        row = {node: i for i, node in enumerate(stacked)}
        verify = []
        for count in sorted({len(tree.children[node]) for node in stacked}):
            nodes = [node for node in stacked if len(tree.children[node]) == count]
            verify.append((torch.tensor(nodes, device=device), torch.tensor([row[n] for n in nodes], device=device),
                           torch.tensor([tree.children[n] for n in nodes], device=device)))
        return StaticPlan(tuple(levels), seen.to(device), tuple(verify), len(stacked))
