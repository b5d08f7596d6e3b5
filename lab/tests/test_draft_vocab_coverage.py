"""lab/draft_vocab_coverage.py: the share of answer tokens a draft vocabulary leaves out."""

from __future__ import annotations

import sys

import pytest

import evaluation_scripts

coverage = evaluation_scripts.load("draft_vocab_coverage")


def test_the_share_outside_counts_every_token_against_the_top_of_the_ranking():
    ranking = [7, 3, 5, 1]
    # 6 tokens: outside [7] are 3, 3, 5, 9 (4 of 6); outside [7, 3] 5, 9; outside all four 9 alone
    assert coverage.outside_share([[7, 3, 3], [5, 9, 7]], ranking, [1, 2, 4]) == pytest.approx(
        {1: 4 / 6, 2: 2 / 6, 4: 1 / 6})


@pytest.mark.parametrize("argv, message", [(["missing.jsonl"], "no answers in missing.jsonl"),
                                           (["a.jsonl", "--sizes", "8k"], "'8k': pass comma-separated token counts"),
                                           (["a.jsonl", "--head", "."], "no draft_vocab.json in .")])
def test_bad_input_is_one_line(monkeypatch, capsys, argv, message):
    monkeypatch.setattr(sys, "argv", ["draft_vocab_coverage.py", *argv])
    with pytest.raises(SystemExit) as exit_:
        coverage.main()
    assert exit_.value.code == 2 and message in capsys.readouterr().err
