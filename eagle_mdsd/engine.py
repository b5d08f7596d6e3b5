"""The decoding loop: draft a tree with the EAGLE head, score it in one target forward, verify, commit.

State between cycles (0-based positions): the target's KV cache holds the
committed tokens x_0..x_{L-1}; the root x_L was sampled from the target but
not yet run through it.  The head's cache holds one entry per pair
(f_i, x_{i+1}) at position i + 1; the pairs whose true features arrived in the
last cycle are pending.  One cycle (`Decoder._cycle`):

1. draft (drafters.py): the head runs on the pending pairs, its output at the
   root predicting the root's feature; then the tree is drafted from the head's
   q, each internal node's children drawn by the drafting scheme;
2. the target runs once on [root, all nodes] with the tree mask: p at every node;
3. verify: at T = 0 every lossless verifier outputs the target's argmax, so the
   whole tree is resolved with tensor ops (a node is accepted when its token is
   its parent's argmax and its ancestors are accepted; the deepest accepted node
   ends the path) and one transfer brings the path back; at T > 0 the walk goes
   from the root down, the verifier drawing the output token at each node (one
   transfer a visited node, two where a lookup draft is tried first); a child
   holding it continues the walk, else it is the bonus;
4. commit: one gather per cache moves the accepted nodes' entries next to the
   root, and the bonus becomes the next root.

Everything a call changes lives in its `Call`; a Decoder holds the models.

Tokens per cycle = accepted drafts + 1; tau = new tokens / cycles, where
cycles counts target verification forwards (the prefill excluded) and new
tokens include the one sampled from the prefill.
"""

from __future__ import annotations

import math
import time
from dataclasses import asdict, dataclass, field

import torch

from . import cycle, drafters, drafting, graphs, kernels, models, verification
from .cache import KVCache
from .errors import UsageError
from . import tree as trees


def check_temperature(temperature: float, name: str = "temperature") -> None:
    """One-line error unless `temperature` is a finite number >= 0 (NaN would otherwise sample garbage)."""
    if not math.isfinite(temperature) or temperature < 0:
        raise UsageError(f"{name} must be >= 0 (a finite number), got {temperature}")


def additive_mask(visible: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """[q, kv] bool -> [1, 1, q, kv] float mask (0 where visible), the shape a model call takes."""
    return trees.additive_mask(visible, dtype)[None, None]


def warp(logits: torch.Tensor, temperature: float) -> torch.Tensor:
    """Target distribution at `temperature`; one-hot argmax at 0 (float32)."""
    if temperature == 0:
        return torch.zeros_like(logits, dtype=torch.float32).scatter_(-1, logits.argmax(-1, keepdim=True), 1.0)
    return torch.softmax(logits.float() / temperature, -1)


def first_argmax(logits: torch.Tensor) -> torch.Tensor:
    """Each row's argmax (the first maximal index, as argmax) on the device: max() is several times faster
    than argmax on bf16."""
    return logits.max(-1).indices


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
    copy_cycles: int = 0  # prompt lookup: cycles that checked the lookup chain alone
    graph_capture_s: float = 0.0  # CUDA graphs captured during the call (kept out of wall_time_s)

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


# On a small target the head's lm_head over the full vocabulary is most of the drafting time; the embedded
# default's 8192 most frequent answer tokens cover nearly all of its greedy answers, so drafting over them keeps
# tau and drafts faster (measured: docs/design.md).
AUTO_DRAFT_VOCAB = 8192


def resolve_draft_vocab(head, draft_vocab: int | str | None) -> int | None:
    """A number of tokens, or None for the full vocabulary: 'full' and None give None; 'auto' gives
    AUTO_DRAFT_VOCAB where the head ships its token ranking, else None."""
    if draft_vocab in (None, "full"):
        return None
    if draft_vocab != "auto":
        if isinstance(draft_vocab, bool) or not isinstance(draft_vocab, int):
            raise UsageError(f"draft_vocab must be a number of tokens, 'full' or 'auto', got {draft_vocab!r}")
        return draft_vocab
    return min(AUTO_DRAFT_VOCAB, len(head.draft_vocab)) if head is not None and head.draft_vocab else None


@dataclass
class Call:
    """The state of one generate call, passed explicitly through the cycle."""

    temperature: float
    generator: torch.Generator
    target_cache: KVCache
    head_cache: KVCache | None
    timer: PhaseTimer
    length: int  # committed target entries; the root is at this position
    root: torch.Tensor  # [1] the root token, on the device
    root_id: int  # the same token on the host
    pending: tuple | None = None  # (features [k, H], tokens [k]): pairs the head has not read yet
    context: list = field(default_factory=list)  # prompt and output so far (prompt lookup searches it)
    accepted_ranks: list = field(default_factory=list)  # per visited node with children: child rank or -1
    seed: int = 0
    drafting: dict = field(default_factory=dict)  # the tree drafter's own state across cycles (drafters.py)


class Decoder:
    """Speculative decoding of one target with an EAGLE head over a static, dynamic or lookup tree."""

    def __init__(self, target, head=None, tree=None,
                 drafter="topk", verifier="topk", eos_token_ids=(), draft_vocab: int | str | None = None,
                 kernels_choice: str = "auto", cuda_graphs: str = "auto", static_shapes: bool | None = None):
        """tree: a topology (tree.Tree, dynamic.DynamicTree or lookup.LookupTree: tree.Tree's interface).
        draft_vocab: draft over the head's N most frequent tokens only (q is 0 elsewhere; still exact);
        'auto': AUTO_DRAFT_VOCAB of them when the head ships its token ranking, else the full vocabulary.
        kernels_choice: 'auto' runs the target's and head's linear layers on prepacked bf16 weights where
        kernels.available (the layers are switched in place, stock outside this decoder), 'stock' never.
        cuda_graphs: 'auto' captures the fixed-shape calls as CUDA graphs on CUDA (graphs.py), 'off' never,
        'emulate' replays them as graphs.Emulated on any device (what a CPU can check and count of the graphs).
        static_shapes: static caches (cache.py) without graphs too (default: where graphs run), which lets a
        CPU check what the graphs replay."""
        self.target, self.head = target, head
        self.tree = tree
        self.scheme, self.verifier = drafting.get(drafter), verification.get(verifier)
        verification.check_pair(self.scheme, self.verifier)
        self.decoder_model = target.get_decoder()
        self.target_cache_keyword = models.cache_keyword(self.decoder_model)
        self.lm_head = target.get_output_embeddings()
        self.device = self.lm_head.weight.device
        # EAGLE-3 heads read three layers' hidden states beside the final feature (eagle3.py)
        self.feature_layers = getattr(head, "feature_layers", None)
        self.hidden_size = target.config.hidden_size
        self.eos = set(int(e) for e in eos_token_ids)
        self.packed = kernels.resolve(kernels_choice, self.lm_head.weight)
        if self.packed:
            kernels.pack(target)
            if head is not None:
                kernels.pack(head)
        if self.feature_layers is not None and draft_vocab not in (None, "auto"):
            raise UsageError(f"--draft-vocab {draft_vocab}: an EAGLE-3 head drafts over its own vocabulary of "
                             f"{head.config.draft_vocab_size} tokens; drop --draft-vocab")
        draft_vocab = resolve_draft_vocab(head, draft_vocab)
        if draft_vocab is not None:
            if head is None or head.draft_vocab is None:
                raise UsageError("--draft-vocab needs a head with a draft_vocab.json (token frequencies): "
                                 "export it with `eagle-mdsd train-head export`, or leave --draft-vocab out")
            if draft_vocab < 1:
                raise UsageError(f"--draft-vocab must be at least 1, got {draft_vocab}")
        if tree is not None:
            tree.check_scheme(self.scheme, self.lm_head.weight.shape[0])
        self.drafter = None if tree is None else drafters.make(tree, self.scheme, self.device, target.dtype)
        self.graphs = graphs.Emulated() if cuda_graphs == "emulate" else \
            graphs.Graphs() if graphs.resolve(cuda_graphs, self.device) else None
        self.static = self.graphs is not None if static_shapes is None else static_shapes
        self.static_caches = {}  # capacity -> (target cache, head cache), kept so that captured graphs replay
        self.device_cycles = {}  # (target cache, method) -> its cycle.DeviceCycle, kept for the same reason
        self.draft_model = None
        if head is not None:
            self.draft_model = drafters.DraftModel(head, target, draft_vocab, tree.fill if tree else 1, self.packed,
                                                   self.graphs, (tree.max_depth if tree is not None else 0) + 1)

    # -- the target ---------------------------------------------------------------------------

    def target_forward(self, cache: KVCache, tokens, positions, mask=None):
        """The target's features (last hidden states after its final norm) [k, H], its k entries written at the
        cache's length.  mask None: plain causal attention, masked by the model itself as in its own `generate` -
        the same attention kernels, so in bf16 the prefill and a plain step round as `generate`'s do, bit for bit.
        (A static cache always passes a mask over its whole capacity: other kernels, whose bf16 rounding may
        differ from `generate`'s.)"""
        layers = self.feature_layers
        out = self.decoder_model(input_ids=tokens[None], position_ids=positions[None],
                                 attention_mask=None if mask is None else mask[None, None], use_cache=True,
                                 output_hidden_states=layers is not None, **{self.target_cache_keyword: cache})
        if layers is None:
            return out.last_hidden_state[0]
        # EAGLE-3: [k, H] final features, then the three layers' [k, 3H] the head reads
        return torch.cat([out.last_hidden_state[0], *(out.hidden_states[i][0] for i in layers)], -1)

    def logits(self, features) -> torch.Tensor:
        """The target's logits from target_forward's features."""
        return self.lm_head(features if self.feature_layers is None else features[..., : self.hidden_size])

    def _target(self, call: Call, tokens, positions, block=None, graph: bool = True):
        """Features of tokens appended after the call's committed entries; block: their additive mask among
        themselves [k, k] (None: causal, and in a dynamic cache the model's own mask)."""
        cache = call.target_cache
        if not cache.static:
            return self.target_forward(cache, tokens, positions, None if block is None else cache.mask(block, call.length))
        k = len(tokens)
        if block is None:
            block = torch.full((k, k), torch.finfo(self.target.dtype).min, dtype=self.target.dtype,
                               device=self.device).triu_(1)
        inputs = (tokens, positions, cache.mask(block, call.length), cache.next_slots(k, self.device))
        if self.graphs is None or not graph:
            features = self._static_forward(cache, *inputs)
        else:
            features = self.graphs.run(("target", k, id(cache)), lambda *x: self._static_forward(cache, *x), *inputs)
        cache.truncate(call.length + k)
        return features

    def _static_forward(self, cache, tokens, positions, mask, slots):
        cache.slots = slots
        return self.target_forward(cache, tokens, positions, mask)

    def _caches(self, capacity: int, method: str):
        """A call's caches: new ones, or in static mode the smallest kept ones that hold it (the graphs captured on
        them replay), else new ones of its capacity rounded up to 256."""
        heads = method == "eagle"
        if not self.static:
            return (KVCache(self.target.config.num_hidden_layers, capacity),
                    self.draft_model.new_cache(capacity) if heads else None)
        kept = [size for size in self.static_caches if size >= capacity]
        capacity = min(kept) if kept else -(-capacity // 256) * 256
        if capacity not in self.static_caches:
            self.static_caches[capacity] = (KVCache(self.target.config.num_hidden_layers, capacity, static=True),
                                            None if self.draft_model is None else
                                            self.draft_model.new_cache(capacity, static=True))
        target_cache, head_cache = self.static_caches[capacity]
        for cache in (target_cache, head_cache):
            if cache is not None:
                cache.truncate(0)
        return target_cache, head_cache if heads else None

    def _choose(self, logits, temperature, generator) -> torch.Tensor:
        """The next token of a plain step [1]: the argmax at T = 0, else a draw of p."""
        if temperature == 0:
            return first_argmax(logits)[None]
        return drafting.draw(warp(logits, temperature), 1, generator)

    # -- the loop ---------------------------------------------------------------------------

    def start(self, prompt_ids, max_new_tokens: int = 128, temperature: float = 0.0, seed: int = 0,
              method: str = "eagle", profile: bool = False) -> tuple[Call, torch.Tensor]:
        """Check the arguments and make a call's state: (call, prompt on the device)."""
        check_temperature(temperature)
        if max_new_tokens < 1:
            raise UsageError(f"max_new_tokens must be at least 1, got {max_new_tokens}")
        if method not in ("eagle", "baseline"):
            raise UsageError(f"unknown method {method!r}: use eagle or baseline")
        if method == "eagle" and (self.head is None or self.tree is None):
            raise UsageError("method eagle needs a draft head and a tree")
        prompt = torch.as_tensor(prompt_ids, dtype=torch.long, device=self.device).reshape(-1)
        tree_depth = self.tree.max_depth if method == "eagle" else 0
        context = getattr(self.target.config, "max_position_embeddings", None)
        if context is not None and len(prompt) + max_new_tokens + tree_depth > context:
            raise UsageError(f"prompt ({len(prompt)} tokens) + max_new_tokens ({max_new_tokens}) + tree depth "
                             f"({tree_depth}) exceed the model's context of {context} tokens: shorten the prompt "
                             f"or lower max_new_tokens")
        # a cycle may run past max_new_tokens by a path, and the device loop queues one cycle ahead
        extra = self.tree.size + self.tree.max_depth + 1 if method == "eagle" else 1
        capacity = len(prompt) + max_new_tokens + 2 * extra + 2
        call = Call(temperature, torch.Generator(device=self.device).manual_seed(seed),
                    *self._caches(capacity, method), PhaseTimer(profile, self.device), 0, prompt[:0], -1, seed=seed)
        return call, prompt

    def generate(self, prompt_ids, max_new_tokens: int = 128, temperature: float = 0.0, seed: int = 0,
                 method: str = "eagle", profile: bool = False) -> GenerationResult:
        call, prompt = self.start(prompt_ids, max_new_tokens, temperature, seed, method, profile)
        with torch.inference_mode(), kernels.packed(self.packed):
            return self.run(call, prompt, max_new_tokens, method)

    def run(self, call: Call, prompt, max_new_tokens: int, method: str = "eagle") -> GenerationResult:
        start, captured = time.perf_counter(), self.graphs.seconds if self.graphs else 0.0
        on_device = self._device_cycle(call, method)
        if on_device is not None:  # its generator, which its graphs draw from, takes the call's seed
            call.generator = on_device.generator.manual_seed(call.seed)
        features = self._target(call, prompt, torch.arange(len(prompt), device=self.device), graph=False)
        call.length = len(prompt)
        call.root = self._choose(self.logits(features[-1]), call.temperature, call.generator)
        call.root_id = call.root.tolist()[0]
        prefill_time = time.perf_counter() - start
        call.context = prompt.tolist() + [call.root_id]
        result = GenerationResult(call.context[:-1], [call.root_id], 0, accepted_ranks=call.accepted_ranks)
        if on_device is not None:
            self._run_on_device(on_device, call, prompt, features, result, max_new_tokens)
        else:
            call.pending = (features, torch.cat([prompt[1:], call.root]))
            self._run_on_host(call, result, max_new_tokens, method)
        del result.token_ids[max_new_tokens:]
        result.prefill_time_s = prefill_time
        result.graph_capture_s = (self.graphs.seconds if self.graphs else 0.0) - captured
        result.wall_time_s = time.perf_counter() - start - result.graph_capture_s
        result.profile = dict(call.timer.seconds)
        result.copy_cycles = call.drafting.get("copy_cycles", 0)
        return result

    def _emit(self, result: GenerationResult, emitted: list[int]) -> bool:
        """Count one cycle's tokens, cut at an EOS; True when the call ends on it."""
        eos = next((i for i, token in enumerate(emitted) if token in self.eos), None)
        emitted = emitted if eos is None else emitted[: eos + 1]  # a T = 0 path may run on past an EOS
        result.cycles += 1
        result.accept_lengths.append(len(emitted))
        result.token_ids.extend(emitted)
        return eos is not None

    def _run_on_host(self, call: Call, result: GenerationResult, max_new_tokens: int, method: str) -> None:
        step = self._cycle if method == "eagle" else self._plain_step
        while call.root_id not in self.eos and result.new_tokens < max_new_tokens:
            emitted = step(call)
            if self._emit(result, emitted):
                break
            call.context.extend(emitted)

    def _device_cycle(self, call: Call, method: str) -> cycle.DeviceCycle | None:
        """The call's cycle on the device (cycle.py), where its caches are static and its tree allows."""
        if not self.static or (method == "eagle" and not cycle.supports(self.tree, self.scheme.name,
                                                                         call.temperature)):
            return None
        key = (id(call.target_cache), method)
        if key not in self.device_cycles:
            self.device_cycles[key] = cycle.DeviceCycle(self, self.tree if method == "eagle" else None,
                                                        call.target_cache, call.head_cache, method)
        return self.device_cycles[key]

    def _run_on_device(self, on_device: cycle.DeviceCycle, call: Call, prompt, features, result: GenerationResult,
                       max_new_tokens: int) -> None:
        """Cycles over device state, one transfer each; a cycle is queued before the host waits for the last
        one's result wherever the token budget cannot end the call first (an EOS can: then it is dropped)."""
        if on_device.method == "eagle" and len(prompt) > 1:  # the head reads the prompt's pairs but the last
            causal = torch.full((len(prompt) - 1,) * 2, torch.finfo(self.target.dtype).min, dtype=self.target.dtype,
                                device=self.device).triu_(1)
            self.draft_model.run(call.head_cache, features[:-1], prompt[1:], torch.arange(1, len(prompt),
                                 device=self.device), causal, 0, graph=False)
        on_device.start(call.length, call.root, features[-1], call.temperature)
        if call.root_id in self.eos or result.new_tokens >= max_new_tokens:
            return
        parity = 0
        call.timer.start()
        on_device.launch(parity, call.timer)
        while True:
            ahead = result.new_tokens + on_device.pairs < max_new_tokens
            if ahead:
                on_device.launch(1 - parity, call.timer)
            accepted, emitted, ranks, internal = on_device.receive(parity)
            if on_device.method == "eagle":
                eos = next((i for i, token in enumerate(emitted[:-1]) if token in self.eos), None)
                call.accepted_ranks.extend(ranks if eos is None else ranks[: eos + 1])
                if eos is None and internal:
                    call.accepted_ranks.append(-1)
            if self._emit(result, emitted) or result.new_tokens >= max_new_tokens:
                return
            if not ahead:
                on_device.launch(1 - parity, call.timer)
            parity = 1 - parity

    def _plain_step(self, call: Call) -> list[int]:
        """One token from one target forward: the baseline every method is measured against."""
        call.timer.start()
        features = self._target(call, call.root, torch.full((1,), call.length, device=self.device))
        call.length += 1
        call.timer.lap("target")
        call.root = self._choose(self.logits(features[-1]), call.temperature, call.generator)
        call.root_id = call.root.tolist()[0]
        call.timer.lap("verify")
        return [call.root_id]

    def _cycle(self, call: Call) -> list[int]:
        call.timer.start()
        draft = self.drafter.draft(self.draft_model, call)
        call.timer.lap("draft")
        features = self._target(call, draft.tokens, call.length + draft.layout.depth, draft.layout.mask)
        call.timer.lap("target")
        # One lm_head pass over the whole tree: it reads the weights once.
        logits = self.logits(features)
        if call.temperature == 0:
            path, emitted = self._accept_greedy(call, draft, logits)
        elif draft.sampled is not None and not draft.point:
            path, emitted = self._accept_sampled(call, draft, logits)
        else:
            path, emitted = self._walk(call, draft, logits)
        call.timer.lap("verify")
        count = len(emitted) - 1
        call.target_cache.truncate(call.length + 1 + count)
        pairs = (features.index_select(0, path[: count + 1]), torch.cat([draft.tokens.index_select(0, path[1 : count + 1]),
                                                                        call.root]))
        self.drafter.commit(call, draft, pairs, emitted)  # the pairs become the head's pending ones
        call.length += count + 1
        call.timer.lap("commit")
        return emitted

    def _accept_greedy(self, call: Call, draft, logits) -> tuple[torch.Tensor, list[int]]:
        """T = 0: the whole tree resolved on the device and one transfer.  Every lossless verifier outputs the
        target's argmax, so a node is accepted when its token is its parent's argmax and every ancestor is
        accepted; the deepest accepted node ends the path (ties: the lower index; with repeated sibling tokens
        the path may go through a later copy than a walk's first match, every one of them greedy)."""
        layout, tokens = draft.layout, draft.tokens
        argmax = first_argmax(logits)
        missed = tokens != argmax.index_select(0, layout.parent)
        reached = ~(layout.below_root & missed).any(-1)
        best = torch.where(reached, layout.rank, -1).argmax().reshape(1)
        return self._take_path(call, draft, layout.paths.index_select(0, best)[0], layout.depth.index_select(0, best),
                               argmax.index_select(0, best))

    def _accept_sampled(self, call: Call, draft, logits) -> tuple[torch.Tensor, list[int]]:
        """T > 0 on a static tree: every node's output drawn at once (cycle.sampled_outputs), the walk by tensor
        ops, one transfer."""
        plan, q_internal, ids = draft.sampled
        outputs = cycle.sampled_outputs(plan, warp(logits, call.temperature), q_internal, draft.tokens, self.verifier,
                                        lambda q: self.draft_model.vocabulary_q(q, ids), call.generator)
        path, accepted = cycle.sampled_walk(draft.layout.parent, outputs, draft.tokens, draft.tree.max_depth)
        return self._take_path(call, draft, path, accepted, outputs.index_select(0, path[-1:]))

    def _take_path(self, call: Call, draft, path, head, bonus) -> tuple[torch.Tensor, list[int]]:
        """Commit an accepted path (padded with its last node) of `head` drafts and its bonus token: one transfer."""
        tokens = draft.tokens
        # the accepted entries move next to the root before the transfer, so the device never waits for the host
        call.target_cache.gather(call.length + 1, call.length + path[1:])
        call.root = bonus
        values = torch.cat([head, path, tokens.index_select(0, path), bonus]).tolist()
        count, depth = values[0], len(path) - 1
        nodes, path_tokens = values[1 : 2 + count], values[2 + depth : 3 + depth + count]
        if draft.ranked:  # the child ranks of the walk's visits, up to an accepted EOS (sequoia.py reads them)
            eos = next((i for i, token in enumerate(path_tokens[1:]) if token in self.eos), None)
            visited = nodes if eos is None else nodes[: eos + 2]
            for parent, node in zip(visited, visited[1:]):
                call.accepted_ranks.append(draft.tree.children[parent].index(node))
            if eos is None and draft.tree.children[nodes[-1]]:
                call.accepted_ranks.append(-1)
        call.root_id = values[-1]
        return path, path_tokens[1:] + [values[-1]]

    def _walk(self, call: Call, draft, logits) -> tuple[torch.Tensor, list[int]]:
        """T > 0: from the root down, the verifier draws the output token at each node (one transfer a node)."""
        layout, node, emitted, outputs = draft.layout, 0, [], []
        while True:
            kids = draft.tree.children[node]
            output = self._verify_node(call, draft, logits, node, kids)
            outputs.append(output)
            candidates = draft.tokens.index_select(0, layout.children[node, : max(len(kids), 1)])
            hit = (candidates == output) if kids else candidates != candidates
            rank = torch.where(hit.any(), hit.to(torch.int8).argmax(), -1)
            token, rank = torch.cat([output, rank[None]]).tolist()
            emitted.append(token)
            if kids and draft.ranked:
                call.accepted_ranks.append(rank)
            if rank < 0 or token in self.eos:
                break
            node = kids[rank]
        if rank >= 0:  # an accepted token was EOS: the call ends here, nothing to commit
            return layout.paths[kids[rank]], emitted
        path = layout.paths[node]
        call.target_cache.gather(call.length + 1, call.length + path[1:])
        call.root, call.root_id = outputs[-1], emitted[-1]
        return path, emitted

    def _verify_node(self, call: Call, draft, logits, node, kids) -> torch.Tensor:
        """The output token at a node at T > 0, distributed as p [1]: a one-point draft first (q = 1 on its token,
        prompt lookup's), accepted with probability p(its token), then the verifier on the head drafts against
        the rest of p (lookup.py gives the argument); a draw of p where the head drafted nothing."""
        p = warp(logits[node], call.temperature)
        # a grown node's whole draft tuple, pruned drafts included, even where none was kept (cycle.grown_outputs)
        drafts = draft.drafts.get(node)
        if drafts is None:
            head_kids = len(kids) if draft.head_nodes is None else sum(kid <= draft.head_nodes for kid in kids)
            if head_kids:
                drafts = draft.tokens.index_select(0, draft.layout.children[node, :head_kids])
        point = draft.point.get(node)
        if point is not None:
            sampled = drafting.draw(p, 1, call.generator)
            if drafts is None or sampled.tolist()[0] == point:
                return sampled  # a sample of p; when it is not the point's token, a sample of p without it
            p = drafting.without_token(p, point)
        if drafts is None:
            return drafting.draw(p, 1, call.generator)
        q, ids = draft.q_of(node)
        return self.verifier.sample_batch(p, self.draft_model.vocabulary_q(q, ids), drafts, call.generator)[None]
