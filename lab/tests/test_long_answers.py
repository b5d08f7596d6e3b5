"""lab/long_answers.py's repeat split and its comparison of long and short answers."""

import json

import pytest
import torch

from evaluation_scripts import load

long_answers = load("long_answers")


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


def test_a_long_first_turn_begins_as_the_short_runs_when_its_cycles_and_text_do():
    short = [_row(["the cat sat on", "x"], [5, 1], [[2, 2], [1]]) | {"question_id": 1},
             _row(["a dog ran far away", "x"], [5, 1], [[2, 3], [1]]) | {"question_id": 2},
             _row(["unmatched", "x"], [3, 1], [[2], [1]]) | {"question_id": 3}]
    long = [_row(["the cat sat on the mat", "y"], [8, 1], [[2, 3, 2], [1]]) | {"question_id": 1},
            _row(["a dog ran far away", "y"], [6, 1], [[3, 2, 1], [1]]) | {"question_id": 2},
            _row(["whatever", "y"], [2, 1], [[2], [1]]) | {"question_id": 4}]
    # question 1: cycles [2] then the cut one; same text.  Question 2: its first cycle differs.  3 and 4: one file
    assert long_answers.same_start(short, long) == (1, 2)
