"""lab/harness.py: the pilots' command lines refuse missing data in one line, arms resume from their result
lines, and the A/B arms take turns going first."""

from __future__ import annotations

import json
import sys
from types import SimpleNamespace

import pytest

import evaluation_scripts

harness = evaluation_scripts.load("harness")


@pytest.mark.parametrize("script, shards, message", [
    ("fused_features_pilot", 0, "no data shards in"),
    ("head_depth_pilot", 0, "no data shards in"),
    ("target_layer_pilot", 0, "has 0 data shards, the pilot needs 2 or more (the last is held out)"),
    ("target_layer_pilot", 1, "has 1 data shards, the pilot needs 2 or more (the last is held out)"),
    ("token_loss_pilot", 1, "has 1 data shards, the pilot needs 2 or more (the last is held out)"),
    ("output_layer_pilot", 1, "has 1 data shards, the pilot needs 2 or more (the last is held out)"),
])
def test_a_run_without_enough_data_is_one_line(script, shards, message, tmp_path, monkeypatch, capsys):
    (tmp_path / "run" / "data").mkdir(parents=True)
    for index in range(shards):
        (tmp_path / "run" / "data" / f"shard_{index:05d}.pt").write_bytes(b"")
    monkeypatch.setattr(sys, "argv", [f"{script}.py", "--data", str(tmp_path / "run"), "--work",
                                      str(tmp_path / "work")])
    with pytest.raises(SystemExit):
        evaluation_scripts.load(script).main()
    error = capsys.readouterr().err
    assert message in error and "Traceback" not in error


def test_arms_resume_from_their_result_lines(tmp_path):
    record, trained = tmp_path / "results.jsonl", []
    record.write_text(json.dumps({"arm": "a", "steps": 3, "train_s": 7, "score": 0.5}) + "\n")

    def train_arm(arm):
        trained.append(arm)
        return f"head {arm}", 0 if arm == "shipped" else 2, {"lr": 0.1}

    done = harness.arms_in_turn(("shipped", "a", "b"), record, train_arm, lambda arm, draft: {"score": draft})
    assert trained == ["shipped", "b"]  # "a" had finished
    assert done["a"]["score"] == 0.5 and done["shipped"]["train_s"] == 0
    assert done["b"] == {"arm": "b", "lr": 0.1, "steps": 2, "train_s": 0, "score": "head b"}
    assert harness.finished(record) == done  # every line written as it finished
    assert harness.arms_in_turn(("shipped", "a", "b"), record, None, None) == done  # nothing left to run


def test_a_pages_command_names_the_options_as_given():
    args = SimpleNamespace(data=["runs/a", "runs/b"], mt_bench="x.pt", epochs=2.0, scratch_epochs=0.5)
    assert harness.command("head_depth_pilot", args, "data", "mt_bench", "epochs", "scratch_epochs") == \
        "python lab/head_depth_pilot.py --data runs/a runs/b --mt-bench x.pt --epochs 2 --scratch-epochs 0.5"


def test_the_arms_take_turns_going_first():
    order = []

    def run(arm, prompt, max_new_tokens, seed):
        order.append((arm, max_new_tokens, seed))
        return SimpleNamespace(new_tokens=max_new_tokens, wall_time_s=1.0 if arm == "x" else 2.0,
                               token_ids=[seed] if arm == "x" or seed == 0 else [9])

    speed, same = harness.take_turns(("x", "y"), run, [[1], [2]])
    assert order == [("x", 8, 0), ("x", 128, 0), ("y", 8, 0), ("y", 128, 0),
                     ("y", 8, 1), ("y", 128, 1), ("x", 8, 1), ("x", 128, 1)]
    assert speed == {"x": 128.0, "y": 64.0} and same == 1
