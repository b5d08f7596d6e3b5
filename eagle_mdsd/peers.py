"""The peers a user would otherwise pick: transformers `generate` (greedy or sampled) and prompt lookup.

They answer through the same interface as `engine.Decoder` (`generate(prompt_ids, max_new_tokens,
temperature, seed, method)` -> GenerationResult), so benchmark files and reports treat every method
alike.  Sampling is plain temperature sampling over the whole vocabulary (top-k and top-p switched
off, whatever the model's generation config says), the distribution the engine reproduces.
A forward hook counts the target's forward passes: cycles = passes after the prefill, so tau is
defined as for the engine (1 for generate; tokens per verification pass for prompt lookup); where
each pass starts (its cache position) gives the tokens each one committed, the answer files'
`accept_lengths`.
"""

from __future__ import annotations

import time

import torch
from transformers import GenerationConfig

from .engine import GenerationResult, check_temperature
from .errors import UsageError

METHODS = ("hf_generate", "prompt_lookup")


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

    def generate(self, prompt_ids, max_new_tokens: int = 128, temperature: float = 0.0, seed: int = 0,
                 method: str = "hf_generate", profile: bool = False) -> GenerationResult:
        if method not in METHODS:
            raise UsageError(f"unknown peer method {method!r}: use one of {', '.join(METHODS)}")
        check_temperature(temperature)
        device = self.target.get_input_embeddings().weight.device
        prompt = torch.as_tensor(prompt_ids, dtype=torch.long, device=device).reshape(1, -1)
        config = self.generation_config(max_new_tokens, temperature, method)
        cuda = prompt.device.type == "cuda"  # GPU kernels run behind the clock: wait for them before reading it

        def now() -> float:
            if cuda:
                torch.cuda.synchronize(prompt.device)
            return time.perf_counter()

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
                output = self.target.generate(prompt, attention_mask=torch.ones_like(prompt),
                                              generation_config=config)
            wall = now() - start
        finally:
            hook.remove()
            pre_hook.remove()
        tokens = output[0, prompt.shape[1]:].tolist()
        if self.eos:  # generate pads nothing for batch 1, but cut after the first EOS to be sure
            cut = next((i for i, token in enumerate(tokens) if token in self.eos), None)
            tokens = tokens if cut is None else tokens[: cut + 1]
        result = GenerationResult(prompt.reshape(-1).tolist(), tokens, max(len(passes) - 1, 0),
                                  prefill_time_s=passes[0] - start if passes else 0.0, wall_time_s=wall)
        if len(starts) == len(passes) > 1:  # tokens each cycle committed, as the engine counts them
            edges = [int(p) for p in torch.cat(starts).tolist()[1:]] + [prompt.shape[1] + len(tokens) - 1]
            result.accept_lengths = [b - a for a, b in zip(edges, edges[1:])]
        return result
