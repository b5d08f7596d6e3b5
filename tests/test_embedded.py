"""The embedded default model: temperature 0 equals transformers greedy decoding, token for token."""

from __future__ import annotations

from eagle_mdsd import checks


# the plain decoding loop, every static tree, the dynamic ones at sizes a 2-core CI runs quickly in fp32, and
# prompt-lookup drafts
TREES = (checks.BASELINE, "eagle_default", "binary_depth4", "quad_depth3", "chain4", "chain6",
         "eagle2:total_tokens=16,depth=4,top_k=4", "opt_tree:nodes=16,threshold=0.05,max_depth=6,top_k=4",
         "eagle_default+lookup")


def test_engine_matches_greedy_generate_for_every_tree(tmp_path):
    rows = checks.greedy_equivalence(tmp_path / "rows.jsonl", question_count=2, max_new_tokens=40, trees=TREES,
                                     dtypes=("float32",))
    assert len(rows) == 2 * len(TREES)
    assert all(row["identical"] for row in rows), [r for r in rows if not r["identical"]]
    # resuming does no work twice and loses nothing
    again = checks.greedy_equivalence(tmp_path / "rows.jsonl", question_count=2, max_new_tokens=40, trees=TREES,
                                      dtypes=("float32",))
    assert again == rows and len((tmp_path / "rows.jsonl").read_text().splitlines()) == len(rows)


def test_plain_decoding_matches_greedy_generate_in_bf16_too(tmp_path):
    """The prefill and each plain step leave the attention mask to the model, as `generate` does: the same kernels
    round alike, bit for bit, on packed linear layers too (a step with the engine's own all-visible mask took
    another attention kernel and drifted apart at token 104 of the first question).  Only a forward of several
    rows rounds its attention differently (evaluation/bf16_rounding.py)."""
    rows = checks.greedy_equivalence(tmp_path / "rows.jsonl", question_count=2, max_new_tokens=128,
                                     trees=(checks.BASELINE,), dtypes=("bfloat16",))
    assert len(rows) == 2 and all(row["identical"] for row in rows), rows


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
    missing = ["check-greedy", "--base-model", str(tmp_path / "absent.gguf"), "--out", str(tmp_path / "out")]
    assert cli.main(missing) == 2
    assert "absent.gguf does not exist" in capsys.readouterr().err
