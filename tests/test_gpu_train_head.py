"""scripts/gpu_train_head.sh at toy scale on the CPU, in two calls as on the device: every stage runs, $OUT is
packed as the device tool brings it back (at most 8 files of at most 16 MiB), and the second call puts the first
call's answers back and answers only the rest."""

import json
import os
import subprocess
import sys
import tarfile
from pathlib import Path

import numpy
import torch

ROOT = Path(__file__).resolve().parents[1]


def _call(tmp_path, name, **settings):
    from eagle_mdsd import models

    out = tmp_path / name
    out.mkdir()
    env = os.environ | {"OUT": str(out), "GPU_SITE": str(tmp_path / "site"), "DEVICE": "cpu",
                        "PYTHON": sys.executable, "BASE_MODEL": str(models.cache_dir() / "smollm2-135m-instruct"),
                        "PROMPTS_ARCHIVE": str(tmp_path / "train_prompts.tar.xz"), "SELF_PROMPTS": "6",
                        "PROMPTS_BATCH": "6", "MAX_NEW_TOKENS": "8", "DATA_BATCH": "4", "SHARD_SIZE": "4",
                        "TOKENS_PER_BATCH": "256", "DRAFT_VOCAB": "64", "UNROLL3": "2",
                        # a busy machine must not cut a stage short: the limits are the GPU call's
                        "PROMPTS_MINUTES": "10", "DATA_MINUTES": "10", "MORE_PROMPTS_MINUTES": "10",
                        "MORE_DATA_MINUTES": "10", "TRAIN_MINUTES": "10", "TRAIN3_MINUTES": "10"} | settings
    done = subprocess.run(["bash", "scripts/gpu_train_head.sh"], cwd=ROOT, env=env, capture_output=True, text=True,
                          timeout=600)
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-2000:]
    files = sorted(p.name for p in out.iterdir())
    assert len(files) <= 8 and all(p.stat().st_size <= 16 << 20 for p in out.iterdir())
    return out


def _unpacked(out, folder):
    """The data parts of a call, joined (as PREVIOUS_DATA takes them) and unpacked into `folder`."""
    joined = folder.with_suffix(".tar.xz")
    joined.write_bytes(b"".join(p.read_bytes() for p in sorted(out.glob("data.tar.xz.*"))))
    with tarfile.open(joined) as packed:
        packed.extractall(folder)
    return joined


def _samples(run):
    return [s for shard in sorted((run / "data").glob("shard_*.pt")) for s in torch.load(shard)]


def test_the_gpu_head_script_answers_in_calls_and_trains_both_heads_on_a_fresh_machine(tmp_path):
    from eagle_mdsd import models

    models.load_target()  # the converted embedded model, the toy run's target
    prompts = tmp_path / "prompts"
    prompts.mkdir()
    (prompts / "few.jsonl").write_text("".join(json.dumps({"prompt": f"Name {n} fruits."}) + "\n" for n in range(6)))
    with tarfile.open(tmp_path / "train_prompts.tar.xz", "w:xz") as packed:
        packed.add(prompts / "few.jsonl", "few.jsonl")
    (tmp_path / "site").mkdir()
    (tmp_path / "site" / ".installed").touch()  # the wheels are this environment's own

    first = _call(tmp_path, "out1", RUN=str(tmp_path / "run1"), STAGES="data", MAX_PROMPTS="8")
    log = (first / "train_head.log").read_text()
    assert "answers/s" in log and "training tokens/s" not in log  # what sizes the next call
    summary = json.loads((first / "summary.json").read_text())
    assert summary["answers"] == 8 and summary["shards"] == 2 and summary["self_prompts"] >= 6
    back = _unpacked(first, tmp_path / "back1")
    ids = numpy.load(tmp_path / "back1" / "ids.npz")
    shards = _samples(tmp_path / "run1")
    assert ids["ids"].tolist() == torch.cat([s["ids"] for s in shards]).tolist()
    assert ids["starts"].tolist() == [s["start"] for s in shards] and ids["shard_sizes"].tolist() == [4, 4]

    # a fresh machine: the first call's answers come back as its shards; 4 more prompts, then 4 of seed 1
    run = tmp_path / "run2"
    second = _call(tmp_path, "out2", RUN=str(run), STAGES="data", PREVIOUS_DATA=str(back), MAX_PROMPTS="12",
                   MORE_PROMPTS="4")
    log = (second / "train_head.log").read_text()
    assert "put back 8 answers in 2 shards" in log and "data stage: 4 answers" in log
    again = _samples(run)
    assert [s["ids"].tolist() for s in again[:8]] == [s["ids"].tolist() for s in shards]
    assert len(again) == 12 and len(_samples(run / "more")) == 4
    assert json.loads((second / "summary.json").read_text())["answers"] == 16
    both = _unpacked(second, tmp_path / "back2")
    assert numpy.load(tmp_path / "back2" / "more" / "ids.npz")["shard_sizes"].tolist() == [4]

    # another fresh machine trains both heads on both runs' answers, put back
    third = _call(tmp_path, "out3", RUN=str(tmp_path / "run3"), STAGES="train", PREVIOUS_DATA=str(both))
    log = (third / "train_head.log").read_text()
    assert "put back 12 answers in 3 shards" in log and "put back 4 answers in 1 shards" in log
    assert log.count("training tokens/s") == 2
    summary = json.loads((third / "summary.json").read_text())
    assert summary["shards"] == 4 and "answers" not in summary  # (counted by the data call)
    assert not list(third.glob("data.tar.*"))  # (brought back by the data call)
    for name in ("eagle1", "eagle3"):
        assert summary[name]["steps"] >= 1 and len(summary[name]["log"]) == summary[name]["steps"]
    with tarfile.open(third / "head.tgz") as packed:
        assert {"head/config.json", "head/draft_vocab.json"} <= set(packed.getnames())
    with tarfile.open(third / "head3.tgz") as packed:
        packed.extractall(tmp_path / "head3")
    config = json.loads((tmp_path / "head3" / "head" / "config.json").read_text())
    assert config["architectures"] == ["LlamaForCausalLMEagle3"] and config["draft_vocab_size"] == 64
