"""lab/long_data_pilot.py's cut data."""

import json

import pytest
import torch

from evaluation_scripts import load

long_data_pilot = load("long_data_pilot")


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
