"""The embedded default model: temperature 0 equals transformers greedy decoding, token for token."""

from __future__ import annotations

import pytest
import torch

from eagle_mdsd import checks, embedded, kernels

# The float64 tests of the engine, dynamic trees and lookup cover every topology; here one of each kind runs on
# the real model: the plain decoding loop, a static tree, a dynamic one at a size a 2-core CI runs quickly in
# fp32, and prompt-lookup drafts.  The shipped head drafts, so that cycles accept paths of several tokens (a random
# head's are all rejected) and commit their cache entries.  The other trees run with `pytest -m slow`.
TREES = (checks.BASELINE, "eagle_default", "eagle2:total_tokens=16,depth=4,top_k=4", "eagle_default+lookup")
MORE_TREES = ("binary_depth4", "quad_depth3", "chain4", "chain6",
              "opt_tree:nodes=16,threshold=0.05,max_depth=6,top_k=4")


def test_engine_matches_greedy_generate_for_a_tree_of_each_kind(tmp_path):
    settings = dict(question_count=1, max_new_tokens=48, trees=TREES, dtypes=("float32",),
                    head_spec=str(embedded.DEFAULT_HEAD))
    rows = checks.greedy_equivalence(tmp_path / "rows.jsonl", **settings)
    assert len(rows) == len(TREES)
    assert all(row["identical"] for row in rows), [r for r in rows if not r["identical"]]
    assert all(row["tau"] > 1.5 for row in rows if row["tree"] != checks.BASELINE), rows  # paths were accepted
    # resuming does no work twice and loses nothing
    again = checks.greedy_equivalence(tmp_path / "rows.jsonl", **settings)
    assert again == rows and len((tmp_path / "rows.jsonl").read_text().splitlines()) == len(rows)


@pytest.mark.slow
def test_engine_matches_greedy_generate_for_the_other_trees(tmp_path):
    rows = checks.greedy_equivalence(tmp_path / "rows.jsonl", question_count=2, max_new_tokens=40,
                                     trees=MORE_TREES, dtypes=("float32",))
    assert len(rows) == 2 * len(MORE_TREES)
    assert all(row["identical"] for row in rows), [r for r in rows if not r["identical"]]


def test_plain_decoding_matches_greedy_generate_in_bf16_on_the_same_kernels(tmp_path):
    """The prefill and each plain step leave the attention mask to the model, as `generate` does, so on the
    stock kernels both run the same products in the same order and round alike, bit for bit, on any CPU.  (A
    forward of several rows, as a tree's, rounds its attention differently: lab/bf16_rounding.py.)"""
    rows = checks.greedy_equivalence(tmp_path / "rows.jsonl", question_count=1, max_new_tokens=64,
                                     trees=(checks.BASELINE,), dtypes=("bfloat16",), kernels_choice="stock")
    assert len(rows) == 1 and all(row["identical"] for row in rows), rows


@pytest.mark.skipif(not kernels.available(torch.zeros(1, dtype=torch.bfloat16)),
                    reason="this CPU has no oneDNN bf16 kernels, so the engine cannot run packed weights here")
def test_plain_decoding_on_packed_kernels_matches_greedy_generate_in_bf16(tmp_path):
    """Packed weights give the stock kernel's products bit for bit (tests/test_kernels.py, layer by layer), so
    a whole answer on them is `generate`'s too."""
    rows = checks.greedy_equivalence(tmp_path / "rows.jsonl", question_count=1, max_new_tokens=64,
                                     trees=(checks.BASELINE,), dtypes=("bfloat16",), kernels_choice="packed")
    assert len(rows) == 1 and all(row["identical"] for row in rows), rows


def test_check_greedy_runs_on_a_target_of_another_family(tmp_path, capsys, monkeypatch):
    """`check-greedy --base-model FOLDER`: a Qwen2 target saved with the embedded tokenizer, its own results file."""
    import datetime

    import torch
    from transformers import AutoTokenizer, Qwen2Config, Qwen2ForCausalLM

    from eagle_mdsd import cli, models

    tokenizer = AutoTokenizer.from_pretrained(models._embedded_folder())
    torch.manual_seed(0)
    config = Qwen2Config(vocab_size=len(tokenizer), hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                         num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=512,
                         eos_token_id=tokenizer.eos_token_id)
    target = Qwen2ForCausalLM(config).eval()
    with torch.no_grad():  # far-apart logits: no near-ties for float32 rounding to flip
        target.lm_head.weight.mul_(50)
    folder = tmp_path / "tiny-qwen2"
    target.save_pretrained(folder)
    tokenizer.save_pretrained(folder)
    load_target, loaded = models.load_target, []
    monkeypatch.setattr(models, "load_target", lambda spec, *args: loaded.append(spec) or load_target(spec, *args))
    argv = ["check-greedy", "--base-model", str(folder), "--questions", "1", "--max-new-tokens", "8",
            "--trees", "chain4", "eagle_default", "--dtypes", "float32", "--out", str(tmp_path / "out")]
    assert cli.main(argv) == 0
    assert loaded == [str(folder)]
    page = tmp_path / "out" / f"greedy_check_{datetime.date.today().isoformat()}_tiny-qwen2.md"
    text = page.read_text()
    assert "Target tiny-qwen2," in text
    assert "| float32 | chain4 | 1 | 1 | - |" in text and "| float32 | eagle_default | 1 | 1 | - |" in text
    # --cuda-graphs compile: rows of their own (torch.compile the identity here; test_device_cycle.py traces it)
    monkeypatch.setattr(torch, "compile", lambda module, **options: module)
    assert cli.main([*argv[:-6], "chain4", "--dtypes", "float32", "--cuda-graphs", "compile",
                     "--out", str(tmp_path / "out")]) == 0
    compiled = page.with_name(page.stem + "_compiled.md").read_text()
    assert "| float32 | chain4 | 1 | 1 | - |" in compiled and "eagle_default" not in compiled
    missing = ["check-greedy", "--base-model", str(tmp_path / "absent.gguf"), "--out", str(tmp_path / "out")]
    assert cli.main(missing) == 2
    assert "absent.gguf does not exist" in capsys.readouterr().err
