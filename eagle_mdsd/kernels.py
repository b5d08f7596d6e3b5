"""Prepacked bf16 linear layers for the CPU: oneDNN's kernel for weights laid out once in its blocked format.

On a CPU with bf16 matrix units, the same product on weights reordered once
for oneDNN (the kernel torch.compile's freezing pass emits) runs faster than
`torch.nn.functional.linear` in bf16, and a decoding step of a small model is
mostly these products (measured: evaluation/results/kernels_*.md).  The
outputs are the stock kernel's, bit for bit, on the shapes tests/test_kernels.py
checks (with the kernels of the machine it runs on).

`pack(model)` turns a model's nn.Linear layers into PackedLinear in place;
they compute as before everywhere except inside `packed()`, so a model shared
with other code (the transformers peers of a benchmark) keeps its stock
kernels there.  It also moves the model's SDPA attention to `gqa_sdpa`:
inside `packed()` a query of several rows with a mask (a tree, a prefill)
attends over the shared key/value heads with torch's enable_gqa instead of
transformers' copies of them (repeat_kv), bit for bit the same output
(tests/test_kernels.py); elsewhere it is transformers' SDPA attention.

Sibling layers that read the same input - a decoder layer's q, k and v
projections, its MLP's gate and up projections - are packed as one weight
(their rows stacked): inside `packed()` the first of them to see an input
computes all of their products in one call and the others take their part of
it.  One call reads the weights faster than three, and each output is the
separate product's, bit for bit (tests/test_kernels.py).

A packed weight is redone when its tensor changes in place (an optimizer
step) or is replaced, so a head still in training never runs on stale weights:
`packed()` checks every packed layer once on entry rather than on every
product, and inside the block the layers trust their packed weights - change
no weight inside a `packed()` block.
"""

from __future__ import annotations

import weakref
from contextlib import contextmanager

import torch
import torch.nn.functional as F
from transformers.integrations.sdpa_attention import sdpa_attention_forward

from .errors import UsageError

CHOICES = ("auto", "packed", "stock")


def available(weight: torch.Tensor) -> bool:
    """Whether oneDNN's packed linear runs here for this weight: bf16 on the CPU with oneDNN's bf16 support."""
    return (weight.device.type == "cpu" and weight.dtype == torch.bfloat16
            and torch.backends.mkldnn.is_available() and torch.ops.mkldnn._is_mkldnn_bf16_supported()
            and hasattr(torch.ops.mkldnn, "_reorder_linear_weight"))


SIBLINGS = (("q_proj", "k_proj", "v_proj"), ("gate_proj", "up_proj"))  # layers a decoder calls on one input
_PACKS = weakref.WeakSet()  # every packed weight's owner (a PackedLinear alone or its Siblings), for refresh()


class PackedLinear(torch.nn.Linear):
    """nn.Linear whose product runs on a prepacked weight inside `packed()` (no autograd there)."""

    active = False  # switched on by `packed()` only
    siblings: "Siblings | None" = None  # set when packed together with the layers that share its input

    def repack(self) -> None:
        self.packed_weight = torch.ops.mkldnn._reorder_linear_weight(self.weight.detach(), None)
        self.packed_from = _sources([self])
        _PACKS.add(self)

    def stale(self) -> bool:
        return not _current(self.packed_from, [self])

    def forward(self, x):
        if not PackedLinear.active or torch.is_grad_enabled():
            return F.linear(x, self.weight, self.bias)
        if self.siblings is not None:
            return self.siblings.output(self, x)
        return torch.ops.mkldnn._linear_pointwise(x, self.packed_weight, self.bias, "none", [], "")


def _parameters(layers) -> list[torch.Tensor]:
    return [tensor for layer in layers for tensor in (layer.weight, layer.bias) if tensor is not None]


def _sources(layers) -> list:
    """What a packed weight is made from: the layers' weights and biases, each with its in-place version."""
    return [(tensor, tensor._version) for tensor in _parameters(layers)]


def _current(sources, layers) -> bool:
    """Whether no weight or bias of the layers has been replaced or changed in place (an optimizer step) since
    `sources` were taken."""
    now = _parameters(layers)
    return len(now) == len(sources) and all(tensor is new and version == new._version
                                            for (tensor, version), new in zip(sources, now))


class Siblings:
    """PackedLinear layers that read the same input, packed as one weight (rows stacked)."""

    def __init__(self, layers: list[PackedLinear]):
        self.layers, self.sizes = layers, [layer.out_features for layer in layers]
        # self.input, self.parts: an input and the parts of its product no layer has taken yet (set by repack)
        for layer in layers:
            layer.siblings = self
        self.repack()

    def repack(self) -> None:
        weight = torch.cat([layer.weight.detach() for layer in self.layers])
        self.bias = None if self.layers[0].bias is None else torch.cat([layer.bias.detach() for layer in self.layers])
        self.packed_weight = torch.ops.mkldnn._reorder_linear_weight(weight, None)
        self.packed_from = _sources(self.layers)
        self.input, self.parts = None, {}  # parts of the old weight's product are stale too
        _PACKS.add(self)

    def stale(self) -> bool:
        return not _current(self.packed_from, self.layers)

    def output(self, layer: PackedLinear, x: torch.Tensor) -> torch.Tensor:
        if x is not self.input or layer not in self.parts:
            product = torch.ops.mkldnn._linear_pointwise(x, self.packed_weight, self.bias, "none", [], "")
            self.input, self.parts = x, dict(zip(self.layers, product.split(self.sizes, -1)))
        part = self.parts.pop(layer)
        if not self.parts:  # every layer has its part: let go of the input
            self.input = None
        return part


GQA_SDPA = __name__.replace(".", "_") + "_gqa_sdpa"  # per copy of the package (scripts/compare_revisions.py)


def gqa_sdpa(module, query, key, value, attention_mask, dropout=0.0, scaling=None, **kwargs):
    """transformers' SDPA attention, but inside `packed()` a masked query of several rows reads the key/value
    heads it shares with other query heads in place (enable_gqa) rather than from copies."""
    groups = getattr(module, "num_key_value_groups", 1)
    if (not PackedLinear.active or torch.is_grad_enabled() or groups == 1 or query.shape[2] == 1
            or attention_mask is None or dropout or kwargs.get("position_bias") is not None):
        return sdpa_attention_forward(module, query, key, value, attention_mask, dropout=dropout, scaling=scaling,
                                      **kwargs)
    output = F.scaled_dot_product_attention(query, key, value, attn_mask=attention_mask, scale=scaling,
                                            enable_gqa=True)
    return output.transpose(1, 2).contiguous(), None


def _register_gqa_sdpa() -> None:
    from transformers import AttentionInterface
    from transformers.masking_utils import AttentionMaskInterface, sdpa_mask

    AttentionInterface.register(GQA_SDPA, gqa_sdpa)
    AttentionMaskInterface.register(GQA_SDPA, sdpa_mask)  # the masks of transformers' SDPA attention


def resolve(choice: str, weight: torch.Tensor, compiling: bool = False) -> bool:
    """--kernels auto|packed|stock -> whether to pack; 'packed' where it cannot run is an error.  Forwards that
    torch.compile compiles are not packed: inductor lowers oneDNN's linear only on weights it froze itself."""
    if choice not in CHOICES:
        raise UsageError(f"unknown kernels {choice!r}: use one of {', '.join(CHOICES)}")
    if choice == "packed" and compiling:
        raise UsageError("--kernels packed with --cuda-graphs compile: inductor packs its own weights; use "
                         "--kernels auto (stock kernels under torch.compile)")
    if choice == "packed" and not available(weight):
        raise UsageError(f"--kernels packed needs bf16 weights on a CPU with oneDNN bf16 support (got "
                         f"{weight.dtype} on {weight.device.type}): use --dtype bfloat16 --device cpu, "
                         f"or --kernels auto")
    return choice != "stock" and available(weight) and not compiling


def pack(model: torch.nn.Module, siblings: bool = True) -> torch.nn.Module:
    """Turn every nn.Linear of `model` into a PackedLinear in place (same parameters), packing the SIBLINGS of
    a module as one weight (each layer alone with siblings=False), and its SDPA attention
    into `gqa_sdpa`; returns the model."""
    config = getattr(model, "config", None)
    if getattr(config, "_attn_implementation", None) == "sdpa":
        _register_gqa_sdpa()
        config._attn_implementation = GQA_SDPA
    fresh = {module for module in model.modules() if type(module) is torch.nn.Linear}
    for module in fresh:
        module.__class__ = PackedLinear
    for module in model.modules() if siblings else ():
        for names in SIBLINGS:
            layers = [getattr(module, name, None) for name in names]
            if all(layer in fresh for layer in layers) and len({(layer.in_features, layer.bias is None)
                                                                for layer in layers}) == 1:
                Siblings(layers)
    for module in fresh:
        if module.siblings is None:
            module.repack()
    return model


def linear_over(weight: torch.Tensor, bias: torch.Tensor | None = None) -> torch.nn.Linear:
    """A frozen nn.Linear over existing tensors (rows of an output embedding, say), for `pack`."""
    layer = torch.nn.Linear(weight.shape[1], weight.shape[0], bias=bias is not None, device="meta")
    layer.weight = torch.nn.Parameter(weight.detach(), requires_grad=False)
    if bias is not None:
        layer.bias = torch.nn.Parameter(bias.detach(), requires_grad=False)
    return layer


def refresh() -> None:
    """Repack every packed weight whose layers changed (in place or replaced) since it was packed."""
    for owner in list(_PACKS):
        if owner.stale():
            owner.repack()


@contextmanager
def packed(enabled: bool = True):
    """Run PackedLinear layers on their packed weights in this block, each weight first checked against its
    layers (`refresh`); no weight may change inside the block."""
    if enabled:
        refresh()
    previous, PackedLinear.active = PackedLinear.active, enabled
    try:
        yield
    finally:
        PackedLinear.active = previous
