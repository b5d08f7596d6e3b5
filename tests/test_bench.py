"""Answer files: valid, resumable, and the summary recomputes from them."""

from __future__ import annotations

import json

import pytest
import torch
from transformers import AutoTokenizer, LlamaConfig, LlamaForCausalLM

from eagle_mdsd import bench, engine, head, models, questions, tree


@pytest.fixture(scope="module")
def small_chat_model():
    """The embedded model's tokenizer and chat template on a tiny random Llama of the same vocabulary."""
    models.load_target()  # makes sure the converted embedded model exists
    tokenizer = AutoTokenizer.from_pretrained(models.cache_dir() / "smollm2-135m-instruct")
    torch.manual_seed(0)
    config = LlamaConfig(vocab_size=len(tokenizer), hidden_size=16, intermediate_size=32, num_hidden_layers=1,
                         num_attention_heads=2, num_key_value_heads=1, max_position_embeddings=2048)
    target = LlamaForCausalLM(config).eval()
    return target, tokenizer


@pytest.mark.parametrize("method", ["eagle", "baseline"])
def test_answer_files_are_valid_and_resume(tmp_path, small_chat_model, method):
    target, tokenizer = small_chat_model
    decoder = engine.Decoder(target, head.random_head(target), tree.load("chain4"))
    chosen = questions.load("mt_bench")[:3]
    answer_file = tmp_path / "answers.jsonl"
    bench.run(decoder, tokenizer, chosen[:2], answer_file, "tiny", 6, 0.0, method=method)
    first = answer_file.read_text().splitlines()
    bench.run(decoder, tokenizer, chosen, answer_file, "tiny", 6, 0.0, method=method)  # resumes: only question 3
    lines = answer_file.read_text().splitlines()
    assert lines[:2] == first and len(lines) == 3
    rows = [json.loads(line) for line in lines]
    assert [r["question_id"] for r in rows] == [81, 82, 83]
    for row in rows:
        assert {"question_id", "answer_id", "model_id", "choices", "tstamp"} <= set(row)
        choice = row["choices"][0]
        assert len(choice["turns"]) == 2 == len(choice["idxs"]) == len(choice["new_tokens"])
        # the token sampled after the prefill plus every cycle's tokens, cut at max_new_tokens
        assert all(n == min(1 + sum(a), 6) for a, n in zip(choice["accept_lengths"], choice["new_tokens"]))
    summary = bench.summarise(answer_file)
    tokens = sum(sum(r["choices"][0]["new_tokens"]) for r in rows)
    cycles = sum(sum(r["choices"][0]["idxs"]) for r in rows)
    assert summary["all"]["new_tokens"] == tokens and summary["all"]["tau"] == pytest.approx(tokens / cycles)
    assert summary["writing"]["questions"] == 3


def test_second_turn_sees_the_first_answer(small_chat_model):
    _, tokenizer = small_chat_model
    ids = bench.conversation_ids(tokenizer, ["Say hi.", "Again."], ["hi"])
    text = tokenizer.decode(ids)
    assert text.index("Say hi.") < text.index("hi", text.index("Say hi.") + 7) < text.index("Again.")
