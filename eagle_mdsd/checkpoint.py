"""What both head kinds (EAGLE-1 in head.py, EAGLE-3 in eagle3.py) share: the Llama config of a head over a
target, finding a head's folder, and reading and writing its weights."""

from __future__ import annotations

from pathlib import Path

import torch

from .errors import MissingFile
from .models import hub_offline


def head_config_for(target_config):
    """A Llama config for a head over `target_config` (hidden size, heads, vocabulary)."""
    from transformers import LlamaConfig

    names = ("hidden_size", "intermediate_size", "num_attention_heads", "num_key_value_heads", "vocab_size",
             "rms_norm_eps", "max_position_embeddings", "rope_theta", "hidden_act")
    values = {name: getattr(target_config, name) for name in names if getattr(target_config, name, None) is not None}
    rope = getattr(target_config, "rope_parameters", None)
    config = LlamaConfig(**values, num_hidden_layers=1, attention_bias=False, mlp_bias=False)
    if isinstance(rope, dict) and rope.get("rope_theta") is not None and hasattr(config, "rope_parameters"):
        config.rope_parameters = {"rope_type": "default", "rope_theta": rope["rope_theta"]}
    config.head_dim = target_config.hidden_size // target_config.num_attention_heads
    return config


def head_folder(spec: str) -> Path:
    """A head's folder: a local folder, or a hub id downloaded with huggingface_hub (needs network)."""
    path = Path(spec)
    if path.exists():
        return path
    if "/" in spec and not spec.startswith((".", "/")):
        from huggingface_hub import snapshot_download

        offline = hub_offline()  # then only a copy in the hub's cache, at once
        try:
            return Path(snapshot_download(spec, allow_patterns=["config.json", "*.bin", "*.safetensors"],
                                          local_files_only=offline))
        except Exception as error:  # no network, no such repository, ...: the hub's own message runs to lines
            why = "the hub is out of reach and its cache has no copy" if offline else type(error).__name__
            raise MissingFile(f"draft head {spec} is no folder here and the hub did not give it "
                                    f"({why}): give a folder with config.json and weights, or a "
                                    f"hub id with network") from None
    raise MissingFile(f"draft head {spec} does not exist: give a folder with config.json and weights")


def read_weights(folder: Path) -> dict:
    """The state dict of a head folder: model.safetensors, else pytorch_model.bin."""
    if (folder / "model.safetensors").exists():
        from safetensors.torch import load_file

        return load_file(folder / "model.safetensors")
    if (folder / "pytorch_model.bin").exists():
        return torch.load(folder / "pytorch_model.bin", map_location="cpu", weights_only=True)
    raise MissingFile(f"draft head {folder} has neither model.safetensors nor pytorch_model.bin")


def write_weights(state: dict, folder: Path, safetensors: bool) -> None:
    """`state` on the CPU as folder/model.safetensors or folder/pytorch_model.bin."""
    state = {key: value.detach().to("cpu").contiguous() for key, value in state.items()}
    if safetensors:
        from safetensors.torch import save_file

        save_file(state, folder / "model.safetensors")
    else:
        torch.save(state, folder / "pytorch_model.bin")
