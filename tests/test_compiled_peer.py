"""evaluation/compiled_peer.py: the compiled `generate` arm decodes what stock greedy `generate` decodes."""

from __future__ import annotations

import torch

import evaluation_scripts
from tiny import tiny_target

peer = evaluation_scripts.load("compiled_peer")


def test_compiled_generate_answers_as_stock_greedy_generate_up_to_eos():
    target = tiny_target(vocab=16, hidden=32).float()
    config = peer.cpu_compile_config()
    prompt = [1, 5, 2, 7, 3]
    with torch.inference_mode():
        stock = target.generate(torch.tensor([prompt]), do_sample=False, max_new_tokens=12, eos_token_id=None,
                                pad_token_id=0)[0, len(prompt):].tolist()
    eos = stock[5]  # a token the greedy answer reaches: the compiled arm must stop right after it
    tokens, seconds = peer.compiled_generate(target, [eos], prompt, 12, 0.0, 0, config)
    assert tokens == stock[: stock.index(eos) + 1]
    assert seconds > 0
    assert hasattr(target, "_compiled_call")  # transformers took the compiled path on this CPU
    tokens, _ = peer.compiled_generate(target, [99], prompt, 12, 0.0, 0, config)  # an EOS it never emits
    assert tokens == stock
