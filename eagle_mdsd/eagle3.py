"""The EAGLE-3 draft head, in the checkpoint layout SGLang and vLLM serve (`LlamaForCausalLMEagle3`).

Input: the target's hidden states after three of its N layers, low, middle and high (the inputs of layers 2,
N // 2 and N - 3, as transformers' `hidden_states` numbers them), concatenated [3H'] and projected by `fc`
to the head's width H; at deeper draft steps the head reads its own output instead.  One decoder layer
(`midlayer`) whose attention reads the token embedding and the hidden state, each normed
(`input_layernorm`, `hidden_norm`) and concatenated [2H], embedding first; the usual residuals, post-attention
norm and MLP.  Its output (before `norm`) is what the next step reads; `lm_head(norm(output))` gives logits
over the head's own draft vocabulary of `draft_vocab_size` tokens, draft id d being target token
d + d2t[d].  The token embedding is the target's (not stored).

The decoder drafts over that vocabulary (q is 0 elsewhere), which is exact for every verifier, as a
`--draft-vocab` of an EAGLE-1 head is.
"""

from __future__ import annotations

import json
from pathlib import Path

import torch
from torch import nn

from .checkpoint import head_config_for, llama_config, meta_shapes, write_weights
from .errors import UsageError
from .models import cache_keyword

ARCHITECTURE = "LlamaForCausalLMEagle3"
CONFIG_NAMES = ("hidden_size", "intermediate_size", "num_attention_heads", "num_key_value_heads", "vocab_size",
                "rms_norm_eps", "max_position_embeddings", "rope_theta", "rope_scaling", "hidden_act", "head_dim",
                "attention_bias", "mlp_bias")


def feature_layers(num_layers: int) -> tuple[int, int, int]:
    """The target layers whose inputs the head reads: 2, N // 2 and N - 3 (transformers' hidden_states indices)."""
    return (2, num_layers // 2, num_layers - 3)


def is_eagle3(raw_config: dict, keys=()) -> bool:
    """Whether a head folder's config (and weight names) is EAGLE-3's layout."""
    return (any("eagle3" in str(a).lower() for a in raw_config.get("architectures") or [])
            or "draft_vocab_size" in raw_config or any(k.startswith("midlayer.") for k in keys))


class Eagle3Layer(nn.Module):
    """EAGLE-3's midlayer: stock Llama attention and MLP, the attention's projections reading 2H."""

    def __init__(self, config):
        super().__init__()
        from transformers.models.llama.modeling_llama import LlamaAttention, LlamaMLP, LlamaRMSNorm

        hidden = config.hidden_size
        self.self_attn = LlamaAttention(config, layer_idx=0)
        for name in ("q_proj", "k_proj", "v_proj"):
            stock = getattr(self.self_attn, name)
            setattr(self.self_attn, name, nn.Linear(2 * hidden, stock.out_features, bias=stock.bias is not None))
        self.mlp = LlamaMLP(config)
        self.input_layernorm = LlamaRMSNorm(hidden, eps=config.rms_norm_eps)
        self.hidden_norm = LlamaRMSNorm(hidden, eps=config.rms_norm_eps)
        self.post_attention_layernorm = LlamaRMSNorm(hidden, eps=config.rms_norm_eps)
        self.cache_keyword = cache_keyword(self.self_attn)

    def forward(self, embeddings, hidden, position_embeddings, attention_mask, cache):
        both = torch.cat([self.input_layernorm(embeddings), self.hidden_norm(hidden)], dim=-1)
        attended = self.self_attn(hidden_states=both, position_embeddings=position_embeddings,
                                  attention_mask=attention_mask, **{self.cache_keyword: cache})[0]
        hidden = hidden + attended
        return hidden + self.mlp(self.post_attention_layernorm(hidden))


class Eagle3Head(nn.Module):
    """An EAGLE-3 head over a target of `target_hidden` width and `target_layers` layers."""

    def __init__(self, config, target_hidden: int, target_layers: int):
        super().__init__()
        from transformers.models.llama.modeling_llama import LlamaRMSNorm, LlamaRotaryEmbedding

        config._attn_implementation = getattr(config, "_attn_implementation", None) or "sdpa"
        self.config, self.target_hidden = config, target_hidden
        self.feature_layers = feature_layers(target_layers)
        self.draft_vocab = None  # (EAGLE-1's token ranking; this head has a vocabulary of its own)
        hidden, size = config.hidden_size, config.draft_vocab_size
        self.fc = nn.Linear(3 * target_hidden, hidden, bias=False)
        self.midlayer = Eagle3Layer(config)
        self.norm = LlamaRMSNorm(hidden, eps=config.rms_norm_eps)
        self.lm_head = nn.Linear(hidden, size, bias=False)
        self.register_buffer("d2t", torch.zeros(size, dtype=torch.long))
        self.register_buffer("t2d", torch.zeros(config.vocab_size, dtype=torch.bool))
        self.rotary_emb = LlamaRotaryEmbedding(config)
        self.layers = [self.midlayer]  # (a plain list: the decoder sizes the head's cache by it)

    def forward(self, features, embeddings, position_ids, attention_mask, cache):
        """The head's outputs [1, k, H] for k (feature, embedded token) pairs.  features: the target's [..., H'
        final + 3H' layers] (the decoder's target features), or [..., H] the head's own earlier outputs."""
        if features.shape[-1] != self.config.hidden_size:
            features = self.fc(features[..., -3 * self.target_hidden:])
        position_embeddings = self.rotary_emb(features, position_ids=position_ids)
        return self.midlayer(embeddings, features, position_embeddings, attention_mask, cache)

    def logits(self, outputs) -> torch.Tensor:
        """Logits over the draft vocabulary [..., draft_vocab_size]."""
        return self.lm_head(self.norm(outputs))

    def target_ids(self) -> torch.Tensor:
        """The target token of each draft id."""
        return torch.arange(len(self.d2t), device=self.d2t.device) + self.d2t


def random_head(target, draft_vocab_size: int | None = None, seed: int = 0) -> Eagle3Head:
    """An untrained EAGLE-3 head for `target` (tests), over the `draft_vocab_size` lowest-numbered tokens
    taken in a shuffled order (so that d2t is no identity), or the whole vocabulary."""
    torch.manual_seed(seed)
    config = head_config_for(target.config)
    config.draft_vocab_size = draft_vocab_size or config.vocab_size
    head = Eagle3Head(config, target.config.hidden_size, target.config.num_hidden_layers)
    for module in head.modules():
        if isinstance(module, nn.Linear):
            nn.init.normal_(module.weight, std=0.02)
    chosen = torch.randperm(config.vocab_size)[: config.draft_vocab_size].sort().values
    head.d2t.copy_(chosen - torch.arange(config.draft_vocab_size))
    head.t2d.zero_()
    head.t2d[chosen] = True
    return head.to(dtype=target.dtype, device=target.device).eval()


def config_for(raw: dict, source: str = "config.json"):
    """A Llama config of one layer from an EAGLE-3 config.json; a value that makes none is a one-line error."""
    from .validate import is_int

    for field in ("hidden_size", "vocab_size", "num_attention_heads", "intermediate_size"):
        if raw.get(field) is None:
            raise UsageError(f"draft head {source} is not an EAGLE-3 checkpoint: config.json has no {field}")
    for field in ("draft_vocab_size", "target_hidden_size"):
        if raw.get(field) is not None and not (is_int(raw[field]) and raw[field] > 0):
            raise UsageError(f"draft head {source}: config.json's {field} must be a whole number above 0, not "
                             f"{json.dumps(raw[field])[:40]}: use the config.json that came with the head")
    values = {name: raw[name] for name in CONFIG_NAMES if raw.get(name) is not None}
    config = llama_config(values, source, num_hidden_layers=1)
    config.draft_vocab_size = int(raw.get("draft_vocab_size") or raw["vocab_size"])
    return config


def expected_layout(raw: dict, source: str) -> tuple[dict, dict]:
    """({key: shape} every EAGLE-3 checkpoint of this config holds, {key: shape or None} it may hold), from the
    config alone (a head built on the meta device), keys without the 'model.' prefix some releases carry."""
    config = config_for(raw, source)
    target_hidden = int(raw.get("target_hidden_size") or config.hidden_size)
    shapes = meta_shapes(lambda: Eagle3Head(config, target_hidden, 4), source)
    optional = {name: shapes.pop(name) for name in ("d2t", "t2d")} | {"embed_tokens.weight": None}
    return shapes, optional


def _check_layers(raw: dict, layers: int, source: str) -> None:
    """One-line error where a head's config names other target layers than `feature_layers` (SpecForge's
    eagle_aux_hidden_state_layer_ids, top-level or in eagle_config: vLLM reads them as the layers whose inputs
    the head takes, SGLang as those whose outputs it takes, one lower; either reading of ours passes)."""
    nested = raw.get("eagle_config") if isinstance(raw.get("eagle_config"), dict) else {}
    named = raw.get("eagle_aux_hidden_state_layer_ids", nested.get("eagle_aux_hidden_state_layer_ids"))
    ours = list(feature_layers(layers))
    if named is not None and named not in (ours, [layer - 1 for layer in ours]):
        raise UsageError(f"draft head {source} was trained on other target layers (config.json's "
                         f"eagle_aux_hidden_state_layer_ids {json.dumps(named)[:40]}) than the ones this engine "
                         f"feeds it, the inputs of layers {ours} (EAGLE-3's): use a head trained on those")


def load(raw: dict, state: dict, target, source: str) -> Eagle3Head:
    """An EAGLE-3 head for `target` from its config and weights; one-line errors name what does not fit."""
    config = config_for(raw, source)
    target_hidden = int(raw.get("target_hidden_size") or config.hidden_size)
    if target_hidden != target.config.hidden_size:
        raise UsageError(f"draft head {source} is an EAGLE-3 head for another base model: its target hidden size "
                         f"is {target_hidden}, the base model's hidden_size is {target.config.hidden_size}; use a "
                         f"head trained for this base model")
    if config.vocab_size != target.config.vocab_size:
        raise UsageError(f"draft head {source} does not fit the base model: vocab_size is {config.vocab_size} in "
                         f"the head but {target.config.vocab_size} in the base model")
    _check_layers(raw, target.config.num_hidden_layers, source)
    embedding = target.get_input_embeddings().weight.shape[1]
    if embedding != config.hidden_size:
        raise UsageError(f"draft head {source} does not fit the base model: hidden_size is {config.hidden_size}, "
                         f"the base model's embeddings are {embedding} wide")
    # in the target's dtype before the weights arrive: they are not rounded through float32 on the way
    head = Eagle3Head(config, target_hidden, target.config.num_hidden_layers).to(dtype=target.dtype)
    state = {key.removeprefix("model."): value for key, value in state.items()}
    state.pop("embed_tokens.weight", None)  # some releases carry the target's embedding
    if "d2t" not in state:  # a head over the whole vocabulary
        state["d2t"] = torch.zeros(config.draft_vocab_size, dtype=torch.long)
        state["t2d"] = torch.ones(config.vocab_size, dtype=torch.bool)
    expected = head.state_dict()
    for key, value in state.items():
        if key in expected and tuple(value.shape) != tuple(expected[key].shape):
            raise UsageError(f"draft head {source} does not fit its config: {key} is {tuple(value.shape)}, "
                             f"the config makes it {tuple(expected[key].shape)}")
    missing, unexpected = head.load_state_dict(state, strict=False)
    missing = [k for k in missing if "rotary_emb" not in k]
    if missing or unexpected:
        raise UsageError(f"draft head {source} is not an EAGLE-3 checkpoint: missing {missing[:3]}, "
                         f"unexpected {unexpected[:3]}")
    ids = head.target_ids()
    if int(ids.min()) < 0 or int(ids.max()) >= config.vocab_size or len(set(ids.tolist())) != len(ids):
        raise UsageError(f"draft head {source}: its d2t map sends draft ids outside the vocabulary of "
                         f"{config.vocab_size} or two to one token")
    return head.to(dtype=target.dtype, device=target.device).eval()


def rope_theta(config) -> float:
    """The RoPE base of a config, written top-level on export too: transformers 5 keeps it in rope_parameters, and
    readers of the released layout (SGLang, vLLM, EAGLE's code) take rope_theta, else 10000."""
    return getattr(config, "rope_theta", None) or (getattr(config, "rope_parameters", None) or {}).get("rope_theta")


def save(head: Eagle3Head, folder) -> Path:
    """Write the released layout: config.json (LlamaForCausalLMEagle3) and model.safetensors."""
    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    config = {name: getattr(head.config, name) for name in CONFIG_NAMES if getattr(head.config, name, None) is not None}
    config.update({"architectures": [ARCHITECTURE], "model_type": "llama", "num_hidden_layers": 1,
                   "draft_vocab_size": head.config.draft_vocab_size, "target_hidden_size": head.target_hidden,
                   "rope_theta": rope_theta(head.config)})
    (folder / "config.json").write_text(json.dumps(config, indent=2, default=str) + "\n")
    write_weights({k: v for k, v in head.state_dict().items() if "rotary_emb" not in k}, folder, safetensors=True)
    return folder
