"""scripts/gpu_train_head.sh and the Python it runs (scripts/gpu_train_head.py): a data stage's answers packed as
token ids, put back as shards on a fresh machine, the call's summary; and the script end to end at toy scale on
the CPU, in two calls as on the device, with $OUT packed as the device tool brings it back (at most 8 files of
at most 16 MiB)."""

import json
import os
import subprocess
import sys
import tarfile
from pathlib import Path

import numpy
import pytest
import torch

from eagle_mdsd import training

import evaluation_scripts

ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="module")
def script():
    return evaluation_scripts.load("gpu_train_head")


def _samples(run):
    return [s for shard in sorted((run / "data").glob("shard_*.pt")) for s in torch.load(shard)]


def _data_run(run, shard_lengths, vocab=1000, seed=0):
    """A run folder with data shards of token ids alone (as --no-features writes them), samples of random lengths."""
    generator = torch.Generator().manual_seed(seed)
    (run / "data").mkdir(parents=True)
    for index, count in enumerate(shard_lengths):
        samples = []
        for _ in range(count):
            length = int(torch.randint(4, 12, (), generator=generator))
            ids = torch.randint(vocab, (length,), generator=generator, dtype=torch.int32)
            samples.append({"ids": ids, "start": int(torch.randint(1, length - 1, (), generator=generator))})
        torch.save(samples, run / "data" / f"shard_{index:05d}.pt")


@pytest.mark.parametrize("vocab", [1000, 70000])  # token ids packed as uint16, and as int32 beyond its range
def test_answers_packed_as_token_ids_come_back_as_the_same_shards(tmp_path, script, vocab):
    made, fresh = tmp_path / "made", tmp_path / "fresh"
    _data_run(made, [3, 5, 2], vocab)
    packed = script.pack_ids(made, script.load_samples(made))
    assert numpy.load(packed)["ids"].dtype == (numpy.uint16 if vocab < 2**16 else numpy.int32)
    assert script.restore(fresh, made, shard_size=5) == (10, 3)
    for before, after in zip(sorted((made / "data").glob("shard_*.pt")), sorted((fresh / "data").glob("shard_*.pt"))):
        assert before.name == after.name
        assert [(s["ids"].tolist(), s["start"]) for s in torch.load(before)] == \
            [(s["ids"].tolist(), s["start"]) for s in torch.load(after)]
    assert all(s["ids"].dtype == torch.int32 for s in _samples(fresh))
    # the record is the script's data stage's own, so that stage goes on with the prompts not yet answered
    record = json.loads((fresh / "data" / "prompts.json").read_text())
    script_recipe = training.DataRecipe(shard_size=5, sort_by_length=True, features=False)
    training.check_data_record(fresh / "data", record, script_recipe)
    with pytest.raises(ValueError, match="--shard-size 5"):
        training.check_data_record(fresh / "data", record, training.DataRecipe(sort_by_length=True, features=False))
    assert script.pack_ids(tmp_path / "empty", []) is None


def test_token_ids_without_their_shard_sizes_are_refused(tmp_path, script):
    numpy.savez(tmp_path / "ids.npz", ids=numpy.arange(6), lengths=numpy.array([6]), starts=numpy.array([2]))
    with pytest.raises(SystemExit, match="has no shard_sizes: it cannot be put back"):
        script.restore(tmp_path / "run", tmp_path, 4)


def test_the_summary_counts_what_the_runs_hold(tmp_path, script, capsys):
    run, more = tmp_path / "run", tmp_path / "run" / "more"
    _data_run(run, [4, 2])
    _data_run(more, [3], seed=1)
    (run / "self_prompts.jsonl").write_text("".join(json.dumps({"prompt": f"p{i}", "batch": 0}) + "\n"
                                                    for i in range(5)))
    log = [{"step": 1, "loss": 2.0, "top1": 0.1}, {"step": 2, "loss": 1.5, "top1": 0.2}]
    (run / "eagle1").mkdir()
    torch.save({"state": {"step": 2, "epoch": 1, "wall_time_s": 3.0, "log": log}}, run / "eagle1" / "checkpoint.pt")
    out = tmp_path / "out"
    out.mkdir()
    assert script.main(["summary", str(out), "data", str(run), str(more)]) == 0
    found = json.loads((out / "summary.json").read_text())
    samples = _samples(run) + _samples(more)
    assert found["shards"] == 3 and found["answers"] == len(samples) and found["self_prompts"] == 5
    assert found["tokens"] == sum(len(s["ids"]) for s in samples)
    assert found["answer_tokens"] == found["tokens"] - sum(s["start"] for s in samples)
    assert found["eagle1"] == {"steps": 2, "epochs_done": 1, "train_s": 3.0, "log": log} and "eagle3" not in found
    assert json.loads(capsys.readouterr().out) == {k: v for k, v in found.items() if k != "eagle1"}
    assert (run / "ids.npz").exists() and (more / "ids.npz").exists()
    assert numpy.load(more / "ids.npz")["shard_sizes"].tolist() == [3]
    (run / "ids.npz").unlink()
    assert script.main(["summary", str(out), "train", str(run), str(more)]) == 0  # a train call: no counts
    assert set(json.loads((out / "summary.json").read_text())) == {"shards", "eagle1"}
    assert not (run / "ids.npz").exists()


def _tiny_target(folder: Path) -> Path:
    """The smallest target the script takes: a 4-layer Llama (EAGLE-3 reads three of its layers) saved with the
    embedded model's tokenizer and chat template."""
    from transformers import AutoTokenizer, LlamaConfig, LlamaForCausalLM

    from eagle_mdsd import models

    tokenizer = AutoTokenizer.from_pretrained(models._embedded_folder())
    torch.manual_seed(0)
    config = LlamaConfig(vocab_size=len(tokenizer), hidden_size=32, intermediate_size=64, num_hidden_layers=4,
                         num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=512,
                         eos_token_id=tokenizer.eos_token_id, bos_token_id=tokenizer.bos_token_id)
    target = LlamaForCausalLM(config)
    # The residual stream's first coordinate is 1 at every position, and the output layer reads it alone: " the"
    # then leads (greedy answers go on), a sampled step ends a message with EOS about one time in thirteen, and
    # all other tokens are equally likely.
    with torch.no_grad():
        target.model.embed_tokens.weight[:, 0] = 1.0
        for layer in target.model.layers:
            layer.self_attn.o_proj.weight[0] = 0.0
            layer.mlp.down_proj.weight[0] = 0.0
        target.lm_head.weight.zero_()[tokenizer.eos_token_id, 0] = 1.5
        target.lm_head.weight[tokenizer(" the", add_special_tokens=False)["input_ids"][0], 0] = 1.6
    target.save_pretrained(folder)
    tokenizer.save_pretrained(folder)
    return folder


def _call(tmp_path, name, **settings):
    out = tmp_path / name
    out.mkdir()
    env = os.environ | {"OUT": str(out), "GPU_SITE": str(tmp_path / "site"), "DEVICE": "cpu",
                        "PYTHON": sys.executable, "BASE_MODEL": str(tmp_path / "target"),
                        "TRAIN_PROMPTS": str(tmp_path / "prompts"), "SELF_PROMPTS": "6",
                        "PROMPTS_BATCH": "6", "MAX_NEW_TOKENS": "8", "DATA_BATCH": "4", "SHARD_SIZE": "4",
                        "TOKENS_PER_BATCH": "256", "DRAFT_VOCAB": "64", "UNROLL3": "2",
                        "INIT_FROM": "none",  # the shipped head fits SmolLM2, not the toy target
                        # a busy machine must not cut a stage short: the limits are the GPU call's
                        "PROMPTS_MINUTES": "10", "DATA_MINUTES": "10", "MORE_PROMPTS_MINUTES": "10",
                        "MORE_DATA_MINUTES": "10", "TRAIN_MINUTES": "10", "TRAIN3_MINUTES": "10"} | settings
    done = subprocess.run(["bash", "scripts/gpu_train_head.sh"], cwd=ROOT, env=env, capture_output=True, text=True,
                          timeout=600)
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-2000:]
    files = sorted(p.name for p in out.iterdir())
    assert len(files) <= 8 and all(p.stat().st_size <= 16 << 20 for p in out.iterdir())
    return out


def _joined(out, path):
    """The data parts of a call, joined as PREVIOUS_DATA takes them."""
    path.write_bytes(b"".join(p.read_bytes() for p in sorted(out.glob("data.tar.xz.*"))))
    return path


def test_the_gpu_head_script_makes_data_in_one_call_and_trains_both_heads_on_it_in_another(tmp_path):
    from eagle_mdsd import jsonl

    _tiny_target(tmp_path / "target")
    prompts = tmp_path / "prompts"
    prompts.mkdir()
    (prompts / "few.jsonl").write_text("".join(json.dumps({"prompt": f"Name {n} fruits."}) + "\n" for n in range(6)))
    (tmp_path / "site").mkdir()
    (tmp_path / "site" / ".installed").touch()  # the wheels are this environment's own

    run = tmp_path / "run1"
    first = _call(tmp_path, "out1", RUN=str(run), STAGES="data", MAX_PROMPTS="8", MORE_PROMPTS="4")
    log = (first / "train_head.log").read_text()
    assert "answers/s" in log and "training tokens/s" not in log  # what sizes the next call
    written = [len(jsonl.records(folder / "self_prompts.jsonl")) for folder in (run, run / "more")]
    assert written == [6, 4]  # as many as asked
    answered = [len(_samples(run)), len(_samples(run / "more"))]
    assert answered == [8, written[1]]  # the run's --max-prompts of its 12, and every prompt of RUN/more
    summary = json.loads((first / "summary.json").read_text())
    assert summary["answers"] == sum(answered) and summary["self_prompts"] == sum(written)
    with tarfile.open(_joined(first, tmp_path / "data.tar.xz")) as packed:
        assert {"self_prompts.jsonl", "ids.npz", "more/self_prompts.jsonl", "more/ids.npz"} <= set(packed.getnames())

    # a fresh machine trains both heads on both runs' answers, put back
    second = _call(tmp_path, "out2", RUN=str(tmp_path / "run2"), STAGES="train", MORE_PROMPTS="4",
                   PREVIOUS_DATA=str(tmp_path / "data.tar.xz"))
    log = (second / "train_head.log").read_text()
    assert f"put back {answered[0]} answers in 2 shards" in log and f"put back {answered[1]} answers in 1 shards" in log
    assert log.count("training tokens/s") == 2
    summary = json.loads((second / "summary.json").read_text())
    assert summary["shards"] == 3 and "answers" not in summary  # (counted by the data call)
    assert not list(second.glob("data.tar.*"))  # (brought back by the data call)
    for name in ("eagle1", "eagle3"):
        assert summary[name]["steps"] >= 1 and len(summary[name]["log"]) == summary[name]["steps"]
    with tarfile.open(second / "head.tgz") as packed:
        assert {"head/config.json", "head/draft_vocab.json"} <= set(packed.getnames())
    with tarfile.open(second / "head3.tgz") as packed:
        packed.extractall(tmp_path / "head3")
    config = json.loads((tmp_path / "head3" / "head" / "config.json").read_text())
    assert config["architectures"] == ["LlamaForCausalLMEagle3"] and config["draft_vocab_size"] == 64
