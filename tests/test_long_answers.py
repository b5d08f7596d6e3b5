"""evaluation/long_answers.py's repeat split and evaluation/long_data_pilot.py's cut data."""

import json

import pytest
import torch

from evaluation_scripts import load

long_answers = load("long_answers")
long_data_pilot = load("long_data_pilot")


def test_a_token_is_in_a_repeat_when_the_ngram_ending_there_occurred_before():
    assert long_answers.repeats([1, 2, 3, 1, 2, 3, 1], 3) == [False] * 5 + [True, True]
    assert long_answers.repeats([5, 5, 5, 5], 2) == [False, False, True, True]  # overlapping occurrences count
    assert long_answers.repeats([1, 2], 3) == [False, False]
    assert long_answers.repeats([1, 2, 1, 2], 1) == [False, False, True, True]


class CharTokenizer:
    """One token per character: a text's ids are its characters' code points."""

    def __call__(self, text, add_special_tokens=False):
        return {"input_ids": [ord(c) for c in text]}


def _row(turns, new_tokens, accept_lengths):
    return {"question_id": 1, "choices": [{"turns": turns, "new_tokens": new_tokens, "accept_lengths": accept_lengths,
                                           "idxs": [len(a) for a in accept_lengths], "wall_time": [1.0] * len(turns)}]}


def test_cycles_are_split_by_whether_they_start_inside_a_repeat():
    # "abcabcab" with 3-grams: positions 5, 6 and 7 close an earlier 3-gram.  Cycles start at 1, 3, 5 and 7.
    rows = [_row(["abcabcab"], [8], [[2, 2, 2, 1]])]
    split = long_answers.repeat_split(rows, CharTokenizer(), 3, max_new_tokens=128)
    assert split["repeat"] == [3, 2] and split["fresh"] == [4, 2]
    assert (split["turns"], split["aligned"], split["repeated_tokens"], split["tokens"]) == (1, 1, 3, 8)


def test_turns_whose_text_does_not_give_their_token_count_are_left_out():
    rows = [_row(["abcabc", "abcabc", "abcabc"], [7, 7, 8], [[3, 3], [3, 3], [3, 3]])]
    split = long_answers.repeat_split(rows, CharTokenizer(), 3, max_new_tokens=7)
    # 7 tokens and 6 in the text: stopped at max_new_tokens, so no end-of-sequence token explains the gap
    assert split["aligned"] == 0
    split = long_answers.repeat_split(rows, CharTokenizer(), 3, max_new_tokens=128)
    assert split["aligned"] == 2  # stopped early: the text lacks the end-of-sequence token; 8 is off by two


def _shard(path, samples):
    path.parent.mkdir(parents=True, exist_ok=True)
    torch.save(samples, path)


def test_cut_answers_keeps_the_prompt_and_the_first_answer_tokens(tmp_path):
    source = tmp_path / "long"
    samples = [{"ids": torch.arange(10, dtype=torch.int32), "start": 4, "features": torch.randn(10, 3)},
               {"ids": torch.arange(5, dtype=torch.int32), "start": 3, "features": torch.randn(5, 3)}]
    _shard(source / "data" / "shard_00000.pt", samples)
    (source / "data" / "prompts.json").write_text(json.dumps({"count": 2}))
    written = long_data_pilot.cut_answers(source, tmp_path / "cut", 3)
    cut = torch.load(written[0])
    assert [len(s["ids"]) for s in cut] == [7, 5] and [s["start"] for s in cut] == [4, 3]
    assert torch.equal(cut[0]["features"], samples[0]["features"][:7])
    assert torch.equal(cut[1]["ids"], samples[1]["ids"])  # an answer shorter than the cut stays whole
    assert long_data_pilot.answer_tokens(written) == 3 + 2
    assert long_data_pilot.answer_tokens([source / "data" / "shard_00000.pt"]) == 6 + 2
    assert json.loads((tmp_path / "cut" / "data" / "prompts.json").read_text()) == {"count": 2}
    with pytest.raises(FileNotFoundError, match="no data shards"):
        long_data_pilot.cut_answers(tmp_path / "none", tmp_path / "cut2", 3)


def test_a_long_first_turn_begins_as_the_short_runs_when_its_cycles_and_text_do():
    short = [_row(["the cat sat on", "x"], [5, 1], [[2, 2], [1]]) | {"question_id": 1},
             _row(["a dog ran far away", "x"], [5, 1], [[2, 3], [1]]) | {"question_id": 2},
             _row(["unmatched", "x"], [3, 1], [[2], [1]]) | {"question_id": 3}]
    long = [_row(["the cat sat on the mat", "y"], [8, 1], [[2, 3, 2], [1]]) | {"question_id": 1},
            _row(["a dog ran far away", "y"], [6, 1], [[3, 2, 1], [1]]) | {"question_id": 2},
            _row(["whatever", "y"], [2, 1], [[2], [1]]) | {"question_id": 4}]
    # question 1: cycles [2] then the cut one; same text.  Question 2: its first cycle differs.  3 and 4: one file
    assert long_answers.same_start(short, long) == (1, 2)
