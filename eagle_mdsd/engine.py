"""The decoding loop: draft a tree with the EAGLE head, score it in one target forward, verify, commit.

State between cycles (0-based positions): the target's KV cache holds the
committed tokens x_0..x_{L-1}; the root x_L was sampled from the target but
not yet run through it.  The head's cache holds one entry per pair
(f_i, x_{i+1}) at position i + 1; the pairs whose true features arrived in the
last cycle are pending.  One cycle:

1. the head runs on the pending pairs; its output at the root predicts the
   root's feature, whose logits give q for the root's children;
2. level by level, each internal node's children are drawn by the drafter
   from that node's q, and the head runs on the new internal nodes with a
   tree mask (each sees the committed pairs and its ancestors);
3. the target runs once on [root, all nodes] with the tree mask: p at every node;
4. from the root down, the verifier picks the output token at each node (at
   T = 0 the target's argmax, which every lossless verifier outputs); if it
   is a child the walk goes on there, otherwise it is the bonus token;
5. the accepted nodes' KV entries are moved next to the root in place
   (both caches are preallocated), and the bonus becomes the next root.

A lookup tree (lookup.py) grafts prompt-lookup tokens onto the tree
after step 2; its copy cycles skip steps 1-2 and check the lookup chain
alone, leaving their pairs pending.

Tokens per cycle = accepted drafts + 1; tau = new tokens / cycles, where
cycles counts target verification forwards (the prefill excluded) and new
tokens include the one sampled from the prefill.
"""

from __future__ import annotations

import math
import time
from dataclasses import asdict, dataclass, field

import torch
from transformers.cache_utils import Cache, DynamicLayer

from . import drafting, dynamic, kernels, lookup, models, verification
from .tree import Tree


class PreallocatedLayer(DynamicLayer):
    """A KV layer backed by one buffer of fixed capacity; updates write in place."""

    def __init__(self, capacity: int):
        super().__init__()
        self.capacity = capacity
        self.length = 0

    def lazy_initialization(self, key_states, value_states):
        self.dtype, self.device = key_states.dtype, key_states.device
        batch, heads, _, key_dim = key_states.shape
        self.key_buffer = key_states.new_zeros(batch, heads, self.capacity, key_dim)
        self.value_buffer = value_states.new_zeros(batch, heads, self.capacity, value_states.shape[-1])
        self.is_initialized = True

    def update(self, key_states, value_states, *args, **kwargs):
        if not self.is_initialized:
            self.lazy_initialization(key_states, value_states)
        end = self.length + key_states.shape[-2]
        if end > self.capacity:
            raise RuntimeError(f"KV cache capacity {self.capacity} exceeded")
        self.key_buffer[:, :, self.length : end] = key_states
        self.value_buffer[:, :, self.length : end] = value_states
        self.length = end
        self.keys, self.values = self.key_buffer[:, :, :end], self.value_buffer[:, :, :end]
        return self.keys, self.values

    def get_seq_length(self) -> int:
        return self.length

    def get_max_length(self) -> int:
        return self.capacity

    def keep(self, start: int, slots: torch.Tensor) -> None:
        """Move the entries at `slots` to start, start+1, ... and drop everything after them."""
        if len(slots):
            end = start + len(slots)
            self.key_buffer[:, :, start:end] = self.key_buffer.index_select(2, slots)
            self.value_buffer[:, :, start:end] = self.value_buffer.index_select(2, slots)
        self.length = start + len(slots)


def preallocated_cache(layers: int, capacity: int) -> Cache:
    return Cache(layers=[PreallocatedLayer(capacity) for _ in range(layers)])


def keep(cache: Cache, start: int, slots: torch.Tensor) -> None:
    for layer in cache.layers:
        layer.keep(start, slots)


def additive_mask(visible: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """[q, kv] bool -> [1, 1, q, kv] float mask (0 where visible), used as-is by eager and SDPA attention."""
    mask = torch.zeros(visible.shape, dtype=dtype, device=visible.device)
    return mask.masked_fill_(~visible, torch.finfo(dtype).min)[None, None]


def check_temperature(temperature: float, name: str = "temperature") -> None:
    """One-line error unless `temperature` is a finite number >= 0 (NaN would otherwise sample garbage)."""
    if not math.isfinite(temperature) or temperature < 0:
        raise ValueError(f"{name} must be >= 0 (a finite number), got {temperature}")


def warp(logits: torch.Tensor, temperature: float) -> torch.Tensor:
    """Target distribution at `temperature`; one-hot argmax at 0 (float32)."""
    if temperature == 0:
        return torch.zeros_like(logits, dtype=torch.float32).scatter_(-1, logits.argmax(-1, keepdim=True), 1.0)
    return torch.softmax(logits.float() / temperature, -1)


def first_argmax(logits: torch.Tensor) -> list[int] | int:
    """Each row's argmax (the first maximal index, as argmax), or a vector's: max() is several times faster
    on bf16."""
    return logits.max(-1).indices.tolist()


class PhaseTimer:
    """Seconds per phase of the decoding loop (draft, target, verify, commit), when enabled.

    On CUDA each lap synchronises, so profiling slows the loop a little; off, it costs nothing.
    """

    def __init__(self, enabled: bool, device: torch.device):
        self.enabled, self.cuda = enabled, device.type == "cuda"
        self.seconds: dict[str, float] = {}
        self.last = 0.0

    def _now(self) -> float:
        if self.cuda:
            torch.cuda.synchronize()
        return time.perf_counter()

    def start(self) -> None:
        if self.enabled:
            self.last = self._now()

    def lap(self, phase: str) -> None:
        if self.enabled:
            now = self._now()
            self.seconds[phase] = self.seconds.get(phase, 0.0) + now - self.last
            self.last = now


@dataclass
class GenerationResult:
    prompt_token_ids: list[int]
    token_ids: list[int]
    cycles: int
    accept_lengths: list[int] = field(default_factory=list)
    prefill_time_s: float = 0.0
    wall_time_s: float = 0.0
    profile: dict[str, float] = field(default_factory=dict)  # seconds per phase, with profile=True
    accepted_ranks: list[int] = field(default_factory=list)  # per visited node with children: child rank or -1

    @property
    def new_tokens(self) -> int:
        return len(self.token_ids)

    @property
    def tau(self) -> float:
        """Average accepted length: new tokens / target verification cycles."""
        return self.new_tokens / max(self.cycles, 1)

    @property
    def tokens_per_s(self) -> float:
        return self.new_tokens / self.wall_time_s if self.wall_time_s > 0 else 0.0

    def to_dict(self) -> dict:
        return asdict(self) | {"new_tokens": self.new_tokens, "tau": self.tau, "tokens_per_s": self.tokens_per_s}


def check_drafter_fits(scheme, tree: Tree, vocab: int = 1 << 30) -> None:
    """Every internal node's child count must be a draft count the scheme can produce."""
    scheme = drafting.get(scheme)
    for kids in tree.children:
        if kids:
            try:
                scheme.check(len(kids), vocab)
            except ValueError as error:
                raise ValueError(f"drafter {scheme.name!r} cannot fill tree {tree.name!r} "
                                 f"(a node has {len(kids)} children): {error}") from None


# On a small target the head's lm_head over the full vocabulary is most of the drafting time; the
# embedded default's 8192 most frequent answer tokens cover ~95% of its greedy MT-Bench answers and
# leave tau unchanged while drafting twice as fast (evaluation/results/, README).
AUTO_DRAFT_VOCAB = 8192


def resolve_draft_vocab(head, draft_vocab: int | str | None) -> int | None:
    """A number of tokens, or None for the full vocabulary: 'full' and None give None; 'auto' gives
    AUTO_DRAFT_VOCAB where the head ships its token ranking, else None."""
    if draft_vocab in (None, "full"):
        return None
    if draft_vocab != "auto":
        if isinstance(draft_vocab, bool) or not isinstance(draft_vocab, int):
            raise ValueError(f"draft_vocab must be a number of tokens, 'full' or 'auto', got {draft_vocab!r}")
        return draft_vocab
    return min(AUTO_DRAFT_VOCAB, len(head.draft_vocab)) if head is not None and head.draft_vocab else None


class Decoder:
    """Speculative decoding of one target with an EAGLE head over a static or dynamic tree."""

    def __init__(self, target, head=None, tree: Tree | dynamic.DynamicTree | lookup.LookupTree | None = None,
                 drafter="topk", verifier="topk", eos_token_ids=(), draft_vocab: int | str | None = None,
                 kernels_choice: str = "auto"):
        """draft_vocab: draft over the head's N most frequent tokens only (q is 0 elsewhere; still exact);
        'auto': AUTO_DRAFT_VOCAB of them when the head ships its token ranking, else the full vocabulary.
        A lookup.LookupTree drafts its base tree and grafts prompt-lookup tokens on.
        kernels_choice: 'auto' runs the target's and head's linear layers on prepacked bf16 weights where
        kernels.available (the layers are switched in place, stock outside this decoder), 'stock' never."""
        self.lookup_tokens = tree.tokens if isinstance(tree, lookup.LookupTree) else 0
        self.target, self.head = target, head
        self.tree = tree = tree.base if self.lookup_tokens else tree
        self.scheme, self.verifier = drafting.get(drafter), verification.get(verifier)
        verification.check_pair(self.scheme, self.verifier)
        self.decoder_model = target.get_decoder()
        self.target_cache_keyword = models.cache_keyword(self.decoder_model)
        self.lm_head = target.get_output_embeddings()
        self.embed = target.get_input_embeddings()
        self.eos = set(int(e) for e in eos_token_ids)
        self.packed = kernels.resolve(kernels_choice, self.lm_head.weight)
        if self.packed:
            kernels.pack(target)
            if head is not None:
                kernels.pack(head)
        self.draft_rows = None
        draft_vocab = resolve_draft_vocab(head, draft_vocab)
        if draft_vocab is not None:
            if head is None or head.draft_vocab is None:
                raise ValueError("--draft-vocab needs a head with a draft_vocab.json (token frequencies): "
                                 "export it with `eagle-mdsd train-head export`, or leave --draft-vocab out")
            if draft_vocab < 1:
                raise ValueError(f"--draft-vocab must be at least 1, got {draft_vocab}")
            rows = torch.tensor(sorted(head.draft_vocab[:draft_vocab]), device=self.lm_head.weight.device)
            bias = getattr(self.lm_head, "bias", None)
            self.draft_rows = rows
            self.draft_lm_head = kernels.linear_over(self.lm_head.weight[rows].contiguous(),
                                                     None if bias is None else bias[rows].contiguous())
            if self.packed:
                kernels.pack(self.draft_lm_head)
        if isinstance(tree, dynamic.DynamicTree):
            dynamic.check_pair(tree, self.scheme.name)
        elif tree is not None:
            check_drafter_fits(self.scheme, tree, self.lm_head.weight.shape[0])
            self.static_buffers = self._buffers(tree)

    def _buffers(self, tree: Tree) -> tuple[torch.Tensor, torch.Tensor]:
        """(positions offset, ancestor mask) of a tree's nodes on the decoder's device."""
        device = self.lm_head.weight.device
        return torch.tensor(tree.depth, device=device), tree.ancestors.to(device)

    # -- target and head calls -------------------------------------------------------------

    def _target(self, tokens, positions, visible=None):
        """The target's features (last hidden states after its final norm) [k, H].  visible None: plain causal
        attention, masked by the model itself as in its own `generate` - the same attention kernels, so in bf16
        the prefill and a plain decoding step round as `generate`'s do, bit for bit."""
        mask = None if visible is None else additive_mask(visible, self.target.dtype)
        out = self.decoder_model(input_ids=tokens[None], position_ids=positions[None], attention_mask=mask,
                                 use_cache=True, **{self.target_cache_keyword: self.target_cache})
        return out.last_hidden_state[0]

    def _head(self, features, tokens, positions, visible):
        return self.head(features[None], self.embed(tokens)[None], positions[None],
                         additive_mask(visible, self.target.dtype), self.head_cache)[0]

    # -- the loop ---------------------------------------------------------------------------

    def generate(self, prompt_ids, max_new_tokens: int = 128, temperature: float = 0.0, seed: int = 0,
                 method: str = "eagle", profile: bool = False) -> GenerationResult:
        check_temperature(temperature)
        if max_new_tokens < 1:
            raise ValueError(f"max_new_tokens must be at least 1, got {max_new_tokens}")
        if method not in ("eagle", "baseline"):
            raise ValueError(f"unknown method {method!r}: use eagle or baseline")
        if method == "eagle" and (self.head is None or self.tree is None):
            raise ValueError("method eagle needs a draft head and a tree")
        device = self.lm_head.weight.device
        prompt = torch.as_tensor(prompt_ids, dtype=torch.long, device=device).reshape(-1)
        tree_depth = self.tree.max_depth + self.lookup_tokens if method == "eagle" else 0
        context = getattr(self.target.config, "max_position_embeddings", None)
        if context is not None and len(prompt) + max_new_tokens + tree_depth > context:
            raise ValueError(f"prompt ({len(prompt)} tokens) + max_new_tokens ({max_new_tokens}) + tree depth "
                             f"({tree_depth}) exceed the model's context of {context} tokens: shorten the prompt "
                             f"or lower max_new_tokens")
        tree_size = self.tree.size + self.lookup_tokens if method == "eagle" else 0
        capacity = len(prompt) + max_new_tokens + tree_size + 2
        self.target_cache = preallocated_cache(self.target.config.num_hidden_layers, capacity)
        self.head_cache = preallocated_cache(len(self.head.layers), capacity) if method == "eagle" else None
        generator = torch.Generator(device=device).manual_seed(seed)
        self.timer = PhaseTimer(profile, device)
        with torch.inference_mode(), kernels.packed(self.packed):
            return self._run(prompt, max_new_tokens, temperature, generator, method)

    def _run(self, prompt, max_new_tokens, temperature, generator, method):
        start = time.perf_counter()
        length = len(prompt)
        features = self._target(prompt, torch.arange(length, device=prompt.device))
        root = self._sample(warp(self.lm_head(features[-1]), temperature), generator)
        prefill_time = time.perf_counter() - start
        result = GenerationResult(prompt.tolist(), [root], 0)
        self.accepted_ranks = result.accepted_ranks  # the walks append to it
        self.context = prompt.tolist() + [root]  # what prompt lookup searches
        self.copying, self.copy_cycles = False, 0  # lookup trees: copy cycles (lookup drafts only) so far
        pending = (features, torch.cat([prompt[1:], prompt.new_tensor([root])]))
        while root not in self.eos and result.new_tokens < max_new_tokens:
            if method == "baseline":
                self.timer.start()
                features = self._target(prompt.new_tensor([root]), prompt.new_tensor([length]))
                self.timer.lap("target")
                emitted, pending = [self._sample(warp(self.lm_head(features[-1]), temperature), generator)], None
                self.timer.lap("verify")
            else:
                emitted, pending = self._cycle(length, root, pending, temperature, generator)
            result.cycles += 1
            result.accept_lengths.append(len(emitted))
            length += len(emitted)
            result.token_ids.extend(emitted)
            self.context.extend(emitted)
            root = emitted[-1]
            if any(token in self.eos for token in emitted):
                cut = next(i for i, token in enumerate(result.token_ids) if token in self.eos)
                del result.token_ids[cut + 1 :]
                break
        del result.token_ids[max_new_tokens:]
        result.prefill_time_s = prefill_time
        result.wall_time_s = time.perf_counter() - start
        result.profile = dict(self.timer.seconds)
        return result

    def _sample(self, p, generator) -> int:
        return int(drafting.draw(p, 1, generator)[0])

    def _draft_distribution(self, predicted, temperature, support: int = 1):
        """(q, ids): each row's draft distribution over the draft vocabulary [F, D] and the vocabulary
        id of each column (ids None: q covers the whole vocabulary).

        The schemes draw from the compact q (a few times cheaper than from the full one; the tokens
        outside have q = 0 and are never drawn) unless a row has fewer than `support` tokens with
        mass: the schemes' fill convention then picks tokens outside, so that call gets the full q.
        """
        scale = temperature if temperature > 0 else 1.0
        if self.draft_rows is None:
            return torch.softmax(self.lm_head(predicted).float() / scale, -1), None
        logits = self.draft_lm_head(predicted).float()
        q = torch.softmax(logits / scale, -1)
        if support > 1 and bool(((q > 0).sum(-1) < support).any()):
            return self.vocabulary_q(q, self.draft_rows), None
        return q, self.draft_rows

    def vocabulary_q(self, q, ids):
        """A compact q from _draft_distribution over the whole vocabulary (0 outside the draft vocabulary)."""
        if ids is None:
            return q
        full = torch.zeros(q.shape[:-1] + self.lm_head.weight.shape[:1], device=q.device)
        return full.index_copy_(-1, ids, q)

    def _draft_static(self, length, root, root_prediction, committed, temperature, generator):
        """Level by level, each internal node's children drawn by the drafter from its q."""
        tree, device = self.tree, self.lm_head.weight.device
        tree_visible = self.static_buffers[1]
        predicted = {0: root_prediction}
        node_tokens = torch.empty(tree.size + 1, dtype=torch.long, device=device)
        node_tokens[0] = root
        draft_q = {}
        head_slots = []  # tree node held by each head cache entry after `committed`
        for depth in range(tree.max_depth):
            parents = tree.internal(depth)
            if not parents:
                break
            if depth > 0:
                head_slots += parents
                rows = torch.tensor(parents, device=device)
                seen = tree_visible[rows][:, head_slots]
                visible = torch.cat([torch.ones(len(parents), committed, dtype=torch.bool, device=device), seen], 1)
                inputs = torch.stack([predicted[tree.parent[node]] for node in parents])
                outputs = self._head(inputs, node_tokens[rows], torch.full_like(rows, length + depth), visible)
                predicted.update(zip(parents, outputs))
            counts = [len(tree.children[node]) for node in parents]
            q, ids = self._draft_distribution(torch.stack([predicted[node] for node in parents]), temperature,
                                              max(counts))
            for count in sorted(set(counts)):
                group = [i for i, c in enumerate(counts) if c == count]
                drafts = self.scheme.sample_batch(q[group], count, generator)
                if ids is not None:
                    drafts = ids[drafts]
                for row, i in enumerate(group):
                    node = parents[i]
                    draft_q[node] = (q[i], ids)
                    node_tokens[list(tree.children[node])] = drafts[row]
        return node_tokens, draft_q

    def _draft_dynamic(self, length, root, root_prediction, committed, temperature, generator):
        """Grow this cycle's tree from the head's probabilities (EAGLE-2, OPT-Tree).

        Returns (tree, node tokens, q per internal node, the full draft tuple per internal node).
        """
        device = self.lm_head.weight.device
        predicted = {0: root_prediction}
        head_slots = []  # candidate held by each head cache entry after `committed`

        def expand(frontier, candidates):
            head_slots.extend(frontier)
            seen = torch.tensor([[candidates.is_ancestor(slot, node) for slot in head_slots] for node in frontier],
                                device=device)
            visible = torch.cat([torch.ones(len(frontier), committed, dtype=torch.bool, device=device), seen], 1)
            inputs = torch.stack([predicted[candidates.parent[node]] for node in frontier])
            tokens = torch.tensor([candidates.token[node] for node in frontier], device=device)
            positions = torch.full_like(tokens, length + candidates.depth[frontier[0]])
            outputs = self._head(inputs, tokens, positions, visible)
            predicted.update(zip(frontier, outputs))
            return self._draft_distribution(outputs, temperature, self.tree.top_k)

        q, ids = self._draft_distribution(root_prediction[None], temperature, self.tree.top_k)
        candidates, expanded, drafted = dynamic.grow(self.tree, root, (q[0], ids), expand, self.scheme, generator)
        tree, chosen = dynamic.select(candidates, self.tree.nodes)
        node_tokens = torch.tensor([candidates.token[c] for c in chosen], device=device)
        internal = [(node, c) for node, c in enumerate(chosen) if tree.children[node]]
        draft_q, node_drafts = {node: expanded[c] for node, c in internal}, {node: drafted[c] for node, c in internal}
        return tree, node_tokens, draft_q, node_drafts

    def _cycle(self, length, root, pending, temperature, generator):
        device = self.lm_head.weight.device
        self.timer.start()
        proposal = lookup.continuation(self.context, self.lookup_tokens) if self.lookup_tokens else []
        if self.copying and proposal:
            return self._copy_cycle(length, root, pending, proposal, temperature, generator)
        # 1. the head catches up on the pairs with true features; its last output is the root's.
        features, tokens = pending
        committed = self.head_cache.layers[0].length
        k = len(tokens)
        visible = torch.ones(k, committed + k, dtype=torch.bool, device=device)
        visible[:, committed:] = torch.ones(k, k, dtype=torch.bool, device=device).tril_()
        root_prediction = self._head(features, tokens, torch.arange(length - k + 1, length + 1, device=device),
                                     visible)[-1]
        committed += k
        # 2. draft the tree (the head's tree entries are dropped afterwards).
        if isinstance(self.tree, dynamic.DynamicTree):
            tree, node_tokens, draft_q, node_drafts = self._draft_dynamic(length, root, root_prediction, committed,
                                                                          temperature, generator)
            tree_depth, tree_visible = self._buffers(tree)
        else:
            tree, (tree_depth, tree_visible) = self.tree, self.static_buffers
            node_tokens, draft_q = self._draft_static(length, root, root_prediction, committed, temperature,
                                                      generator)
            node_drafts = {}
        drafted, branch = tree.size, {}  # nodes 1..drafted hold head drafts; branch: node -> its lookup child
        if proposal:
            tree, node_tokens, branch = lookup.graft(tree, node_tokens, proposal)
            tree_depth, tree_visible = self._buffers(tree)
        keep(self.head_cache, committed, node_tokens[:0])
        self.timer.lap("draft")
        # 3. one target forward over the whole tree.
        visible = torch.cat([torch.ones(tree.size + 1, length, dtype=torch.bool, device=device), tree_visible], 1)
        features = self._target(node_tokens, length + tree_depth, visible)
        self.timer.lap("target")
        # 4. verify from the root down.  One lm_head pass over the whole tree: it reads the weights once
        #    (on a 2-core CPU a 26-row pass costs about what the walk's two or three one-row passes would).  At
        #    T = 0 every lossless verifier outputs the target's argmax, so the walk follows it, taking
        #    the argmax of the rows it visits only (a bf16 max with indices over all of them is slow).
        logits = self.lm_head(features)
        greedy = temperature == 0
        node, accepted = 0, []
        while True:
            kids = tree.children[node]
            if greedy:
                output = first_argmax(logits[node])
            else:
                output = self._verify_node(warp(logits[node], temperature), node_tokens, node, draft_q, node_drafts,
                                           [kid for kid in kids if kid <= drafted], branch.get(node), generator)
            if not kids:
                bonus = output
                break
            drafts = node_tokens[list(kids)]
            match = (drafts == output).nonzero()
            self.accepted_ranks.append(int(match[0]) if len(match) else -1)
            if len(match) == 0:
                bonus = output
                break
            node = kids[int(match[0])]
            accepted.append(node)
            if output in self.eos:
                self.timer.lap("verify")
                return [int(node_tokens[n]) for n in accepted], None
        self.timer.lap("verify")
        # 5. commit: the accepted nodes' target entries move next to the root; the head
        #    gets their true features as pending pairs at the start of the next cycle.
        keep(self.target_cache, length + 1, torch.tensor([length + n for n in accepted], device=device))
        path = [0] + accepted
        emitted = [int(node_tokens[n]) for n in accepted] + [bonus]
        pending = (features[path], torch.tensor(emitted, device=device))
        self.copying = lookup.agreement(emitted, proposal) >= lookup.COPY_MIN
        self.timer.lap("commit")
        return emitted, pending

    def _verify_node(self, p, node_tokens, node, draft_q, node_drafts, head_kids, lookup_kid, generator) -> int:
        """The output token at a node at T > 0, distributed as p: the lookup draft first, with probability
        p(its token), then the verifier on the head drafts against the rest of p (lookup.py)."""
        if lookup_kid is not None:
            sampled, token = self._sample(p, generator), int(node_tokens[lookup_kid])
            if sampled == token or not head_kids:
                return sampled  # a sample of p; when it is not the lookup token, a sample of p without it
            p = lookup.without(p, token)
        if not head_kids:
            return self._sample(p, generator)
        # a dynamic tree's verifier sees the node's whole draft tuple, pruned drafts included
        drafts = node_drafts.get(node, node_tokens[head_kids])
        return self.verifier.sample(p, self.vocabulary_q(*draft_q[node]), drafts, generator)

    def _copy_cycle(self, length, root, pending, proposal, temperature, generator):
        """A cycle of prompt-lookup drafts only, while the answer copies a span.

        The head is not run: this cycle's pairs join the pending ones and it catches up on all of them
        at the next full cycle.  Back to full cycles once fewer than lookup.COPY_MIN drafts agree.
        """
        device = self.lm_head.weight.device
        self.copy_cycles += 1
        n = len(proposal)
        node_tokens = torch.tensor([root] + proposal, device=device)
        chain = torch.ones(n + 1, n + 1, dtype=torch.bool, device=device).tril_()
        visible = torch.cat([torch.ones(n + 1, length, dtype=torch.bool, device=device), chain], 1)
        self.timer.lap("draft")
        features = self._target(node_tokens, torch.arange(length, length + n + 1, device=device), visible)
        self.timer.lap("target")
        logits = self.lm_head(features)
        if temperature == 0:
            outputs = first_argmax(logits)
        else:  # each node's output is a sample of its p (lookup.py); the walk stops at the first miss
            outputs = []
            for j in range(n + 1):
                outputs.append(self._sample(warp(logits[j], temperature), generator))
                if j == n or outputs[j] != proposal[j]:
                    break
        accepted = lookup.agreement(outputs, proposal)
        emitted = proposal[:accepted] + [outputs[accepted]]
        self.timer.lap("verify")
        eos = next((i for i, token in enumerate(emitted[:-1]) if token in self.eos), None)
        if eos is not None:
            return emitted[: eos + 1], None
        keep(self.target_cache, length + 1, torch.arange(length + 1, length + 1 + accepted, device=device))
        pending = (torch.cat([pending[0], features[: accepted + 1]]),
                   torch.cat([pending[1], torch.tensor(emitted, device=device)]))
        self.copying = accepted >= lookup.COPY_MIN
        self.timer.lap("commit")
        return emitted, pending
