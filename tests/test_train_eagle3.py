"""Training EAGLE-3 heads (`train-head train --format eagle3`): the training-time test, the token loss alone over
the draft vocabulary, and export in the released layout."""

from __future__ import annotations

import copy
import json

import pytest
import torch
from safetensors.torch import load_file
from transformers import DynamicCache

from eagle_mdsd import eagle3, engine, head, models, training, tree

from test_training import _embedded_tokenizer, _train
from tiny import tiny_target


def _mask(query: int, keys: int, causal: bool = True) -> torch.Tensor:
    visible = torch.ones(query, keys, dtype=torch.bool)
    if causal:
        visible = visible.tril(keys - query)
    return torch.zeros(query, keys, dtype=torch.float64).masked_fill_(~visible, -1e30)[None, None]


def test_unrolled_passes_of_an_eagle3_head_are_the_decoders_draft_steps():
    """Pass r at position i is the head run, with a cache, over the target's features up to i - r + 1 and then
    over its own outputs along the path, one draft step at a time, as the decoder drafts at depth r."""
    target = tiny_target(vocab=16, hidden=32, layers=4)
    draft_head = eagle3.random_head(target, draft_vocab_size=8, seed=2).double()
    ids = torch.randint(16, (1, 10), generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        features = training.target_features(target, ids, layers=draft_head.feature_layers)[:, :-1]
    embedded = target.get_input_embeddings()(ids[:, 1:])
    passes = training.unrolled_predictions(draft_head, features, embedded, unroll=3)

    def drafted(i, depth):
        """The head's output at position i, draft depth `depth`: true pairs up to i - depth + 1, then its own."""
        cache, known = DynamicCache(), i - depth + 2
        out = draft_head(features[:, :known], embedded[:, :known], torch.arange(1, known + 1)[None],
                         _mask(known, known), cache)[:, -1:]
        for position in range(known, i + 1):
            out = draft_head(out, embedded[:, position : position + 1], torch.tensor([[position + 1]]),
                             _mask(1, position + 1, causal=False), cache)
        return out[0, -1]

    for i in range(9):
        torch.testing.assert_close(passes[0][0, i], drafted(i, 1))
        if i >= 1:
            torch.testing.assert_close(passes[1][0, i], drafted(i, 2))
        if i >= 2:
            torch.testing.assert_close(passes[2][0, i], drafted(i, 3))
    assert not torch.allclose(passes[1][0, 1:], passes[0][0, 1:])


def test_the_eagle3_loss_is_the_token_cross_entropy_over_the_draft_vocabulary_alone():
    target = tiny_target(vocab=16, hidden=32, layers=4)
    rows = torch.tensor([1, 4, 5, 9, 12, 15])
    draft_head = training.new_eagle3_head(target, rows, seed=3).double()
    ids = torch.randint(16, (2, 11), generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        full = training.target_features(target, ids, layers=draft_head.feature_layers)
    features, tokens, targets = full[:, :-1], ids[:, 1:], full[:, 1:]
    mask = torch.zeros(2, 10, dtype=torch.bool)
    mask[:, 3:] = True
    lm_head = training.draft_vocab_lm_head(target.get_output_embeddings(), rows)
    embed = target.get_input_embeddings()
    loss, accuracy = training.head_loss(draft_head, embed, lm_head, features, tokens, targets, mask)

    out = draft_head(features, embed(tokens), torch.arange(1, 11)[None], _mask(10, 10), None)
    log_q = torch.log_softmax(draft_head.lm_head(draft_head.norm(out)), -1)[mask]
    p = torch.softmax(target.lm_head(targets[..., :32])[..., rows], -1)[mask]
    assert loss.item() == pytest.approx(-(p * log_q).sum(-1).mean().item(), rel=1e-6)  # (the loss in float32)
    assert accuracy == pytest.approx((log_q.argmax(-1) == p.argmax(-1)).double().mean().item())
    blind = targets.clone()
    blind[..., 32:] = 0.0  # no feature term: the three layers' targets do not count
    assert training.head_loss(draft_head, embed, lm_head, features, tokens, blind, mask)[0].item() == loss.item()
    two = training.head_loss(draft_head, embed, lm_head, features, tokens, targets, mask, unroll=2)[0]
    assert two.item() > loss.item()  # + 0.8 x the second pass's term
    assert torch.equal(draft_head.target_ids(), rows)
    assert torch.equal(draft_head.lm_head.weight, target.lm_head.weight[rows])


def _deep_run(folder, tokenizer, features: bool):
    """A run folder with a tiny 4-layer Llama (the embedded tokenizer) and one data shard of 6 samples, with
    stored EAGLE-1 features or token ids alone."""
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(0)
    config = LlamaConfig(vocab_size=len(tokenizer), hidden_size=16, intermediate_size=32, num_hidden_layers=4,
                         num_attention_heads=2, num_key_value_heads=1, max_position_embeddings=128)
    model = LlamaForCausalLM(config).eval()
    with torch.no_grad():  # a peaked p, which a head can learn to match
        model.lm_head.weight.mul_(40.0)
    model.save_pretrained(folder / "model")
    tokenizer.save_pretrained(folder / "model")
    pool = torch.randint(len(tokenizer), (60,), dtype=torch.int32)  # few distinct tokens: a small draft vocabulary
    samples = []
    for length in (20, 24, 28, 18, 30, 22):
        ids = pool[torch.randint(60, (length,))]
        sample = {"ids": ids, "start": 5}
        if features:
            with torch.no_grad():
                sample["features"] = model.get_decoder()(ids[None].long()).last_hidden_state[0].to(torch.bfloat16)
        samples.append(sample)
    (folder / "data").mkdir(parents=True)
    torch.save(samples, folder / "data" / "shard_00000.pt")
    (folder / "data" / "prompts.json").write_text(json.dumps({"dtype": "float32", "features": features}))
    return str(folder / "model")


def test_an_eagle3_head_trains_exports_in_the_released_layout_and_decodes_greedily(tmp_path):
    tokenizer = _embedded_tokenizer()
    model = _deep_run(tmp_path / "stored", tokenizer, features=True)
    _deep_run(tmp_path / "bare", tokenizer, features=False)
    settings = dict(format="eagle3", draft_vocab=40, unroll=2, epochs=12, lr=1e-2, tokens_per_batch=60, bf16=False)
    state = _train(tmp_path / "stored", model, **settings)
    assert state["format"] == "eagle3" and state["log"][-1]["loss"] < 0.8 * state["log"][0]["loss"]
    # stored EAGLE-1 features are not what an EAGLE-3 head reads: both runs compute the same ones
    bare = _train(tmp_path / "bare", model, **settings)
    assert [r["loss"] for r in bare["log"]] == pytest.approx([r["loss"] for r in state["log"]], rel=1e-5)

    exported = training.export(tmp_path / "stored", tmp_path / "head", model)
    config = json.loads((exported / "config.json").read_text())
    assert config["architectures"] == [eagle3.ARCHITECTURE] and config["draft_vocab_size"] == 40
    weights = load_file(exported / "model.safetensors")
    assert weights["d2t"].shape == (40,) and weights["t2d"].shape == (len(tokenizer),)
    assert weights["fc.weight"].shape == (16, 48) and weights["midlayer.self_attn.q_proj.weight"].shape[1] == 32

    target, _ = models.load_target(model, torch.float32)
    draft_head = head.load_head(str(exported), target)
    shards = training.data_shards(tmp_path / "stored")
    most_frequent = sorted(training.rank_tokens(shards, len(tokenizer))[:40])
    assert isinstance(draft_head, eagle3.Eagle3Head) and draft_head.target_ids().tolist() == most_frequent
    prompt = torch.load(shards[0])[0]["ids"][:8].tolist()
    decoder = engine.Decoder(target, draft_head, tree.load("eagle_default"))
    greedy = target.generate(torch.tensor([prompt]), max_new_tokens=12, do_sample=False, min_new_tokens=12)
    assert decoder.generate(prompt, 12, 0.0).token_ids == greedy[0, len(prompt):].tolist()

    sample = torch.load(shards[0])[1]
    with torch.no_grad():
        sample["features"] = training.target_features(target, sample["ids"][None].long(),
                                                      layers=draft_head.feature_layers)[0]
    hits, accepted, positions = training.depth1_scores(draft_head, target, sample)
    assert positions == len(sample["ids"]) - sample["start"] and 0 <= hits <= positions and 0 < accepted < positions


def test_eagle3_training_refuses_what_does_not_apply(tmp_path):
    tokenizer = _embedded_tokenizer()
    model = _deep_run(tmp_path / "run", tokenizer, features=False)
    settings = dict(draft_vocab=40, epochs=1, tokens_per_batch=60, bf16=False)
    _train(tmp_path / "run", model, format="eagle3", **settings)
    with pytest.raises(ValueError, match="--format eagle3, not eagle1"):
        _train(tmp_path / "run", model, **settings)
    with pytest.raises(ValueError, match="trained an EAGLE-3 head: leave it out"):
        training.export(tmp_path / "run", tmp_path / "full", model, compact=False)
    with pytest.raises(ValueError, match="--token-weight 1.0 weighs EAGLE-1's feature term"):
        training.TrainRecipe(format="eagle3", token_weight=1.0)
    with pytest.raises(ValueError, match="--format is 'eagle2'"):
        training.TrainRecipe(format="eagle2")
    with pytest.raises(ValueError, match="is no EAGLE-3 head that drafts over the --draft-vocab 30"):
        _train(tmp_path / "other", model, format="eagle3", data_from=[tmp_path / "run"], init_from=tmp_path / "run",
               **{**settings, "draft_vocab": 30})
    exported = training.export(tmp_path / "run", tmp_path / "head", model)  # an exported head starts a run too
    warm = _train(tmp_path / "warm", model, format="eagle3", data_from=[tmp_path / "run"], init_from=exported,
                  **settings)
    assert warm["step"] >= 1
    samples = torch.load(tmp_path / "run" / "data" / "shard_00000.pt")
    torch.save([dict(s, ids=torch.flip(s["ids"], [0]) + 7) for s in samples] * 3,
               tmp_path / "run" / "data" / "shard_00001.pt")  # other answers: another draft vocabulary
    with pytest.raises(ValueError, match="which the data's shards no longer give"):
        _train(tmp_path / "run", model, format="eagle3", **{**settings, "epochs": 2})


def test_train_head_passes_the_format_to_training_and_only_the_train_stage_reads_it(monkeypatch, tmp_path, capsys):
    from eagle_mdsd import cli

    seen = {}
    monkeypatch.setattr(training, "train",
                        lambda run, recipe, *args, **options: seen.update(recipe=recipe) or {"log": []})
    for argv, expected in ((["--format", "eagle3"], "eagle3"), ([], "eagle1")):
        args = cli.build_parser().parse_args(["train-head", "train", "--run", str(tmp_path)] + argv)
        args.fn(args)
        assert seen["recipe"].format == expected
    with pytest.raises(SystemExit) as stop:  # the export stage's parser has no --format
        cli.main(["train-head", "export", "--run", str(tmp_path), "--format", "eagle3"])
    assert stop.value.code == 2 and "unrecognized arguments: --format eagle3" in capsys.readouterr().err


def test_a_schedule_in_minutes_ends_the_decay_and_the_run(tmp_path):
    model = _deep_run(tmp_path / "data", _embedded_tokenizer(), features=False)
    recipe = training.TrainRecipe(data_from=(str(tmp_path / "data"),), epochs=2, tokens_per_batch=60, bf16=False)
    whole = training.train(tmp_path / "whole", recipe, model)
    roomy = training.train(tmp_path / "roomy", recipe, model, schedule_minutes=60.0)
    assert [r["loss"] for r in roomy["log"]] == [r["loss"] for r in whole["log"]] and whole["step"] >= 4
    boxed = training.train(tmp_path / "boxed", recipe, model, schedule_minutes=1e-9)  # over before a step
    assert boxed["step"] == 0


def test_training_features_are_the_decoders():
    target = tiny_target(vocab=16, hidden=32, layers=5)
    draft_head = eagle3.random_head(target, draft_vocab_size=8, seed=4)
    decoder = engine.Decoder(target, draft_head, tree.load("eagle_default"))
    call, prompt = decoder.start(list(range(3, 12)), 4)
    with torch.inference_mode():
        decoded = decoder.target_forward(call.target_cache, prompt, torch.arange(len(prompt)))
        trained = training.target_features(target, prompt[None], layers=draft_head.feature_layers)[0]
    assert trained.shape == (9, 4 * 32) and torch.equal(trained, decoded)


def test_a_batch_collated_in_place_equals_the_samples_collated_one_by_one():
    target = tiny_target(vocab=16, hidden=32, layers=4).float()
    twin = copy.deepcopy(target)  # the same weights under another key: the batch takes the per-sample way
    generator = torch.Generator().manual_seed(5)
    samples = [{"ids": torch.randint(16, (n,), generator=generator, dtype=torch.int32), "start": s, "shard": "a"}
               for n, s in ((9, 3), (14, 5), (6, 1))]
    layers = (2, 2, 1)
    fast = training._training_batch([dict(s) for s in samples], lambda shard: target, 32, "cpu", layers)
    mixed = [dict(s, shard="b") if i == 1 else dict(s) for i, s in enumerate(samples)]
    slow = training._training_batch(mixed, lambda shard: target if shard == "a" else twin, 32, "cpu", layers)
    assert torch.equal(fast[3], slow[3]) and fast[3].sum() == (8 - 2) + (13 - 4) + (5 - 0)
    mask = fast[3]
    for one, other in zip(fast[:3], slow[:3]):
        assert torch.equal(one[mask], other[mask].to(one.dtype))


def test_a_rerun_continues_the_time_schedule_it_was_cut_by(tmp_path, monkeypatch):
    model = _deep_run(tmp_path / "data", _embedded_tokenizer(), features=False)
    recipe = training.TrainRecipe(data_from=(str(tmp_path / "data"),), epochs=50, tokens_per_batch=60, bf16=False)
    clock = iter(range(10**6))
    monkeypatch.setattr(training.trainer.time, "monotonic", lambda: float(next(clock)))  # a second a look at the clock
    cut = training.train(tmp_path / "boxed", recipe, model, schedule_minutes=0.1)  # 6 s of this clock
    assert 1 <= cut["step"] < 10 and cut["scheduled_s"] >= 6
    again = training.train(tmp_path / "boxed", recipe, model, schedule_minutes=0.1)
    assert again["step"] == cut["step"]  # the decay had ended: no learning-rate restart
