"""Checks of what a user gives, where it enters: option values and the records of JSONL files.

Option checks raise argparse errors, which `Parser` prints as one line naming the input and the fix; files are
read through `errors.read_text` and `errors.read_json`.  Record schemas are small dicts of field -> `Field`,
checked field by field, so that a question, answer or prompt line of an odd type is refused when it is read,
before it can reach arithmetic, sorting or a model.
"""

from __future__ import annotations

import argparse
import json
import math
import re
import sys
from dataclasses import dataclass
from typing import Callable

from .errors import type_name

SEED_LIMIT = 2**63  # torch.manual_seed takes a signed 64-bit seed, and a turn's seed is seed + its index


class Parser(argparse.ArgumentParser):
    """argparse with its errors on one line (it prints the usage block first otherwise); --help keeps the usage."""

    def error(self, message):
        sys.stderr.write(f"{self.prog}: error: {message} (`{self.prog} --help` lists the options)\n")
        sys.exit(2)


def seed(text: str) -> int:
    """argparse type: a whole number from 0 to 2**63 - 1."""
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a whole number such as 0, got {text!r}") from None
    if not 0 <= value < SEED_LIMIT:
        raise argparse.ArgumentTypeError(f"must be from 0 to 2**63 - 1, got {text}")
    return value


_CUDA = re.compile(r"cuda(:\d{1,3})?")


def device(text: str) -> str:
    """argparse type: cpu, cuda or cuda:N."""
    if text == "cpu" or _CUDA.fullmatch(text):
        return text
    raise argparse.ArgumentTypeError(f"unknown device {text!r}: use cpu, cuda or cuda:N")


def device_or_auto(text: str) -> str:
    """argparse type: cpu, cuda, cuda:N, or auto (the model's layers spread over the visible GPUs)."""
    if text == "auto" or text == "cpu" or _CUDA.fullmatch(text):
        return text
    raise argparse.ArgumentTypeError(f"unknown device {text!r}: use cpu, cuda, cuda:N or auto")


def not_utf8(text: str) -> str | None:
    """Where `text` holds what is no UTF-8 text, or None: a byte of the command line that is no UTF-8 (Python
    keeps it as a lone surrogate), or a lone surrogate a JSON file escaped ("\\udcff"); a tokenizer fails on
    either."""
    for position, char in enumerate(text, 1):
        if "\ud800" <= char <= "\udfff":
            what = (f"byte 0x{ord(char) - 0xdc00:02x}" if "\udc80" <= char <= "\udcff"
                    else f"a lone surrogate \\u{ord(char):04x}")
            return f"{what} at character {position}"
    return None


# Checks of one decoded JSON value: True when it is of the kind the field wants.
def is_int(value) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def is_count(value) -> bool:
    return is_int(value) and value >= 0


def is_seconds(value) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value) and value >= 0


def is_text(value) -> bool:
    return isinstance(value, str)


def is_cell_text(value) -> bool:
    """A text a page's table can hold in one cell: no '|' and no line break."""
    return isinstance(value, str) and not any(mark in value for mark in "|\n\r")


def is_texts(value) -> bool:
    return isinstance(value, list) and all(isinstance(v, str) for v in value)


def is_counts(value) -> bool:
    return isinstance(value, list) and all(is_count(v) for v in value)


def is_seconds_list(value) -> bool:
    return isinstance(value, list) and all(is_seconds(v) for v in value)


@dataclass(frozen=True)
class Field:
    """One field of a record: its check, what it must be (for the message), and whether it may be absent or
    null."""

    check: Callable[[object], bool]
    must_be: str
    required: bool = True
    nullable: bool = False


def record_fault(record, schema: dict[str, Field], prefix: str = "") -> str | None:
    """What keeps `record` from matching `schema` (None when it does): the first field that is missing or of
    the wrong kind, named with `prefix` (e.g. 'choices[0].')."""
    if not isinstance(record, dict):
        return f"{prefix.rstrip('.') or 'the line'} is a JSON {type_name(record)}, not an object"
    for name, field in schema.items():
        if name not in record:
            if field.required:
                return f"no {prefix}{name}"
            continue
        value = record[name]
        if value is None and field.nullable:
            continue
        if not field.check(value):
            shown = json.dumps(value)
            shown = shown if len(shown) <= 40 else shown[:37] + "..."
            return f"{prefix}{name} must be {field.must_be}, not {shown}"
    return None
