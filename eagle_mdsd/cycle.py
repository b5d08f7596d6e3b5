"""The decoding cycle: state in device tensors, two fixed-shape functions a cycle, one transfer.

State between cycles (0-based positions): the target's KV cache holds the committed tokens x_0..x_{L-1}; the
root x_L was sampled from the target but not yet run through it.  The head's cache holds one entry per pair
(f_i, x_{i+1}) at position i + 1; the pairs whose true features arrived in the last cycle are pending.  Length,
root and pending pairs live in device tensors, so a cycle needs no host decision between its two phases:

- `draft`: the head catches up on the pending pairs (padded to the most a cycle commits, so one shape serves
  every cycle; its output at the root predicts the root's feature), then drafts the tree: a static tree level
  by level, each parent's children drawn by the drafting scheme (drafters.StaticPlan); a dynamic tree grown in
  fixed-size candidate buffers and selected (dynamic.py); prompt lookup's proposal grafted on (lookup.py).  A
  grown or grafted tree is laid out (parents, depths, paths, ancestors) by tensor ops;
- `verify`: the target's forward over [root, nodes] with the tree mask, lm_head, acceptance, the KV gather of
  the accepted entries next to the root, the next cycle's pending pairs, root and length, and the result the
  host reads.  At T = 0 every lossless verifier outputs the target's argmax, so a node is accepted when its
  token is its parent's argmax and its ancestors are accepted; the deepest accepted node ends the path.  At
  T > 0 every node's output token is drawn up front (`node_outputs`), each distributed as p at its node, and
  the walk from the root into the child holding the output is tensor ops (`sampled_walk`).

Every mask, position and cache slot is computed inside the functions from the device length, so a phase
needs no input from the host but the span its attention reads (cache.py): exact when eager, a bucket under
CUDA graphs (graphs.py), which capture each phase once per parity, temperature and bucket.  The state is
kept twice: a cycle reads one copy and writes the other, so no function writes what it reads and running one
twice (a CUDA graph's warm-up does) gives the same result.  The host copies one small result tensor a cycle
(accepted count, tokens, child ranks, whether the last node has children) and checks the token budget and
EOS on it; under graphs, where the budget cannot end the call, the next cycle is queued before the host
waits for that copy.  Eagerly (`eager`: no graphs) a CPU pays for every row, so the cycle takes host
shortcuts that leave its tokens as they are: the pending count from the last result, the rows up to the last
valid node (`_scored`), OPT-Tree's stop and a graft's descent stopped by host checks, and at T > 0 the walk on
the host (`_walk`), computing only the visited nodes' outputs from the same draws.
"""

from __future__ import annotations

import torch

from . import drafting, dynamic, lookup
from .drafters import StaticPlan
from .graphs import Transfer, generator
from .tree import additive_mask

SPAN_BUCKET = 128  # under graphs a phase reads a multiple of this many entries: a graph a bucket


class State:
    """What one cycle leaves the next, in device tensors: length, root, the pending (feature, token) pairs."""

    def __init__(self, pairs: int, width: int, dtype, device):
        self.length = torch.zeros(1, dtype=torch.long, device=device)
        self.root = torch.zeros(1, dtype=torch.long, device=device)
        self.count = torch.ones(1, dtype=torch.long, device=device)  # pending pairs, at most `pairs`
        self.features = torch.zeros(pairs, width, dtype=dtype, device=device)
        self.tokens = torch.zeros(pairs, dtype=torch.long, device=device)


class TreeBuffers:
    """The tree the verify phase scores [N+1 nodes, the root first]: tokens, the layout (`deepest`: which accepted
    node ends a T = 0 path), each node's rank among its siblings (`sibling`) and whether it has children (the child
    ranks sequoia.py reads), whether a walk may enter it, its one-point draft (a lookup token, else -1) and, grown,
    its expanded row (else -1).  Constant for a static tree; written by the draft phase for a grown or grafted one."""

    def __init__(self, nodes: int, levels: int, device):
        count, long = nodes + 1, dict(dtype=torch.long, device=device)
        self.tokens = torch.zeros(count, **long)
        self.depth = torch.zeros(count, **long)
        self.parent = torch.zeros(count, **long)
        self.ancestors = torch.eye(count, dtype=torch.bool, device=device)
        self.paths = torch.zeros(count, levels + 1, **long)
        self.deepest = torch.zeros(count, **long)
        self.sibling = torch.zeros(count, **long)
        self.internal = torch.zeros(count, dtype=torch.bool, device=device)
        self.valid = torch.ones(count, dtype=torch.bool, device=device)
        self.point = torch.full((count,), -1, **long)
        self.row = torch.full((count,), -1, **long)
        self.levels = levels

    def lay_out(self, parent: torch.Tensor, depth: torch.Tensor, valid: torch.Tensor) -> None:
        """The layout of a tree from its parents [N+1] (the root its own, parents before children) and depths."""
        count, levels = len(parent), self.levels
        nodes = torch.arange(count, device=parent.device)
        self.parent.copy_(parent)
        self.depth.copy_(depth)
        self.valid.copy_(valid)
        # climb: chain[n, m] is node n's ancestor m levels up (the root stays put)
        chain = [nodes]
        for _ in range(levels):
            chain.append(parent.index_select(0, chain[-1]))
        chain = torch.stack(chain, 1)  # [count, levels + 1]
        self.ancestors.copy_(torch.zeros(count, count, dtype=torch.bool, device=parent.device).scatter_(1, chain, True))
        # paths[n, j]: the ancestor at depth j, then the node itself past its depth
        up = (depth[:, None] - torch.arange(levels + 1, device=parent.device)[None]).clamp_min(0)
        self.paths.copy_(chain.gather(1, up))
        self.deepest.copy_(depth * count - nodes)  # deeper first, then the lower number
        same = (parent[None] == parent[:, None]) & (nodes[None] < nodes[:, None]) & (nodes[None] > 0)
        self.sibling.copy_(same.sum(-1))  # each node's number among its siblings, in node order
        child = (parent[None] == nodes[:, None]) & (nodes[None] > 0) & valid[None]  # [node, its valid child]
        self.internal.copy_(child.any(-1))


def node_outputs(p, y, point, verified, drafted) -> torch.Tensor:
    """Every node's output token [N+1], each distributed as p at its node.  y [N+1]: a draw of p at every node;
    verified [N+1]: the verifier's draw against the node's head drafts, verified against p without the node's
    one-point draft where it has one (point >= 0); drafted [N+1]: whether the node has head drafts.  A node with
    a one-point draft l outputs y when y = l (probability p(l)), else the verifier's token, distributed as p
    without l: p(t) for every t != l (lookup.py); a node without head drafts outputs y.  Each node's draws are
    independent of the others', so drawing all of them before the walk leaves the walk's distribution as it is."""
    return torch.where(drafted & (point != y), verified, y)


def sampled_walk(parent, valid, outputs, tokens, levels: int) -> tuple[torch.Tensor, torch.Tensor]:
    """(path [levels + 1], accepted [1]): from the root into the lowest-numbered valid child holding the node's
    output (siblings are numbered in draft order), while one does; the path is padded with its last node, as
    TreeBuffers.paths are."""
    nodes = torch.arange(len(parent), device=parent.device)
    node = nodes[:1]
    accepted, going, path = torch.zeros_like(node), torch.ones(1, dtype=torch.bool, device=tokens.device), [node]
    for _ in range(levels):
        hit = (parent == node) & (nodes > 0) & valid & (tokens == outputs.index_select(0, node))
        found = hit.any().reshape(1) & going
        node = torch.where(found, hit.to(torch.int8).argmax().reshape(1), node)
        accepted, going = accepted + found.long(), found
        path.append(node)
    return torch.cat(path), accepted


class Cycle:
    """One decoder's cycle over one pair of caches (graphs capture their buffers): method 'baseline' (our plain
    step: a tree of the root alone) or 'eagle' over a static, grown or grafted topology."""

    def __init__(self, decoder, topology, target_cache, head_cache, method: str):
        self.decoder, self.method = decoder, method
        # set by start(): the call's temperature (graphs are kept per temperature); eagerly, the pending pairs' count
        self.temperature, self.pending = 0.0, 1
        self.generator = generator(decoder.device, decoder.graphs)
        self.target_cache, self.head_cache = target_cache, head_cache
        self.device, self.dtype = decoder.device, decoder.target.dtype
        self.eager = decoder.graphs is None  # exact spans, the plain step as `generate` runs it, host shortcuts
        self.topology = topology if method == "eagle" else None
        base = None if self.topology is None else getattr(topology, "base", topology)
        self.grafted = 0 if self.topology is None else topology.grafted
        self.grown = base is not None and not base.static
        self.drafted = 0 if base is None else min(base.nodes, dynamic.candidates(base)) if self.grown else base.size
        levels = 0 if base is None else base.max_depth
        self.nodes, self.levels = self.drafted + self.grafted, levels + self.grafted
        self.pairs = self.levels + 1  # a cycle commits at most the deepest path and the bonus
        width = decoder.hidden_size * (1 if decoder.feature_layers is None else 1 + len(decoder.feature_layers))
        # cycle i reads states[i % 2] and writes states[1 - i % 2]: a phase never writes what it reads
        self.states = [State(self.pairs, width, self.dtype, self.device) for _ in range(2)]
        self.tree = TreeBuffers(self.nodes, self.levels, self.device)
        self.result = torch.zeros(2 * self.levels + 3, dtype=torch.long, device=self.device)
        self.rows = torch.arange(max(self.nodes, self.pairs) + 1, device=self.device)
        self.columns = torch.arange(target_cache.capacity, device=self.device)
        self.reach = max(self.nodes + 1, self.pairs)  # most entries past the length a cycle writes
        self.has_drafts = torch.zeros(self.nodes + 1, dtype=torch.bool, device=self.device)  # nodes with head drafts
        if base is not None:
            self.base = base
            if self.grown:
                self.reach = max(self.reach, (base.max_depth - 1) * base.top_k)
                expanded = 1 + (base.max_depth - 1) * base.top_k
                self.grown_q = torch.zeros(expanded, decoder.draft_model.width, device=self.device)
                self.grown_drafts = torch.zeros(expanded, base.top_k, dtype=torch.long, device=self.device)
            else:
                self._set_static(base)
        if self.grafted:
            self.context = torch.zeros(target_cache.capacity + self.pairs + 1, dtype=torch.long, device=self.device)
        self.transfer = Transfer(self.result, self.device)

    def _set_static(self, tree) -> None:
        self.plan = StaticPlan.of(tree, self.device)
        self.q_internal = torch.zeros(self.plan.internal, self.decoder.draft_model.width, device=self.device)
        self.base_parent = torch.tensor([0, *tree.parent[1:]], device=self.device)
        self.base_depth = torch.tensor(tree.depth, device=self.device)
        self.has_drafts[: tree.size + 1] = torch.tensor([bool(kids) for kids in tree.children], device=self.device)
        self.tree.lay_out(*self._padded(self.base_parent, self.base_depth, self.base_depth >= 0))

    def _padded(self, parent, depth, valid) -> tuple:
        """A drafted tree's layout inputs, with the reserved lookup slots (if any) as not-valid leaves of the root
        until a graft fills them."""
        zeros = torch.zeros(self.grafted, dtype=torch.long, device=self.device)
        return torch.cat([parent, zeros]), torch.cat([depth, zeros + 1]), torch.cat([valid, zeros.bool()])

    # -- masks ---------------------------------------------------------------------------------------------

    def _mask(self, length, seen: torch.Tensor, span: int) -> torch.Tensor:
        """Additive mask [rows, span]: every committed entry (before `length`) and, from `length` on, the entries
        `seen` [rows, width] marks."""
        relative = self.columns[:span][None] - length
        width = seen.shape[1]
        inside = (relative >= 0) & (relative < width)
        marked = seen.gather(1, relative.clamp(0, width - 1).expand(seen.shape[0], -1))
        return additive_mask((relative < 0) | (inside & marked), self.dtype)

    # -- the draft phase -----------------------------------------------------------------------------------

    def draft(self, parity: int) -> torch.Tensor:
        """The tree's tokens (and, grown or grafted, its layout) from the state the last verify left."""
        state, span = self.states[parity], self.head_cache.span
        model, tree = self.decoder.draft_model, self.tree
        # pending pair j at head slot length - count + j, position one further.  Under graphs they are padded to
        # the most a cycle commits (one shape; padded rows write garbage that the tree's entries overwrite, and no
        # real row sees it); eagerly the head reads them alone, their count the host's from the last result
        pending = self.pending if self.eager else self.pairs
        slots = self.head_cache.slots = state.length - state.count + self.rows[:pending]
        mask = additive_mask(self.columns[:span][None] <= slots[:, None], self.dtype)
        root_prediction = model.forward(self.head_cache, state.features[:pending], state.tokens[:pending], slots + 1,
                                        mask).index_select(0, state.count - 1)
        tree.tokens[:1] = state.root
        if self.grown:
            parent, depth, valid = self._grow(state, root_prediction, span)
        else:
            self._draft_static(state, root_prediction, span)
            parent, depth, valid = self.base_parent, self.base_depth, self.base_depth >= 0
        if self.grafted:
            proposal, count = lookup.propose(self.context, state.length + 1, self.grafted)
            parent, depth, tokens, valid, point = lookup.graft(parent, depth, tree.tokens[: self.drafted + 1],
                                                               valid, proposal, count, eager=self.eager)
            tree.tokens.copy_(tokens)
            tree.point.copy_(point)
        if self.grown or self.grafted:
            tree.lay_out(parent, depth, valid)
        return tree.tokens

    def _draft_static(self, state: State, outputs, span: int) -> None:
        """The tree's tokens level by level, each parent's children drawn by the scheme (at T = 0 from q at
        temperature 1: the top k for topk) per group of parents with the same child count; at T > 0 each level's
        q is kept for the verifier."""
        model, tokens, scheme = self.decoder.draft_model, self.tree.tokens, self.decoder.scheme
        first = 0
        for level in self.plan.levels:
            if level.depth > 0:
                self.head_cache.slots = state.length + level.offsets
                mask = self._mask(state.length, self.plan.slot_seen.index_select(0, level.offsets), span)
                outputs = model.forward(self.head_cache, outputs.index_select(0, level.inputs),
                                        tokens.index_select(0, level.parents),
                                        (state.length + level.depth).expand(len(level.parents)), mask)
            q, ids = model.distribution(outputs, self.temperature)
            if self.temperature > 0:
                self.q_internal[first : first + len(q)] = q
                first += len(q)
            for count, rows, children in level.groups:
                drafts = scheme.sample_batch(q if rows is None else q.index_select(0, rows), count, self.generator)
                drafts = drafts.reshape(-1)
                tokens.index_copy_(0, children.reshape(-1), drafts if ids is None else ids.index_select(0, drafts))

    def _grow(self, state: State, root_prediction, span: int) -> tuple:
        """A dynamic tree (dynamic.grow, dynamic.select) whose expansions run the head: each depth's frontier
        attends to its ancestors among the expanded candidates.  Returns (parent, depth, valid)."""
        spec, model = self.base, self.decoder.draft_model
        k = spec.top_k
        own = torch.arange(k, device=self.device)
        carried = {"inputs": root_prediction.expand(k, -1),
                   "seen": torch.zeros(k, max((spec.max_depth - 1) * k, 1), dtype=torch.bool, device=self.device)}

        def expand(depth, tokens, parents):
            if parents is not None:
                carried["inputs"] = carried["outputs"].index_select(0, parents)
                carried["seen"] = carried["seen"].index_select(0, parents)
            offsets = (depth - 1) * k + own
            carried["seen"] = carried["seen"].index_copy(1, offsets, torch.eye(k, dtype=torch.bool, device=self.device))
            self.head_cache.slots = state.length + offsets
            carried["outputs"] = model.forward(self.head_cache, carried["inputs"], tokens,
                                               (state.length + depth).expand(k),
                                               self._mask(state.length, carried["seen"], span))
            return model.distribution(carried["outputs"], self.temperature)[0]

        q_root, ids = model.distribution(root_prediction, self.temperature)
        grown = dynamic.grow(spec, q_root, ids, expand, self.decoder.scheme, self.generator, eager=self.eager,
                             keep_q=self.temperature > 0)
        _, tokens, parent, depth, valid, row = dynamic.select(grown, self.drafted)
        self.tree.tokens[1 : self.drafted + 1] = tokens
        self.has_drafts[: self.drafted + 1] = row >= 0
        self.tree.row[: self.drafted + 1] = row
        if self.temperature > 0:  # into buffers of their own, which the verify phase's graph reads
            self.grown_q.copy_(grown.q)
            self.grown_drafts.copy_(grown.drafts)
        return parent, depth, valid

    # -- the verify phase ----------------------------------------------------------------------------------

    def verify(self, parity: int) -> torch.Tensor:
        """Score the tree, accept a path, move the path's entries next to the root, leave the next state; returns
        the result [accepted count, path tokens and bonus (levels + 1), child ranks (levels), whether the last
        accepted node has children]."""
        tree, state, following_state = self.tree, self.states[parity], self.states[1 - parity]
        if self.topology is None:
            tree.tokens[:1] = state.root
        cache, count = self.target_cache, self._scored()
        # eagerly the committed entries and the scored rows alone, not the most a cycle may write
        span = cache.span = cache.length + count if self.eager else cache.span
        cache.slots = state.length + self.rows[:count]
        # eagerly the plain step attends as `generate`'s does: no mask, the model's own kernel choice
        mask = None if self.eager and self.nodes == 0 else self._mask(state.length, tree.ancestors[:count], span)
        features = self.decoder.target_forward(cache, tree.tokens[:count], state.length + tree.depth[:count], mask)
        logits = self.decoder.logits(features)  # [count, V]
        if self.temperature == 0:
            argmax = logits.max(-1).indices  # the first maximal index, as argmax; several times faster on bf16
            missed = (tree.tokens[:count] != argmax.index_select(0, tree.parent[:count])) | ~tree.valid[:count]
            reached = ~(tree.ancestors[:count, 1:count] & missed[None, 1:]).any(-1)
            best = torch.where(reached, tree.deepest[:count], -1).argmax().reshape(1)
            path, accepted, bonus = tree.paths.index_select(0, best)[0], tree.depth.index_select(0, best), \
                argmax.index_select(0, best)
        else:
            path, accepted, bonus = self._sample(logits)
            best = path[-1:]
        if self.levels:
            buffer = cache.buffer
            buffer.index_copy_(-2, state.length + 1 + self.rows[: self.levels],
                               buffer.index_select(-2, state.length + path[1:]))
        # the path's tokens after the root, then the bonus: what the cycle emits, and the token of each new pair
        emitted = torch.where(self.rows[: self.pairs] < accepted,
                              tree.tokens.index_select(0, torch.cat([path[1:], path[-1:]])), bonus)
        if self.grafted:
            self.context.index_copy_(0, state.length + 1 + self.rows[: self.pairs], emitted)
        following_state.features.copy_(features.index_select(0, path))
        following_state.tokens.copy_(emitted)
        following_state.count.copy_(accepted + 1)
        following_state.length.copy_(state.length + accepted + 1)
        following_state.root.copy_(bonus)
        self.result.copy_(torch.cat([accepted, emitted, tree.sibling.index_select(0, path[1:]),
                                     tree.internal.index_select(0, best).long()]))
        return self.result

    def _scored(self) -> int:
        """How many of the tree's rows [root, nodes] the target scores: all under graphs (one shape); eagerly up to
        the last valid node (one host read), so that a graft's unfilled slots and a grown tree's unused ones cost
        a CPU nothing.  A node's parent precedes it, so the scored rows hold every valid node's ancestors."""
        if not self.eager or not (self.grafted or self.grown):
            return self.nodes + 1
        return int(self.tree.valid.nonzero()[-1]) + 1

    def _sample(self, logits) -> tuple:
        """T > 0: (path, accepted drafts, bonus).  Every node's output (node_outputs) takes two uniforms drawn up
        front, one for its draw of p and one for the verifier's; under graphs every node's output is computed and
        the walk is tensor ops, eagerly only the walk's nodes' are (a CPU pays for every row it computes, and the
        walk visits few).  The uniforms make both give the same tokens, seed for seed."""
        # every node's pair, scored or not: the same draws eagerly as under graphs, seed for seed
        uniform = torch.rand((2, self.nodes + 1, 1), generator=self.generator, dtype=torch.float64, device=self.device)
        if self.eager and self.topology is not None:
            return self._walk(logits, uniform)
        p = drafting.warp(logits, self.temperature)
        y = drafting.pick(p, uniform[0])[:, 0]
        if self.topology is None:
            return self.rows[:1], self.rows[:1] * 0, y
        if self.grafted:
            p = drafting.without_token(p, self.tree.point)
        verified = self._verified(p, uniform[1], self.rows[: self.nodes + 1])
        outputs = node_outputs(p, y, self.tree.point, verified, self.has_drafts)
        path, accepted = sampled_walk(self.tree.parent, self.tree.valid, outputs, self.tree.tokens, self.levels)
        return path, accepted, outputs.index_select(0, path[-1:])

    def _verified(self, p, uniform, nodes) -> torch.Tensor:
        """The verifier's output at `nodes` [R] from their p [R, V] (one batched call a child count for a static
        tree), against each node's head drafts: at a node without any a token of no meaning, which node_outputs
        never takes."""
        model, verifier, tree = self.decoder.draft_model, self.decoder.verifier, self.tree
        if self.grown:
            rows = tree.row.index_select(0, nodes).clamp_min(0)
            q = model.vocabulary_q(self.grown_q.index_select(0, rows), model.ids)
            plan = verifier.plan(p, q, self.grown_drafts.index_select(0, rows))
            return drafting.pick(plan, uniform.index_select(0, nodes))[:, 0]
        verified = torch.zeros(len(tree.tokens), dtype=torch.long, device=self.device)
        for group, rows, children in self.plan.groups:
            group_p = None
            if len(nodes) == 1:  # the eager walk's node: its own group's row alone
                chosen = group == nodes
                if not bool(chosen.any()):
                    continue
                group, rows, children, group_p = group[chosen], rows[chosen], children[chosen], p
            drafts = tree.tokens.index_select(0, children.reshape(-1)).view(children.shape)
            q = model.vocabulary_q(self.q_internal.index_select(0, rows), model.ids)
            plan = verifier.plan(p.index_select(0, group) if group_p is None else group_p, q, drafts)
            verified.index_copy_(0, group, drafting.pick(plan, uniform.index_select(0, group))[:, 0])
        return verified.index_select(0, nodes)

    def _walk(self, logits, uniform) -> tuple:
        """The sampled walk on the host (eager only): from the root into the first valid child holding the node's
        output, each output (its p, its draw, its verifier's draw) computed when the walk reaches its node."""
        tree = self.tree
        parent, valid, tokens, point, drafted = (values.tolist() for values in (
            tree.parent, tree.valid, tree.tokens, tree.point, self.has_drafts))
        children = [[] for _ in parent]
        for node in range(1, len(parent)):
            if valid[node]:
                children[parent[node]].append(node)
        path = [0]
        while True:
            node = path[-1]
            p = drafting.warp(logits[node : node + 1], self.temperature)
            output = drafting.pick(p, uniform[0, node : node + 1]).item()
            if drafted[node] and point[node] != output:
                if point[node] >= 0:
                    p = drafting.without_token(p, point[node])
                output = self._verified(p, uniform[1], self.rows[node : node + 1]).item()
            child = next((kid for kid in children[node] if tokens[kid] == output), None)
            if child is None:
                break
            path.append(child)
        accepted = len(path) - 1
        path += path[-1:] * (self.levels - accepted)
        return (torch.tensor(path, device=self.device), torch.tensor([accepted], device=self.device),
                torch.tensor([output], device=self.device))

    # -- the host side -------------------------------------------------------------------------------------

    def start(self, prompt: torch.Tensor, root: torch.Tensor, feature: torch.Tensor, temperature: float) -> None:
        """After the prefill (and the head's catch-up on the prompt's pairs but the last): the last pair pends;
        the first cycle has parity 0."""
        self.temperature, self.pending = temperature, 1
        state, length = self.states[0], len(prompt)
        state.length.fill_(length)
        state.root.copy_(root)
        state.count.fill_(1)
        state.features[:1] = feature
        state.tokens[:1] = root
        if self.grafted:
            self.context[:length] = prompt
            self.context[length : length + 1] = root

    def launch(self, parity: int, bound: int, timer) -> None:
        """Queue one cycle, whose committed length is at most `bound` (exact when eager), and the copy of its
        result into the host buffer of its parity."""
        graphs = self.decoder.graphs
        span = bound + self.reach
        if graphs is not None:
            span = min(-(-span // SPAN_BUCKET) * SPAN_BUCKET, self.target_cache.capacity)
        for cache in filter(None, (self.target_cache, self.head_cache)):
            cache.span, cache.length = span, bound
        if self.method == "eagle":
            self._run(graphs, "draft", parity, span)
            timer.lap("draft")
        self._run(graphs, "verify", parity, span)
        self.transfer.send(self.result, parity)
        timer.lap("verify")

    def _run(self, graphs, phase: str, parity: int, span: int) -> None:
        if graphs is None:
            return getattr(self, phase)(parity)
        graphs.run((phase, id(self), parity, self.temperature, span), lambda: getattr(self, phase)(parity),
                   generator=self.generator)

    def receive(self, parity: int) -> tuple[int, list[int], list[int], bool]:
        """(accepted drafts, the path's tokens and the bonus, the path's child ranks, whether its last node has
        children) of the cycle of that parity."""
        values = self.transfer.receive(parity)
        accepted, levels = values[0], self.levels
        self.pending = accepted + 1  # the next cycle's pending pairs (eagerly, that cycle is launched after this)
        return accepted, values[1 : accepted + 2], values[2 + levels : 2 + levels + accepted], bool(values[-1])
