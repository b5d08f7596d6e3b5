"""The peers a user would otherwise pick: transformers `generate` (greedy or sampled), the same compiled over a
static cache (`hf_compiled`), and prompt lookup.

They answer through the same interface as `engine.Decoder` (`generate(prompt_ids, max_new_tokens,
temperature, seed, method)` -> GenerationResult), so benchmark files and reports treat every method
alike.  Sampling is plain temperature sampling over the whole vocabulary (top-k and top-p switched
off, whatever the model's generation config says), the distribution the engine reproduces.
A forward hook counts the target's forward passes: cycles = passes after the prefill, so tau is
defined as for the engine (1 for generate; tokens per verification pass for prompt lookup); where
each pass starts (its cache position) gives the tokens each one committed, the answer files'
`accept_lengths`.  `hf_compiled` runs no hooks (they would break its compiled graph): its tau is 1 by
construction.
"""

from __future__ import annotations

import time

import torch
import transformers
from transformers import CompileConfig, GenerationConfig, StoppingCriteria

from .engine import GenerationResult
from .errors import UsageError, check_context, check_temperature, compiler_failure

COMPILED = "hf_compiled"
METHODS = ("hf_generate", COMPILED, "prompt_lookup")


def clock(device: torch.device):
    """A wall clock for `device`: GPU kernels run behind the host, so on CUDA it waits for them before reading."""
    def now() -> float:
        if device.type == "cuda":
            torch.cuda.synchronize(device)
        return time.perf_counter()

    return now


def plain_generate(model, prompt: torch.Tensor, config: GenerationConfig, attention_mask=None,
                   **kwargs) -> torch.Tensor:
    """model.generate(prompt, generation_config=config) with nothing taken from the model's own generation config:
    transformers fills every field a call leaves unset from it (a hub checkpoint's repetition_penalty, min_p,
    no_repeat_ngram_size, ...), and the peers (and the training stages' answers) decode plain greedy or plain
    sampling.  attention_mask: ones where None (a batch of one, unpadded)."""
    kept, model.generation_config = model.generation_config, GenerationConfig()
    mask = torch.ones_like(prompt) if attention_mask is None else attention_mask
    try:
        return model.generate(prompt, attention_mask=mask, generation_config=config, **kwargs)
    finally:
        model.generation_config = kept


class TransformersPeer:
    """transformers' own decoding of `target`: `hf_generate` or `prompt_lookup`."""

    def __init__(self, target, eos_token_ids, prompt_lookup_tokens: int = 10, max_matching_ngram: int = 2):
        self.target = target
        self.eos = [int(e) for e in eos_token_ids]
        self.prompt_lookup_tokens, self.max_matching_ngram = prompt_lookup_tokens, max_matching_ngram

    def generation_config(self, max_new_tokens: int, temperature: float, method: str) -> GenerationConfig:
        """What `generate` is called with for `method`: greedy at T = 0, plain sampling over the whole vocabulary
        otherwise; prompt lookup's settings for prompt_lookup."""
        sampled = temperature > 0
        extra = ({"prompt_lookup_num_tokens": self.prompt_lookup_tokens,
                  "max_matching_ngram_size": self.max_matching_ngram} if method == "prompt_lookup" else {})
        return GenerationConfig(max_new_tokens=max_new_tokens, do_sample=sampled,
                                temperature=temperature if sampled else None, top_k=0 if sampled else None,
                                top_p=1.0 if sampled else None, eos_token_id=self.eos or None,
                                pad_token_id=self.eos[0] if self.eos else None, **extra)

    def prompt_tensor(self, prompt_ids) -> torch.Tensor:
        device = self.target.get_input_embeddings().weight.device
        return torch.as_tensor(prompt_ids, dtype=torch.long, device=device).reshape(1, -1)

    def answer_tokens(self, output: torch.Tensor, prompt: torch.Tensor) -> list[int]:
        """The new tokens of `generate`'s output, up to and with the first EOS."""
        tokens = output[0, prompt.shape[1]:].tolist()
        if self.eos:  # generate pads nothing for batch 1, but cut after the first EOS to be sure
            cut = next((i for i, token in enumerate(tokens) if token in self.eos), None)
            tokens = tokens if cut is None else tokens[: cut + 1]
        return tokens

    def generate(self, prompt_ids, max_new_tokens: int = 128, temperature: float = 0.0, seed: int = 0,
                 method: str = "hf_generate", profile: bool = False) -> GenerationResult:
        if method not in ("hf_generate", "prompt_lookup"):
            raise UsageError(f"unknown peer method {method!r} for TransformersPeer: use hf_generate or "
                             f"prompt_lookup ({COMPILED} answers through CompiledPeer)")
        check_temperature(temperature)
        prompt = self.prompt_tensor(prompt_ids)
        check_context(self.target, prompt.shape[1], max_new_tokens)
        config = self.generation_config(max_new_tokens, temperature, method)
        now = clock(prompt.device)

        passes = []  # one entry per target forward: the first's end time (the prefill's), then None
        starts = []  # where each forward's input starts (committed tokens before it), kept on the device

        def before(module, args, kwargs):
            position = kwargs.get("position_ids")  # (batch 1, no padding: the positions are the cache's)
            position = position[0] if position is not None else kwargs.get("cache_position")
            if position is not None:
                starts.append(position[:1].clone())  # no host sync inside the timed region

        hook = self.target.register_forward_hook(lambda *_: passes.append(None if passes else now()))
        pre_hook = self.target.register_forward_pre_hook(before, with_kwargs=True)
        try:
            torch.manual_seed(seed)  # generate samples from the global generator
            start = now()
            with torch.inference_mode():
                output = plain_generate(self.target, prompt, config)
            wall = now() - start
        finally:
            hook.remove()
            pre_hook.remove()
        tokens = self.answer_tokens(output, prompt)
        result = GenerationResult(prompt.reshape(-1).tolist(), tokens, max(len(passes) - 1, 0),
                                  prefill_time_s=passes[0] - start if passes else 0.0, wall_time_s=wall)
        if len(starts) == len(passes) > 1:  # tokens each cycle committed, as the engine counts them
            edges = [int(p) for p in torch.cat(starts).tolist()[1:]] + [prompt.shape[1] + len(tokens) - 1]
            result.accept_lengths = [b - a for a, b in zip(edges, edges[1:])]
        return result


def compile_config(device: torch.device) -> CompileConfig:
    """How `hf_compiled` compiles: on CUDA transformers' default (inductor, mode reduce-overhead: CUDA graphs),
    which `generate` applies to a static cache unasked; elsewhere inductor's default mode, and transformers must be
    told to compile off CUDA (`_compile_all_devices`)."""
    if device.type == "cuda":
        return CompileConfig()
    config = CompileConfig(mode="default")
    config._compile_all_devices = True
    return config


class _StopAfter(StoppingCriteria):
    """Stops `generate` after `count` new tokens whatever its max_new_tokens (which sizes the static cache)."""

    def __init__(self, prompt_tokens: int, count: int):
        self.length = prompt_tokens + count

    def __call__(self, input_ids, scores, **kwargs):
        return torch.full((input_ids.shape[0],), input_ids.shape[1] >= self.length, dtype=torch.bool,
                          device=input_ids.device)


class CompiledPeer(TransformersPeer):
    """`hf_compiled`: transformers `generate` over a static cache with its one-token forward compiled by
    torch.compile, as the transformers documentation sets it up (`cache_implementation="static"` and a compile
    config; the prefill runs eagerly).  `prepare` compiles and sizes the cache for `cache_tokens` (prompt and new
    tokens) outside any timed call, so every later prompt up to that length reuses one cache and one compiled
    graph; `generate` prepares first on its own when a call would not fit.  Greedy and sampled as hf_generate."""

    def __init__(self, target, eos_token_ids, cache_tokens: int = 0):
        super().__init__(target, eos_token_ids)
        self.cache_tokens = cache_tokens
        self.prepared_tokens = 0  # the static cache's length once prepared
        self.compile_s = 0.0  # seconds of the preparing calls (compilation, the cache's allocation)
        self.compile_config = compile_config(self.prompt_tensor([0]).device)

    def config(self, max_new_tokens: int, temperature: float) -> GenerationConfig:
        config = self.generation_config(max_new_tokens, temperature, "hf_generate")
        config.cache_implementation = "static"
        config.compile_config = self.compile_config
        return config

    def prepare(self, cache_tokens: int | None = None) -> float:
        """Compile the forward and allocate a static cache of max(cache_tokens, this peer's) tokens: a few tokens
        generated with max_new_tokens set to fill it (what sizes transformers' cache, and it keeps the largest
        one across calls).  Returns the seconds it took (added to compile_s); a one-line UsageError where
        torch.compile fails or transformers declines to compile on this device."""
        length = max(cache_tokens or 0, self.cache_tokens, 8)
        prompt = self.prompt_tensor([self.eos[0] if self.eos else 0] * 4)
        config = self.config(length - prompt.shape[1], 0.0)
        config.eos_token_id = None  # the few tokens run whatever they are
        import torch._dynamo.exc  # (loaded on first use: the peers that do not compile never pay for it)

        now = clock(prompt.device)
        start = now()
        try:
            with torch.inference_mode():
                plain_generate(self.target, prompt, config, stopping_criteria=[_StopAfter(prompt.shape[1], 4)])
        except torch._dynamo.exc.BackendCompilerFailed as error:  # the machine's compiler (inductor wraps its own)
            raise UsageError(f"{COMPILED}: torch.compile failed on {prompt.device.type} ({compiler_failure(error)}): "
                             f"drop {COMPILED} from the methods, or run where inductor compiles (a C++ compiler on a "
                             f"CPU)") from error
        if getattr(self.target, "_compiled_call", None) is None:
            raise UsageError(f"{COMPILED}: transformers {transformers.__version__} did not compile "
                             f"generate's forward on {prompt.device.type}: drop {COMPILED} from the methods")
        seconds = now() - start
        self.prepared_tokens = max(self.prepared_tokens, length)
        self.compile_s += seconds
        return seconds

    def generate(self, prompt_ids, max_new_tokens: int = 128, temperature: float = 0.0, seed: int = 0,
                 method: str = COMPILED, profile: bool = False) -> GenerationResult:
        if method != COMPILED:
            raise ValueError(f"CompiledPeer answers {COMPILED} only, not {method!r}")
        check_temperature(temperature)
        prompt = self.prompt_tensor(prompt_ids)
        check_context(self.target, prompt.shape[1], max_new_tokens)
        if prompt.shape[1] + max_new_tokens > self.prepared_tokens:  # compile and allocate before the clock
            self.prepare(prompt.shape[1] + max_new_tokens)
        config = self.config(max_new_tokens, temperature)
        now = clock(prompt.device)
        torch.manual_seed(seed)  # generate samples from the global generator
        start = now()
        with torch.inference_mode():
            output = plain_generate(self.target, prompt, config)
        wall = now() - start
        tokens = self.answer_tokens(output, prompt)
        cycles = max(len(tokens) - 1, 0)  # one token a forward; the first comes from the prefill
        return GenerationResult(prompt.reshape(-1).tolist(), tokens, cycles, [1] * cycles, wall_time_s=wall)
