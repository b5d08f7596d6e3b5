"""The head-training pipeline: clean data, and a loss that goes down."""

from __future__ import annotations

import json

import pytest
import torch

from eagle_mdsd import head, questions, training

from tiny import tiny_target


def test_training_prompts_never_contain_benchmark_questions(tmp_path):
    benchmark = questions.load("spec_bench")
    planted = tmp_path / "planted.jsonl"
    planted.write_text("\n".join(json.dumps({"instruction": text, "response": "x"}) for text in
                                 ["  " + benchmark[0]["turns"][0].upper() + " ", "A harmless new prompt."]))
    prompts = training.load_prompts([planted] + ([training.DEFAULT_PROMPTS] if training.DEFAULT_PROMPTS.exists()
                                                 else []))
    banned = training.benchmark_texts()
    assert not any(training._normalise(p["prompt"]) in banned for p in prompts)
    assert any(p["prompt"] == "A harmless new prompt." for p in prompts)
    if training.DEFAULT_PROMPTS.exists():
        assert len(prompts) > 10000


def test_a_few_training_steps_lower_the_loss():
    target = tiny_target(vocab=32, hidden=32)
    draft_head = head.random_head(target, seed=1).train()
    optimizer = torch.optim.AdamW(draft_head.parameters(), lr=3e-3, betas=(0.9, 0.95))
    torch.manual_seed(0)
    ids = torch.randint(32, (2, 12))
    with torch.no_grad():
        feats = target.get_decoder()(ids).last_hidden_state
    samples = [{"ids": ids[i].int(), "start": 3, "features": feats[i].float()} for i in range(2)]
    batch = [t.double() if t.is_floating_point() else t for t in training._collate(samples, 32)]
    losses = []
    for _ in range(40):
        loss, _ = training.head_loss(draft_head, target.get_input_embeddings(), target.get_output_embeddings(),
                                     *batch, noise=0.0)
        optimizer.zero_grad()
        loss.backward()
        torch.nn.utils.clip_grad_norm_(draft_head.parameters(), 0.5)
        optimizer.step()
        losses.append(float(loss))
    assert losses[-1] < 0.5 * losses[0]


def test_missing_prompt_file_is_a_clear_error(tmp_path):
    with pytest.raises(FileNotFoundError, match="does not exist"):
        training.load_prompts([tmp_path / "nope.json"])
