"""scripts/gpu_train_head.sh at toy scale on the CPU: every stage runs and $OUT is packed as the device tool
brings it back (at most 8 files of at most 16 MiB)."""

import json
import os
import subprocess
import sys
import tarfile
from pathlib import Path

import numpy
import torch

ROOT = Path(__file__).resolve().parents[1]


def test_the_gpu_head_script_runs_every_stage_and_packs_its_results(tmp_path):
    from eagle_mdsd import models

    models.load_target()  # the converted embedded model, the toy run's target
    prompts = tmp_path / "prompts"
    prompts.mkdir()
    (prompts / "few.jsonl").write_text("".join(json.dumps({"prompt": f"Name {n} fruits."}) + "\n" for n in range(6)))
    archive = tmp_path / "train_prompts.tar.xz"
    with tarfile.open(archive, "w:xz") as packed:
        packed.add(prompts / "few.jsonl", "few.jsonl")
    (tmp_path / "site").mkdir()
    (tmp_path / "site" / ".installed").touch()  # the wheels are this environment's own
    out, run = tmp_path / "out", tmp_path / "run"
    out.mkdir()
    env = os.environ | {"OUT": str(out), "RUN": str(run), "GPU_SITE": str(tmp_path / "site"), "DEVICE": "cpu",
                        "PYTHON": sys.executable, "BASE_MODEL": str(models.cache_dir() / "smollm2-135m-instruct"),
                        "PROMPTS_ARCHIVE": str(archive), "SELF_PROMPTS": "6", "PROMPTS_BATCH": "6",
                        "MAX_PROMPTS": "8", "MAX_NEW_TOKENS": "8", "DATA_BATCH": "4", "SHARD_SIZE": "4",
                        "TOKENS_PER_BATCH": "256", "DRAFT_VOCAB": "64",
                        # a busy machine must not cut a stage short: the limits are the GPU call's
                        "PROMPTS_MINUTES": "10", "DATA_MINUTES": "10", "TRAIN_MINUTES": "10"}
    done = subprocess.run(["bash", "scripts/gpu_train_head.sh"], cwd=ROOT, env=env, capture_output=True, text=True,
                          timeout=600)
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-2000:]
    log = (out / "train_head.log").read_text()
    assert "answers/s" in log and "training tokens/s" in log  # what sizes the next call
    summary = json.loads((out / "summary.json").read_text())
    assert summary["answers"] == 8 and summary["shards"] == 2 and summary["steps"] >= 1
    assert summary["self_prompts"] >= 6 and len(summary["log"]) == summary["steps"]
    files = sorted(p.name for p in out.iterdir())
    assert len(files) <= 8 and all(p.stat().st_size <= 16 << 20 for p in out.iterdir())
    assert {"machine.txt", "train_head.log", "summary.json", "head.tgz"} <= set(files)
    with tarfile.open(out / "head.tgz") as packed:
        assert {"head/config.json", "head/draft_vocab.json"} <= set(packed.getnames())
    parts = sorted(out.glob("data.tar.*"))
    data = tmp_path / "data.tar"
    data.write_bytes(b"".join(p.read_bytes() for p in parts))
    with tarfile.open(data) as packed:
        packed.extractall(tmp_path / "back")
    ids = numpy.load(tmp_path / "back" / "ids.npz")
    shards = [s for shard in sorted((run / "data").glob("shard_*.pt")) for s in torch.load(shard)]
    assert ids["ids"].tolist() == torch.cat([s["ids"] for s in shards]).tolist()
    assert ids["starts"].tolist() == [s["start"] for s in shards]
