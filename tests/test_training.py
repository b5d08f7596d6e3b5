"""The head-training pipeline: clean data, and a loss that goes down."""

from __future__ import annotations

import dataclasses
import json
import os
import random
import re
import shlex
import subprocess
import sys
from pathlib import Path

import pytest
import torch

import eagle_mdsd
from eagle_mdsd import head, jsonl, models, questions, training
from eagle_mdsd.errors import UsageError

from tiny import embedded_tokenizer as _embedded_tokenizer, tiny_target


def test_training_prompts_never_contain_benchmark_questions(tmp_path):
    benchmark = questions.load("spec_bench")
    planted = tmp_path / "planted.jsonl"
    planted.write_text("\n".join(json.dumps({"instruction": text, "response": "x"}) for text in
                                 ["  " + benchmark[0]["turns"][0].upper() + " ", "A harmless new prompt."]))
    prompts = training.load_prompts([planted, training.DEFAULT_PROMPTS])
    banned = training.benchmark_texts()
    assert not any(training._normalise(p["prompt"]) in banned for p in prompts)
    assert any(p["prompt"] == "A harmless new prompt." for p in prompts)
    assert len(prompts) > 10000  # the shipped set was read too


def test_the_default_prompts_ship_inside_the_package_with_their_licences():
    package = Path(eagle_mdsd.__file__).resolve().parent
    assert training.DEFAULT_PROMPTS.is_relative_to(package)
    shipped = sorted(training.DEFAULT_PROMPTS.glob("*.json*"))
    assert shipped and all(path.suffix == ".xz" for path in shipped)
    readme = (training.DEFAULT_PROMPTS / "README.md").read_text()  # each file named with its source and licence
    assert all(path.name in readme for path in shipped)
    licences = re.findall(r"`(LICENSE-[\w-]+)`", readme)
    assert len(licences) == 2 and all((training.DEFAULT_PROMPTS / licence).exists() for licence in licences)


def _tiny_batch():
    """A tiny target (vocabulary 32), a random head over it, and a collated float64 batch of two sequences."""
    target = tiny_target(vocab=32, hidden=32)
    draft_head = head.random_head(target, seed=1)
    torch.manual_seed(0)
    ids = torch.randint(32, (2, 12))
    with torch.no_grad():
        feats = target.get_decoder()(ids).last_hidden_state
    samples = [{"ids": ids[i].int(), "start": 3, "features": feats[i].float()} for i in range(2)]
    batch = [t.double() if t.is_floating_point() else t for t in training._collate(samples, 32)]
    return target, draft_head, batch


def test_a_few_training_steps_lower_the_loss():
    target, draft_head, batch = _tiny_batch()
    draft_head.train()
    optimizer = torch.optim.AdamW(draft_head.parameters(), lr=3e-3, betas=(0.9, 0.95))
    losses = []
    for _ in range(40):
        loss, _ = training.head_loss(draft_head, target.get_input_embeddings(), target.get_output_embeddings(),
                                     *batch, noise=0.0)
        optimizer.zero_grad()
        loss.backward()
        torch.nn.utils.clip_grad_norm_(draft_head.parameters(), 0.5)
        optimizer.step()
        losses.append(loss.item())
    assert losses[-1] < 0.5 * losses[0]


def test_the_token_weight_scales_the_cross_entropy_term():
    target, draft_head, batch = _tiny_batch()
    embed, lm_head = target.get_input_embeddings(), target.get_output_embeddings()
    with torch.no_grad():
        loss = {w: float(training.head_loss(draft_head, embed, lm_head, *batch, noise=0.0, unroll=2,
                                            token_weight=w)[0]) for w in (0.0, 0.1, 1.0)}
    token_term = loss[1.0] - loss[0.0]
    assert token_term > 0.1 and loss[0.0] > 0
    assert loss[0.1] - loss[0.0] == pytest.approx(0.1 * token_term, rel=1e-4)  # EAGLE's default weight


def _token_term(token_loss="ce", rows=None):
    """What head_loss adds for the token term at weight 1 (no noise), with the target's and the head's logits at
    the scored positions (over `rows` only, when given)."""
    target, draft_head, (features, tokens, targets, mask) = _tiny_batch()
    embed, lm_head = target.get_input_embeddings(), target.get_output_embeddings()
    scored = lm_head if rows is None else training.draft_vocab_lm_head(lm_head, rows)
    with torch.no_grad():
        loss = {w: float(training.head_loss(draft_head, embed, scored, features, tokens, targets, mask, noise=0.0,
                                            token_weight=w, token_loss=token_loss)[0]) for w in (0.0, 1.0)}
        predicted = training.unrolled_predictions(draft_head, features, embed(tokens).double())[0]
        return loss[1.0] - loss[0.0], scored(targets[mask]), scored(predicted[mask])


def test_the_draft_vocabulary_loss_is_the_cross_entropy_over_those_tokens():
    term, target_logits, head_logits = _token_term(rows=torch.tensor([1, 4, 5, 9, 17, 30]))
    p = torch.softmax(target_logits, -1)  # the target's distribution over the rows
    assert term == pytest.approx(float(-(p * torch.log_softmax(head_logits, -1)).sum(-1).mean()), rel=1e-6)


def test_the_tv_token_loss_is_one_minus_the_acceptance_rate():
    term, target_logits, head_logits = _token_term("tv")
    accept = torch.minimum(torch.softmax(target_logits, -1), torch.softmax(head_logits, -1)).sum(-1).mean()
    assert term == pytest.approx(float(1 - accept), rel=1e-6)  # sum min(p, q): one sampled draft's acceptance
    with pytest.raises(ValueError, match="unknown token loss 'kl': use ce, tv or top1"):
        _token_term("kl")


def test_the_top1_token_loss_is_the_cross_entropy_of_the_targets_argmax():
    term, target_logits, head_logits = _token_term("top1")
    best = target_logits.argmax(-1)  # the token the target decodes at T = 0
    log_q = torch.log_softmax(head_logits, -1)
    assert term == pytest.approx(-sum(float(log_q[row, token]) for row, token in enumerate(best.tolist()))
                                 / len(best), rel=1e-6)


def test_depth1_scores_count_argmax_hits_and_a_sampled_drafts_acceptance():
    target, draft_head, _ = _tiny_batch()
    target, draft_head = target.double(), draft_head.double()
    torch.manual_seed(2)
    ids = torch.randint(32, (10,))
    with torch.no_grad():
        features = target.get_decoder()(ids[None]).last_hidden_state[0]
        hits, accepted, count = training.depth1_scores(draft_head, target, {"ids": ids, "start": 4,
                                                                          "features": features})
        inputs, tokens, targets, mask = training._collate([{"ids": ids, "start": 4, "features": features}], 32)
        predicted = training.unrolled_predictions(draft_head, inputs.double(),
                                                  target.get_input_embeddings()(tokens))[0][mask]
        lm_head = target.get_output_embeddings()
        p, q = torch.softmax(lm_head(targets[mask].double()), -1), torch.softmax(lm_head(predicted), -1)
    assert count == 6 == len(p)  # answer positions: inputs 3..8, predicting tokens 5..9's successors
    assert hits == int((q.argmax(-1) == p.argmax(-1)).sum())
    assert accepted == pytest.approx(float(6 - 0.5 * (p - q).abs().sum()), rel=1e-6)  # sum of 1 - TV(p, q)


    class Oracle(torch.nn.Module):  # predicts the target's next features exactly
        def __init__(self):
            super().__init__()
            self.scale = torch.nn.Parameter(torch.ones((), dtype=torch.float64))

        def forward(self, inputs, embedded, positions, attention, cache):
            return features[1:][None] * self.scale  # inputs are features 0..8, targets 1..9

    assert training.depth1_scores(Oracle(), target, {"ids": ids, "start": 4, "features": features})[:2] == \
        (6, pytest.approx(6.0))


def test_train_head_takes_a_draft_vocabulary_size_or_full(capsys):
    from eagle_mdsd import cli

    parse = cli.build_parser().parse_args
    assert parse(["train-head", "train", "--draft-vocab", "8192"]).draft_vocab == 8192
    assert parse(["train-head", "train", "--draft-vocab", "full"]).draft_vocab is None
    assert parse(["train-head", "train"]).draft_vocab is None  # the default: as heads 1-7 were trained
    with pytest.raises(SystemExit):
        parse(["train-head", "train", "--draft-vocab", "auto"])
    assert "expected a number of tokens or 'full', got 'auto'" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        parse(["train-head", "train", "--draft-vocab", "many"])
    assert "expected a number of tokens or 'full', got 'many'" in capsys.readouterr().err


def test_train_head_passes_the_token_loss_to_training(monkeypatch, tmp_path):
    from eagle_mdsd import cli

    seen = {}
    monkeypatch.setattr(training, "train",
                        lambda run, recipe, *args, **options: seen.update(recipe=recipe) or {"log": []})
    for argv, expected in ((["--token-loss", "tv"], "tv"), (["--token-loss", "top1"], "top1"), ([], "ce")):
        args = cli.build_parser().parse_args(["train-head", "train", "--run", str(tmp_path)] + argv)
        args.fn(args)
        assert seen["recipe"].token_loss == expected


def test_the_train_stage_exports_in_the_same_process_when_asked(monkeypatch, tmp_path):
    from eagle_mdsd import cli

    exported = []
    monkeypatch.setattr(training, "train", lambda *args, **options: {"log": []})
    monkeypatch.setattr(training, "export", lambda run, to, base, compact: exported.append((run, to, compact)) or to)
    assert cli.main(["train-head", "train", "--run", str(tmp_path)]) == 0 and exported == []
    assert cli.main(["train-head", "train", "--run", str(tmp_path), "--export"]) == 0
    assert exported == [(tmp_path, tmp_path / "head", True)]  # where and as the export stage writes by default


def test_train_head_refuses_options_its_stage_does_not_read(monkeypatch, tmp_path, capsys):
    from eagle_mdsd import cli

    run = ["--run", str(tmp_path)]
    for stage in ("self_prompts", "make_data", "train", "export"):
        monkeypatch.setattr(training, stage, lambda *args, **kwargs: pytest.fail("a stage ran"))
    for argv, message in ((["data", "--epochs", "3"], "unrecognized arguments: --epochs 3"),
                          (["prompts", "--unroll", "2", "--temperature", "1"],
                           "unrecognized arguments: --unroll 2 --temperature 1"),
                          (["export", "--seed", "3"], "unrecognized arguments: --seed 3"),
                          (["all", "--openers", "x"], "unrecognized arguments: --openers x")):
        with pytest.raises(SystemExit) as stop:  # each stage's parser has only the options it reads
            cli.main(["train-head", *argv, *run])
        assert stop.value.code == 2 and message in capsys.readouterr().err
    seen = {}
    monkeypatch.setattr(training, "make_data", lambda run, prompts, recipe, *args: seen.update(recipe=recipe) or [])
    assert cli.main(["train-head", "data", "--seed", "7", "--max-prompts", "16", *run]) == 0
    assert seen["recipe"].seed == 7 and seen["recipe"].max_prompts == 16  # --seed chose nothing here before
    assert not seen["recipe"].sort_by_length
    assert cli.main(["train-head", "data", "--sort-by-length", *run]) == 0 and seen["recipe"].sort_by_length
    with pytest.raises(SystemExit):
        cli.main(["train-head", "train", "--sort-by-length", *run])
    assert "unrecognized arguments: --sort-by-length" in capsys.readouterr().err


def test_missing_prompt_file_is_a_clear_error(tmp_path):
    with pytest.raises(FileNotFoundError, match="does not exist"):
        training.load_prompts([tmp_path / "nope.json"])


def test_a_prompt_file_that_is_not_json_is_a_one_line_error_naming_it(tmp_path):
    (tmp_path / "cut.jsonl").write_text('{"prompt": "Name a colour."}\n\n{"prompt": "cut\n')
    with pytest.raises(ValueError, match="prompt file .*cut.jsonl, line 3 is not JSON"):
        training.load_prompts([tmp_path / "cut.jsonl"])
    (tmp_path / "cut.json").write_text('[{"prompt": "Name a colour."},\n {"prompt"')
    with pytest.raises(ValueError, match="prompt file .*cut.json is not JSON .* at line 2"):
        training.load_prompts([tmp_path / "cut.json"])
    (tmp_path / "cut.json").write_text('"just a text"')  # JSON, but no records in it
    with pytest.raises(ValueError, match="no usable prompts"):
        training.load_prompts([tmp_path / "cut.json"])


def test_a_prompt_field_that_is_not_text_is_a_one_line_error_naming_the_file_and_line(tmp_path, capsys):
    from eagle_mdsd import cli

    numbers = tmp_path / "numbers.jsonl"
    numbers.write_text('{"instruction": "Name a colour."}\n\n{"instruction": 42}\n')
    with pytest.raises(UsageError, match=r"prompt file .*numbers.jsonl, line 3: 'instruction' is 42, not text"):
        training.load_prompts([numbers])
    assert cli.main(["train-head", "data", "--run", str(tmp_path / "run"), "--prompts", str(numbers)]) == 2
    error = capsys.readouterr().err
    assert f"{numbers}, line 3: 'instruction' is 42" in error and error.count("\n") == 1
    listed = tmp_path / "listed.json"
    for record, field in (({"prompt": "Name a colour.", "response": 7.5}, "'response' is 7.5"),
                          ({"instruction": "Name a colour.", "instances": [{"input": [1, 2]}]}, "'input' is [1, 2]"),
                          ({"messages": [{"role": "user", "content": 3}]}, "text contents")):
        listed.write_text(json.dumps([{"prompt": "Name a tree."}, record]))
        with pytest.raises(UsageError, match=rf"prompt file .*listed.json, record 2: .*{re.escape(field)}"):
            training.load_prompts([listed])


def test_compressed_prompt_files_read_as_their_contents(tmp_path):
    import gzip
    import lzma

    records = [{"prompt": f"Name {n} colours."} for n in range(3)]
    plain = tmp_path / "plain"
    plain.mkdir()
    (plain / "colours.jsonl").write_text("".join(json.dumps(r) + "\n" for r in records))
    packed = tmp_path / "packed"
    packed.mkdir()
    (packed / "colours.jsonl.gz").write_bytes(gzip.compress((plain / "colours.jsonl").read_bytes()))
    (packed / "more.json.xz").write_bytes(lzma.compress(json.dumps([{"prompt": "Name a tree."}]).encode()))
    assert training.load_prompts([packed]) == training.load_prompts([plain]) + [{"prompt": "Name a tree.",
                                                                                 "reference": ""}]


def test_exporting_a_run_that_has_not_trained_is_a_clear_error(tmp_path):
    with pytest.raises(FileNotFoundError, match="no checkpoint.pt in .*: run `eagle-mdsd train-head train --run"):
        training.export(tmp_path / "untrained", tmp_path / "head")
    assert not (tmp_path / "head").exists()


def test_conversation_prompts_load_as_their_turns_and_benchmark_turns_are_dropped(tmp_path):
    question = questions.load("mt_bench")[0]["turns"][1]
    turns = [{"role": "user", "content": "Name a colour."}, {"role": "assistant", "content": "Blue."}]
    file = tmp_path / "conversations.jsonl"
    file.write_text("".join(json.dumps(r) + "\n" for r in [
        {"messages": turns + [{"role": "user", "content": "Say it again, in capitals."}]},
        {"messages": turns + [{"role": "user", "content": question}]},  # a benchmark turn: dropped
        {"messages": turns + [{"role": "user", "content": "Say it again, in capitals."}]},  # a duplicate
        {"prompt": "Name a colour."}]))
    prompts = [p["prompt"] for p in training.load_prompts([file])]
    assert prompts == [turns + [{"role": "user", "content": "Say it again, in capitals."}], "Name a colour."]
    file.write_text(json.dumps({"messages": turns}) + "\n")
    with pytest.raises(ValueError, match="end with a user turn"):
        training.load_prompts([file])


def _train(run, model, save_every=100, **recipe):
    return training.train(run, training.TrainRecipe(**recipe), model, save_every=save_every)


def _make_data(run, prompts, model, **recipe):
    return training.make_data(run, prompts, training.DataRecipe(**recipe), model, "float32")


def _tiny_run(folder, tokenizer, seed=0):
    """A run folder with a tiny Llama (the embedded tokenizer) and one data shard of 6 samples."""
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(seed)
    config = LlamaConfig(vocab_size=len(tokenizer), hidden_size=16, intermediate_size=32, num_hidden_layers=1,
                         num_attention_heads=2, num_key_value_heads=1, max_position_embeddings=128)
    model = LlamaForCausalLM(config).eval()
    model.save_pretrained(folder / "model")
    tokenizer.save_pretrained(folder / "model")
    samples = []
    for length in (20, 24, 28, 18, 30, 22):
        ids = torch.randint(len(tokenizer), (length,), dtype=torch.int32)
        with torch.no_grad():
            features = model.get_decoder()(ids[None].long()).last_hidden_state[0]
        samples.append({"ids": ids, "start": 5, "features": features.to(torch.bfloat16)})
    (folder / "data").mkdir(parents=True)
    torch.save(samples, folder / "data" / "shard_00000.pt")
    return str(folder / "model")


def test_the_data_stage_samples_at_a_temperature_and_a_rerun_repeats_the_samples(tmp_path):
    model = _tiny_run(tmp_path / "tiny", _embedded_tokenizer())
    prompts = tmp_path / "prompts.jsonl"
    prompts.write_text("".join(json.dumps({"prompt": f"Name a colour, number {i}."}) + "\n" for i in range(3)))

    def answers(run, temperature):
        shards = _make_data(tmp_path / run, [prompts], model, max_new_tokens=6, batch_size=2, shard_size=2,
                            temperature=temperature)
        return [sample["ids"].tolist() for shard in shards for sample in torch.load(shard)]

    sampled = answers("sampled", 1.0)
    assert len(sampled) == 3 and sampled != answers("greedy", 0.0)
    (tmp_path / "sampled" / "data" / "shard_00001.pt").unlink()  # an interrupted run: its rerun samples alike
    assert answers("sampled", 1.0) == sampled
    with pytest.raises(ValueError, match="temperature 1.0"):
        answers("sampled", 0.5)
    for changed, message in ((dict(seed=1), "--seed 0: pass that --seed"), (dict(shard_size=3), "--shard-size 2")):
        with pytest.raises(ValueError, match=message):  # the finished shards hold another shuffle or split
            _make_data(tmp_path / "sampled", [prompts], model, **(dict(max_new_tokens=6, batch_size=2, shard_size=2,
                                                                     temperature=1.0) | changed))


def test_the_data_stage_sorts_a_shards_prompts_by_length_only_when_asked(tmp_path, monkeypatch):
    tokenizer = _embedded_tokenizer()
    model = _tiny_run(tmp_path / "tiny", tokenizer)
    prompts = tmp_path / "prompts.jsonl"
    words = [9, 2, 14, 5, 1, 11, 7]  # a prompt of n extra words is longer than one of fewer
    prompts.write_text("".join(json.dumps({"prompt": "Say " + "more " * n + "now."}) + "\n" for n in words))
    batches = []
    generate = training._generate
    monkeypatch.setattr(training.data, "_generate", lambda target, ids, *args, **kwargs: batches.append(
        [len(prompt) for prompt in ids]) or generate(target, ids, *args, **kwargs))

    def shards(run, **recipe):
        batches.clear()
        made = _make_data(tmp_path / run, [prompts], model, max_new_tokens=3, batch_size=2, shard_size=4, **recipe)
        return [[sample["ids"][: sample["start"]].tolist() for sample in torch.load(shard)] for shard in made]

    plain = shards("plain")
    plain_batches = list(batches)
    ordered = shards("sorted", sort_by_length=True)
    assert [len(batch) for batch in batches] == [2, 2, 2, 1]  # shards of 4 and 3 prompts, batches of 2
    for first, second in ((0, 1), (2, 3)):  # within a shard, shortest first
        lengths = batches[first] + batches[second]
        assert lengths == sorted(lengths)
    assert batches != plain_batches  # the shuffled order is not already sorted
    assert [sorted(shard) for shard in ordered] == [sorted(shard) for shard in plain]  # the same prompts per shard
    assert [[len(prompt) for prompt in shard] for shard in ordered] == [sorted(map(len, shard)) for shard in ordered]
    with pytest.raises(ValueError, match="made without --sort-by-length: leave out --sort-by-length"):
        shards("plain", sort_by_length=True)
    with pytest.raises(ValueError, match="made with --sort-by-length: pass --sort-by-length"):
        shards("sorted")
    record = tmp_path / "plain" / "data" / "prompts.json"  # a record without the option: made without it
    record.write_text(json.dumps({key: value for key, value in json.loads(record.read_text()).items()
                                  if key != "sort_by_length"}))
    assert shards("plain") == plain


def test_the_data_stage_answers_a_conversation_after_its_last_user_turn(tmp_path):
    tokenizer = _embedded_tokenizer()
    model = _tiny_run(tmp_path / "tiny", tokenizer)
    turns = [{"role": "user", "content": "Name a colour."}, {"role": "assistant", "content": "Blue."},
             {"role": "user", "content": "Again, please."}]
    prompts = tmp_path / "prompts.jsonl"
    prompts.write_text(json.dumps({"messages": turns}) + "\n")
    shards = _make_data(tmp_path / "run", [prompts], model, max_new_tokens=4, batch_size=1)
    sample = torch.load(shards[0])[0]
    prompt = models.chat_prompt_ids(tokenizer, turns)
    assert sample["ids"][: sample["start"]].tolist() == prompt and sample["start"] == len(prompt)
    text = tokenizer.decode(prompt)
    assert text.index("Name a colour.") < text.index("Blue.") < text.index("Again, please.")


def test_data_kept_as_token_ids_alone_trains_as_data_with_its_features(tmp_path):
    tokenizer = _embedded_tokenizer()
    model = _tiny_run(tmp_path / "tiny", tokenizer)
    prompts = tmp_path / "prompts.jsonl"
    prompts.write_text("".join(json.dumps({"prompt": f"Name {n} colours."}) + "\n" for n in range(5)))
    recipe = dict(max_new_tokens=8, batch_size=2, shard_size=4)
    stored = _make_data(tmp_path / "stored", [prompts], model, **recipe)
    bare = _make_data(tmp_path / "bare", [prompts], model, features=False, **recipe)
    samples = [[s for shard in shards for s in torch.load(shard)] for shards in (stored, bare)]
    assert [s["ids"].tolist() for s in samples[0]] == [s["ids"].tolist() for s in samples[1]]
    assert all("features" not in s for s in samples[1]) and all("features" in s for s in samples[0])
    with pytest.raises(ValueError, match="made with --no-features: pass --no-features"):
        _make_data(tmp_path / "bare", [prompts], model, **recipe)
    settings = dict(epochs=2, lr=1e-2, tokens_per_batch=40, bf16=False)
    logs = [_train(tmp_path / run, model, **settings)["log"] for run in ("stored", "bare")]
    assert len(logs[0]) == len(logs[1]) >= 4
    for with_features, computed in zip(*logs):  # the same features up to bf16 rounding of a padded batch
        assert computed["loss"] == pytest.approx(with_features["loss"], rel=1e-3)


def test_an_interrupted_training_run_resumes_to_the_same_head(tmp_path, monkeypatch):
    tokenizer = _embedded_tokenizer()
    settings = dict(epochs=3, lr=1e-2, tokens_per_batch=48, save_every=1, bf16=False)
    whole, parts = tmp_path / "whole", tmp_path / "parts"
    state = _train(whole, _tiny_run(whole, tokenizer), **settings)
    steps = state["step"]
    assert steps >= 6 and state["log"][-1]["loss"] < state["log"][0]["loss"]

    model = _tiny_run(parts, tokenizer)
    real_loss, calls = training.head_loss, []

    def interrupted(*args, **kwargs):
        calls.append(1)
        if len(calls) == steps // 2 + 1:
            raise KeyboardInterrupt
        return real_loss(*args, **kwargs)

    monkeypatch.setattr(training.trainer, "head_loss", interrupted)
    with pytest.raises(KeyboardInterrupt):
        _train(parts, model, **settings)
    monkeypatch.setattr(training.trainer, "head_loss", real_loss)
    assert torch.load(parts / "checkpoint.pt", weights_only=False)["state"]["step"] == steps // 2
    with pytest.raises(ValueError, match="seed 0, not 1"):
        _train(parts, model, seed=1, **settings)
    resumed = _train(parts, model, **settings)
    assert resumed["step"] == steps and resumed["log"] == state["log"]
    heads = [torch.load(folder / "checkpoint.pt", weights_only=False)["head"] for folder in (whole, parts)]
    assert all(torch.equal(heads[0][key], heads[1][key]) for key in heads[0])


def test_the_learning_rate_warms_up_then_decays_on_a_cosine_to_zero():
    peak, warm = 1e-3, training.trainer.WARMUP_STEPS
    warming = [training.learning_rate(peak, step, 0.0) for step in range(warm)]
    assert warming[0] == pytest.approx(peak / warm) and warming[-1] == pytest.approx(peak)
    assert all(a < b for a, b in zip(warming, warming[1:]))
    decay = [training.learning_rate(peak, 10 * warm, along / 10) for along in range(11)]
    assert decay[0] == pytest.approx(peak) and decay[5] == pytest.approx(peak / 2) and decay[10] == pytest.approx(0)
    assert all(a > b for a, b in zip(decay, decay[1:]))
    assert training.learning_rate(peak, 10 * warm, 1.5) == pytest.approx(0)  # past the end it stays at 0


def test_the_schedule_position_is_the_steps_or_the_minutes_whichever_is_further():
    assert training.schedule_position(25, 100) == 0.25
    assert training.schedule_position(25, 100, scheduled_s=600.0) == 0.25  # without minutes, time does not count
    assert training.schedule_position(25, 100, scheduled_s=30.0, schedule_minutes=1.0) == 0.5
    assert training.schedule_position(75, 100, scheduled_s=30.0, schedule_minutes=1.0) == 0.75


def test_a_checkpoint_resumes_only_with_the_options_it_was_trained_with(tmp_path):
    checkpoint = tmp_path / "checkpoint.pt"
    recipe = training.TrainRecipe(unroll=2, draft_vocab=64, data_from=("a", "b"))
    state = recipe.saved() | {"step": 3, "log": []}
    training.check_resumable(checkpoint, state, dataclasses.replace(recipe, lr=1.0, epochs=3))  # not recorded
    for changed, message in ((dict(unroll=1), "--unroll 2, not 1"), (dict(data_from=()), "--data-from a b, not (none)"),
                             (dict(draft_vocab=None), "--draft-vocab 64, not full"),
                             (dict(tokens_per_batch=24), "--tokens-per-batch 4096, not 24")):  # batches counted
        with pytest.raises(UsageError, match=rf"{checkpoint} was trained with {re.escape(message)}: pass the same"):
            training.check_resumable(checkpoint, state, dataclasses.replace(recipe, **changed))
    recorded_nothing = {"step": 3, "log": []}  # the defaults are what such a checkpoint was trained with
    training.check_resumable(checkpoint, recorded_nothing, training.TrainRecipe())
    training.check_resumable(checkpoint, recorded_nothing, training.TrainRecipe(tokens_per_batch=24))  # unknown
    with pytest.raises(UsageError, match="--seed 0, not 1"):
        training.check_resumable(checkpoint, recorded_nothing, training.TrainRecipe(seed=1))


def _talkative(folder, tokenizer, monkeypatch):
    """The tiny run's model with its logits pushed towards a handful of words and the end of turn, so that
    it writes short messages; models.load_target answers with it."""
    model = models.load_target(_tiny_run(folder, tokenizer))[0]
    bias = torch.zeros(len(tokenizer))
    words = [tokenizer.encode(w, add_special_tokens=False)[0] for w in (" cats", " dogs", " why", " how", " fly")]
    bias[words] = 12.0
    bias[models.eos_token_ids(model, tokenizer)] = 12.0
    model.lm_head.register_forward_hook(lambda module, inputs, output: output + bias)
    monkeypatch.setattr(models, "load_target", lambda *args, **kwargs: (model, tokenizer))


def test_self_written_prompts_are_as_many_as_asked_resume_and_skip_benchmark_questions(tmp_path, monkeypatch):
    tokenizer = _embedded_tokenizer()
    _talkative(tmp_path / "model", tokenizer, monkeypatch)
    whole = training.self_prompts(tmp_path / "whole", 41, batch_size=8, max_tokens=12)
    records = [json.loads(line) for line in whole.read_text().splitlines()]
    texts = [training._normalise(r["prompt"]) for r in records]
    assert len(records) == 41 and len(set(texts)) == len(texts)  # as many as asked, whatever a batch keeps
    assert all(len(t.split()) >= 3 for t in texts) and not set(texts) & training.benchmark_texts()
    assert [r["prompt"] for r in training.load_prompts([whole])] == [r["prompt"] for r in records]

    # asked for fewer, then for all: the file of one call that asked for all
    fewer = tmp_path / "fewer"
    assert len(jsonl.records(training.self_prompts(fewer, 13, batch_size=8, max_tokens=12))) == 13
    assert training.self_prompts(fewer, 41, batch_size=8, max_tokens=12).read_text() == whole.read_text()

    # stopped after two batches with half a line written: the rerun drops the half line and continues alike
    part = tmp_path / "part" / "self_prompts.jsonl"
    part.parent.mkdir()
    first_two = [line for line in whole.read_text().splitlines(keepends=True) if json.loads(line)["batch"] < 2]
    part.write_text("".join(first_two) + first_two[-1][:15])
    assert training.self_prompts(part.parent, 41, batch_size=8, max_tokens=12).read_text() == whole.read_text()

    # a benchmark question the model happens to write is dropped
    planted = questions.load("spec_bench")[0]["turns"][0]
    monkeypatch.setattr(models, "load_target", lambda *a, **k: (_Parrot(tokenizer, planted), tokenizer))
    with pytest.raises(ValueError, match="cannot write its own prompts"):
        training.self_prompts(tmp_path / "parrot", 5, batch_size=2, max_tokens=400)
    assert not (tmp_path / "parrot" / "self_prompts.jsonl").read_text()


def test_self_written_prompts_start_with_their_batch_opener(tmp_path, monkeypatch):
    tokenizer = _embedded_tokenizer()
    _talkative(tmp_path / "model", tokenizer, monkeypatch)
    openers = ["Write a poem about", "Explain"]
    path = training.self_prompts(tmp_path / "steered", 30, batch_size=8, max_tokens=12, openers=openers)
    records = [json.loads(line) for line in path.read_text().splitlines()]
    assert len(records) == 30 and {r["batch"] % 2 for r in records} == {0, 1}
    for record in records:
        opener = openers[record["batch"] % 2]
        assert record["prompt"].startswith(opener)
        assert len(record["prompt"][len(opener):].split()) >= 3  # three words of the target's own


def test_train_head_prompts_reads_an_openers_file(monkeypatch, tmp_path):
    from eagle_mdsd import cli

    seen = {}
    monkeypatch.setattr(training, "self_prompts",
                        lambda *args, **kwargs: seen.update(kwargs) or tmp_path / "none.jsonl")
    monkeypatch.setattr(training, "load_prompts", lambda paths: [])
    (tmp_path / "openers.txt").write_text("Write a\n\n  Solve  \n")
    parse = cli.build_parser().parse_args
    for argv, expected in ((["--openers", str(tmp_path / "openers.txt")], ["Write a", "Solve"]), ([], None)):
        args = parse(["train-head", "prompts", "--run", str(tmp_path)] + argv)
        args.fn(args)
        assert seen["openers"] == expected
    # a missing or empty file: test_tree_and_head.py::test_a_missing_or_empty_openers_file_is_the_usual_one_line_error


class _Parrot:
    """A stand-in target whose every message is the same text."""

    device, dtype = torch.device("cpu"), torch.float32

    def __init__(self, tokenizer, text):
        from transformers import LlamaConfig

        self.config = LlamaConfig(hidden_size=8, num_hidden_layers=1, num_attention_heads=1)  # (the memory check's)
        self.message = tokenizer.encode(text, add_special_tokens=False) + [tokenizer.eos_token_id]
        self.generation_config = type("Config", (), {"eos_token_id": tokenizer.eos_token_id})()

    def generate(self, prefix, **kwargs):
        return torch.cat([prefix, torch.tensor([self.message] * len(prefix))], 1)


def test_training_on_the_data_of_other_runs(tmp_path):
    tokenizer = _embedded_tokenizer()
    settings = dict(epochs=1, lr=1e-2, tokens_per_batch=48, bf16=False)
    model = _tiny_run(tmp_path / "own", tokenizer)
    _tiny_run(tmp_path / "other", tokenizer, seed=1)
    alone = _train(tmp_path / "alone", model, data_from=[tmp_path / "own"], **settings)
    both = _train(tmp_path / "own", model, data_from=[tmp_path / "other"], **settings)
    assert both["step"] == 2 * alone["step"] and both["data_from"] == [str(tmp_path / "other")]
    with pytest.raises(ValueError, match="--data-from"):
        _train(tmp_path / "own", model, **settings)
    with pytest.raises(FileNotFoundError, match="no data shards"):
        _train(tmp_path / "fresh", model, data_from=[tmp_path / "nothing"], **settings)


def test_evaluation_takes_held_out_prompts_from_the_runs_trained_on(tmp_path):
    (tmp_path / "other" / "data").mkdir(parents=True)
    (tmp_path / "other" / "data" / "prompts.json").write_text("{}")
    (tmp_path / "mixed").mkdir()
    torch.save({"state": {"data_from": [str(tmp_path / "other")]}}, tmp_path / "mixed" / "checkpoint.pt")
    assert training._prompt_data(tmp_path / "mixed") == tmp_path / "other" / "data"
    assert training._prompt_data(tmp_path / "other") == tmp_path / "other" / "data"
    with pytest.raises(FileNotFoundError, match="no data stage"):
        training._prompt_data(tmp_path / "empty")


def test_held_out_prompts_are_those_the_data_stage_left(tmp_path):
    data = tmp_path / "data"
    data.mkdir()
    texts = [f"Tell me fact number {i} about owls." for i in range(5)]
    (tmp_path / "prompts.jsonl").write_text("".join(json.dumps({"prompt": t}) + "\n" for t in texts))
    (data / "prompts.json").write_text(json.dumps({"sources": [str(tmp_path / "prompts.jsonl")], "seed": 3,
                                                   "shard_size": 2}))
    for shard in range(2):
        (data / f"shard_{shard:05d}.pt").write_bytes(b"")
    shuffled = list(texts)
    random.Random(3).shuffle(shuffled)
    assert training.held_out_prompts(data, 16) == shuffled[4:]
    (data / "shard_00002.pt").write_bytes(b"")  # the last prompt answered too: nothing is held out
    assert training.held_out_prompts(data, 16) == []


def test_unrolled_passes_see_what_the_decoders_head_sees():
    """Pass r at position i equals the head run causally over the true pairs up to i - r + 1 followed by the
    path of its own predictions: the drafting at depth r - 1 that the multi-step loss trains for."""
    target = tiny_target(vocab=32, hidden=32)
    draft_head = head.random_head(target, seed=2).double()
    torch.manual_seed(0)
    features, tokens = torch.randn(1, 9, 32, dtype=torch.float64), torch.randint(32, (1, 9))
    embedded = target.get_input_embeddings()(tokens)
    passes = training.unrolled_predictions(draft_head, features, embedded, unroll=3)

    def causal_last(inputs, length):
        visible = torch.ones(length, length, dtype=torch.bool).tril()
        attention = torch.zeros(length, length, dtype=torch.float64).masked_fill_(~visible, -1e30)[None, None]
        return draft_head(inputs[None], embedded[:, :length], torch.arange(1, length + 1)[None], attention,
                          None)[0, -1]

    for i in range(1, 9):
        depth1 = causal_last(torch.cat([features[0, :i], passes[0][0, i - 1 : i]]), i + 1)
        torch.testing.assert_close(passes[1][0, i], depth1)
        if i >= 2:
            parent = causal_last(torch.cat([features[0, : i - 1], passes[0][0, i - 2 : i - 1]]), i)
            depth2 = causal_last(torch.cat([features[0, : i - 1], passes[0][0, i - 2 : i - 1], parent[None]]),
                                 i + 1)
            torch.testing.assert_close(passes[2][0, i], depth2)
    assert not torch.allclose(passes[1][0, 1:], passes[0][0, 1:])  # the passes do differ


def test_multi_step_training_from_a_trained_head(tmp_path):
    tokenizer = _embedded_tokenizer()
    settings = dict(epochs=1, tokens_per_batch=48, bf16=False)
    model = _tiny_run(tmp_path / "own", tokenizer)
    trained = _train(tmp_path / "first", model, data_from=[tmp_path / "own"], lr=1e-2, **settings)
    # lr 0: the warm-started head is exactly the one it started from, also through the 2-step loss
    unchanged = _train(tmp_path / "same", model, data_from=[tmp_path / "own"], lr=0.0, unroll=2,
                               init_from=tmp_path / "first", **settings)
    assert unchanged["step"] == trained["step"] and unchanged["unroll"] == 2
    heads = [torch.load(tmp_path / run / "checkpoint.pt", weights_only=False)["head"] for run in ("first", "same")]
    assert all(torch.equal(heads[0][key], heads[1][key]) for key in heads[0])
    tuned = _train(tmp_path / "tuned", model, data_from=[tmp_path / "own"], lr=1e-2, epochs=3, unroll=3,
                           init_from=tmp_path / "first", tokens_per_batch=48, bf16=False)
    assert tuned["log"][-1]["loss"] < tuned["log"][0]["loss"]
    with pytest.raises(ValueError, match="--unroll 3, not 2"):
        _train(tmp_path / "tuned", model, data_from=[tmp_path / "own"], unroll=2,
                       init_from=tmp_path / "first", **settings)
    with pytest.raises(ValueError, match="--token-weight 0.1, not 1.0"):
        _train(tmp_path / "tuned", model, data_from=[tmp_path / "own"], unroll=3, token_weight=1.0,
                       init_from=tmp_path / "first", **settings)
    vocab = _train(tmp_path / "vocab", model, data_from=[tmp_path / "own"], lr=1e-2, epochs=3,
                           draft_vocab=40, init_from=tmp_path / "first", tokens_per_batch=48, bf16=False)
    assert vocab["draft_vocab"] == 40 and vocab["log"][-1]["loss"] < vocab["log"][0]["loss"]
    with pytest.raises(ValueError, match="--draft-vocab 40, not full"):
        _train(tmp_path / "vocab", model, data_from=[tmp_path / "own"], init_from=tmp_path / "first",
                       **settings)
    by_loss = {loss: _train(tmp_path / loss, model, data_from=[tmp_path / "own"], lr=1e-2, epochs=3,
                                    token_loss=loss, token_weight=2.0, init_from=tmp_path / "first",
                                    tokens_per_batch=48, bf16=False) for loss in ("ce", "tv", "top1")}
    for loss in ("tv", "top1"):
        losses = [record["loss"] for record in by_loss[loss]["log"]]
        assert by_loss[loss]["token_loss"] == loss and losses[-1] < losses[0]
        assert losses != [record["loss"] for record in by_loss["ce"]["log"]]
    with pytest.raises(ValueError, match="--token-loss tv, not ce"):
        _train(tmp_path / "tv", model, data_from=[tmp_path / "own"], token_weight=2.0,
                       init_from=tmp_path / "first", **settings)
    with pytest.raises(ValueError, match="--token-loss is 'kl'"):
        _train(tmp_path / "kl", model, data_from=[tmp_path / "own"], token_loss="kl", **settings)
    with pytest.raises(ValueError, match="--draft-vocab is 0"):
        _train(tmp_path / "zero", model, data_from=[tmp_path / "own"], draft_vocab=0, **settings)
    with pytest.raises(FileNotFoundError, match="--init-from"):
        _train(tmp_path / "other", model, data_from=[tmp_path / "own"], init_from=tmp_path / "nothing",
                       **settings)


@pytest.mark.parametrize("stage, option, value, message", [
    ("train", "--lr", "-1", "must be a number above 0, got -1"),  # trained with the gradient's sign flipped
    ("train", "--epochs", "0", "must be a number above 0, got 0"),
    ("train", "--max-minutes", "nan", "must be a number above 0, got nan"),
    ("train", "--tokens-per-batch", "0", "must be at least 1, got 0"),
    ("data", "--batch-size", "0", "must be at least 1, got 0"),
    ("prompts", "--batch-size", "0", "must be at least 1, got 0"),
    ("data", "--shard-size", "0", "must be at least 1, got 0"),
    ("prompts", "--count", "0", "must be at least 1, got 0"),
    ("data", "--max-prompts", "0", "must be at least 1, got 0"),
])
def test_train_head_numbers_out_of_range_are_refused_by_the_parser(stage, option, value, message, capsys):
    from eagle_mdsd import cli

    with pytest.raises(SystemExit):
        cli.build_parser().parse_args(["train-head", stage, option, value])
    assert f"argument {option}: {message}" in capsys.readouterr().err
    assert cli.build_parser().parse_args(["train-head", stage, option, "3"])  # a number in range is taken


def _options(words: list[str]) -> dict[str, list[str]]:
    """A command line's words after the subcommand as {option: its values} ("" keys the positional words)."""
    options, key = {"": []}, ""
    for word in words:
        if word.startswith("--"):
            key = word
            options[key] = []
        else:
            options[key].append(word)
    return options


@pytest.mark.parametrize("rerun_answers, rerun_top1, swapped, verdict", [
    ("head_reproduction/repro_tv-eagle_default-t0.jsonl", 0.530, True,
     "tau 2.66 against 2.74, teacher-forced MT-Bench top-1 0.530 against 0.559: outside"),
    ("head_reproduction_2026-11-26/lengthened-eagle_default-t0.jsonl", 0.538, False,  # tau within, top-1 not
     "tau 2.70 against 2.74, teacher-forced MT-Bench top-1 0.538 against 0.559: outside"),
    ("head_reproduction_2026-11-26/lengthened2-eagle_default-t0.jsonl", 0.551, False,  # both within
     "tau 2.71 against 2.74, teacher-forced MT-Bench top-1 0.551 against 0.559: within"),
    ("tv_head/tv-eagle_default-t0.jsonl", 0.559, False,
     "tau 2.74 against 2.74, teacher-forced MT-Bench top-1 0.559 against 0.559: within")])
def test_the_reproduction_script_runs_the_readmes_recipe_and_judges_the_tolerance(tmp_path, rerun_answers,
                                                                                    rerun_top1, swapped, verdict):
    """scripts/reproduce_head.sh runs docs/training.md's recipe commands (option for option; each stage resumes by
    itself) and judges the rerun against the shipped head: here on stored answer files of heads (the shipped
    head's, the recipe's and two lengthened ones'), standing in for the bench runs."""
    root = Path(__file__).resolve().parents[1]
    answers = root / "evaluation" / "answers"
    run = tmp_path / "run"
    fake = tmp_path / "python"
    fake.write_text(f"""#!/bin/bash
[ "$1" = - ] && exec {shlex.quote(sys.executable)} "$@"
printf '%s\\n' "$*" >>{tmp_path}/calls
case "$*" in
  *"evaluate"*"--export-to {run}/finish/head"*) echo '{{"top1_mt_bench": {rerun_top1}}}' ;;
  *"evaluate"*) echo '{{"top1_mt_bench": 0.559}}' ;;
  *"--model-id shipped"*) cp {answers}/tv_head/tv-eagle_default-t0.jsonl "${{@: -1}}" ;;
  *"--model-id rerun"*) cp {answers}/{rerun_answers} "${{@: -1}}" ;;
  *"export"*) mkdir -p {run}/finish/head && cp {tmp_path}/draft_vocab.json {run}/finish/head/ ;;
esac
""")
    fake.chmod(0o755)
    ranking = json.loads((root / "eagle_mdsd/heads/smollm2-135m-instruct/draft_vocab.json").read_text())["token_ids"]
    if swapped:  # the data's two most frequent answer tokens the other way round
        ranking[:2] = ranking[1::-1]
    (tmp_path / "draft_vocab.json").write_text(json.dumps({"token_ids": ranking}))
    env = {**os.environ, "PYTHON": str(tmp_path / "none"), "RUN": str(run)}
    done = subprocess.run(["bash", "scripts/reproduce_head.sh"], cwd=root, env=env, capture_output=True, text=True)
    assert done.returncode == 2  # no set-up yet: one line that says what to run
    assert done.stderr == f"no interpreter at {tmp_path / 'none'}: run bash scripts/setup.sh first (or set PYTHON)\n"
    env["PYTHON"] = str(fake)
    done = subprocess.run(["bash", "scripts/reproduce_head.sh"], cwd=root, env=env, capture_output=True, text=True)
    assert done.returncode == 0, done.stderr
    assert verdict in done.stdout
    assert (("otherwise than in the shipped head's training data (draft_vocab.json), from rank 0 on" if swapped
             else "exactly as in the shipped head's training data") in done.stdout)

    calls = [line.split()[2:] for line in (tmp_path / "calls").read_text().splitlines()]  # after -m eagle_mdsd.cli
    recipe = (root / "docs" / "training.md").read_text().replace("runs/repro", str(run))
    commands = (line.strip().removeprefix(".venv/bin/") for line in recipe.splitlines())
    documented = [line.split()[1:] for line in commands if line.startswith("eagle-mdsd train-head")]
    for seed in range(2, 11):
        for stage in ("prompts", "data"):
            loop = next(words for words in documented if words[1:2] == [stage] and "self$S" in " ".join(words))
            expected = [word.replace("$S", str(seed)) for word in loop]
            assert any(_options(call) == _options(expected) for call in calls), (stage, seed)
    for trained in ("head", "more", "more2", "finish"):
        expected = next(words for words in documented if words[1:4] == ["train", "--run", f"{run}/{trained}"])
        assert any(_options(call) == _options(expected) for call in calls), trained
    assert ["train-head", "export", "--run", f"{run}/finish"] in calls
    assert sum(call[:2] == ["train-head", "evaluate"] for call in calls) == 2


def test_the_data_stage_answers_plainly_and_stops_at_every_eos():
    """Training answers are the target's plain greedy ones, whatever its generation config adds (a hub checkpoint's
    repetition_penalty), and end at the EOS ids the decoder stops at, the tokenizer's among them."""
    from transformers import GenerationConfig

    from eagle_mdsd import engine

    target = tiny_target(vocab=16, layers=1).float()
    prompt = [3, 5, 7]
    plain = engine.Decoder(target).generate(prompt, 10, method="baseline").token_ids
    stop = plain[4]  # a token the plain answer reaches: the answer ends with it
    target.generation_config = GenerationConfig(repetition_penalty=1.5, no_repeat_ngram_size=2, eos_token_id=None)
    answer = training._generate(target, [prompt], 10, pad_id=0, eos=[stop])[0]
    assert answer == plain[: plain.index(stop) + 1]


def test_a_data_stage_refuses_to_continue_on_a_prompt_list_that_changed(tmp_path):
    """Finished shards hold the first prompts of one shuffle; a list that grew since (more self-written prompts)
    shuffles otherwise, and continuing would answer some prompts twice and skip others."""
    prompts = [{"prompt": f"Write about topic {i}."} for i in range(8)]
    recipe = training.DataRecipe(shard_size=4)
    data = tmp_path / "data"
    first = training.data._recorded_prompts(data, list(prompts), ["p.jsonl"], recipe, "float32")
    assert training.data._recorded_prompts(data, list(prompts), ["p.jsonl"], recipe, "float32") == first
    grown = prompts + [{"prompt": f"Write about topic {i}."} for i in range(8, 16)]
    with pytest.raises(UsageError, match=r"answers the 8 prompts its sources held when it began, and they now hold 16"):
        training.data._recorded_prompts(data, grown, ["p.jsonl"], recipe, "float32")


def test_a_damaged_compressed_prompt_file_is_a_one_line_error_naming_it(tmp_path):
    import lzma

    whole = lzma.compress(json.dumps([{"prompt": "Name a tree."}]).encode())
    for name, data in (("garbage.json.xz", b"not xz at all"), ("garbage.jsonl.gz", b"not gzip at all"),
                       ("cut.json.xz", whole[: len(whole) // 2])):
        (tmp_path / name).write_bytes(data)
        with pytest.raises(UsageError, match=rf"prompt file .*{re.escape(name)} cannot be decompressed as "
                                             rf"\.(xz|gz) \(.+\): give the file whole"):
            training.load_prompts([tmp_path / name])
    (tmp_path / "data.json").write_text('{"data": 5}')  # JSON, with no list of records where the records go
    with pytest.raises(UsageError, match="no usable prompts"):
        training.load_prompts([tmp_path / "data.json"])


def test_a_damaged_data_record_is_a_one_line_error_naming_it(tmp_path):
    """prompts.json says how a run's shards were made; it is written whole, and one that is not a JSON object
    (an empty file, a list) is a one-line error."""
    prompts = [{"prompt": f"Write about topic {i}."} for i in range(4)]
    data = tmp_path / "data"
    training.data._recorded_prompts(data, list(prompts), ["p.jsonl"], training.DataRecipe(), "float32")
    assert isinstance(json.loads((data / "prompts.json").read_text()), dict)
    for text, fault in (("", "is not valid JSON"), ("[1]", "holds a JSON list, not an object")):
        (data / "prompts.json").write_text(text)
        with pytest.raises(UsageError, match=rf"data record {re.escape(str(data / 'prompts.json'))} {fault}"):
            training.data._recorded_prompts(data, list(prompts), ["p.jsonl"], training.DataRecipe(), "float32")


def test_a_damaged_shard_or_checkpoint_is_a_one_line_error_naming_it(tmp_path):
    run = tmp_path / "run"
    model = _tiny_run(run, _embedded_tokenizer())
    shard = run / "data" / "shard_00000.pt"
    whole = shard.read_bytes()
    shard.write_bytes(whole[:200])
    with pytest.raises(UsageError, match=rf"data shard {re.escape(str(shard))} cannot be read \(.+\): delete it"):
        _train(run, model, tokens_per_batch=48, bf16=False)
    shard.write_bytes(whole)
    _train(run, model, tokens_per_batch=48, bf16=False)
    checkpoint = run / "checkpoint.pt"
    checkpoint.write_bytes(checkpoint.read_bytes()[:200])
    cut = rf"checkpoint {re.escape(str(checkpoint))} cannot be read \(.+\)"
    with pytest.raises(UsageError, match=cut):
        _train(run, model, tokens_per_batch=48, bf16=False)
    with pytest.raises(UsageError, match=cut):
        training.export(run, tmp_path / "head", model)
    with pytest.raises(UsageError, match=rf"--init-from {cut}"):
        _train(tmp_path / "other", model, data_from=[run], init_from=run, tokens_per_batch=48, bf16=False)


@pytest.mark.parametrize("option, value, message", [
    ("--token-weight", "nan", "--token-weight is nan: pass a finite number of 0 or more"),  # a nan loss, a nan head
    ("--token-weight", "inf", "--token-weight is inf: pass a finite number of 0 or more"),
    ("--unroll", "17", "--unroll is 17: pass 1 (EAGLE-1's loss) up to 16"),  # memory grows with its square
])
def test_training_numbers_that_make_a_nan_head_or_exhaust_memory_are_one_line(option, value, message, tmp_path,
                                                                               monkeypatch, capsys):
    from eagle_mdsd import cli

    monkeypatch.setattr(training, "train", lambda *args, **kwargs: pytest.fail("the stage ran"))
    assert cli.main(["train-head", "train", "--run", str(tmp_path / "run"), option, value]) == 2
    error = capsys.readouterr().err
    assert error.startswith(f"eagle-mdsd: error: {message}") and error.count("\n") == 1, error
    training.TrainRecipe(unroll=16)  # the largest taken


def test_epochs_past_what_steps_can_count_are_a_one_line_error(tmp_path):
    run = tmp_path / "run"
    model = _tiny_run(run, _embedded_tokenizer())
    with pytest.raises(UsageError, match=r"--epochs 1e\+308 of \d+ batches is more steps than can be counted"):
        _train(run, model, epochs=1e308, tokens_per_batch=48, bf16=False)


def test_ctrl_c_in_training_keeps_the_steps_done_and_a_rerun_ends_with_the_same_head(tmp_path, monkeypatch):
    """A Ctrl-C (SIGINT, as a terminal sends it) in step 3 of a run that checkpoints every 100 steps: the step
    under way finishes, the three steps are saved, and the rerun ends where an uninterrupted run does."""
    import signal

    tokenizer = _embedded_tokenizer()
    settings = dict(epochs=3, lr=1e-2, tokens_per_batch=48, bf16=False)
    whole, parts = tmp_path / "whole", tmp_path / "parts"
    state = _train(whole, _tiny_run(whole, tokenizer), **settings)
    model = _tiny_run(parts, tokenizer)
    real_loss, calls = training.head_loss, []

    def signalled(*args, **kwargs):
        calls.append(1)
        if len(calls) == 3:
            os.kill(os.getpid(), signal.SIGINT)
        return real_loss(*args, **kwargs)

    monkeypatch.setattr(training.trainer, "head_loss", signalled)
    previous = signal.signal(signal.SIGINT, signal.default_int_handler)
    try:
        with pytest.raises(KeyboardInterrupt):
            _train(parts, model, **settings)
    finally:
        signal.signal(signal.SIGINT, previous)
    monkeypatch.setattr(training.trainer, "head_loss", real_loss)
    assert torch.load(parts / "checkpoint.pt", weights_only=False)["state"]["step"] == 3
    resumed = _train(parts, model, **settings)
    assert resumed["step"] == state["step"] and resumed["log"] == state["log"]
    heads = [torch.load(folder / "checkpoint.pt", weights_only=False)["head"] for folder in (whole, parts)]
    assert all(torch.equal(heads[0][key], heads[1][key]) for key in heads[0])
