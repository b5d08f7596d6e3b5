"""The decoding loop's driver: start a call, prefill, run cycles (cycle.py) and read their results to EOS or budget.

The cycle itself (draft a tree with the EAGLE head, score it in one target forward, verify, commit) lives in
cycle.py and runs the same on every device: eagerly on a CPU, under CUDA graphs on a GPU.  Everything a call
changes lives in its `Call` and its cycle's device state; a Decoder holds the models, the cache pair of its
longest call and a cycle per method over it (kept, so that captured graphs replay), which each call borrows.

Tokens per cycle = accepted drafts + 1; tau = new tokens / cycles, where cycles counts target verification
forwards (the prefill excluded) and new tokens include the one sampled from the prefill.
"""

from __future__ import annotations

import gc
import time
from dataclasses import asdict, dataclass, field

import torch

from . import cycle as cycle_module
from . import drafters, drafting, graphs, kernels, models, verification
from .cache import KVCache
from .errors import UsageError, check_context, check_temperature
from .head import checked_draft_vocab


class PhaseTimer:
    """Seconds per phase of the cycle (draft, verify), when enabled: each lap adds the time since the last (on
    CUDA it synchronises, so profiling slows the loop a little); off, it costs nothing."""

    def __init__(self, enabled: bool, device: torch.device):
        self.enabled, self.cuda, self.seconds, self.last = enabled, device.type == "cuda", {}, 0.0

    def lap(self, phase: str | None = None) -> None:
        if self.enabled:
            if self.cuda:
                torch.cuda.synchronize()
            now = time.perf_counter()
            if phase is not None:
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


@dataclass
class Call:
    """One generate call's settings and caches (its cycle keeps the rest, on the device)."""

    temperature: float
    seed: int
    target_cache: KVCache
    head_cache: KVCache | None
    timer: PhaseTimer
    accepted_ranks: list = field(default_factory=list)  # per visited node with children: child rank or -1


class Decoder:
    """Speculative decoding of one target with an EAGLE head over a static, dynamic or lookup tree."""

    def __init__(self, target, head=None, tree=None,
                 drafter="topk", verifier="topk", eos_token_ids=(), draft_vocab: int | str | None = None,
                 kernels_choice: str = "auto", cuda_graphs: str = "auto"):
        """tree: tree.Tree, dynamic.DynamicTree or lookup.LookupTree.  draft_vocab: draft over the head's N most
        frequent tokens only (exact); 'auto': head.AUTO_DRAFT_VOCAB of them where the head ships its token ranking.
        kernels_choice: 'auto' packs the linear layers in bf16 where kernels.available, 'stock' never.
        cuda_graphs: 'auto' captures each phase of the cycle as a CUDA graph on CUDA (graphs.py), 'off' never,
        'compile' also compiles the target's and the head's forwards (graphs.compiled; on any device), 'emulate'
        replays them as graphs.Emulated on any device (what a CPU can check and count of the graphs)."""
        self.target, self.head, self.tree = target, head, tree
        self.scheme, self.verifier = drafting.get(drafter), verification.get(verifier)
        verification.check_pair(self.scheme, self.verifier)
        compiling, decoder_model = cuda_graphs == "compile", target.get_decoder()
        self.decoder_model = graphs.compiled(decoder_model) if compiling else decoder_model
        self.target_cache_keyword = models.cache_keyword(decoder_model)
        self.lm_head = target.get_output_embeddings()
        self.device = self.lm_head.weight.device
        self.feature_layers = getattr(head, "feature_layers", None)  # EAGLE-3 heads read three layers (eagle3.py)
        self.hidden_size = target.config.hidden_size
        self.eos = set(int(e) for e in eos_token_ids)
        self.packed = kernels.resolve(kernels_choice, self.lm_head.weight, compiling)
        for model in (model for model in (target, head) if self.packed and model is not None):
            kernels.pack(model)
        draft_vocab = checked_draft_vocab(head, draft_vocab)
        if tree is not None:
            tree.check_scheme(self.scheme, self.lm_head.weight.shape[0])
        self.graphs = graphs.Emulated() if cuda_graphs == "emulate" else \
            graphs.Graphs(self.device) if graphs.resolve(cuda_graphs, self.device, target) else None
        self.caches = None  # (target cache, head cache): the largest a call has needed, kept for the next
        self.cycles = {}  # method -> its cycle.Cycle over those caches, kept so that its captured graphs replay
        self.draft_model = None if head is None else \
            drafters.DraftModel(head, target, draft_vocab, tree.fill if tree else 1, self.packed, compiling)

    def target_forward(self, cache: KVCache, tokens, positions, mask=None):
        """The target's features (last hidden states after its final norm) [k, H], its k entries written at the
        cache's slots.  mask None: plain causal attention, masked by the model itself as in its own `generate` -
        the same attention kernels, so in bf16 the prefill and a plain step round as `generate`'s do."""
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

    def _caches(self, capacity: int, method: str):
        """A call's caches: the kept pair if it holds the call, else a new pair of its capacity rounded up to 256,
        which replaces the kept one with its cycles and their graphs.  Memory holds the longest call's pair; a
        shorter call attends over its own span of it, not over the capacity (cache.py)."""
        if self.caches is None or self.caches[0].capacity < capacity:
            for owner in map(id, self.cycles.values() if self.graphs is not None else ()):  # (no cycle kept here)
                self.graphs.forget(owner)
            self.cycles, self.caches = {}, None
            gc.collect()  # a cache and its layers refer to each other: the old pair goes before the new is taken
            capacity = -(-capacity // 256) * 256
            self.caches = (KVCache(self.target.config.num_hidden_layers, capacity),
                           None if self.draft_model is None else self.draft_model.new_cache(capacity))
        for cache in filter(None, self.caches):  # calls share them: each starts afresh
            cache.truncate(0)
        return self.caches[0], self.caches[1] if method == "eagle" else None

    def start(self, prompt_ids, max_new_tokens: int = 128, temperature: float = 0.0, seed: int = 0,
              method: str = "eagle", profile: bool = False) -> tuple[Call, torch.Tensor]:
        """Check the arguments and make a call's state: (call, prompt on the device)."""
        prompt = torch.as_tensor(prompt_ids, dtype=torch.long, device=self.device).reshape(-1)
        _check_call(self, len(prompt), max_new_tokens, temperature, method)
        # a cycle may run past max_new_tokens by a path, and the loop queues one cycle ahead
        extra = self.tree.size + self.tree.max_depth + 1 if method == "eagle" else 1
        caches = self._caches(len(prompt) + max_new_tokens + 2 * extra + 2, method)
        return Call(temperature, seed, *caches, PhaseTimer(profile, self.device)), prompt

    def generate(self, prompt_ids, max_new_tokens: int = 128, temperature: float = 0.0, seed: int = 0,
                 method: str = "eagle", profile: bool = False) -> GenerationResult:
        call, prompt = self.start(prompt_ids, max_new_tokens, temperature, seed, method, profile)
        with torch.inference_mode(), kernels.packed(self.packed):
            return self.run(call, prompt, max_new_tokens, method)

    def run(self, call: Call, prompt, max_new_tokens: int, method: str = "eagle") -> GenerationResult:
        start, captured = time.perf_counter(), self.graphs.seconds if self.graphs else 0.0
        # emptied; a call started before a longer one replaced its caches takes the new ones
        call.target_cache, call.head_cache = self._caches(call.target_cache.capacity, method)
        if method not in self.cycles:  # kept, so that its captured graphs replay
            self.cycles[method] = cycle_module.Cycle(self, self.tree, call.target_cache, call.head_cache, method)
        cycle = self.cycles[method]
        generator = cycle.generator.manual_seed(call.seed)  # its graphs draw from it: it takes the call's seed
        root, features = self._prefill(call, prompt, generator)
        root_id = root.tolist()[0]
        result = GenerationResult(prompt.tolist(), [root_id], 0, accepted_ranks=call.accepted_ranks)
        result.prefill_time_s = time.perf_counter() - start
        cycle.start(prompt, root, features[-1], call.temperature)
        if root_id not in self.eos and max_new_tokens > 1:
            self._cycles(cycle, call, result, len(prompt), max_new_tokens)
        del result.token_ids[max_new_tokens:]
        result.graph_capture_s = (self.graphs.seconds if self.graphs else 0.0) - captured
        result.wall_time_s = time.perf_counter() - start - result.graph_capture_s
        result.profile = dict(call.timer.seconds)
        return result

    def _prefill(self, call: Call, prompt, generator) -> tuple[torch.Tensor, torch.Tensor]:
        """The target reads the prompt, as its `generate` does; the head reads its pairs but the last, which the
        first cycle's catch-up reads.  Returns (root [1], the prompt's features)."""
        cache = call.target_cache
        cache.append(len(prompt), self.device)
        features = self.target_forward(cache, prompt, torch.arange(len(prompt), device=self.device))
        cache.truncate(len(prompt))
        logits = self.logits(features[-1])
        if call.temperature == 0:
            root = logits.max(-1).indices[None]
        else:
            root = drafting.draw(drafting.warp(logits, call.temperature), 1, generator)
        if call.head_cache is not None and len(prompt) > 1:
            causal = torch.full((len(prompt) - 1,) * 2, torch.finfo(self.target.dtype).min, dtype=self.target.dtype,
                                device=self.device).triu_(1)
            self.draft_model.run(call.head_cache, features[:-1], prompt[1:], torch.arange(1, len(prompt),
                                 device=self.device), causal)
        return root, features

    def _cycles(self, cycle, call: Call, result: GenerationResult, length: int, max_new_tokens: int) -> None:
        """Cycles until EOS or the budget, one transfer each.  Under graphs a cycle is queued before the host waits
        for the last one's result wherever the budget cannot end the call first (an EOS can: then it is dropped)."""
        parity, ahead = 0, self.graphs is not None
        call.timer.lap()
        cycle.launch(parity, length, call.timer)
        while True:
            early = ahead and result.new_tokens + cycle.pairs < max_new_tokens
            if early:
                cycle.launch(1 - parity, length + cycle.pairs, call.timer)
            accepted, emitted, ranks, internal = cycle.receive(parity)
            length += accepted + 1
            if cycle.topology is not None:
                eos = next((i for i, token in enumerate(emitted[:-1]) if token in self.eos), None)
                call.accepted_ranks.extend(ranks if eos is None else ranks[: eos + 1])
                if eos is None and internal:
                    call.accepted_ranks.append(-1)
            if _emit(result, emitted, self.eos) or result.new_tokens >= max_new_tokens:
                return
            if not early:
                cycle.launch(1 - parity, length, call.timer)
            parity = 1 - parity

def _check_call(decoder: Decoder, prompt: int, max_new_tokens: int, temperature: float, method: str) -> None:
    """One-line errors for a call the decoder cannot make."""
    check_temperature(temperature)
    if prompt < 1:
        raise UsageError("the prompt is empty: give at least one token")
    if max_new_tokens < 1:
        raise UsageError(f"max_new_tokens must be at least 1, got {max_new_tokens}")
    if method not in ("eagle", "baseline"):
        raise UsageError(f"unknown method {method!r}: use eagle or baseline")
    if method == "eagle" and (decoder.head is None or decoder.tree is None):
        raise UsageError("method eagle needs a draft head and a tree")
    check_context(decoder.target, prompt, max_new_tokens, decoder.tree.max_depth if method == "eagle" else 0)


def _emit(result: GenerationResult, emitted: list[int], eos: set) -> bool:
    """Count one cycle's tokens, cut at an EOS; True when the call ends on it."""
    end = next((i for i, token in enumerate(emitted) if token in eos), None)
    emitted = emitted if end is None else emitted[: end + 1]  # a T = 0 path may run on past an EOS
    result.cycles += 1
    result.accept_lengths.append(len(emitted))
    result.token_ids.extend(emitted)
    return end is not None
