"""EAGLE-3 heads (eagle_mdsd/eagle3.py): the released layout loads, the forward is the published architecture,
and decoding with one is greedy at T = 0 for every drafter/verifier pair and follows the target at T = 1 for
every drafting scheme."""

from __future__ import annotations

import json

import pytest
import torch
from safetensors.torch import load_file

from eagle_mdsd import eagle3, engine, head, tree, tree_specs, verification

from test_engine import PROMPT, P_VALUE, TREES, chi_square_p_value, empirical_first_three, exact_first_three
from tiny import greedy_tokens, tiny_target


@pytest.fixture(scope="module")
def tiny3():
    """A 4-token, 4-layer target and a sharp random EAGLE-3 head over 3 of its tokens (d2t no identity)."""
    target = tiny_target(layers=4)
    draft_head = eagle3.random_head(target, draft_vocab_size=3, seed=1)
    with torch.no_grad():
        draft_head.fc.weight.mul_(20.0)
    return target, draft_head


def test_a_head_in_the_released_layout_loads(tiny3, tmp_path):
    target, draft_head = tiny3
    folder = eagle3.save(draft_head, tmp_path / "head")
    config = json.loads((folder / "config.json").read_text())
    assert config["architectures"] == ["LlamaForCausalLMEagle3"] and config["draft_vocab_size"] == 3
    weights = load_file(folder / "model.safetensors")
    hidden = target.config.hidden_size
    assert tuple(weights["fc.weight"].shape) == (hidden, 3 * hidden)
    assert weights["midlayer.self_attn.q_proj.weight"].shape[1] == 2 * hidden
    assert {"midlayer.hidden_norm.weight", "midlayer.input_layernorm.weight", "norm.weight", "d2t", "t2d"} <= set(weights)
    assert tuple(weights["lm_head.weight"].shape) == (3, hidden) and weights["d2t"].dtype == torch.int64
    loaded = head.load_head(str(folder), target)
    assert isinstance(loaded, eagle3.Eagle3Head) and loaded.feature_layers == (2, 2, 1)
    mine, theirs = loaded.state_dict(), draft_head.state_dict()
    assert mine.keys() == theirs.keys() and [k for k in mine if not torch.equal(mine[k], theirs[k])] == []
    assert loaded.target_ids().tolist() == draft_head.target_ids().tolist()


@pytest.mark.parametrize("named, nested, fits", [
    ([2, 2, 1], False, True),   # vLLM's reading: the inputs of layers 2, N // 2, N - 3 of this 4-layer target
    ([1, 1, 0], True, True),    # SGLang's: the outputs of the layers below them (under eagle_config)
    ([0, 1, 3], False, False),  # other layers: the head would read features it was not trained on
])
def test_a_head_naming_its_target_layers_loads_only_where_they_are_the_ones_it_is_fed(tiny3, tmp_path, named,
                                                                                       nested, fits):
    target, draft_head = tiny3
    folder = eagle3.save(draft_head, tmp_path / "head")
    config = json.loads((folder / "config.json").read_text())
    field = {"eagle_aux_hidden_state_layer_ids": named}
    (folder / "config.json").write_text(json.dumps(config | ({"eagle_config": field} if nested else field)))
    if fits:
        assert head.load_head(str(folder), target).feature_layers == (2, 2, 1)
    else:
        with pytest.raises(ValueError, match=r"trained on other target layers .*\[0, 1, 3\].*inputs of layers "
                                             r"\[2, 2, 1\]"):
            head.load_head(str(folder), target)


def test_exported_heads_name_their_rope_base_where_other_readers_look(tiny3, tmp_path, monkeypatch):
    """transformers 5 keeps the RoPE base in rope_parameters; SGLang, vLLM and EAGLE's code read rope_theta and
    take 10000 without it, so both exports write it top-level, and it loads back the same."""
    target, draft_head = tiny3
    monkeypatch.setattr(target.config, "rope_parameters", {"rope_type": "default", "rope_theta": 12345.0})
    for folder in (eagle3.save(eagle3.random_head(target, draft_vocab_size=3), tmp_path / "eagle3"),
                   head.save_head(head.random_head(target), tmp_path / "eagle1")):
        assert json.loads((folder / "config.json").read_text())["rope_theta"] == 12345.0
        assert eagle3.rope_theta(head.load_head(str(folder), target).config) == 12345.0


def test_a_head_that_does_not_fit_is_a_one_line_error_naming_the_field(tiny3, tmp_path):
    target, draft_head = tiny3
    folder = eagle3.save(draft_head, tmp_path / "head")
    config = json.loads((folder / "config.json").read_text())
    (folder / "config.json").write_text(json.dumps(config | {"target_hidden_size": 4096}))
    with pytest.raises(ValueError, match=r"fc.weight is \(32, 96\), this head's config.json makes it \(32, 12288\)"):
        head.load_head(str(folder), target)  # weights that are not the config's, refused before any allocation
    (folder / "config.json").write_text(json.dumps(config | {"intermediate_size": 48}))
    with pytest.raises(ValueError, match=r"midlayer.mlp.\w+_proj.weight is \(\d+, \d+\), this head's config.json"):
        head.load_head(str(folder), target)
    (folder / "config.json").write_text(json.dumps({k: v for k, v in config.items() if k != "hidden_size"}))
    with pytest.raises(ValueError, match="config.json has no hidden_size"):
        head.load_head(str(folder), target)


def _rms(x, weight, eps):
    return weight * x / torch.sqrt((x * x).mean(-1, keepdim=True) + eps)


def _rope(x, positions, theta):
    half = x.shape[-1] // 2
    freq = 1.0 / theta ** (torch.arange(half, dtype=torch.float64) / half)
    angle = positions[:, None].double() * freq[None]
    cos, sin = torch.cat([angle.cos()] * 2, -1), torch.cat([angle.sin()] * 2, -1)
    rotated = torch.cat([-x[..., half:], x[..., :half]], -1)
    return x * cos + rotated * sin


def test_the_forward_is_the_published_architecture(tiny3):
    """Written from the architecture (fc over three layers; norms; [embedding, hidden] into the attention; residual;
    MLP; lm_head over norm), not from the module."""
    target, draft_head = tiny3
    w = {k: v.double() for k, v in draft_head.state_dict().items()}
    config = draft_head.config
    eps, heads, kv_heads = config.rms_norm_eps, config.num_attention_heads, config.num_key_value_heads
    head_dim = config.hidden_size // heads
    theta = getattr(config, "rope_theta", None) or config.rope_parameters["rope_theta"]
    torch.manual_seed(3)
    k = 5
    features = torch.randn(k, 3 * target.config.hidden_size, dtype=torch.float64)
    embedded = torch.randn(k, config.hidden_size, dtype=torch.float64)
    positions = torch.arange(7, 7 + k)
    hidden = features @ w["fc.weight"].T
    both = torch.cat([_rms(embedded, w["midlayer.input_layernorm.weight"], eps),
                      _rms(hidden, w["midlayer.hidden_norm.weight"], eps)], -1)
    q = (both @ w["midlayer.self_attn.q_proj.weight"].T).view(k, heads, head_dim).transpose(0, 1)
    key = (both @ w["midlayer.self_attn.k_proj.weight"].T).view(k, kv_heads, head_dim).transpose(0, 1)
    value = (both @ w["midlayer.self_attn.v_proj.weight"].T).view(k, kv_heads, head_dim).transpose(0, 1)
    q, key = _rope(q, positions, theta), _rope(key, positions, theta)
    key, value = key.repeat_interleave(heads // kv_heads, 0), value.repeat_interleave(heads // kv_heads, 0)
    scores = q @ key.transpose(1, 2) / head_dim**0.5 + torch.full((k, k), float("-inf")).triu(1)
    attended = (scores.softmax(-1) @ value).transpose(0, 1).reshape(k, heads * head_dim)
    hidden = hidden + attended @ w["midlayer.self_attn.o_proj.weight"].T
    normed = _rms(hidden, w["midlayer.post_attention_layernorm.weight"], eps)
    mlp = (torch.nn.functional.silu(normed @ w["midlayer.mlp.gate_proj.weight"].T)
           * (normed @ w["midlayer.mlp.up_proj.weight"].T)) @ w["midlayer.mlp.down_proj.weight"].T
    hidden = hidden + mlp
    logits = _rms(hidden, w["norm.weight"], eps) @ w["lm_head.weight"].T
    mask = tree.additive_mask(torch.ones(k, k, dtype=torch.bool).tril(), torch.float64)[None, None]
    with torch.no_grad():
        mine = draft_head(features[None], embedded[None], positions[None], mask, None)[0]
        assert torch.allclose(mine, hidden, atol=1e-10)
        assert torch.allclose(draft_head.logits(mine), logits, atol=1e-10)
        # deeper steps read the head's own output (H wide), not fc's input
        again = draft_head(mine[None], embedded[None], positions[None], mask, None)[0]
    assert not torch.allclose(again, mine)


@pytest.mark.parametrize("spec", ["wide", "eagle2:total_tokens=6,depth=3,top_k=2", "wide+lookup"])
def test_temperature_zero_is_greedy_with_an_eagle3_head_for_every_pair(tiny3, spec):
    target, draft_head = tiny3
    reference = greedy_tokens(target, PROMPT, 12)
    base, _, _ = spec.partition("+")
    pairs = verification.pairs() if base == "wide" else [("topk", "topk")]
    for scheme, verifier in pairs:
        shape = "binary2" if scheme == "spechub" else "wide"  # SpecHub drafts two children a node
        topology = tree.compile_tree(TREES[shape]) if base == "wide" else tree_specs.load(base)
        if spec.endswith("+lookup"):
            from eagle_mdsd import lookup

            topology = lookup.LookupTree(topology)
        decoder = engine.Decoder(target, draft_head, topology, scheme, verifier)
        assert decoder.generate(PROMPT, 12, 0.0).token_ids == reference, (scheme, verifier)


# One pair per drafting scheme, with its own verifier.  The head decides q and the tokens it drafts over (d2t),
# which the draft phase reads alike for every verifier of a scheme; verification reads (p, q over the target's
# vocabulary, drafts) whatever the head, and test_engine.py samples every pair with an EAGLE-1 head.
OWN_PAIRS = [("with_replacement", "rrs_w"), ("without_replacement", "rrs_wo"), ("greedy", "greedy"),
             ("spechub", "spechub"), ("topk", "topk")]
CASES = [(s, v, "binary2" if s == "spechub" else "wide") for s, v in OWN_PAIRS]


@pytest.mark.parametrize("scheme, verifier, tree_name", CASES, ids=["-".join(c) for c in CASES])
def test_first_three_tokens_follow_the_target_exactly_with_an_eagle3_head(tiny3, scheme, verifier, tree_name):
    target, draft_head = tiny3
    decoder = engine.Decoder(target, draft_head, tree.compile_tree(TREES[tree_name], tree_name), scheme, verifier)
    q, ids = decoder.draft_model.distribution(torch.randn(2, target.config.hidden_size, dtype=target.dtype), 1.0)
    outside = sorted(set(range(4)) - set(draft_head.target_ids().tolist()))
    assert torch.equal(decoder.draft_model.vocabulary_q(q, ids)[:, outside], torch.zeros(2, len(outside)))
    exact = exact_first_three(target, 1.0)
    assert chi_square_p_value(empirical_first_three(decoder, 1.0), exact) > P_VALUE


def test_every_drafting_scheme_is_sampled_with_an_eagle3_head():
    assert sorted(s for s, _ in OWN_PAIRS) == sorted({s for s, _ in verification.pairs()})
    assert set(OWN_PAIRS) <= set(verification.pairs())


def test_an_eagle3_head_takes_no_draft_vocabulary_option(tiny3):
    target, draft_head = tiny3
    with pytest.raises(ValueError, match="an EAGLE-3 head drafts over its own vocabulary of 3 tokens"):
        engine.Decoder(target, draft_head, tree.compile_tree(TREES["wide"]), draft_vocab=2)
