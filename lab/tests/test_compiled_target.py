"""lab/compiled_target.py: the compiled arm computes the engine's target call, and the context stays put."""

from __future__ import annotations

import torch

import evaluation_scripts
from tiny import tiny_target

script = evaluation_scripts.load("compiled_target")


def test_compiled_forward_gives_the_eager_features_for_each_row_count():
    eager = script.Forward(tiny_target(vocab=16, hidden=32).float(), compiled=False)
    compiled = script.Forward(tiny_target(vocab=16, hidden=32).float(), compiled=True)  # same seed: same weights
    context = torch.tensor([1, 5, 2, 7, 3, 9, 4])
    with torch._inductor.config.patch(freezing=True):
        for rows in (1, 3):
            tokens = torch.arange(rows) + 6
            result = script.compare(eager, compiled, context, tokens, calls=2)
            assert result["max_difference"] < 1e-4
            assert result["eager_ms"] > 0 and result["compiled_ms"] > 0 and result["first_call_s"] > 0
            for arm in (eager, compiled):  # every timed call leaves the context as it found it
                assert arm.cache.length == len(context)
    # the calls are the engine's: a row's features are those of a causal forward over context + tokens
    with torch.inference_mode():
        full = eager.eager_model(input_ids=torch.cat([context, tokens])[None]).last_hidden_state[0, len(context):]
    features, _ = compiled.call(tokens)
    assert torch.allclose(features, full, atol=1e-4)
