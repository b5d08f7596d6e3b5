"""Reading a head's weights: model.safetensors through safetensors, or pytorch_model.bin through torch.load.

Every failure of the file itself - corrupt or truncated, a missing or unexpected key, a tensor of the wrong
shape or of a type that is no floating point - is a one-line `UsageError` naming the file and the key.  A
safetensors file is checked from its header alone, so a bad head is refused before any model loads.
"""

from __future__ import annotations

import pickle
import zipfile
from pathlib import Path

import torch

from .errors import UsageError

FILES = ("model.safetensors", "pytorch_model.bin")
FLOATS = {"F16": torch.float16, "BF16": torch.bfloat16, "F32": torch.float32, "F64": torch.float64}
REFETCH = "replace it with a complete copy of the head (download or export it again)"


def weights_file(folder: Path, what: str) -> Path:
    """The folder's model.safetensors, else its pytorch_model.bin; neither is a one-line error."""
    for name in FILES:
        if (Path(folder) / name).is_file():
            return Path(folder) / name
    raise UsageError(f"{what} {folder} has neither model.safetensors nor pytorch_model.bin: give a folder with "
                     f"config.json and one of them")


def _unreadable(path: Path, why: str) -> UsageError:
    return UsageError(f"weights file {path} cannot be read ({why}): {REFETCH}")


def _first_line(error: BaseException) -> str:
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
            raise _unreadable(path, _first_line(error)) from None
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
            raise _unreadable(path, _first_line(error)) from None
    try:
        try:
            state = torch.load(path, map_location="cpu", weights_only=True, mmap=mmap)
        except RuntimeError:
            if not mmap:
                raise
            state = torch.load(path, map_location="cpu", weights_only=True)  # the legacy format maps not
    except (pickle.UnpicklingError, zipfile.BadZipFile, EOFError, RuntimeError, OSError, ValueError,
            AttributeError, TypeError, KeyError, IndexError) as error:
        raise _unreadable(path, _first_line(error)) from None
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
