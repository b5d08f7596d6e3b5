"""The EAGLE-1 draft head and its checkpoint format.

h = fc(concat(embed(token_{t+1}), feature_t)), embedding first, then one stock
Llama decoder layer whose input_layernorm is skipped; no final norm.  (A head
may have more layers, num_hidden_layers in its config; the later ones keep
their input norms.  The released heads and the shipped one have one.)  The
token embedding and lm_head are the target's (shared, not copied).  The
feature is the target's last hidden state after its final norm.

Optionally the folder holds draft_vocab.json, the target's tokens ranked by
how often they occur in the head's training answers: the decoder can draft
over the most frequent N of them only (FR-Spec, Zhao et al. 2025), which on a
small target with a large vocabulary cuts the head's lm_head cost by V/N.

Checkpoints: a folder with config.json (a Llama config, num_hidden_layers 1 for EAGLE-1,
optional top-level "bias" for fc, default true) and pytorch_model.bin or
model.safetensors with the released key names (fc.*, layers.0.*, and in the
EAGLE-1 release a frozen copy of embed_tokens.weight, which we check and
otherwise ignore).  yuhuili/EAGLE-Vicuna-7B-v1.3 loads unchanged.
"""

from __future__ import annotations

import json
from pathlib import Path

import torch
from torch import nn

from . import eagle3, validate
from .checkpoint import (check, head_config_for, head_folder, layout, llama_config, meta_shapes, read_weights,
                         weights_file, write_weights)
from .errors import UsageError, read_json
from .models import cache_keyword

DRAFT_VOCAB_FILE = "draft_vocab.json"


class EagleHead(nn.Module):
    def __init__(self, config, bias: bool = True):
        super().__init__()
        self.draft_vocab: list[int] | None = None  # token ids ranked by training frequency, if shipped
        from transformers.models.llama.modeling_llama import LlamaDecoderLayer, LlamaRotaryEmbedding

        config._attn_implementation = getattr(config, "_attn_implementation", None) or "sdpa"
        self.config = config
        self.bias = bias
        hidden = config.hidden_size
        self.fc = nn.Linear(2 * hidden, hidden, bias=bias)
        self.layers = nn.ModuleList(LlamaDecoderLayer(config, layer_idx=i) for i in range(config.num_hidden_layers))
        self.layers[0].input_layernorm = nn.Identity()  # EAGLE-1: attention runs directly on the fc output
        self.rotary_emb = LlamaRotaryEmbedding(config)
        self.cache_keyword = cache_keyword(self.layers[0])

    def forward(self, features, embeddings, position_ids, attention_mask, cache):
        """Predicted next features [1, k, H] for k (feature, embedded token) pairs."""
        hidden = self.fc(torch.cat([embeddings, features], dim=-1))
        position_embeddings = self.rotary_emb(hidden, position_ids=position_ids)
        for layer in self.layers:
            hidden = layer(hidden, attention_mask=attention_mask, position_ids=position_ids, use_cache=True,
                           position_embeddings=position_embeddings, **{self.cache_keyword: cache})
        return hidden


def random_head(target, seed: int = 0, layers: int = 1) -> EagleHead:
    """An untrained head for `target` (tests: correctness must not depend on head quality)."""
    torch.manual_seed(seed)
    config = head_config_for(target.config)
    config.num_hidden_layers = layers
    head = EagleHead(config)
    for module in head.modules():
        if isinstance(module, nn.Linear):
            nn.init.normal_(module.weight, std=0.02)
            if module.bias is not None:
                nn.init.zeros_(module.bias)
    return head.to(dtype=target.dtype, device=target.device).eval()


def _check_fits_target(config, target_config, source: str) -> None:
    """A head whose sizes do not match the target is refused, naming the field."""
    for field in ("hidden_size", "vocab_size"):
        head_value, target_value = getattr(config, field, None), getattr(target_config, field, None)
        if head_value != target_value:
            raise UsageError(f"draft head {source} does not fit the base model: {field} is {head_value} in the "
                             f"head but {target_value} in the base model; use a head trained for this base model")


def _head_config(raw: dict, spec: str):
    """(config, bias) of an EAGLE-1 head's config.json."""
    raw = dict(raw)
    bias = raw.pop("bias", True)
    if not isinstance(bias, bool):
        raise UsageError(f"draft head {spec}: config.json's bias must be true or false, not {json.dumps(bias)[:40]}")
    for name in ("hidden_size", "vocab_size", "num_attention_heads", "intermediate_size"):
        if name not in raw:
            raise UsageError(f"draft head {spec}: config.json has no {name}: use the config.json that came with "
                             f"the head")
    config = llama_config({k: v for k, v in raw.items() if k not in ("architectures",)}, spec)
    if not validate.is_int(config.num_hidden_layers) or config.num_hidden_layers < 1:
        raise UsageError(f"draft head {spec}: num_hidden_layers is {config.num_hidden_layers}; a head needs at "
                         f"least one decoder layer (EAGLE-1 heads have 1)")
    return config, bias


def inspect(spec) -> tuple[Path, dict, bool]:
    """(folder, config.json, whether it is an EAGLE-3 head) of a head, its files checked against its config
    without loading any model: the config is valid, and the weights file holds every tensor the config asks
    for, in shape and as floats."""
    folder = head_folder(str(spec))
    if not folder.is_dir():
        raise UsageError(f"draft head {spec} is a file, not a folder: give the folder with config.json and weights")
    raw = read_json(folder / "config.json", f"draft head {spec}: config file",
                    "give the config.json that came with the head", kind=dict)
    weights = weights_file(folder, "draft head")
    found = layout(weights)
    is_eagle3 = eagle3.is_eagle3(raw, found)
    if is_eagle3:
        expected, optional = eagle3.expected_layout(raw, str(spec))
        found = {key.removeprefix("model."): value for key, value in found.items()}
        check(found, expected, weights, optional, whole_numbers=("d2t", "t2d"))
    else:
        config, bias = _head_config(raw, str(spec))
        last = f"layers.{config.num_hidden_layers - 1}."
        if not any(key.startswith(last) for key in found):  # before building that many layers, even on meta
            raise UsageError(f"weights file {weights} lacks {last}* for the num_hidden_layers "
                             f"{config.num_hidden_layers} of its config.json: use the config.json that came with "
                             f"these weights")
        shapes = meta_shapes(lambda: EagleHead(config, bias=bias), str(spec))
        embedding = (config.vocab_size, config.hidden_size)
        check(found, shapes, weights, {"embed_tokens.weight": embedding})
    _draft_vocab(folder, spec, raw.get("vocab_size"))
    return folder, raw, is_eagle3


def _draft_vocab(folder: Path, spec, vocab_size) -> list[int] | None:
    """The token ranking of draft_vocab.json, checked, or None without one."""
    ranked = folder / DRAFT_VOCAB_FILE
    if not ranked.exists():
        return None
    fix = "regenerate it with `eagle-mdsd train-head export`, or delete it to draft over the full vocabulary"
    record = read_json(ranked, f"draft head {spec}: token ranking", fix, kind=dict)
    token_ids = record.get("token_ids")
    if not (isinstance(token_ids, list) and token_ids and all(validate.is_int(t) for t in token_ids)):
        raise UsageError(f"draft head {spec}: {DRAFT_VOCAB_FILE} must hold a non-empty list of token ids under "
                         f"'token_ids': {fix}")
    if validate.is_int(vocab_size) and (max(token_ids) >= vocab_size or min(token_ids) < 0):
        raise UsageError(f"draft head {spec}: {DRAFT_VOCAB_FILE} has token ids outside the vocabulary of "
                         f"{vocab_size}; {fix}")
    if len(set(token_ids)) < len(token_ids):  # a ranking's first N ids are N tokens, as --draft-vocab N records
        raise UsageError(f"draft head {spec}: {DRAFT_VOCAB_FILE} ranks a token id more than once; {fix}")
    return token_ids


def load_head(spec: str, target):
    """Load an EAGLE-1 head (EagleHead) or an EAGLE-3 one (eagle3.Eagle3Head, told by its config) for `target`;
    refuses heads that do not fit it, and files that do not match their config (`inspect`)."""
    folder, raw, is_eagle3 = inspect(spec)
    if is_eagle3:
        return eagle3.load(raw, read_weights(folder), target, str(spec))
    config, bias = _head_config(raw, str(spec))
    _check_fits_target(config, target.config, str(spec))
    state = read_weights(folder)
    embed = state.pop("embed_tokens.weight", None)
    if embed is not None and tuple(embed.shape) != tuple(target.get_input_embeddings().weight.shape):
        raise UsageError(f"draft head {spec} does not fit the base model: embed_tokens.weight is "
                         f"{tuple(embed.shape)}, the base model's embedding is "
                         f"{tuple(target.get_input_embeddings().weight.shape)}")
    head = EagleHead(config, bias=bias)
    missing, unexpected = head.load_state_dict(state, strict=False)
    missing = [k for k in missing if "rotary_emb" not in k]
    if missing or unexpected:
        raise UsageError(f"draft head {spec} is neither an EAGLE-1 checkpoint nor an EAGLE-3 one: missing "
                         f"{missing[:3]}, unexpected {unexpected[:3]}")
    head.draft_vocab = _draft_vocab(folder, spec, config.vocab_size)
    return head.to(dtype=target.dtype, device=target.device).eval()


def save_head(head: EagleHead, folder, target=None, safetensors: bool = False) -> Path:
    """Write the EAGLE-1 format: config.json + pytorch_model.bin (or model.safetensors).

    With `target`, the frozen fp32 embedding copy of the released format is
    included, so the reference EAGLE code can read the folder too.
    """
    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    config = head.config.to_dict()
    config.update({"bias": head.bias, "num_hidden_layers": len(head.layers), "architectures": ["LlamaForCausalLM"],
                   "rope_theta": eagle3.rope_theta(head.config)})  # top-level, as released heads and readers have it
    config.pop("_attn_implementation_autoset", None)
    (folder / "config.json").write_text(json.dumps(config, indent=2, default=str) + "\n")
    state = dict(head.state_dict())
    if target is not None:
        state["embed_tokens.weight"] = target.get_input_embeddings().weight.float()
    write_weights(state, folder, safetensors)
    if head.draft_vocab is not None:
        (folder / DRAFT_VOCAB_FILE).write_text(json.dumps({"token_ids": list(head.draft_vocab)}) + "\n")
    return folder


# On a small target the head's lm_head over the full vocabulary is most of the drafting time; the embedded
# default's 8192 most frequent answer tokens cover nearly all of its greedy answers, so drafting over them keeps
# tau and drafts faster (measured: docs/design.md).
AUTO_DRAFT_VOCAB = 8192


def resolve_draft_vocab(head, draft_vocab: int | str | None) -> int | None:
    """A number of tokens, or None for the full vocabulary: 'full' and None give None; 'auto' gives
    AUTO_DRAFT_VOCAB where the head ships its token ranking, else None."""
    if draft_vocab in (None, "full"):
        return None
    if draft_vocab != "auto":
        if isinstance(draft_vocab, bool) or not isinstance(draft_vocab, int):
            raise UsageError(f"draft_vocab must be a number of tokens, 'full' or 'auto', got {draft_vocab!r}")
        return draft_vocab
    return min(AUTO_DRAFT_VOCAB, len(head.draft_vocab)) if head is not None and head.draft_vocab else None


def checked_draft_vocab(head, draft_vocab) -> int | None:
    """The draft vocabulary's size (None: the whole vocabulary), or a one-line error for a choice the head
    cannot take."""
    if getattr(head, "feature_layers", None) is not None and draft_vocab not in (None, "auto"):
        raise UsageError(f"--draft-vocab {draft_vocab}: an EAGLE-3 head drafts over its own vocabulary of "
                         f"{head.config.draft_vocab_size} tokens; drop --draft-vocab")
    draft_vocab = resolve_draft_vocab(head, draft_vocab)
    if draft_vocab is not None:
        if head is None or head.draft_vocab is None:
            raise UsageError("--draft-vocab needs a head with a draft_vocab.json (token frequencies): "
                             "export it with `eagle-mdsd train-head export`, or leave --draft-vocab out")
        if draft_vocab < 1:
            raise UsageError(f"--draft-vocab must be at least 1, got {draft_vocab}")
        # Not clamped: a number past the vocabulary is a typo or a head for another target, and would draft over
        # the whole ranking while the settings recorded the number given.
        vocab = head.config.vocab_size  # the target's (load_head refuses a head that does not fit it)
        if draft_vocab > vocab:
            raise UsageError(f"--draft-vocab {draft_vocab} is more than the target's vocabulary of {vocab} tokens: "
                             f"give at most {vocab}, or 'full' to draft over all of them")
        if draft_vocab > len(head.draft_vocab):  # drafting would take the whole ranking and record N
            raise UsageError(f"--draft-vocab {draft_vocab} is more than the head's draft_vocab.json ranks "
                             f"({len(head.draft_vocab)} tokens): give at most {len(head.draft_vocab)}, or 'full' "
                             f"to draft over the whole vocabulary")
    return draft_vocab
