"""Training prompts: the files a data stage answers, and instructions the target writes itself.

Spec-Bench / MT-Bench questions are never trained on: a prompt equal to one of them (after normalising case and
spaces) is dropped wherever prompts enter.
"""

from __future__ import annotations

import gzip
import json
import lzma
import re
import time
from pathlib import Path

import torch
from tqdm import tqdm
from transformers import GenerationConfig

from .. import jsonl, models, peers, questions, validate
from ..errors import MissingFile, UsageError, read_text
from .budget import Budget, check_batch_memory

# The shipped prompt set (GPTeacher and the Alpaca seed tasks, xz-compressed; their licences beside them).
DEFAULT_PROMPTS = Path(__file__).resolve().parent.parent / "data" / "prompts"

_OPENERS = {".xz": lzma.open, ".gz": gzip.open}


def _normalise(text: str) -> str:
    return re.sub(r"\s+", " ", text).strip().lower()


def benchmark_texts() -> set[str]:
    return {_normalise(turn) for q in questions.load("spec_bench") for turn in q["turns"]}


def _records(path: Path) -> list[tuple[str, object]]:
    """(where, record) of a JSONL file (one a line) or a JSON file (a list, or {"data": [...]}), either one
    possibly xz- or gzip-compressed; `where` names the line or record.  A file that is not JSON is a one-line
    error naming it."""
    opener = _OPENERS.get(path.suffix)
    if opener is None or not path.is_file():  # (read_text refuses a folder, a device or a pipe by name)
        text = read_text(path, "prompt file")
    else:
        try:
            text = opener(path, "rt", encoding="utf-8").read()
        except UnicodeDecodeError as error:
            raise UsageError(f"prompt file {path} is not UTF-8 text once decompressed (byte {error.start}): give "
                             f"a text file") from None
        except (OSError, EOFError, lzma.LZMAError) as error:  # not that format, cut short, or unreadable
            cause = getattr(error, "strerror", None) or str(error) or "cut short"
            raise UsageError(f"prompt file {path} cannot be decompressed as {path.suffix} ({cause}): give the "
                             f"file whole, or its contents uncompressed") from None
    name = path.name.removesuffix(path.suffix) if opener else path.name
    if name.endswith(".jsonl"):
        numbered = [(number, line) for number, line in enumerate(text.splitlines(), 1) if line.strip()]
        values = jsonl.decode(numbered, f"prompt file {path}", "write one JSON object a line")
        return [(f"line {number}", value) for (number, _), value in zip(numbered, values)]
    try:
        data = json.loads(text)
    except json.JSONDecodeError as error:
        raise UsageError(f"prompt file {path} is not JSON ({error.msg} at line {error.lineno}): give a JSON list "
                         f"of records, or a .jsonl file of one record a line") from None
    data = data.get("data") if isinstance(data, dict) else data
    return [(f"record {index}", record) for index, record in enumerate(data if isinstance(data, list) else [], 1)]


def _text(record: dict, key: str, file: Path, where: str) -> str:
    """The record's text field `key` ("" when absent or empty); anything but text is a one-line error."""
    value = record.get(key)
    if value is None or value == "":
        return ""
    if not isinstance(value, str):
        raise UsageError(f"prompt file {file}, {where}: {key!r} is {json.dumps(value)[:40]}, not text: write it "
                         f"as a JSON string, e.g. \"{key}\": \"...\"")
    fault = validate.not_utf8(value)
    if fault:
        raise UsageError(f"prompt file {file}, {where}: {key!r} holds {fault}, which is not UTF-8 text: write it "
                         f"as UTF-8 text")
    return value


def _conversation(messages, file: Path, where: str) -> list[dict]:
    roles = [m.get("role") if isinstance(m, dict) else None for m in messages]
    if (not messages or roles[-1] != "user" or any(r not in ("system", "user", "assistant") for r in roles)
            or any(not isinstance(m.get("content"), str) for m in messages)):
        raise UsageError(f"prompt file {file}, {where}: a 'messages' list must hold {{role, content}} turns "
                         f"(system, user, assistant) with text contents and end with a user turn, got roles {roles}")
    return [{"role": m["role"], "content": m["content"]} for m in messages]


def _prompt(record: dict, file: Path, where: str) -> tuple:
    """(prompt, reference, user turns, key for duplicates) of one record."""
    if isinstance(record.get("messages"), list):  # a conversation ending with a user turn
        prompt = _conversation(record["messages"], file, where)
        users = [m["content"] for m in prompt if m["role"] == "user"]
        key = "\n".join(_normalise(m["content"]) for m in prompt)
        return prompt, _text(record, "response", file, where), users, key
    def field(key):
        return _text(record, key, file, where)

    instruction = field("instruction") or field("prompt") or field("text")
    extra, reference = field("input"), field("response") or field("output")
    instances = record.get("instances")
    if not extra and not reference and isinstance(instances, list) and instances and isinstance(instances[0], dict):
        extra = _text(instances[0], "input", file, where)
        reference = _text(instances[0], "output", file, where)
    prompt = f"{instruction}\n\n{extra}".strip() if extra else instruction.strip()
    return prompt, reference, [prompt], _normalise(prompt)


def load_prompts(paths) -> list[dict]:
    """{"prompt", "reference"} from JSON/JSONL files (possibly .xz or .gz) or folders of them.

    Understands instruction/input/response (GPTeacher, Alpaca), Alpaca seed tasks (instruction + instances),
    plain prompt/text fields, and conversations ("messages": [{"role", "content"}, ...] ending with a user turn,
    e.g. a request to revise an earlier answer), kept as the list.  Duplicates and benchmark questions are
    removed.
    """
    files = []
    for p in paths:
        p = Path(p)
        if not p.exists():
            raise MissingFile(f"prompt file or folder {p} does not exist")
        files += sorted(p.glob("*.json*")) if p.is_dir() else [p]
    banned = benchmark_texts()
    prompts, seen = [], set()
    for file in files:
        for where, record in _records(file):
            if not isinstance(record, dict):
                continue
            prompt, reference, users, key = _prompt(record, file, where)
            if not prompt or key in seen or any(_normalise(u) in banned for u in users):
                continue
            seen.add(key)
            prompts.append({"prompt": prompt, "reference": reference})
    if not prompts:
        raise UsageError(f"no usable prompts in {', '.join(str(p) for p in paths)}")
    return prompts


def user_turn_prefix(tokenizer) -> list[int]:
    """The chat template's tokens up to where a user message starts."""
    marker = "\u2603MESSAGE\u2603"
    text = tokenizer.decode(models.chat_prompt_ids(tokenizer, marker))
    if marker not in text:
        raise UsageError("the tokenizer's chat template does not show the user message verbatim: "
                         "self-written prompts need a chat template")
    return tokenizer(text[: text.index(marker)], add_special_tokens=False)["input_ids"]


def _kept(rows, tokenizer, stop: set, opener: str, seen: set, room: int) -> list[str]:
    """The messages of one batch worth keeping, at most `room`, in the batch's order (added to `seen`): those the
    target ended itself, with at least three words of its own, not seen before."""
    kept = []
    for row in rows:
        if len(kept) == room:
            break
        end = next((i for i, t in enumerate(row) if t in stop), None)
        own = tokenizer.decode(row[:end]) if end is not None else ""
        text = (opener + own).strip()
        if len(own.split()) < 3 or _normalise(text) in seen:
            continue
        seen.add(_normalise(text))
        kept.append(text)
    return kept


def self_prompts(out_dir: Path, count: int, base_model=None, dtype: str = "bfloat16", batch_size: int = 64,
                 max_tokens: int = 96, seed: int = 0, max_minutes: float | None = None,
                 openers: list[str] | None = None, device: str = "cpu") -> Path:
    """Append instructions the target writes itself to RUN/self_prompts.jsonl until `count` are there (exactly
    that many, unless an earlier call asked for more).

    The target samples right after its chat template's user-turn header, as Magpie (Xu et al. 2024) does.
    Batch b samples at temperature 1 with the seed (seed, b).  A rerun starts again at the file's last batch,
    whose messages already written come out again and are skipped as seen, so a call cut short or asked for
    more continues as one longer call would.  With `openers`, batch b's messages start with
    openers[b % len(openers)] (e.g. "Write a Python function"), which steers what kind of task the target
    writes.  Kept: messages the target ended itself (no length cut), with at least three words of its own, not
    seen before and not a Spec-Bench / MT-Bench question; a batch's last kept messages beyond `count` are not.
    """
    budget = Budget(max_minutes)
    path = Path(out_dir) / "self_prompts.jsonl"
    jsonl.drop_cut_short_line(path)
    records = jsonl.records(path)
    seen = {_normalise(r["prompt"]) for r in records} | benchmark_texts()
    batch = max((r["batch"] for r in records), default=0)
    written = len(records)
    if written >= count:
        return path
    target, tokenizer = models.load_target(base_model, models.parse_dtype(dtype), device)
    header = user_turn_prefix(tokenizer)
    opener_ids = [tokenizer(opener, add_special_tokens=False)["input_ids"] for opener in openers or [""]]
    check_batch_memory(target, batch_size, len(header) + max(map(len, opener_ids)) + max_tokens)
    stop = set(models.eos_token_ids(target, tokenizer))
    with tqdm(total=count, initial=written, desc="self-written prompts") as progress:  # (closed on an error too)
        barren = 0  # batches in a row that kept nothing
        started, tried = time.monotonic(), 0
        while written < count:
            if barren == 20:
                raise UsageError(f"the target ended none of its last 20 x {batch_size} messages within {max_tokens} "
                                 f"tokens or all were duplicates: this model cannot write its own prompts")
            if not budget.allows_step():
                print(f"time budget reached: {written} prompts written; rerun to continue")
                break
            opener = openers[batch % len(openers)] if openers else ""
            messages = _sampled_messages(target, tokenizer, header + opener_ids[batch % len(opener_ids)], batch_size,
                                         max_tokens, stop, seed=seed * 1_000_003 + batch)
            kept = _kept(messages, tokenizer, stop, opener, seen, count - written)
            jsonl.append(path, *({"prompt": text, "batch": batch} for text in kept))  # one write per batch
            budget.step_took()
            written += len(kept)
            tried += batch_size
            barren = 0 if kept else barren + 1
            progress.update(len(kept))
            batch += 1
    if tried:  # the rate that sizes a run on another machine or batch size
        seconds = time.monotonic() - started
        print(f"prompts stage: {written - len(records)} kept of {tried} messages in {seconds:.0f} s: "
              f"{tried / seconds:.1f} messages/s at batch size {batch_size} on {device}")
    return path


def _sampled_messages(target, tokenizer, prefix_ids: list[int], batch_size: int, max_tokens: int, stop: set,
                      seed: int) -> list[list[int]]:
    """batch_size continuations of prefix_ids sampled at temperature 1 (torch's global seed set to `seed`): the
    token ids after the prefix, up to an end token or max_tokens."""
    pad_id = models.pad_token_id(tokenizer)
    prefix = torch.tensor([prefix_ids] * batch_size, device=target.device)
    torch.manual_seed(seed)
    with torch.inference_mode():
        out = peers.plain_generate(target, prefix, GenerationConfig(
            do_sample=True, temperature=1.0, top_k=0, top_p=1.0, max_new_tokens=max_tokens,
            eos_token_id=sorted(stop), pad_token_id=pad_id))
    return out[:, prefix.shape[1]:].tolist()
