"""evaluation/reference_eagle.py: EAGLE's reference code run beside the engine on the same target and head."""

from __future__ import annotations

import tempfile
from pathlib import Path

import pytest
import torch

from eagle_mdsd import engine, head, models, tree

import evaluation_scripts

reference_eagle = evaluation_scripts.load("reference_eagle")


@pytest.mark.parametrize("text", ["float16:0", "bfloat16", "float32:-1"])
def test_a_malformed_run_is_one_line_naming_the_form(text):
    with pytest.raises(ValueError, match="DTYPE:TEMPERATURE|must be >= 0"):
        reference_eagle.parse_run(text)


def test_a_missing_reference_environment_names_the_setup_script(monkeypatch):
    monkeypatch.setattr(reference_eagle, "REFERENCE_PYTHON", reference_eagle.ROOT / "no-such-venv" / "python")
    with pytest.raises(FileNotFoundError, match="scripts/setup_reference.sh"):
        reference_eagle.ReferenceDecoder(None, Path("."), "float32", 2)


@pytest.mark.skipif(not reference_eagle.REFERENCE_PYTHON.exists(),
                    reason="EAGLE's reference code is not set up (bash scripts/setup_reference.sh)")
def test_the_reference_makes_the_engines_greedy_tokens_and_cycles_in_float32():
    # float32, T = 0, full draft vocabulary: both decode the target's greedy answer with the same trees,
    # which fails if the reference decoded another model (its rotary base) or read the head differently.
    target, tokenizer = models.load_target(None, torch.float32)
    draft_head = head.load_head(models.DEFAULT_HEAD, target)
    eos = models.eos_token_ids(target, tokenizer)
    prompt = models.chat_prompt_ids(tokenizer, "Explain what a prime number is.")
    ours = engine.Decoder(target, draft_head, tree.load("eagle_default"), eos_token_ids=eos, draft_vocab=None)
    expected = ours.generate(prompt, 40)
    with tempfile.TemporaryDirectory() as folder:
        head.save_head(draft_head, folder, target)
        reference = reference_eagle.ReferenceDecoder(target, Path(folder), "float32", eos[0])
        try:
            got = reference.generate(prompt, 40, 0.0)
        finally:
            reference.close()
    assert got.token_ids == expected.token_ids
    assert abs(got.cycles - expected.cycles) <= 1  # the engine also emits the last cycle's bonus token
