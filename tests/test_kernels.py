"""Prepacked bf16 linear layers: the stock kernel's outputs, only inside `packed()`, never stale."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from eagle_mdsd import engine, head, kernels, tree

from tiny import tiny_target

needs_packing = pytest.mark.skipif(not kernels.available(torch.zeros(1, dtype=torch.bfloat16)),
                                   reason="no oneDNN bf16 kernels on this CPU")


def bf16_linear(in_features=576, out_features=1536, bias=True, seed=0):
    torch.manual_seed(seed)
    return torch.nn.Linear(in_features, out_features, bias=bias).to(torch.bfloat16)


@needs_packing
@pytest.mark.parametrize("rows", [1, 7, 26])
@pytest.mark.parametrize("bias", [False, True])
def test_packed_linear_gives_the_stock_outputs_bit_for_bit(rows, bias):
    layer = bf16_linear(bias=bias)
    x = torch.randn(1, rows, 576, dtype=torch.bfloat16)
    stock = F.linear(x, layer.weight, layer.bias)
    kernels.pack(layer)
    with torch.inference_mode(), kernels.packed():
        assert torch.equal(layer(x), stock)


@needs_packing
def test_the_packed_weight_is_used_only_inside_packed():
    layer = kernels.pack(bf16_linear())
    layer.packed_weight = torch.ops.mkldnn._reorder_linear_weight(torch.zeros_like(layer.weight), None)
    x = torch.randn(3, 576, dtype=torch.bfloat16)
    with torch.inference_mode():
        assert torch.equal(layer(x), F.linear(x, layer.weight, layer.bias))  # outside: stock
        with kernels.packed():
            assert torch.equal(layer(x), layer.bias.expand(3, -1))  # inside: the (zeroed) packed weight
        assert not kernels.PackedLinear.active


@needs_packing
def test_a_weight_changed_in_place_is_repacked():
    layer = kernels.pack(bf16_linear())
    with torch.no_grad():
        layer.weight.mul_(-2.0)  # an optimizer step, say
    x = torch.randn(5, 576, dtype=torch.bfloat16)
    with torch.inference_mode(), kernels.packed():
        assert torch.equal(layer(x), F.linear(x, layer.weight, layer.bias))


@needs_packing
def test_a_replaced_weight_is_repacked():
    layer = kernels.pack(bf16_linear())
    replacement = torch.nn.Parameter(-layer.weight.detach())  # a loaded checkpoint, say
    with torch.no_grad():
        while replacement._version < layer.weight._version:
            replacement.mul_(1)  # the same version count, so only its identity tells it apart
    assert replacement._version == layer.weight._version
    layer.weight = replacement
    x = torch.randn(5, 576, dtype=torch.bfloat16)
    with torch.inference_mode(), kernels.packed():
        assert torch.equal(layer(x), F.linear(x, layer.weight, layer.bias))


class Projections(torch.nn.Module):
    """q, k and v projections of one input, as a decoder layer's attention holds them."""

    def __init__(self, bias):
        super().__init__()
        self.q_proj, self.k_proj, self.v_proj = (bf16_linear(576, size, bias, seed) for seed, size in
                                                 enumerate((576, 192, 192)))


@needs_packing
@pytest.mark.parametrize("rows", [1, 7, 26])
@pytest.mark.parametrize("bias", [False, True])
def test_sibling_layers_packed_together_give_the_stock_outputs_bit_for_bit(rows, bias):
    module = Projections(bias)
    x = torch.randn(1, rows, 576, dtype=torch.bfloat16)
    names = ("q_proj", "k_proj", "v_proj")
    stock = [F.linear(x, getattr(module, name).weight, getattr(module, name).bias) for name in names]
    kernels.pack(module)
    siblings = module.q_proj.siblings
    assert isinstance(siblings, kernels.Siblings) and siblings.layers == [getattr(module, name) for name in names]
    with torch.inference_mode(), kernels.packed():
        with torch.profiler.profile() as profile:
            made = [getattr(module, name)(x) for name in names]
        assert [event.name for event in profile.events()].count("mkldnn::_linear_pointwise") == 1  # one product
        assert siblings.input is None  # each layer took its part: nothing held
        assert all(torch.equal(a, b) for a, b in zip(made, stock))
        assert torch.equal(module.v_proj(x), stock[2])  # one layer alone on an input
    with torch.no_grad():
        module.k_proj.weight.mul_(-2.0)  # an optimizer step, say: the shared weight is repacked
    with torch.inference_mode(), kernels.packed():
        assert torch.equal(module.k_proj(x), F.linear(x, module.k_proj.weight, module.k_proj.bias))
        assert torch.equal(module.q_proj(x), stock[0])


@needs_packing
def test_siblings_are_packed_only_in_decoder_layers_and_only_when_asked():
    target = tiny_target(vocab=64, hidden=64).to(torch.bfloat16)
    kernels.pack(target)
    layer = target.model.layers[0]
    assert layer.self_attn.q_proj.siblings is layer.self_attn.v_proj.siblings is not None
    assert layer.mlp.gate_proj.siblings is layer.mlp.up_proj.siblings is not None
    assert layer.self_attn.o_proj.siblings is layer.mlp.down_proj.siblings is target.lm_head.siblings is None
    alone = kernels.pack(tiny_target(vocab=64, hidden=64).to(torch.bfloat16), siblings=False)
    assert all(module.siblings is None for module in alone.modules() if isinstance(module, kernels.PackedLinear))


def test_kernel_choices_are_checked():
    with pytest.raises(ValueError, match="unknown kernels 'fast': use one of auto, packed, stock"):
        kernels.resolve("fast", torch.zeros(1))
    with pytest.raises(ValueError, match="--kernels packed needs bf16 weights on a CPU.*got torch.float32"):
        kernels.resolve("packed", torch.zeros(1))
    assert not kernels.resolve("auto", torch.zeros(1))  # fp32: stock kernels
    assert not kernels.resolve("stock", torch.zeros(1, dtype=torch.bfloat16))
    assert not kernels.resolve("auto", torch.zeros(1, dtype=torch.bfloat16), compiling=True)  # inductor's own
    with pytest.raises(ValueError, match="--kernels packed with --cuda-graphs compile: inductor packs its own"):
        kernels.resolve("packed", torch.zeros(1, dtype=torch.bfloat16), compiling=True)


@needs_packing
@pytest.mark.parametrize("temperature", [0.0, 1.0])
def test_the_decoder_makes_the_same_tokens_on_packed_kernels(temperature):
    target = tiny_target(vocab=64, hidden=64).to(torch.bfloat16)
    draft_head = head.random_head(target)
    topology = tree.load("eagle_default")
    pair = ("topk", "topk") if temperature == 0 else ("without_replacement", "rrs_wo")
    prompt = [1, 2, 3, 4, 5, 6, 7, 8]
    stock = engine.Decoder(target, draft_head, topology, *pair, kernels_choice="stock")
    made = {seed: stock.generate(prompt, 24, temperature, seed=seed).token_ids for seed in range(3)}
    packed = engine.Decoder(target, draft_head, topology, *pair, kernels_choice="auto")
    assert packed.packed and isinstance(target.lm_head, kernels.PackedLinear)
    assert isinstance(draft_head.fc, kernels.PackedLinear)
    with torch.profiler.profile() as profile:
        assert packed.generate(prompt, 24, temperature, seed=0).token_ids == made[0]
    # the packed kernel ran (the raw events: the profiler's event tree costs more than the decoding)
    assert any("_linear_pointwise" in event.name() for event in profile.profiler.kineto_results.events())
    for seed, tokens in made.items():
        assert packed.generate(prompt, 24, temperature, seed=seed).token_ids == tokens
    assert stock.generate(prompt, 24, temperature, seed=0).token_ids == made[0]  # stock again after packing


@needs_packing
@pytest.mark.parametrize("rows", [3, 26])
def test_gqa_attention_gives_the_stock_outputs_bit_for_bit_inside_packed_only(rows, monkeypatch):
    target = tiny_target(vocab=64, hidden=64).to(torch.bfloat16)  # 4 query heads share 2 key/value heads
    kernels.pack(target)
    assert target.config._attn_implementation == kernels.GQA_SDPA
    torch.manual_seed(0)
    prefix = 30
    ids = torch.randint(0, 64, (1, prefix + rows))
    visible = torch.ones(prefix + rows, prefix + rows, dtype=torch.bool).tril_()
    visible[prefix:, prefix:] &= torch.rand(rows, rows) < 0.5  # a tree's rows see some of the rows before them
    visible.fill_diagonal_(True)
    mask = tree.additive_mask(visible, torch.bfloat16)[None, None]
    sdpa, calls = F.scaled_dot_product_attention, []

    def spy(*args, **kwargs):
        calls.append(kwargs.get("enable_gqa", False))
        return sdpa(*args, **kwargs)

    monkeypatch.setattr(F, "scaled_dot_product_attention", spy)

    def forward(attention):
        target.config._attn_implementation = attention
        calls.clear()
        return target.get_decoder()(input_ids=ids, attention_mask=mask).last_hidden_state

    with torch.inference_mode():
        outside = forward(kernels.GQA_SDPA)
        assert calls == [False, False]  # transformers' SDPA (copies of the key/value heads) for the peers
        with kernels.packed():
            stock = forward("sdpa")
            assert calls == [False, False]
            shared = forward(kernels.GQA_SDPA)
            assert calls == [True, True]
    assert torch.equal(shared, stock)
    assert torch.equal(outside, forward("sdpa"))
