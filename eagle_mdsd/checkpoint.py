"""What both head kinds (EAGLE-1 in head.py, EAGLE-3 in eagle3.py) share: the Llama config of a head over a
target or from a config.json, finding a head's folder, and reading, checking and writing its weights.

Weights are model.safetensors, read through safetensors, or pytorch_model.bin, read through torch.load.  Every
failure of the file itself - corrupt or truncated, a missing or unexpected key, a tensor of the wrong shape or
of a type that is no floating point - is a one-line `UsageError` naming the file and the key.  A safetensors
file is checked from its header alone, so a bad head is refused before any model loads.
"""

from __future__ import annotations

import hashlib
import json
import math
import pickle
import zipfile
from pathlib import Path

import torch

from .errors import MissingFile, UsageError
from .models import hub_offline
from .validate import is_int

FILES = ("model.safetensors", "pytorch_model.bin")
FLOATS = {"F16": torch.float16, "BF16": torch.bfloat16, "F32": torch.float32, "F64": torch.float64}
REFETCH = "replace it with a complete copy of the head (download or export it again)"


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


def config_fault(error: BaseException) -> str:
    """The last line of a transformers config's validation error (its first lines name the validator)."""
    lines = [line.strip() for line in str(error).strip().splitlines() if line.strip()]
    return lines[-1][:160] if lines else type(error).__name__


def llama_config(values: dict, spec: str, **extra):
    """A LlamaConfig from a head's config.json values; a value transformers refuses is a one-line error."""
    from transformers import LlamaConfig

    for name in ("hidden_size", "intermediate_size", "num_attention_heads", "vocab_size"):
        if name in values and not (is_int(values[name]) and values[name] > 0):
            raise UsageError(f"draft head {spec}: config.json's {name} must be a whole number above 0, not "
                             f"{json.dumps(values[name])[:40]}: use the config.json that came with the head")
    nested = values.get("rope_parameters") if isinstance(values.get("rope_parameters"), dict) else {}
    # each divides or scales a position's rotation or a norm: 0, less or not finite makes NaN or scrambles them
    for name in ("rope_theta", "rms_norm_eps", "factor"):
        number = values.get(name, nested.get(name))
        if number is not None and not (isinstance(number, (int, float)) and not isinstance(number, bool)
                                       and 0 < number < math.inf):
            raise UsageError(f"draft head {spec}: config.json's {name} must be a number above 0, not "
                             f"{json.dumps(number)[:40]}: use the config.json that came with the head")
    try:
        return LlamaConfig(**values, **extra)
    except Exception as error:  # transformers' strict validation raises its own classes besides TypeError
        raise UsageError(f"draft head {spec}: config.json does not make a Llama config ({config_fault(error)}): "
                         f"use the config.json that came with the head") from None


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
            raise MissingFile(f"draft head {spec} is no folder here and the hub did not give it ({why}): give a "
                              f"folder with config.json and weights, or a hub id with network") from None
    raise MissingFile(f"draft head {spec} does not exist: give a folder with config.json and weights")


def read_weights(folder: Path) -> dict:
    """The state dict of a head folder: model.safetensors, else pytorch_model.bin; a file that cannot be read,
    or a float tensor with a NaN or infinite entry (a q of NaN is no distribution: no verifier is exact on it),
    is a one-line error naming it."""
    file = weights_file(folder, "draft head")
    state = load(file)
    broken = next((key for key, value in state.items() if isinstance(value, torch.Tensor)
                   and value.is_floating_point() and not bool(torch.isfinite(value).all())), None)
    if broken is not None:
        raise UsageError(f"weights file {file}: {broken} holds NaN or infinite entries (a damaged checkpoint, or a "
                         f"training run that diverged): use another head, or train it again")
    return state


def meta_shapes(build, spec: str) -> dict:
    """{key: shape} of the module `build()` makes on the meta device (no memory; rotary buffers left out); a
    config transformers cannot make a layer of (an unknown activation or rope type, no key/value heads) is a
    one-line error."""
    try:
        with torch.device("meta"):
            module = build()
    except (KeyError, ValueError, TypeError, ZeroDivisionError, AttributeError) as error:
        raise UsageError(f"draft head {spec}: transformers cannot make a decoder layer of its config.json "
                         f"({type(error).__name__}: {str(error)[:60]}): use the config.json that came with the "
                         f"head") from None
    return {key: tuple(value.shape) for key, value in module.state_dict().items() if "rotary_emb" not in key}


def write_weights(state: dict, folder: Path, safetensors: bool) -> None:
    """`state` on the CPU as folder/model.safetensors or folder/pytorch_model.bin."""
    state = {key: value.detach().to("cpu").contiguous() for key, value in state.items()}
    if safetensors:
        from safetensors.torch import save_file

        save_file(state, folder / "model.safetensors")
    else:
        torch.save(state, folder / "pytorch_model.bin")


def weights_file(folder: Path, what: str) -> Path:
    """The folder's model.safetensors, else its pytorch_model.bin; neither is a one-line error."""
    for name in FILES:
        if (Path(folder) / name).is_file():
            return Path(folder) / name
    raise MissingFile(f"{what} {folder} has neither model.safetensors nor pytorch_model.bin: give a folder with "
                      f"config.json and one of them")


def _unreadable(path: Path, why: str) -> UsageError:
    return UsageError(f"weights file {path} cannot be read ({why}): {REFETCH}")


# What torch.load raises on a file cut short, not written by torch.save, or holding objects weights_only refuses
LOAD_ERRORS = (pickle.UnpicklingError, zipfile.BadZipFile, EOFError, RuntimeError, OSError, ValueError,
               AttributeError, TypeError, KeyError, IndexError)


def head_checksum(folder: Path) -> str:
    """sha256 over a head folder's files (names and bytes), so answers and collected data name the head that made
    them."""
    digest = hashlib.sha256()
    for path in sorted(p for p in Path(folder).iterdir() if p.is_file()):
        digest.update(path.name.encode() + b"\0" + path.read_bytes())
    return digest.hexdigest()[:16]


def load_saved(path: Path, what: str, fix: str, weights_only: bool = True, mmap: bool = False):
    """torch.load of a file the project saved (a data shard, a training checkpoint, a study's task file): one cut
    short, damaged or not torch's is a one-line error naming it, `what` it is and `fix`."""
    try:
        return torch.load(path, weights_only=weights_only, mmap=mmap)
    except LOAD_ERRORS as error:
        raise UsageError(f"{what} {path} cannot be read ({first_line(error)}): {fix}") from None


def first_line(error: BaseException) -> str:
    """The first sentence of an error's first line (torch's and safetensors' messages run on)."""
    text = str(error).strip()
    return text.splitlines()[0].split(". ")[0].rstrip(".")[:120] if text else type(error).__name__


def layout(path: Path) -> dict[str, tuple[str, tuple[int, ...]]]:
    """{key: (dtype name, shape)} of a weights file; a safetensors file is read from its header only."""
    path = Path(path)
    if path.suffix == ".safetensors":
        from safetensors import SafetensorError, safe_open

        try:
            with safe_open(str(path), framework="pt") as handle:
                return {key: (handle.get_slice(key).get_dtype(), tuple(handle.get_slice(key).get_shape()))
                        for key in handle.keys()}
        except (SafetensorError, OSError, ValueError) as error:
            raise _unreadable(path, first_line(error)) from None
    return {key: (_dtype_name(value), tuple(value.shape)) for key, value in load(path, mmap=True).items()}


def _dtype_name(value) -> str:
    """A torch tensor's dtype in safetensors' names (F32, BF16, I64, ...); not a tensor: its type's name."""
    if not isinstance(value, torch.Tensor):
        return type(value).__name__
    names = {dtype: name for name, dtype in FLOATS.items()} | {torch.int64: "I64", torch.int32: "I32",
                                                                torch.int16: "I16", torch.int8: "I8",
                                                                torch.uint8: "U8", torch.bool: "BOOL"}
    return names.get(value.dtype, str(value.dtype).removeprefix("torch."))


def load(path: Path, mmap: bool = False) -> dict[str, torch.Tensor]:
    """The tensors of a weights file, on the CPU; an unreadable file is a one-line error naming it.  mmap: map a
    pytorch_model.bin instead of reading it (for its layout; a file of torch's legacy format is read)."""
    path = Path(path)
    if path.suffix == ".safetensors":
        from safetensors import SafetensorError
        from safetensors.torch import load_file

        try:
            return load_file(path)
        except (SafetensorError, OSError, ValueError) as error:
            raise _unreadable(path, first_line(error)) from None
    try:
        try:
            state = torch.load(path, map_location="cpu", weights_only=True, mmap=mmap)
        except RuntimeError:
            if not mmap:
                raise
            state = torch.load(path, map_location="cpu", weights_only=True)  # the legacy format maps not
    except LOAD_ERRORS as error:
        raise _unreadable(path, first_line(error)) from None
    if not isinstance(state, dict) or not all(isinstance(k, str) and isinstance(v, torch.Tensor)
                                              for k, v in state.items()):
        raise _unreadable(path, "it holds no mapping of names to tensors")
    return state


def check(found: dict[str, tuple[str, tuple[int, ...]]], expected: dict[str, tuple[int, ...]], path: Path,
          optional: dict[str, tuple[int, ...] | None] | None = None, whole_numbers: tuple[str, ...] = ()) -> None:
    """One-line error unless `found` (a file's `layout`) has every key of `expected` with its shape, floating
    point values (except the `whole_numbers` keys), and no key outside `expected` and `optional` (a shape, or
    None for any)."""
    optional = optional or {}
    missing = [key for key in expected if key not in found]
    if missing:
        raise UsageError(f"weights file {path} lacks {missing[0]}" + (f" and {len(missing) - 1} more key(s)"
                                                                        if len(missing) > 1 else "")
                         + f": it is no checkpoint of this head's config.json; {REFETCH}")
    unexpected = [key for key in found if key not in expected and key not in optional]
    if unexpected:
        raise UsageError(f"weights file {path} holds {unexpected[0]}, which this head's config.json has no place "
                         f"for: use the config.json that came with these weights")
    for key, (dtype, shape) in found.items():
        wanted = expected.get(key, optional.get(key))
        if wanted is not None and tuple(shape) != tuple(wanted):
            raise UsageError(f"weights file {path}: {key} is {tuple(shape)}, this head's config.json makes it "
                             f"{tuple(wanted)}: use the config.json that came with these weights")
        if key not in whole_numbers and dtype not in FLOATS:
            raise UsageError(f"weights file {path}: {key} holds {dtype} values, not floating point ones "
                             f"(F32, BF16, F16): {REFETCH}")
