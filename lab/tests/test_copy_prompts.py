"""lab/copy_prompts.py: prompts whose answers copy a given text, and the copy rate of a run's data."""

from __future__ import annotations

import json
import sys

import pytest
import torch

import evaluation_scripts
from eagle_mdsd import training


def test_the_copy_prompt_builder_writes_revisions_and_documents(tmp_path):
    copy_prompts = evaluation_scripts.load("copy_prompts")
    folder = tmp_path / "train_prompts"
    folder.mkdir()
    answer = "A reference answer of more than eighty characters, which the prompts below are built around."
    (folder / "gpteacher-roleplay-instruct.json").write_text(json.dumps(
        [{"instruction": f"Play role {i}.", "input": "", "response": answer} for i in range(3)]))
    (folder / "gpteacher-codegen-instruct.json").write_text(json.dumps(
        [{"instruction": "Write code.", "input": "", "response": "def f(x):\n    return x + 1  " + answer}]))
    (folder / "alpaca-seed-tasks.jsonl").write_text(json.dumps(
        {"instruction": "Explain.", "instances": [{"input": "", "output": "short"}]}) + "\n")
    prompts = copy_prompts.build(folder, 10, seed=0)
    assert len(prompts) == 4 and prompts == copy_prompts.build(folder, 10, seed=0)
    revisions = [p["messages"] for p in prompts if "messages" in p]
    documents = [p["prompt"] for p in prompts if "prompt" in p]
    assert len(revisions) == 2 and len(documents) == 2
    assert all(m[1] == {"role": "assistant", "content": m[1]["content"]} and m[2]["content"] in
               copy_prompts.REVISIONS for m in revisions)
    assert all(d.endswith(answer) for d in documents)
    file = tmp_path / "copy.jsonl"
    file.write_text("".join(json.dumps(p) + "\n" for p in prompts))
    assert len(training.load_prompts([file])) == 4
    shard = tmp_path / "shard_00000.pt"  # prompt 1 2 3 4, answer 2 3 4 9 9: grams 234 (copied), 349, 499
    torch.save([{"ids": torch.tensor([1, 2, 3, 4, 2, 3, 4, 9, 9], dtype=torch.int32), "start": 4}], shard)
    assert copy_prompts.copy_rate([shard]) == pytest.approx(1 / 3)


def test_the_copy_rate_of_a_run_without_shards_is_a_one_line_error(monkeypatch, capsys, tmp_path):
    copy_prompts = evaluation_scripts.load("copy_prompts")
    monkeypatch.setattr(sys, "argv", ["copy_prompts.py", "--copy-rate", str(tmp_path)])
    with pytest.raises(SystemExit):
        copy_prompts.main()
    assert f"no data shards in {tmp_path / 'data'}" in capsys.readouterr().err
