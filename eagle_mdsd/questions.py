"""The Spec-Bench / MT-Bench questions shipped with the package (data/spec_bench, Apache-2.0), and question
files of your own."""

from __future__ import annotations

import json
from collections import Counter
from pathlib import Path

from . import validate
from .errors import MissingFile, UsageError, read_text

QUESTION_FILE = Path(__file__).resolve().parent / "data" / "spec_bench" / "question.jsonl"
MT_BENCH_IDS = range(81, 161)


EXAMPLE = 'write one question a line as {"turns": ["first turn", ...]} or {"prompt": "..."}'
# A question line, field by field (other fields are kept out of the answers, not refused): 'turns' or 'prompt'.
SCHEMA = {
    "turns": validate.Field(lambda v: isinstance(v, list) and bool(v) and all(isinstance(t, str) and t.strip()
                                                                               for t in v),
                            "a non-empty list of non-blank texts", required=False),
    "prompt": validate.Field(lambda v: isinstance(v, str) and bool(v.strip()), "a non-blank text", required=False),
    "question_id": validate.Field(validate.is_int, "a whole number", required=False),
    "category": validate.Field(validate.is_cell_text, "a text without '|' or line breaks (a table cell)",
                               required=False, nullable=True),
}


def _turns(record, where: str) -> list[str]:
    """A question record's user turns: its 'turns' (a list of texts) or its one 'prompt'; a one-line error else."""
    if isinstance(record, dict) and "turns" not in record and "prompt" not in record:
        raise UsageError(f"{where} has neither 'turns' nor 'prompt': {EXAMPLE}")
    fault = validate.record_fault(record, SCHEMA)
    if fault:
        raise UsageError(f"{where} is not a question ({fault}): {EXAMPLE}")
    turns = record["turns"] if "turns" in record else [record["prompt"]]
    for number, turn in enumerate(turns, 1):
        fault = validate.not_utf8(turn)
        if fault:
            raise UsageError(f"{where}, turn {number} holds {fault}, which is not UTF-8 text: write the turn as "
                             f"UTF-8 text")
    return turns


def from_file(path: Path) -> list[dict]:
    """The questions of a JSONL file of your own: Spec-Bench records (`turns`, optional `question_id` and
    `category`) or prompt records (`prompt`, as `train-head prompts` writes), one turn each; numbered by line
    where they carry no id, in the category named after the file where they name none."""
    path = Path(path)
    chosen = []
    for number, line in enumerate(read_text(path, "question file", "give a JSONL file of questions").splitlines()):
        if not line.strip():
            continue
        try:
            record = json.loads(line)
        except (json.JSONDecodeError, RecursionError) as error:
            why = error.msg if isinstance(error, json.JSONDecodeError) else "nested too deeply"
            raise UsageError(f"{path} line {number + 1} is not JSON ({why}): write one JSON object a line") from None
        turns = _turns(record, f"{path} line {number + 1}")
        chosen.append({"question_id": record.get("question_id", number),
                       "category": record.get("category") or path.stem, "turns": turns})
    if not chosen:
        raise UsageError(f"question file {path} holds no question: {EXAMPLE}")
    twice = [i for i, count in Counter(q["question_id"] for q in chosen).items() if count > 1]
    if twice:
        raise UsageError(f"question_id {twice[0]} appears twice in {path}: answer files resume by id, so give every "
                         f"question its own (lines without one are numbered by line from 0)")
    return chosen


def load(bench: str = "mt_bench", path: Path = QUESTION_FILE) -> list[dict]:
    """Questions of `bench`: mt_bench, spec_bench (all 480), one category name, or a .jsonl file (`from_file`)."""
    if bench.endswith(".jsonl"):
        if not Path(bench).exists():
            raise MissingFile(f"question file {bench} does not exist: give a JSONL file of questions")
        return from_file(Path(bench))
    if not Path(path).exists():
        raise MissingFile(f"question file {path} does not exist: reinstall eagle-mdsd, which ships it")
    questions = [json.loads(line) for line in Path(path).read_text().splitlines() if line.strip()]
    if bench == "spec_bench":
        return questions
    if bench == "mt_bench":
        return [q for q in questions if q["question_id"] in MT_BENCH_IDS]
    chosen = [q for q in questions if q["category"] == bench]
    if not chosen:
        categories = sorted({q["category"] for q in questions})
        raise UsageError(f"unknown bench {bench!r}: use mt_bench, spec_bench, a .jsonl question file or one of "
                         f"{', '.join(categories)}")
    return chosen


def select(bench: str, begin: int | None = None, end: int | None = None, path: Path = QUESTION_FILE) -> list[dict]:
    """Questions begin..end-1 (0-based, as a slice) of `bench`; an empty selection is an error."""
    every = load(bench, path)
    chosen = every[begin:end]
    if not chosen:
        raise UsageError(f"--question-begin {begin} --question-end {end} selects none of the {len(every)} questions "
                         f"of {bench}: give 0 <= begin < end <= {len(every)}")
    return chosen
