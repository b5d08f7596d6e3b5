"""The Spec-Bench / MT-Bench questions shipped with the package (data/spec_bench, Apache-2.0), and question
files of your own."""

from __future__ import annotations

import json
from collections import Counter
from pathlib import Path

from .errors import MissingFile, UsageError, read_text

QUESTION_FILE = Path(__file__).resolve().parent / "data" / "spec_bench" / "question.jsonl"
MT_BENCH_IDS = range(81, 161)


def _turns(record, where: str) -> list[str]:
    """A question record's user turns: its 'turns' (a list of texts) or its one 'prompt'; a one-line error else."""
    example = 'write one question a line as {"turns": ["first turn", ...]} or {"prompt": "..."}'
    if not isinstance(record, dict) or ("turns" not in record and "prompt" not in record):
        raise UsageError(f"{where} has neither 'turns' nor 'prompt': {example}")
    turns = record["turns"] if "turns" in record else [record["prompt"]]
    if not isinstance(turns, list) or not turns or not all(isinstance(t, str) and t.strip() for t in turns):
        raise UsageError(f"{where}: 'turns' must be a non-empty list of texts and 'prompt' a text, got "
                         f"{json.dumps(record.get('turns', record.get('prompt')))[:60]}: {example}")
    return turns


def from_file(path: Path) -> list[dict]:
    """The questions of a JSONL file of your own: Spec-Bench records (`turns`, optional `question_id` and
    `category`) or prompt records (`prompt`, as `train-head prompts` writes), one turn each; numbered by line
    where they carry no id, in the category named after the file where they name none."""
    path = Path(path)
    chosen = []
    for number, line in enumerate(read_text(path, "question file").splitlines()):
        if not line.strip():
            continue
        try:
            record = json.loads(line)
        except json.JSONDecodeError as error:
            raise UsageError(f"{path} line {number + 1} is not JSON ({error.msg}): write one JSON object a line")
        turns = _turns(record, f"{path} line {number + 1}")
        chosen.append({"question_id": record.get("question_id", number), "category": record.get("category", path.stem),
                       "turns": turns})
    twice = [i for i, count in Counter(q["question_id"] for q in chosen).items() if count > 1]
    if twice:
        raise UsageError(f"question_id {twice[0]} appears twice in {path}: answer files resume by id, so give every "
                         f"question its own (lines without one are numbered by line from 0)")
    return chosen


def load(bench: str = "mt_bench", path: Path = QUESTION_FILE) -> list[dict]:
    """Questions of `bench`: mt_bench, spec_bench (all 480), one category name, or a .jsonl file (`from_file`)."""
    if bench.endswith(".jsonl"):
        if not Path(bench).is_file():
            raise MissingFile(f"question file {bench} does not exist: give a JSONL file of questions")
        return from_file(Path(bench))
    if not Path(path).exists():
        raise MissingFile(f"question file {path} does not exist")
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
