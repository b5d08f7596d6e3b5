"""hf_compiled (peers.CompiledPeer): transformers' compiled static-cache `generate` answers as stock `generate`."""

from __future__ import annotations

import pytest
import torch
from transformers import CompileConfig

from eagle_mdsd import peers
from eagle_mdsd.errors import UsageError
from tiny import tiny_target


@pytest.fixture(scope="module")
def compiled():
    """A tiny target of the embedded tokenizer's vocabulary and its compiled peer, prepared once for 256 tokens
    (compiling takes most of this file's time; transformers keeps that cache for every later peer of the model)."""
    from transformers import AutoTokenizer, LlamaConfig, LlamaForCausalLM

    from eagle_mdsd import models

    tokenizer = AutoTokenizer.from_pretrained(models._embedded_folder())
    torch.manual_seed(0)
    config = LlamaConfig(vocab_size=len(tokenizer), hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                         num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=512)
    target = LlamaForCausalLM(config).eval()
    with torch.no_grad():  # far-apart logits: no near-ties for float32 rounding to flip
        target.lm_head.weight.mul_(50)
    target.generation_config.eos_token_id = None
    peer = peers.CompiledPeer(target, [], cache_tokens=256)
    peer.prepare()
    target.tokenizer_for_tests = tokenizer
    return target, peer


def test_hf_compiled_answers_greedy_identically_to_hf_generate_without_recompiling(compiled):
    from torch._dynamo.utils import counters

    target, peer = compiled
    assert peer.compile_s > 0 and peer.prepared_tokens >= 256
    assert getattr(target, "_compiled_call", None) is not None  # transformers took the compiled path on this CPU
    graphs = counters["stats"]["unique_graphs"]
    for prompt in ([1, 5, 2, 7, 3], [3, 4, 1, 2, 9, 9, 9, 1, 2, 6, 6]):  # two prompt lengths, one cache
        stock = peers.TransformersPeer(target, []).generate(prompt, 12, 0.0, method="hf_generate")
        result = peer.generate(prompt, 12, 0.0)
        assert result.token_ids == stock.token_ids
        assert result.cycles == len(result.token_ids) - 1 and result.accept_lengths == [1] * result.cycles  # tau 1
        assert result.wall_time_s > 0
    assert counters["stats"]["unique_graphs"] == graphs  # the preallocated cache served both lengths
    before = peer.compile_s
    sampled = peer.generate([1, 2, 3], 10, 1.0, seed=3)
    assert 1 <= sampled.new_tokens <= 10 and all(0 <= t < target.config.vocab_size for t in sampled.token_ids)
    assert peer.compile_s == before  # sampling reuses the compiled forward (no preparing call)


def test_hf_compiled_prepares_before_the_clock_when_a_call_would_not_fit(compiled, monkeypatch):
    target, peer = compiled
    prepared = []
    monkeypatch.setattr(peer, "prepare", lambda tokens=None: prepared.append(tokens) or 0.0)
    peer.generate([1] * 250, 20, 0.0)  # 270 tokens: more than the 256 it holds
    assert prepared == [270]


def test_hf_compiled_stops_at_eos_as_generate_does(compiled):
    target, peer = compiled
    prompt = [1, 5, 2, 7, 3]
    stock = peers.TransformersPeer(target, []).generate(prompt, 12, 0.0, method="hf_generate").token_ids
    eos = stock[5]  # a token the greedy answer reaches: the compiled peer stops right after it
    peer.eos = [eos]
    try:
        assert peer.generate(prompt, 12, 0.0).token_ids == stock[: stock.index(eos) + 1]
    finally:
        peer.eos = []


def test_hf_compiled_refuses_in_one_line_where_compilation_fails(monkeypatch):
    def no_compiler(graph, example_inputs):
        raise RuntimeError("no C++ compiler found\nmore detail")

    failing = CompileConfig(backend=no_compiler, mode=None)
    failing._compile_all_devices = True
    monkeypatch.setattr(peers, "compile_config", lambda device: failing)
    peer = peers.CompiledPeer(tiny_target(vocab=16, hidden=32, seed=1).float(), [], cache_tokens=16)
    with pytest.raises(UsageError) as refused:
        peer.generate([1, 2, 3], 4, 0.0)
    message = str(refused.value)
    assert message.startswith("hf_compiled: torch.compile failed on cpu (") and "\n" not in message
    assert "drop hf_compiled from the methods" in message


def test_the_other_peers_refuse_hf_compiled():
    with pytest.raises(ValueError, match="CompiledPeer"):
        peers.TransformersPeer(tiny_target(vocab=16).float(), []).generate([1, 2], 2, 0.0, method=peers.COMPILED)


def test_check_greedy_has_a_row_for_hf_compiled(tmp_path, compiled, monkeypatch):
    """check-greedy's `hf_compiled` row: the compiled peer's tokens against greedy `generate`'s, beside the engine's."""
    from eagle_mdsd import checks, models

    target, _ = compiled
    monkeypatch.setattr(models, "load_target", lambda *args: (target, target.tokenizer_for_tests))
    assert peers.COMPILED in checks.ALL_TREES
    rows = checks.greedy_equivalence(tmp_path / "rows.jsonl", question_count=1, max_new_tokens=8,
                                     trees=(checks.BASELINE, peers.COMPILED), dtypes=("float32",))
    assert [(row["tree"], row["identical"]) for row in rows] == [("baseline", True), ("hf_compiled", True)]
    assert "| float32 | hf_compiled | 1 | 1 | - |" in checks.summary_markdown(rows, 8, "random")
