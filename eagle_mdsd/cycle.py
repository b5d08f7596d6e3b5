"""The cycle on the device: state in device tensors, two fixed-shape functions a cycle, one transfer.

With static caches (cache.py) a cycle needs no host decision between drafting and verifying, so its state
lives in device tensors and each phase is one function of fixed shapes that CUDA graphs replay (graphs.py):

- `draft`: the head catches up on the pending pairs (padded to the most a cycle commits, so one shape serves
  every cycle), then drafts the tree: a static tree level by level (a top-k, or at T > 0 the scheme's draws);
  an EAGLE-2 tree grown in fixed-size candidate buffers, reranked, and laid out (parents, depths, paths, mask)
  by tensor ops;
- `verify`: the target's tree forward, lm_head, acceptance (greedy, or at T > 0 every node's output drawn up
  front and a walk by tensor ops), the KV gather of the accepted entries next to the root, the next cycle's
  pending pairs, root and length, and the result the host reads.

Every mask, position and cache slot is computed inside the functions from the device length, so a replay
needs no input from the host.  The state is kept twice: a cycle reads one copy and writes the other (one
graph per phase and parity), so no function writes what it reads and running one twice (a CUDA graph's
warm-up does) gives the same result.  The host copies one small result tensor a cycle (accepted count, tokens, child ranks) and checks the
token budget and EOS on it; where the budget cannot end the call, the next cycle is queued before the host
waits for that copy.

What stays on the older path (engine.py): schemes other than topk at T = 0, prompt-lookup trees and OPT-Tree,
whose stopping rule depends on the drafted scores.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from . import drafting, dynamic
from .graphs import Emulated, Graphs
from .tree import Tree, additive_mask, layout


def supports(topology, scheme_name: str, temperature: float) -> bool:
    """Whether a tree's cycle runs here: a static tree or EAGLE-2, drafted by top-k at T = 0, by any scheme of a
    lossless pair at T > 0."""
    if topology.grafted or not (topology.static or topology.name == "eagle2"):
        return False
    return temperature > 0 or scheme_name == "topk"


@dataclass(frozen=True)
class SampledPlan:
    """How a static tree's nodes get their output tokens at T > 0: per child count, the internal nodes with that
    many children, the row of each one's q among the stacked q of the tree's internal nodes (level by level) and
    its children; the leaves."""

    groups: tuple  # (nodes [R], q rows [R], children [R, count]) per child count
    leaves: torch.Tensor

    @staticmethod
    def of(tree: Tree, device) -> "SampledPlan":
        internal = [node for depth in range(tree.max_depth) for node in tree.internal(depth)]
        row = {node: i for i, node in enumerate(internal)}
        groups = []
        for count in sorted({len(tree.children[node]) for node in internal}):
            nodes = [node for node in internal if len(tree.children[node]) == count]
            groups.append((torch.tensor(nodes, device=device), torch.tensor([row[n] for n in nodes], device=device),
                           torch.tensor([tree.children[n] for n in nodes], device=device)))
        return SampledPlan(tuple(groups), torch.tensor([n for n, kids in enumerate(tree.children) if not kids],
                                                       device=device))


def sampled_outputs(plan: SampledPlan, p, q_internal, tokens, verifier, full_q, generator) -> torch.Tensor:
    """Every node's output token [N+1], each distributed as p at that node: the verifier's draw against the node's
    drafts where it has children (one batched call per child count), a draw of p at a leaf.  Each node's draw is
    independent of the others', so drawing all of them before the walk leaves the walk's distribution as it is.
    full_q: q rows over the draft vocabulary -> over the whole vocabulary."""
    outputs = torch.zeros(len(tokens), dtype=torch.long, device=tokens.device)
    for nodes, rows, children in plan.groups:
        drafts = tokens.index_select(0, children.reshape(-1)).view(children.shape)
        drawn = verifier.sample_batch(p.index_select(0, nodes), full_q(q_internal.index_select(0, rows)), drafts,
                                      generator)
        outputs.index_copy_(0, nodes, drawn)
    if len(plan.leaves):
        outputs.index_copy_(0, plan.leaves, drafting.draw(p.index_select(0, plan.leaves), 1, generator)[:, 0])
    return outputs


def grown_outputs(p, q_nodes, drafts, expanded, verifier, generator) -> torch.Tensor:
    """A grown tree's output tokens [N+1], each distributed as p at its node: the verifier's draw against the
    node's whole draft tuple [N+1, k] wherever the node was expanded, kept children or not (dynamic.verified), a
    draw of p elsewhere."""
    drawn = verifier.sample_batch(p, q_nodes, drafts, generator)
    return torch.where(expanded, drawn, drafting.draw(p, 1, generator)[:, 0])


def sampled_walk(parent, outputs, tokens, levels: int) -> tuple[torch.Tensor, torch.Tensor]:
    """(path [levels + 1], accepted [1]) over a tree given by its parents [N+1]: from the root into the
    lowest-numbered child holding the node's output (siblings are numbered in draft order), while one does; the
    path is padded with its last node, as tree.Layout's paths are."""
    nodes = torch.arange(len(parent), device=parent.device)
    node = nodes[:1]
    accepted, going, path = torch.zeros_like(node), torch.ones(1, dtype=torch.bool, device=tokens.device), [node]
    for _ in range(levels):
        hit = (parent == node) & (nodes > 0) & (tokens == outputs.index_select(0, node))
        found = hit.any().reshape(1) & going
        node = torch.where(found, hit.to(torch.int8).argmax().reshape(1), node)
        accepted, going = accepted + found.long(), found
        path.append(node)
    return torch.cat(path), accepted


class State:
    """What one cycle leaves the next, in device tensors: length, root, the pending (feature, token) pairs."""

    def __init__(self, pairs: int, width: int, dtype, device):
        self.length = torch.zeros(1, dtype=torch.long, device=device)
        self.root = torch.zeros(1, dtype=torch.long, device=device)
        self.count = torch.ones(1, dtype=torch.long, device=device)  # pending pairs, at most `pairs`
        self.features = torch.zeros(pairs, width, dtype=dtype, device=device)
        self.tokens = torch.zeros(pairs, dtype=torch.long, device=device)


class TreeBuffers:
    """The tree the verify step scores: tokens and the layout buffers of tree.Layout, plus each node's rank among
    its siblings and whether it has children (the child ranks sequoia.py reads).  Constant for a static tree;
    written by the draft for a grown one."""

    def __init__(self, nodes: int, depth: int, device):
        count, long = nodes + 1, dict(dtype=torch.long, device=device)
        self.tokens = torch.zeros(count, **long)
        self.depth = torch.zeros(count, **long)
        self.parent = torch.zeros(count, **long)
        self.ancestors = torch.eye(count, dtype=torch.bool, device=device)
        self.paths = torch.zeros(count, depth + 1, **long)
        self.rank = torch.zeros(count, **long)
        self.sibling = torch.zeros(count, **long)
        self.internal = torch.zeros(count, dtype=torch.bool, device=device)

    def set_static(self, tree: Tree, device, dtype) -> None:
        fixed = layout(tree, device, dtype)
        self.depth.copy_(fixed.depth)
        self.parent.copy_(fixed.parent)
        self.ancestors.copy_(tree.ancestors.to(device))
        self.paths.copy_(fixed.paths)
        self.rank.copy_(fixed.rank)
        self.sibling.copy_(torch.tensor([0] + [tree.children[tree.parent[node]].index(node)
                                               for node in range(1, tree.size + 1)], device=device))
        self.internal.copy_(torch.tensor([bool(kids) for kids in tree.children], device=device))

    def lay_out(self, parent: torch.Tensor, depth: torch.Tensor, levels: int) -> None:
        """Fill the layout of a grown tree from its parents (root first, parents before children) and depths."""
        count = len(parent)
        nodes = torch.arange(count, device=parent.device)
        self.parent.copy_(parent)
        self.depth.copy_(depth)
        # climb: chain[m] is each node's ancestor m levels up (the root stays put)
        chain = [nodes]
        for _ in range(levels):
            chain.append(parent.index_select(0, chain[-1]))
        chain = torch.stack(chain, 1)  # [count, levels + 1]
        ancestors = torch.zeros(count, count, dtype=torch.bool, device=parent.device)
        self.ancestors.copy_(ancestors.scatter_(1, chain, True))
        # paths[n, j]: the ancestor at depth j, then the node itself past its depth
        up = (depth[:, None] - torch.arange(levels + 1, device=parent.device)[None]).clamp_min(0)
        self.paths.copy_(chain.gather(1, up))
        self.rank.copy_(depth * count - nodes)
        below = nodes[None] < nodes[:, None]
        same = (parent[None] == parent[:, None]) & below & (nodes[None] > 0)
        self.sibling.copy_(same.sum(-1))
        self.internal.copy_((parent[None] == nodes[:, None]).logical_and_(nodes[None] > 0).any(-1))


class DeviceCycle:
    """One decoder's cycle over one pair of static caches (graphs capture their buffers)."""

    def __init__(self, decoder, topology, target_cache, head_cache, method: str):
        self.decoder, self.method = decoder, method
        self.temperature = 0.0  # the call's, set by start(); graphs are kept per temperature
        self.generator = _generator(decoder.device, decoder.graphs)
        self.target_cache, self.head_cache = target_cache, head_cache
        device, self.dtype = decoder.device, decoder.target.dtype
        self.device = device
        self.grown = topology is not None and not topology.static
        if method == "baseline":
            self.nodes, self.levels = 0, 0
        elif self.grown:
            self.spec = topology
            k = topology.top_k  # a tree of at most the candidates grown
            self.nodes = min(topology.nodes, k + (topology.max_depth - 1) * k * k)
            self.levels = topology.max_depth
        else:
            self.tree = topology
            self.nodes, self.levels = topology.size, topology.max_depth
        width = decoder.hidden_size * (1 if decoder.feature_layers is None else 1 + len(decoder.feature_layers))
        self.pairs = self.levels + 1  # a cycle commits at most the deepest path and the bonus
        # cycle i reads states[i % 2] and writes states[1 - i % 2]: a phase never writes what it reads
        self.states = [State(self.pairs, width, self.dtype, device) for _ in range(2)]
        self.tree_buffers = TreeBuffers(self.nodes, self.levels, device)
        self.result = torch.zeros(2 * self.levels + 3, dtype=torch.long, device=device)
        self.target_columns = torch.arange(target_cache.capacity, device=device)
        self.rows = torch.arange(max(self.nodes, self.pairs) + 1, device=device)
        if method == "eagle":
            self.head_columns = torch.arange(head_cache.capacity, device=device)
            if self.grown:
                self._grown_buffers()
            else:
                self.tree_buffers.set_static(topology, device, self.dtype)
                self._static_levels()
                self.plan = SampledPlan.of(topology, device)
                internal = sum(len(level["parents"]) for level in self.static_levels)
                self.q_internal = torch.zeros(internal, self._draft_vocabulary(), device=device)
        self.transfer = Transfer(self.result, device)

    # -- set-up ------------------------------------------------------------------------------

    def _static_levels(self) -> None:
        """Per level of the tree drafter (drafters.Level): besides its parents and their inputs, each parent's head
        cache slot (an offset after the committed length), and where the top-k of each parent goes."""
        tree, device = self.tree, self.device
        slot_nodes, self.static_levels = [], []
        for level in self.decoder.drafter.levels:
            parents = level.parents.tolist()
            if level.depth > 0:
                slot_nodes += parents
            kids = [tree.children[node] for node in parents]
            width = max(map(len, kids))
            offsets = [slot_nodes.index(node) for node in parents] if level.depth else []
            self.static_levels.append(dict(
                depth=level.depth, parents=level.parents, inputs=level.inputs, width=width,
                offsets=torch.tensor(offsets, dtype=torch.long, device=device),
                picks=torch.tensor([row * width + rank for row, k in enumerate(kids) for rank in range(len(k))],
                                   device=device),
                children=torch.tensor([child for k in kids for child in k], device=device)))
        # what each head slot's node sees among the tree's slots: its ancestors that hold slots, and itself
        seen = tree.ancestors[slot_nodes][:, slot_nodes] if slot_nodes else torch.zeros(1, 1, dtype=torch.bool)
        self.slot_seen = seen.to(device)

    def _draft_vocabulary(self) -> int:
        ids = self.decoder.draft_model.ids
        return len(ids) if ids is not None else self.decoder.lm_head.weight.shape[0]

    def _grown_buffers(self) -> None:
        """The candidates of a grown tree, and for T > 0 what the verifier reads at each expanded candidate: its q
        and its whole draft tuple (row 0 the root's, then top_k rows a depth)."""
        spec, device = self.spec, self.device
        k = spec.top_k
        self.candidates = k + (spec.max_depth - 1) * k * k
        self.slot_count = max((spec.max_depth - 1) * k, 1)
        long = dict(dtype=torch.long, device=device)
        self.cand_token = torch.zeros(self.candidates, **long)
        self.cand_parent = torch.zeros(self.candidates, **long)  # -1: the root
        self.cand_depth = torch.zeros(self.candidates, **long)
        self.cand_score = torch.zeros(self.candidates, dtype=torch.float32, device=device)
        expanded = 1 + (spec.max_depth - 1) * k
        self.cand_row = torch.zeros(self.candidates, **long)  # row of an expanded candidate, else -1
        self.node_row = torch.zeros(self.nodes + 1, **long)  # the same for the tree's nodes, the root's 0
        self.expanded_q = torch.zeros(expanded, self._draft_vocabulary(), device=device)
        self.expanded_drafts = torch.zeros(expanded, k, **long)
        self.expanded_rows = torch.arange(expanded, device=device)

    # -- masks -------------------------------------------------------------------------------

    def _mask(self, columns, length, seen: torch.Tensor) -> torch.Tensor:
        """Additive mask [rows, capacity]: every committed entry (before `length`) and, from `length` on, the
        entries `seen` [rows, width] marks."""
        relative = columns[None] - length
        width = seen.shape[1]
        inside = (relative >= 0) & (relative < width)
        marked = seen.gather(1, relative.clamp(0, width - 1).expand(seen.shape[0], -1))
        return additive_mask((relative < 0) | (inside & marked), self.dtype)

    # -- the two phases ------------------------------------------------------------------------

    def draft(self, parity: int) -> torch.Tensor:
        """The catch-up and the tree's tokens (and, grown, its layout) from the state the last verify left."""
        state = self.states[parity]
        model, cache = self.decoder.draft_model, self.head_cache
        rows = self.rows[: self.pairs]
        # pending pair j at head slot length - count + j, position one further; padded rows write garbage past
        # the committed entries that the tree's entries then overwrite, and no real row sees them
        slots = state.length - state.count + rows
        mask = additive_mask(self.head_columns[None] <= slots[:, None], self.dtype)
        outputs = model._forward(cache, state.features, state.tokens, slots + 1, mask, slots)
        root_prediction = outputs.index_select(0, state.count - 1)
        tokens = self.tree_buffers.tokens
        tokens[:1] = state.root
        if self.grown:
            self._grow(state, root_prediction)
        else:
            self._draft_static(state, root_prediction)
        return tokens

    def _logits(self, outputs) -> torch.Tensor:
        model = self.decoder.draft_model
        logits = model.draft_lm_head(outputs)
        return logits if model.outside is None else logits.masked_fill(model.outside, float("-inf"))

    def _ids(self, columns) -> torch.Tensor:
        ids = self.decoder.draft_model.ids
        return columns if ids is None else ids[columns]

    def _draft_static(self, state: State, outputs) -> None:
        """The tree's tokens level by level: at T = 0 one top-k of the logits a level; at T > 0 the scheme's draws
        per group of parents with the same child count, in the order StaticTreeDrafter draws them, each level's q
        kept for the verifier."""
        model, tokens = self.decoder.draft_model, self.tree_buffers.tokens
        first = 0
        for level, drafted in zip(self.static_levels, self.decoder.drafter.levels):
            if level["depth"] > 0:
                slots = state.length + level["offsets"]
                mask = self._mask(self.head_columns, state.length, self.slot_seen.index_select(0, level["offsets"]))
                outputs = model._forward(self.head_cache, outputs.index_select(0, level["inputs"]),
                                         tokens.index_select(0, level["parents"]),
                                         (state.length + level["depth"]).expand(len(slots)), mask, slots)
            if self.temperature == 0:
                top = self._logits(outputs).topk(level["width"], -1).indices
                tokens.index_copy_(0, level["children"], self._ids(top.reshape(-1).index_select(0, level["picks"])))
                continue
            q = model.distribution(outputs, self.temperature)[0]
            self.q_internal[first : first + len(q)] = q
            first += len(q)
            for count, rows, children in drafted.groups:
                drafts = self.decoder.scheme.sample_batch(q if rows is None else q.index_select(0, rows), count,
                                                          self.generator)
                tokens.index_copy_(0, children.reshape(-1), self._ids(drafts.reshape(-1)))

    def _grow(self, state: State, root_prediction) -> None:
        """EAGLE-2 (dynamic.py) in fixed-size buffers: each depth expands the best top_k candidates of the last
        into top_k children drawn by the scheme (dynamic.draw_children: at T = 0 the top k); then the best `nodes`
        candidates become the tree.  Candidates are numbered depth by depth, so ranking by (score, number) puts a
        parent before its children on ties.  A repeated draft scores -inf: it ranks below every other candidate,
        and where it is chosen all the same (too few others) the walk never reaches it, as an earlier sibling
        holds its token."""
        spec, model = self.spec, self.decoder.draft_model
        k, device = spec.top_k, self.device
        sampled = self.temperature > 0
        drafts, logs = self._children(root_prediction, 0 if sampled else None)
        self.cand_token[:k] = drafts[0]
        self.cand_score[:k] = logs[0]
        self.cand_parent[:k] = -1
        self.cand_depth[:k] = 1
        frontier = torch.sort(self.cand_score[:k], descending=True, stable=True).indices
        inputs = root_prediction.expand(k, -1)
        seen = torch.zeros(k, self.slot_count, dtype=torch.bool, device=device)
        own = torch.arange(k, device=device)
        if sampled:
            self.cand_row.fill_(-1)
        for depth in range(1, spec.max_depth):
            offsets = (depth - 1) * k + own
            seen = seen.index_copy(1, offsets, torch.eye(k, dtype=torch.bool, device=device))
            slots = state.length + offsets
            outputs = model._forward(self.head_cache, inputs, self.cand_token.index_select(0, frontier),
                                     (state.length + depth).expand(k), self._mask(self.head_columns, state.length,
                                                                                  seen), slots)
            if sampled:
                self.cand_row.index_copy_(0, frontier, self.expanded_rows[1 + offsets])
            drafts, logs = self._children(outputs, 1 + (depth - 1) * k if sampled else None)
            start = k + (depth - 1) * k * k
            block = slice(start, start + k * k)
            scores = self.cand_score.index_select(0, frontier)[:, None] + logs
            self.cand_token[block] = drafts.reshape(-1)
            self.cand_score[block] = scores.reshape(-1)
            self.cand_parent[block] = frontier.repeat_interleave(k)
            self.cand_depth[block] = depth + 1
            best = torch.sort(self.cand_score[block], descending=True, stable=True).indices[:k]
            parents = best // k
            frontier = start + best
            inputs, seen = outputs.index_select(0, parents), seen.index_select(0, parents)
        self._select()

    def _children(self, outputs, row: int | None) -> tuple[torch.Tensor, torch.Tensor]:
        """Drafts [F, k] (vocabulary ids) and their log q of the head's outputs [F, H]; at T > 0 their q and
        drafts are kept from expanded row `row` on."""
        model = self.decoder.draft_model
        q = model.distribution(outputs.reshape(-1, outputs.shape[-1]), self.temperature)[0]
        drafts, logs = dynamic.draw_children(q, self.spec.top_k, self.decoder.scheme, self.generator, model.ids)
        if row is not None:
            self.expanded_q[row : row + len(q)] = q
            self.expanded_drafts[row : row + len(q)] = drafts
        return drafts, logs

    def _select(self) -> None:
        """The best `nodes` candidates as the tree: nodes in candidate order (parents first), the root node 0."""
        buffers, count = self.tree_buffers, self.nodes + 1
        chosen = torch.sort(self.cand_score, descending=True, stable=True).indices[: self.nodes]
        chosen = torch.sort(chosen).values
        node_of = torch.zeros(self.candidates + 1, dtype=torch.long, device=self.device)
        node_of[chosen + 1] = self.rows[1:count]
        parent = torch.cat([self.rows[:1], node_of.index_select(0, self.cand_parent.index_select(0, chosen) + 1)])
        depth = torch.cat([self.rows[:1], self.cand_depth.index_select(0, chosen)])
        buffers.tokens[1:] = self.cand_token.index_select(0, chosen)
        buffers.lay_out(parent, depth, self.levels)
        if self.temperature > 0:
            self.node_row[1:] = self.cand_row.index_select(0, chosen)

    def verify(self, parity: int) -> torch.Tensor:
        """Score the tree, accept its greedy path, move the path's entries next to the root, leave the next
        state; returns the result [accepted count, path tokens and bonus (levels + 1), child ranks (levels),
        whether the last accepted node has children]."""
        decoder, buffers = self.decoder, self.tree_buffers
        state, following_state = self.states[parity], self.states[1 - parity]
        count = self.nodes + 1
        if self.method == "baseline":
            buffers.tokens[:1] = state.root
        slots = state.length + self.rows[:count]
        mask = self._mask(self.target_columns, state.length, buffers.ancestors)
        features = decoder._static_forward(self.target_cache, buffers.tokens, state.length + buffers.depth, mask,
                                           slots)
        logits = decoder.logits(features)
        if self.temperature == 0:
            argmax = logits.max(-1).indices
            missed = buffers.tokens != argmax.index_select(0, buffers.parent)
            reached = ~(buffers.ancestors[:, 1:] & missed[None, 1:]).any(-1)
            best = torch.where(reached, buffers.rank, -1).argmax().reshape(1)
            path = buffers.paths.index_select(0, best)[0]
            accepted = buffers.depth.index_select(0, best)
            bonus = argmax.index_select(0, best)
        else:
            path, accepted, bonus = self._sample(torch.softmax(logits.float() / self.temperature, -1))
            best = path[-1:]
        if self.levels:
            cache = self.target_cache.buffer
            cache.index_copy_(-2, state.length + 1 + self.rows[: self.levels],
                              cache.index_select(-2, state.length + path[1:]))
        # the path's tokens after the root, then the bonus: what the cycle emits, and the token of each new pair
        following = torch.cat([path[1:], path[-1:]])
        emitted = torch.where(self.rows[: self.pairs] < accepted, buffers.tokens.index_select(0, following), bonus)
        following_state.features.copy_(features.index_select(0, path))
        following_state.tokens.copy_(emitted)
        following_state.count.copy_(accepted + 1)
        following_state.length.copy_(state.length + accepted + 1)
        following_state.root.copy_(bonus)
        self.result.copy_(torch.cat([accepted, emitted, buffers.sibling.index_select(0, path[1:]),
                                     buffers.internal.index_select(0, best).long()]))
        return self.result

    def _sample(self, p) -> tuple:
        """T > 0: (path, accepted drafts, bonus) from every node's output drawn up front (sampled_outputs)."""
        decoder, tokens = self.decoder, self.tree_buffers.tokens
        if self.method == "baseline":
            return self.rows[:1], self.rows[:1] * 0, drafting.draw(p, 1, self.generator)[:, 0]
        model = decoder.draft_model
        if self.grown:
            rows = self.node_row.clamp_min(0)
            q = model.vocabulary_q(self.expanded_q.index_select(0, rows), model.ids)
            outputs = grown_outputs(p, q, self.expanded_drafts.index_select(0, rows), self.node_row >= 0,
                                    decoder.verifier, self.generator)
        else:
            outputs = sampled_outputs(self.plan, p, self.q_internal, tokens, decoder.verifier,
                                      lambda q: model.vocabulary_q(q, model.ids), self.generator)
        path, accepted = sampled_walk(self.tree_buffers.parent, outputs, tokens, self.levels)
        return path, accepted, outputs.index_select(0, path[-1:])

    # -- the host side -------------------------------------------------------------------------

    def start(self, length: int, root: torch.Tensor, feature: torch.Tensor, temperature: float) -> None:
        """After the prefill (and the head's catch-up on the prompt's pairs but the last): the last pair pends;
        the first cycle has parity 0."""
        self.temperature = temperature
        state = self.states[0]
        state.length.fill_(length)
        state.root.copy_(root)
        state.count.fill_(1)
        state.features[:1] = feature
        state.tokens[:1] = root

    def launch(self, parity: int, timer) -> None:
        """Queue one cycle and the copy of its result into the host buffer of its parity."""
        graphs = self.decoder.graphs
        if self.method == "eagle":
            self._run(graphs, "draft", parity)
            timer.lap("draft")
        self._run(graphs, "verify", parity)
        self.transfer.send(self.result, parity)
        timer.lap("verify")

    def _run(self, graphs, phase: str, parity: int) -> None:
        function = getattr(self, phase)
        if graphs is None:
            function(parity)
        else:
            graphs.run((phase, id(self), parity, self.temperature), lambda: function(parity),
                       generator=self.generator)

    def receive(self, parity: int) -> tuple[int, list[int], list[int], bool]:
        """(accepted drafts, the path's tokens and the bonus, the path's child ranks, whether its last node has
        children) of the cycle of that parity."""
        values = self.transfer.receive(parity)
        accepted, levels = values[0], self.levels
        return accepted, values[1 : accepted + 2], values[2 + levels : 2 + levels + accepted], bool(values[-1])


def _generator(device, graphs) -> torch.Generator:
    """The cycle's random numbers: under CUDA graphs the device's default generator, whose state a replay reads
    afresh (captured kernels take their seed and offset from it, and each replay advances it), so replays draw new
    numbers and a seed gives the same tokens with graphs on and off; elsewhere a generator of its own."""
    device = torch.device(device)
    if device.type == "cuda" and isinstance(graphs, Graphs) and not isinstance(graphs, Emulated):
        return torch.cuda.default_generators[device.index if device.index is not None else torch.cuda.current_device()]
    return torch.Generator(device)


class Transfer:
    """A small device tensor to the host: on CUDA a non-blocking copy into pinned memory and an event per slot,
    so the host can queue more work before it waits."""

    def __init__(self, like: torch.Tensor, device):
        self.cuda = torch.device(device).type == "cuda"
        self.host = [torch.zeros(like.shape, dtype=like.dtype, pin_memory=self.cuda) for _ in range(2)]
        self.events = [torch.cuda.Event() for _ in range(2)] if self.cuda else None

    def send(self, value: torch.Tensor, slot: int) -> None:
        self.host[slot].copy_(value, non_blocking=self.cuda)
        if self.cuda:
            self.events[slot].record()

    def receive(self, slot: int) -> list[int]:
        if self.cuda:
            self.events[slot].synchronize()
        return self.host[slot].tolist()
