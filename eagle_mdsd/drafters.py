"""Tree drafters: how a cycle gets its tree of draft tokens from the EAGLE head.

Every drafter has two methods: `draft(model, call) -> Draft`: the head first reads the pairs whose true
features arrived in the last cycle (its output at the root predicts the root's feature), then the tree
is drafted; `commit(call, draft, pairs, emitted)`: the accepted path's pairs become the pending ones.  The
engine scores the Draft in one target forward and verifies it without knowing which drafter made it.

- StaticTreeDrafter: a fixed topology compiled once into per-level index buffers; a level is one head
  call and one draw per group of nodes with the same number of children, all on the device.
- DynamicTreeDrafter: EAGLE-2 and OPT-Tree, grown from the head's probabilities (dynamic.py); choosing
  candidates is host work, a few transfers a level.
- LookupDrafter: a base drafter with prompt-lookup tokens grafted on (lookup.py), and copy cycles that
  check the lookup chain alone while the answer copies a span.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Callable

import torch

from . import cycle, drafting, dynamic, kernels, lookup
from .cache import KVCache
from .tree import Layout, Tree, additive_mask, chain, layout


@dataclass
class Draft:
    tree: Tree
    tokens: torch.Tensor  # [N+1] the root, then every node's token
    layout: Layout
    q_of: Callable | None = None  # internal node -> (q over ids, ids) it was drafted from (the walk at T > 0)
    drafts: dict = field(default_factory=dict)  # grown trees: expanded node -> its whole draft tuple, as drawn
    point: dict = field(default_factory=dict)  # node -> token of its one-point draft (q = 1), verified first
    head_nodes: int | None = None  # nodes 1..head_nodes hold the head's drafts (None: all); others follow
    ranked: bool = True  # the walk's child ranks describe the drafter's tree (sequoia.py reads them)
    sampled: tuple | None = None  # static trees at T > 0: (cycle.SampledPlan, q of the internal nodes, ids)


def commit(call, draft: Draft, pairs, emitted) -> None:
    """The accepted path's (feature, token) pairs become the head's pending pairs."""
    call.pending = pairs


class DraftModel:
    """The head beside its target: the embedding and lm_head it shares, and the draft vocabulary.

    With a draft vocabulary q covers the head's N most frequent tokens, plus the `fill` lowest token ids
    at q = 0: a scheme that runs out of mass fills with the lowest ids not yet drawn (drafting.py), and
    carrying them makes the compact q fill exactly as the whole vocabulary's would, so no row needs a
    check on the host.
    """

    def __init__(self, head, target, draft_vocab: int | None, fill: int, packed: bool, graphs=None,
                 catch_up_graph_rows: int = 0):
        self.head, self.dtype, self.graphs = head, target.dtype, graphs
        self.embed, self.lm_head = target.get_input_embeddings(), target.get_output_embeddings()
        self.ids = self.outside = self.rows = None
        self.draft_lm_head = self.lm_head
        self.catch_up_graph_rows = catch_up_graph_rows
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

    def new_cache(self, capacity: int, static: bool = False) -> KVCache:
        return KVCache(len(self.head.layers), capacity, static)

    def run(self, cache, features, tokens, positions, block, prefix: int, graph: bool = True):
        """Predicted features [k, H] of k (feature, token) pairs, whose entries go into the cache after its
        length; the pairs see the first `prefix` entries and then what `block` says (KVCache.mask).  graph: a
        static cache's call may be captured (graphs.py)."""
        mask = cache.mask(block, prefix)
        if not cache.static:
            return self._forward(cache, features, tokens, positions, mask)
        k, slots = len(tokens), cache.next_slots(len(tokens), tokens.device)
        if self.graphs is None or not graph:
            outputs = self._forward(cache, features, tokens, positions, mask, slots)
        else:
            outputs = self.graphs.run(("head", k, id(cache)), lambda *inputs: self._forward(cache, *inputs),
                                      features, tokens, positions, mask, slots)
        cache.truncate(cache.length + k)
        return outputs

    def _forward(self, cache, features, tokens, positions, mask, slots=None):
        cache.slots = slots
        return self.head(features[None], self.embed(tokens)[None], positions[None], mask[None, None], cache)[0]

    def distribution(self, predicted, temperature):
        """(q, ids): each row's draft distribution [F, D] and the vocabulary id of each column (ids None: q
        covers the whole vocabulary)."""
        scale = temperature if temperature > 0 else 1.0
        logits = self.draft_lm_head(predicted).float()
        if self.outside is not None:
            logits = logits.masked_fill(self.outside, float("-inf"))
        return torch.softmax(logits / scale, -1), self.ids

    def vocabulary_q(self, q, ids):
        """A q from `distribution` over the whole vocabulary (0 outside the draft vocabulary)."""
        if ids is None:
            return q
        full = torch.zeros(q.shape[:-1] + self.lm_head.weight.shape[:1], device=q.device)
        return full.index_copy_(-1, ids, q)

    def catch_up(self, call) -> torch.Tensor:
        """Run the head on the pending pairs (kept in its cache); its output at the root predicts the root's
        feature."""
        features, tokens = call.pending
        k, committed = len(tokens), call.head_cache.length
        causal = torch.full((k, k), torch.finfo(self.dtype).min, dtype=self.dtype, device=tokens.device).triu_(1)
        positions = torch.arange(call.length - k + 1, call.length + 1, device=tokens.device)
        # the first catch-up reads the whole prompt and copy cycles pile pairs up: only a cycle's usual
        # counts are worth a graph each
        outputs = self.run(call.head_cache, features, tokens, positions, causal, committed,
                           graph=k <= self.catch_up_graph_rows)
        return outputs[-1]


@dataclass(frozen=True)
class Level:
    """The internal nodes at one depth: the head runs on them (below the root) and draws their children."""

    depth: int
    parents: torch.Tensor  # [P] node ids
    inputs: torch.Tensor  # [P] row of each parent's parent among the previous level's outputs
    seen: torch.Tensor  # [P, S] additive mask over the head's tree entries so far (earlier levels' and these)
    groups: tuple  # (count, rows [R] or None for all, children [R, count]) per number of children


class StaticTreeDrafter:
    """A fixed topology, compiled once: each level is a few batched tensor ops, with no host list."""

    def __init__(self, tree: Tree, scheme, device, dtype):
        self.tree, self.scheme = tree, scheme
        self.layout = layout(tree, device, dtype)
        self.plan = cycle.SampledPlan.of(tree, device)
        self.levels, self.row_of = [], {}  # row_of: internal node -> (level, row) of its q
        slots, previous = [], [0]
        for depth in range(tree.max_depth):
            parents = tree.internal(depth)
            if not parents:
                break
            if depth > 0:
                slots += parents
            counts = [len(tree.children[node]) for node in parents]
            groups = []
            for count in sorted(set(counts)):
                rows = [i for i, c in enumerate(counts) if c == count]
                children = torch.tensor([tree.children[parents[i]] for i in rows], device=device)
                groups.append((count, None if len(rows) == len(parents) else torch.tensor(rows, device=device),
                               children))
            seen = additive_mask(tree.ancestors[parents][:, slots], dtype)
            self.levels.append(Level(depth, torch.tensor(parents, device=device),
                                     torch.tensor([previous.index(tree.parent[node]) if depth else 0
                                                   for node in parents], device=device),
                                     seen.to(device), tuple(groups)))
            self.row_of.update((node, (len(self.levels) - 1, row)) for row, node in enumerate(parents))
            previous = parents

    def draft(self, model: DraftModel, call) -> Draft:
        outputs = model.catch_up(call)[None]
        committed = call.head_cache.length
        tokens = torch.empty(self.tree.size + 1, dtype=torch.long, device=outputs.device)
        tokens[:1] = call.root
        q_levels = []
        for level in self.levels:
            if level.depth > 0:
                parents = len(level.parents)
                outputs = model.run(call.head_cache, outputs.index_select(0, level.inputs),
                                    tokens.index_select(0, level.parents),
                                    torch.full((parents,), call.length + level.depth, device=tokens.device),
                                    level.seen, committed)
            q, ids = model.distribution(outputs, call.temperature)
            for count, rows, children in level.groups:
                drafts = self.scheme.sample_batch(q if rows is None else q.index_select(0, rows), count,
                                                  call.generator)
                tokens[children] = drafts if ids is None else ids[drafts]
            q_levels.append(q)
        call.head_cache.truncate(committed)  # the tree's entries go; the accepted ones come back as pending pairs

        def q_of(node):
            level, row = self.row_of[node]
            return q_levels[level][row], model.ids

        sampled = (self.plan, torch.cat(q_levels), model.ids) if call.temperature > 0 else None
        return Draft(self.tree, tokens, self.layout, q_of, sampled=sampled)

    commit = staticmethod(commit)


class DynamicTreeDrafter:
    """EAGLE-2 and OPT-Tree: the tree is grown anew every cycle (dynamic.grow, dynamic.select)."""

    def __init__(self, spec: dynamic.DynamicTree, scheme, device, dtype):
        self.spec, self.scheme, self.device, self.dtype = spec, scheme, device, dtype

    def draft(self, model: DraftModel, call) -> Draft:
        root_prediction = model.catch_up(call)
        committed = call.head_cache.length
        predicted = {0: root_prediction}
        slots = []  # candidate held by each head cache entry after `committed`

        def expand(frontier, candidates):
            slots.extend(frontier)
            seen = torch.tensor([[candidates.is_ancestor(slot, node) for slot in slots] for node in frontier])
            inputs = torch.stack([predicted[candidates.parent[node]] for node in frontier])
            tokens = torch.tensor([candidates.token[node] for node in frontier], device=self.device)
            positions = torch.full_like(tokens, call.length + candidates.depth[frontier[0]])
            outputs = model.run(call.head_cache, inputs, tokens, positions,
                                additive_mask(seen, self.dtype).to(self.device), committed)
            predicted.update(zip(frontier, outputs))
            return model.distribution(outputs, call.temperature)

        q, ids = model.distribution(root_prediction[None], call.temperature)
        candidates, expanded, drafted = dynamic.grow(self.spec, call.root_id, (q[0], ids), expand, self.scheme,
                                                     call.generator)
        call.head_cache.truncate(committed)
        tree, chosen = dynamic.select(candidates, self.spec.nodes)
        tokens = torch.tensor([candidates.token[c] for c in chosen], device=self.device)
        checked = dynamic.verified(chosen, drafted).items()
        return Draft(tree, tokens, layout(tree, self.device, self.dtype), {node: expanded[c] for node, c in checked}.get,
                     {node: drafted[c] for node, c in checked})

    commit = staticmethod(commit)


@dataclass
class LookupDraft(Draft):
    proposal: list = field(default_factory=list)  # the prompt-lookup tokens
    copy: bool = False  # a copy cycle: the head did not run, and its pending pairs wait for the next cycle


class LookupDrafter:
    """A base drafter with the prompt-lookup continuation grafted on as a trie branch (lookup.py), and copy cycles
    that check the lookup chain alone while the answer copies a span (call.drafting["copying"])."""

    def __init__(self, base, tokens: int, device, dtype):
        self.base, self.tokens, self.device, self.dtype = base, tokens, device, dtype
        self.chains = {}  # copy cycles' layouts by length

    def draft(self, model: DraftModel, call) -> Draft:
        proposal = lookup.continuation(call.context, self.tokens)
        if call.drafting.get("copying") and proposal:
            return self._copy(call, proposal)
        draft = self.base.draft(model, call)
        if not proposal:
            return LookupDraft(**vars(draft))
        tree, tokens, branch = lookup.graft(draft.tree, draft.tokens, proposal)
        return LookupDraft(**(vars(draft) | dict(tree=tree, tokens=tokens, layout=layout(tree, self.device, self.dtype),
                                                 point=self._points(tree, branch, proposal),
                                                 head_nodes=draft.tree.size, proposal=proposal)))

    @staticmethod
    def _points(tree: Tree, branch: dict, proposal: list) -> dict:
        """node -> the proposal token its lookup child holds."""
        return {node: proposal[tree.depth[child] - 1] for node, child in branch.items()}

    def _copy(self, call, proposal) -> Draft:
        """The lookup chain alone; the head does not run (its pairs wait for the next full cycle)."""
        call.drafting["copy_cycles"] = call.drafting.get("copy_cycles", 0) + 1
        n = len(proposal)
        if n not in self.chains:
            self.chains[n] = chain(n), layout(chain(n), self.device, self.dtype)
        tree, chain_layout = self.chains[n]
        tokens = torch.cat([call.root, torch.tensor(proposal, device=self.device)])
        return LookupDraft(tree, tokens, chain_layout, point=self._points(tree, {i: i + 1 for i in range(n)}, proposal),
                           head_nodes=0, ranked=False, proposal=proposal, copy=True)

    @staticmethod
    def commit(call, draft: LookupDraft, pairs, emitted) -> None:
        """After a copy cycle the pairs join the waiting ones; a cycle that accepts COPY_MIN lookup drafts or more
        makes the next one a copy cycle."""
        if draft.copy:
            pairs = (torch.cat([call.pending[0], pairs[0]]), torch.cat([call.pending[1], pairs[1]]))
        call.pending = pairs
        call.drafting["copying"] = lookup.agreement(emitted, draft.proposal) >= lookup.COPY_MIN


def make(topology, scheme, device, dtype):
    """The drafter for a topology (tree.Tree's interface): grafted, grown or static."""
    if topology.grafted:
        return LookupDrafter(make(topology.base, scheme, device, dtype), topology.grafted, device, dtype)
    if not topology.static:
        return DynamicTreeDrafter(topology, scheme, device, dtype)
    return StaticTreeDrafter(topology, drafting.get(scheme), device, dtype)
