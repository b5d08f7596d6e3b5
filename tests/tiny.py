"""A tiny random Llama target with a small vocabulary, for exact end-to-end checks; the embedded model's
tokenizer for tests that need real text."""

import functools

import torch
from transformers import LlamaConfig, LlamaForCausalLM


def tiny_target(vocab: int = 4, hidden: int = 32, seed: int = 0, sharpness: float = 8.0, layers: int = 2):
    torch.manual_seed(seed)
    config = LlamaConfig(vocab_size=vocab, hidden_size=hidden, intermediate_size=2 * hidden, num_hidden_layers=layers,
                         num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=64,
                         tie_word_embeddings=False)
    model = LlamaForCausalLM(config).eval()
    with torch.no_grad():  # spread the logits so p is far from uniform and far from q
        model.lm_head.weight.mul_(sharpness)
    return model.double()


def tiny_family(family: str, vocab: int = 16, hidden: int = 32, seed: int = 0):
    """Tiny random targets of other architectures the engine drives unmodified."""
    from transformers import MistralConfig, MistralForCausalLM, Qwen2Config, Qwen2ForCausalLM

    torch.manual_seed(seed)
    common = dict(vocab_size=vocab, hidden_size=hidden, intermediate_size=2 * hidden, num_hidden_layers=2,
                  num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=64)
    if family == "qwen2":
        model = Qwen2ForCausalLM(Qwen2Config(**common, tie_word_embeddings=True))
    elif family == "mistral":
        model = MistralForCausalLM(MistralConfig(**common, sliding_window=None))
    else:
        model = LlamaForCausalLM(LlamaConfig(**common))
    return model.eval().double()


def greedy_tokens(target, prompt: list[int], steps: int) -> list[int]:
    """The target's greedy continuation by full forwards: no cache, no generation config."""
    sequence = list(prompt)
    with torch.no_grad():
        for _ in range(steps):
            sequence.append(int(target(torch.tensor([sequence])).logits[0, -1].argmax()))
    return sequence[len(prompt):]


@functools.cache
def embedded_tokenizer():
    """The embedded model's tokenizer, loaded once a worker (the model is converted from its GGUF on first use, but
    not loaded: a test that needs text alone does not pay for the model)."""
    from transformers import AutoTokenizer

    from eagle_mdsd import models

    return AutoTokenizer.from_pretrained(models._embedded_folder())
