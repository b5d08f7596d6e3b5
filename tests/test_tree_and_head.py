"""Tree topologies and the EAGLE-1 head checkpoint format."""

from __future__ import annotations

import copy
import json
import subprocess
import sys
import warnings

import pytest
import torch

from eagle_mdsd import checkpoint, head, tree, tree_specs
from eagle_mdsd.errors import MissingFile, UsageError

from tiny import tiny_target


@pytest.mark.parametrize("name, size, depth", [("eagle_default", 25, 5), ("binary_depth4", 30, 4),
                                               ("quad_depth3", 84, 3), ("chain4", 4, 4), ("chain6", 6, 6)])
def test_named_trees(name, size, depth):
    topology = tree.load(name)
    assert topology.size == size and topology.max_depth == depth
    assert all(topology.depth[c] == topology.depth[n] + 1 for n, kids in enumerate(topology.children) for c in kids)
    # each node sees exactly its ancestors and itself
    assert int(topology.ancestors.sum()) == sum(d + 1 for d in topology.depth)


def test_tree_buffers():
    topology = tree.compile_tree([[1], [0], [0, 0]])
    assert topology.paths == ((0,), (1,), (0, 0))
    assert topology.parent == (-1, 0, 0, 1) and topology.children == ((1, 2), (3,), (), ())
    assert topology.ancestors[3].tolist() == [True, True, False, True]
    assert topology.internal(0) == [0] and topology.internal(1) == [1]


@pytest.mark.parametrize("paths, message", [
    ([], "non-empty list of paths"),
    ([[0], [0]], r"path \[0\] appears twice"),
    ([[0], [0, 1]], r"no earlier sibling \[0, 0\]"),
    ([[1]], r"no earlier sibling \[0\]"),
    ([[0, 0]], r"no parent \[0\]"),
    ([[0], [-1]], "non-negative integers"),
    ([[0], "a"], "non-negative integers"),
    ([[0], [True]], r"path \[true\] must be"),  # echoed as the JSON it came from, not Python's [True]
    ([[0]] + [[i] for i in range(1, 1100)], "at most 1024"),
])
def test_malformed_trees_are_refused(paths, message):
    with pytest.raises(ValueError, match=message):
        tree.compile_tree(paths)


def test_tree_files(tmp_path):
    good = tmp_path / "mine.json"
    good.write_text(json.dumps({"paths": [[0], [1], [0, 0]]}))
    assert tree.load(str(good)).size == 3
    bad = tmp_path / "bad.json"
    bad.write_text("[[0], [0,")
    with pytest.raises(ValueError, match="not valid JSON"):
        tree.load(str(bad))
    with pytest.raises(FileNotFoundError, match="does not exist"):
        tree.load(str(tmp_path / "missing.json"))
    with pytest.raises(ValueError, match="unknown tree 'nope'"):
        tree.load("nope")
    assert tree.load("chain9").size == 9
    for odd in ("chain04", "chain\u0663", "chain\u00b2"):  # a chain's length in the digits 0-9, no leading 0
        with pytest.raises(ValueError, match="unknown tree"):
            tree.load(odd)


def test_a_file_s_tree_is_named_by_its_path_so_it_never_passes_for_a_shipped_tree(tmp_path):
    from eagle_mdsd.benchmark import plans

    mine = tmp_path / "chain4.json"
    mine.write_text(json.dumps([[0], [1]]))
    assert tree.load(str(mine)).name == str(mine) and tree.load("chain4").name == "chain4"
    topologies, _ = plans.sweep_cells(plans.SweepPlan(trees=("chain4", str(mine)), temperatures=(0.0,)))
    assert {label: t.paths for label, t in topologies.items()} == {"chain4": ((0,), (0, 0), (0, 0, 0), (0, 0, 0, 0)),
                                                                   str(mine): ((0,), (1,))}
    with pytest.raises(ValueError, match="--trees names chain4 more than once"):
        plans.sweep_cells(plans.SweepPlan(trees=("chain4", "chain4"), temperatures=(0.0,)))


def test_a_name_finds_the_shipped_trees_from_any_folder_and_a_tree_of_tree_configs_there(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    assert tree.load("eagle_default").size == 25  # from the package, not the working directory
    (tmp_path / "tree_configs").mkdir()
    (tmp_path / "tree_configs" / "measured.json").write_text(json.dumps({"paths": [[0], [1]]}))
    assert tree.load("measured").paths == ((0,), (1,))
    assert {"eagle_default", "measured", "sequoia_cpu"} <= set(tree.names())


def test_a_tree_of_tree_configs_that_differs_from_the_shipped_tree_of_its_name_is_refused(tmp_path, monkeypatch):
    """A name means one tree: a user's tree_configs/chain4.json is never silently passed over for the shipped
    chain4 (nor taken in its place); a copy of the shipped file is no clash, and the file's path still loads it."""
    monkeypatch.chdir(tmp_path)
    (tmp_path / "tree_configs").mkdir()
    (tmp_path / "tree_configs" / "chain4.json").write_text(json.dumps({"paths": [[0]]}))
    with pytest.raises(ValueError, match="tree 'chain4': tree_configs/chain4.json differs from the shipped tree"):
        tree.load("chain4")
    assert tree.load("./tree_configs/chain4.json").size == 1
    (tmp_path / "tree_configs" / "chain4.json").write_bytes((tree.SHIPPED_TREES / "chain4.json").read_bytes())
    assert tree.load("chain4").size == 4



def test_a_tree_of_tree_configs_named_as_a_built_in_tree_is_refused(tmp_path, monkeypatch):
    """chain2 (made, not shipped) and eagle2 (grown) are built-in trees: a file of either name in tree_configs/ is
    never read in place of the built-in tree (nor passed over in silence); its path still loads it."""
    monkeypatch.chdir(tmp_path)
    (tmp_path / "tree_configs").mkdir()
    for name in ("chain2", "eagle2"):
        (tmp_path / "tree_configs" / f"{name}.json").write_text(json.dumps([[0], [1]]))
        with pytest.raises(ValueError, match=f"tree '{name}': tree_configs/{name}.json takes the name of a built-in"):
            tree_specs.load(name)
        assert tree.load(f"./tree_configs/{name}.json").size == 2
    assert tree_specs.load("chain3").size == 3
    with pytest.raises(ValueError, match=r"unknown tree 'eagle-2': .*chainN, a .json file, a dynamic tree \(eagle2, "
                                         r"opt_tree\), or any of them\+lookup$"):
        tree_specs.load("eagle-2")  # the error names every kind of tree

def head_logits(draft_head, target):
    torch.manual_seed(1)
    features = torch.randn(1, 5, target.config.hidden_size, dtype=target.dtype)
    tokens = torch.randint(target.config.vocab_size, (1, 5))
    from eagle_mdsd.cache import KVCache
    from eagle_mdsd.tree import additive_mask as mask_of

    def additive_mask(visible, dtype):  # the [1, 1, q, kv] form a model call takes
        return mask_of(visible, dtype)[None, None]

    mask = additive_mask(torch.ones(5, 5, dtype=torch.bool).tril(), target.dtype)
    with torch.no_grad():
        out = draft_head(features, target.get_input_embeddings()(tokens), torch.arange(5)[None], mask,
                         KVCache(len(draft_head.layers), 8))
    return target.get_output_embeddings()(out)


@pytest.mark.parametrize("safetensors", [False, True])
def test_head_round_trip_in_eagle1_format(tmp_path, safetensors):
    target = tiny_target(vocab=11)
    original = head.random_head(target, seed=3)
    folder = head.save_head(original, tmp_path / "head", target=target, safetensors=safetensors)
    weights = "model.safetensors" if safetensors else "pytorch_model.bin"
    assert (folder / "config.json").exists() and (folder / weights).exists()
    config = json.loads((folder / "config.json").read_text())
    assert config["num_hidden_layers"] == 1 and config["bias"] is True
    if not safetensors:
        keys = set(torch.load(folder / weights, weights_only=True))
        assert {"embed_tokens.weight", "fc.weight", "fc.bias", "layers.0.self_attn.q_proj.weight",
                "layers.0.mlp.down_proj.weight", "layers.0.post_attention_layernorm.weight"} <= keys
        assert not any("input_layernorm" in k or "lm_head" in k for k in keys)
    reloaded = head.load_head(str(folder), target)
    assert torch.equal(head_logits(original, target), head_logits(reloaded, target))


def test_a_two_layer_head_round_trips_and_keeps_a_cache_per_layer(tmp_path):
    from eagle_mdsd.cache import KVCache
    from eagle_mdsd.tree import additive_mask as mask_of

    def additive_mask(visible, dtype):  # the [1, 1, q, kv] form a model call takes
        return mask_of(visible, dtype)[None, None]

    target = tiny_target(vocab=11)
    original = head.random_head(target, seed=3, layers=2)
    norms = [type(layer.input_layernorm).__name__ for layer in original.layers]
    assert norms == ["Identity", "LlamaRMSNorm"]  # EAGLE-1's first layer skips it, a later one keeps it
    folder = head.save_head(original, tmp_path / "head", safetensors=True)
    assert json.loads((folder / "config.json").read_text())["num_hidden_layers"] == 2
    assert torch.equal(head_logits(original, target), head_logits(head.load_head(str(folder), target), target))
    torch.manual_seed(2)  # five positions in one causal pass = three, then two more through the cache
    width = target.config.hidden_size
    features, embedded = torch.randn(1, 5, width, dtype=target.dtype), torch.randn(1, 5, width, dtype=target.dtype)
    visible = torch.ones(5, 5, dtype=torch.bool).tril()
    with torch.no_grad():
        whole = original(features, embedded, torch.arange(5)[None], additive_mask(visible, target.dtype), None)
        cache = KVCache(2, 8)
        first = original(features[:, :3], embedded[:, :3], torch.arange(3)[None],
                         additive_mask(visible[:3, :3], target.dtype), cache)
        then = original(features[:, 3:], embedded[:, 3:], torch.arange(3, 5)[None],
                        additive_mask(visible[3:], target.dtype), cache)
    assert torch.allclose(torch.cat([first, then], 1), whole, atol=1e-5)
    first_layer_only = copy.deepcopy(original)
    del first_layer_only.layers[1]
    with torch.no_grad():  # the second layer is used
        alone = first_layer_only(features, embedded, torch.arange(5)[None], additive_mask(visible, target.dtype), None)
    assert not torch.allclose(alone, whole, atol=1e-3)
    config = json.loads((folder / "config.json").read_text())
    (folder / "config.json").write_text(json.dumps({**config, "num_hidden_layers": 0}))
    with pytest.raises(ValueError, match="num_hidden_layers is 0; a head needs at least one decoder layer"):
        head.load_head(str(folder), target)


def test_draft_vocabulary_round_trip_and_check(tmp_path):
    target = tiny_target(vocab=11)
    original = head.random_head(target)
    original.draft_vocab = [4, 1, 7]
    folder = head.save_head(original, tmp_path / "head", safetensors=True)
    assert head.load_head(str(folder), target).draft_vocab == [4, 1, 7]
    (folder / head.DRAFT_VOCAB_FILE).write_text(json.dumps({"token_ids": [4, 11]}))
    with pytest.raises(ValueError, match="token ids outside the vocabulary of 11"):
        head.load_head(str(folder), target)


def test_a_draft_vocabulary_larger_than_the_targets_is_a_one_line_error():
    """--draft-vocab 10000000 was taken as the whole ranking: a number past the target's vocabulary is a typo."""
    from eagle_mdsd import engine

    target = tiny_target(vocab=11)
    draft_head = head.random_head(target)
    draft_head.draft_vocab = list(range(11))
    with pytest.raises(UsageError, match=r"--draft-vocab 10000000 is more than the target's vocabulary of 11 "
                                         r"tokens: give at most 11, or 'full'"):
        engine.Decoder(target, draft_head, tree.load("chain2"), draft_vocab=10_000_000)
    assert head.checked_draft_vocab(draft_head, 11) == 11  # the whole vocabulary is a draft vocabulary too


def test_head_that_does_not_fit_is_refused(tmp_path):
    small = tiny_target(vocab=11, hidden=32)
    folder = head.save_head(head.random_head(small), tmp_path / "head")
    with pytest.raises(ValueError, match="hidden_size is 32 in the head but 48 in the base model"):
        head.load_head(str(folder), tiny_target(vocab=11, hidden=48))
    with pytest.raises(ValueError, match="vocab_size is 11 in the head but 13"):
        head.load_head(str(folder), tiny_target(vocab=13, hidden=32))
    with pytest.raises(UsageError, match="does not exist"):
        head.load_head(str(tmp_path / "nothing"), small)


def test_a_head_id_the_hub_cannot_give_is_a_one_line_error(monkeypatch):
    import huggingface_hub

    def offline(*args, **kwargs):
        raise OSError("We couldn't connect to the hub.\nCheck your internet connection.")

    monkeypatch.setattr(huggingface_hub, "snapshot_download", offline)
    with pytest.raises(MissingFile) as error:
        checkpoint.head_folder("runs/no_such_head")
    assert str(error.value).startswith("draft head runs/no_such_head is no folder here and the hub did not give it")
    assert "\n" not in str(error.value)


@pytest.mark.parametrize("args, message", [
    (["--tree", "nope"], "unknown tree 'nope'"),
    (["--drafter", "nope"], "unknown drafting scheme 'nope'"),
    (["--verifier", "nope"], "unknown verifier 'nope'"),
    (["--drafter", "without_replacement", "--verifier", "rrs_w"], "not lossless for 'without_replacement'"),
    (["--drafter", "spechub", "--verifier", "spechub"], "cannot fill tree 'eagle_default'"),
    (["--temperature", "-0.5"], "temperature must be >= 0"),
    (["--temperature", "nan"], "--temperature must be >= 0 (a finite number), got nan"),
    (["--base-model", "some/model"], "--ea-model is required with --base-model some/model"),
    (["--ea-model", "/no/such/head"], "draft head /no/such/head does not exist"),
])
def test_cli_errors_are_one_line(args, message, capsys):
    assert _cli(["generate", "--prompt", "hi", *args]) == 2
    error = capsys.readouterr().err
    assert message in error and len(error.strip().splitlines()) == 1, error


def test_the_installed_command_prints_one_line_too():
    """The cases above run `cli.main` in this process; the module as a command behaves alike."""
    done = subprocess.run([sys.executable, "-m", "eagle_mdsd.cli", "generate", "--prompt", "hi", "--tree", "nope"],
                          capture_output=True, text=True)
    assert done.returncode == 2
    assert "unknown tree 'nope'" in done.stderr and len(done.stderr.strip().splitlines()) == 1, done.stderr


def _cli(argv) -> int:
    """cli.main's exit status, the parser's refusals (SystemExit) included."""
    from eagle_mdsd import cli

    try:
        return cli.main(argv)
    except SystemExit as stop:
        return stop.code


@pytest.mark.skipif(torch.cuda.is_available(), reason="this machine has a CUDA GPU")
@pytest.mark.parametrize("command", [["generate", "--prompt", "hi"], ["check-greedy", "--questions", "1"]])
def test_cuda_without_a_gpu_is_a_one_line_error(command, tmp_path, capsys):
    assert _cli([*command, "--device", "cuda", *(["--out", str(tmp_path)] if command[0] == "check-greedy" else [])]) == 2
    error = capsys.readouterr().err
    assert len(error.strip().splitlines()) == 1, error
    assert "--device cuda" in error and "use --device cpu" in error
    assert not list(tmp_path.iterdir())  # check-greedy: no rows file


@pytest.mark.parametrize("args, message", [
    (["--p", "[0.5, 0.6]", "--q", "[0.5, 0.5]"], "--p sums to 1.1, not 1"),  # not normalised away
    (["--p", "[0.5, 0.5]", "--q", "[0.5, NaN]"], "--q must hold probabilities between 0 and 1"),
    (["--p", "[0.5, 0.5]", "--q", "[1.5, -0.5]"], "--q must hold probabilities between 0 and 1"),
])
def test_acceptance_refuses_what_is_not_a_distribution(args, message, capsys):
    from eagle_mdsd import cli

    assert cli.main(["acceptance", *args]) == 2
    error = capsys.readouterr().err
    assert message in error and len(error.strip().splitlines()) == 1, error


def test_acceptance_takes_probabilities_that_add_up_to_1_within_rounding(capsys):
    from eagle_mdsd import cli

    tenth = json.dumps([0.1] * 10)  # sums to 0.9999999999999999 in floating point
    assert cli.main(["acceptance", "--p", tenth, "--q", tenth, "--json"]) == 0
    rows = json.loads(capsys.readouterr().out)
    assert {(row["scheme"], row["verifier"]) for row in rows} >= {("topk", "topk"), ("without_replacement", "rrs_wo")}
    with pytest.raises(SystemExit):  # no drafts: the parser refuses it (printed an empty table)
        cli.main(["acceptance", "--p", tenth, "--q", tenth, "--n", "0"])
    assert "argument --n: must be at least 1, got 0" in capsys.readouterr().err


def test_no_new_tokens_is_refused_before_anything_loads(capsys, monkeypatch):
    from eagle_mdsd import models

    monkeypatch.setattr(models, "load_target", None)  # loading anything fails this test
    assert _cli(["bench", "--max-new-tokens", "0"]) == 2
    assert "argument --max-new-tokens: must be at least 1, got 0" in capsys.readouterr().err


def test_the_kv_cache_goes_under_the_name_the_model_takes():
    from eagle_mdsd import models

    class Old(torch.nn.Module):
        def forward(self, hidden, past_key_values=None, use_cache=False):
            return hidden

    class New(torch.nn.Module):
        def forward(self, hidden, cache=None, use_cache=False):
            return hidden

    assert models.cache_keyword(Old()) == "past_key_values" and models.cache_keyword(New()) == "cache"
    # decoding passes the cache under that name: no deprecation warning about it (transformers 5.24 warns
    # about past_key_values), the same tokens as plain decoding
    from eagle_mdsd import engine

    target = tiny_target(vocab=32, hidden=32)
    decoder = engine.Decoder(target, head.random_head(target), tree.chain(3))
    with warnings.catch_warnings():
        warnings.simplefilter("error", FutureWarning)
        eagle = decoder.generate([1, 2, 3], 8, 0.0)
        plain = decoder.generate([1, 2, 3], 8, 0.0, method="baseline")
    assert eagle.token_ids == plain.token_ids


def test_a_missing_or_empty_openers_file_is_the_usual_one_line_error(tmp_path, capsys):
    """It ended with exit code 1 and no 'eagle-mdsd: error:' prefix (a bare SystemExit)."""
    from eagle_mdsd import cli

    empty = tmp_path / "openers.txt"
    empty.write_text("\n  \n")
    for openers, message in ((tmp_path / "none.txt", "does not exist"), (empty, "has no lines")):
        assert cli.main(["train-head", "prompts", "--run", str(tmp_path / "run"), "--openers", str(openers)]) == 2
        error = capsys.readouterr().err
        assert error.startswith("eagle-mdsd: error: openers file") and message in error, error
    assert not (tmp_path / "run").exists()  # refused before anything is written


def test_bench_core_needs_two_drafts_to_time(capsys):
    """With --max-drafts below 2 it timed nothing and still wrote the day's results page, replacing any real run of that
    day."""
    from eagle_mdsd import cli

    with pytest.raises(SystemExit):
        cli.build_parser().parse_args(["bench-core", "--max-drafts", "1"])
    assert "argument --max-drafts: must be at least 2, got 1" in capsys.readouterr().err
