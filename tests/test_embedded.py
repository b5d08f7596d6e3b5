"""The embedded default model: temperature 0 equals transformers greedy decoding, token for token."""

from __future__ import annotations

from eagle_mdsd import checks


# every static tree, the dynamic ones at sizes a 2-core CI runs quickly in fp32, and prompt-lookup drafts
TREES = ("eagle_default", "binary_depth4", "quad_depth3", "chain4", "chain6",
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
