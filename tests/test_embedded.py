"""The embedded default model: temperature 0 equals transformers greedy decoding, token for token."""

from __future__ import annotations

from eagle_mdsd import checks


def test_engine_matches_greedy_generate_for_every_tree(tmp_path):
    rows = checks.greedy_equivalence(tmp_path / "rows.jsonl", question_count=2, max_new_tokens=40,
                                     dtypes=("float32",))
    assert len(rows) == 2 * len(checks.ALL_TREES)
    assert all(row["identical"] for row in rows), [r for r in rows if not r["identical"]]
    # resuming does no work twice and loses nothing
    again = checks.greedy_equivalence(tmp_path / "rows.jsonl", question_count=2, max_new_tokens=40,
                                      dtypes=("float32",))
    assert again == rows and len((tmp_path / "rows.jsonl").read_text().splitlines()) == len(rows)
