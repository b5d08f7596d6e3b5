"""Benchmark generation: answer files in the FastChat / EAGLE / Spec-Bench format.

One JSON line per finished question, appended as soon as the question is done:
{question_id, answer_id, model_id, category, choices: [{index, turns, idxs,
new_tokens, wall_time, accept_lengths}], tstamp}, with `accept_lengths` one
flat list per choice (every cycle of every turn, in order; `idxs` says how
many belong to each turn), as Spec-Bench and EAGLE write it; files of ours
from before 2026-11-27 hold one list per turn, and both read (`turn_lengths`).
A rerun skips the question
ids already in the file; an interrupt never leaves a partial line.  Turns
after the first see the earlier turns and answers through the one prompt
builder (`prompts`): fastchat's template where fastchat knows the model
(vicuna, llama-2, ...), the tokenizer's chat template otherwise.

Under `accelerate launch` every process answers its share of the questions
into its own shard file next to the answer file; the main process merges the
shards into the answer file, sorted by question id, once all are done (and
any rerun merges shards an interrupted run left behind).
"""

from __future__ import annotations

import json
import os
import time
import uuid
from dataclasses import dataclass
from pathlib import Path

from tqdm import tqdm

from . import jsonl, models, prompts
from .errors import UsageError


@dataclass(frozen=True)
class Settings:
    """How each question is answered."""

    method: str = "eagle"
    max_new_tokens: int = 128
    temperature: float = 0.0
    seed: int = 0
    profile: bool = False
    turns: int | None = None  # answer only the first turns (None: all)


def fastchat_template(model_spec: str | None):
    """fastchat's conversation template for the model, or None where fastchat has none of its own."""
    return prompts.fastchat_template(model_spec)


def conversation_ids(tokenizer, turns: list[str], answers: list[str], template=None) -> list[int]:
    """Token ids of the conversation so far, ending where the assistant's next answer starts (`prompts`)."""
    return prompts.conversation_ids(tokenizer, turns, answers, template=template)


def answer(decoder, tokenizer, question: dict, settings: Settings, template=None) -> dict:
    """The question's turns (the first `settings.turns`, or all); each turn sees the earlier answers."""
    turns, idxs, new_tokens, wall_time, accept_lengths, profiles, captures = [], [], [], [], [], [], []
    for index in range(min(len(question["turns"]), settings.turns or len(question["turns"]))):
        prompt = conversation_ids(tokenizer, question["turns"][: index + 1], turns, template)
        result = decoder.generate(prompt, settings.max_new_tokens, settings.temperature, settings.seed + index,
                                  settings.method, profile=settings.profile)
        turns.append(tokenizer.decode(result.token_ids, skip_special_tokens=True).strip())
        idxs.append(result.cycles)
        new_tokens.append(result.new_tokens)
        wall_time.append(result.wall_time_s)
        accept_lengths.append(result.accept_lengths)
        profiles.append(result.profile)
        captures.append(getattr(result, "graph_capture_s", 0.0))
    choice = {"index": 0, "turns": turns, "idxs": idxs, "new_tokens": new_tokens, "wall_time": wall_time,
              "accept_lengths": [n for lengths in accept_lengths for n in lengths]}
    # CUDA graphs captured during a turn: seconds kept out of its wall_time, said here
    return choice | ({"profile": profiles} if settings.profile else {}) | (
        {"graph_capture_time": captures} if any(captures) else {})


ANSWER_LISTS = ("turns", "new_tokens", "idxs", "wall_time")  # one entry per turn in choices[0]


def turn_lengths(choice: dict) -> list[list[int]]:
    """A choice's accepted lengths per turn: one flat list split by `idxs` (cycles per turn), or the per-turn
    lists of our older files (a turn without cycles: []); [] when the file has none (our peers' files before
    2026-11-27: one empty list a turn), one list when a flat list does not split by idxs."""
    lengths = choice.get("accept_lengths") or []
    if not lengths or isinstance(lengths[0], list):
        return [list(turn) for turn in lengths] if any(lengths) else []
    idxs = choice.get("idxs") or []
    if sum(idxs) != len(lengths):
        return [list(lengths)]
    turns, start = [], 0
    for count in idxs:
        turns.append(list(lengths[start : start + count]))
        start += count
    return turns


def _answer_fault(row) -> str | None:
    """What keeps `row` from being an answer record the reports can read (None when it is one)."""
    if not isinstance(row, dict) or "question_id" not in row:
        return "no question_id"
    choices = row.get("choices")
    if not isinstance(choices, list) or not choices or not isinstance(choices[0], dict):
        return "no choices[0]"
    turns = [choices[0].get(key) for key in ANSWER_LISTS]
    missing = [key for key, value in zip(ANSWER_LISTS, turns) if not isinstance(value, list)]
    if missing:
        return f"no list choices[0].{missing[0]}"
    if len({len(value) for value in turns}) > 1:
        return f"choices[0].{'/'.join(ANSWER_LISTS)} of different lengths"
    return None


def read_rows(answer_file: Path) -> list[dict]:
    """The finished questions of an answer file (none if it does not exist; a line cut short is not one, see
    jsonl.py); a line that is not an answer record (an edited or foreign file) is a one-line error naming it."""
    numbered = jsonl.lines(answer_file)  # read once: the records and their line numbers
    rows = jsonl.decode(numbered, str(answer_file), "delete that line, and a rerun writes its record again")
    for (number, _), row in zip(numbered, rows):
        fault = _answer_fault(row)
        if fault:
            raise UsageError(f"answer file {answer_file}, line {number} is not an answer record ({fault}): "
                             f"delete that line, and `eagle-mdsd bench` answers its question again")
    return rows


def shard_files(answer_file: Path) -> list[Path]:
    return sorted(answer_file.parent.glob(f"{answer_file.stem}.shard*.jsonl"))


def finished_ids(answer_file: Path) -> set[int]:
    """Question ids finished in the answer file or in any of its shards."""
    return {row["question_id"] for path in [answer_file, *shard_files(answer_file)] for row in read_rows(path)}


def merge_shards(answer_file: Path) -> None:
    """Fold the shard files into the answer file, one line per question id, sorted; atomic."""
    shards = shard_files(answer_file)
    if not shards:
        return
    rows: dict[int, dict] = {}
    for path in [answer_file, *shards]:
        for row in read_rows(path):
            rows.setdefault(row["question_id"], row)
    staging = answer_file.with_suffix(".merging")
    staging.write_text("".join(json.dumps(rows[qid]) + "\n" for qid in sorted(rows)))
    os.replace(staging, answer_file)
    for path in shards:
        path.unlink()


def run(decoder, tokenizer, questions: list[dict], answer_file: Path, model_id: str, settings: Settings,
        template=None, warmup: bool = True, process: tuple[int, int] = (0, 1), progress: bool = True,
        share_out: bool = True) -> Path:
    """Answer the unfinished `questions` into `answer_file`; process = (index, count) shares them out and writes
    this process's shard file (share_out False: the caller already gave this process its own questions)."""
    index, count = process
    answer_file = Path(answer_file)
    answer_file.parent.mkdir(parents=True, exist_ok=True)
    done = finished_ids(answer_file)
    # Share out the full list, not what is left: the shares must not depend on when each process looks.
    todo = [q for q in (questions[index::count] if share_out else questions) if q["question_id"] not in done]
    target_file = answer_file if count == 1 else answer_file.with_name(
        f"{answer_file.stem}.shard{index:03d}-of-{count:03d}.jsonl")
    jsonl.drop_cut_short_line(target_file)
    if todo and warmup:  # first calls pay one-off costs (allocations, kernels): not timed
        decoder.generate(conversation_ids(tokenizer, ["Hello!"], [], template), 16, settings.temperature,
                         settings.seed, settings.method)
    for question in tqdm(todo, desc=f"{model_id} {settings.method}", disable=index > 0 or not progress):
        choice = answer(decoder, tokenizer, question, settings, template)
        line = json.dumps({"question_id": question["question_id"], "answer_id": uuid.uuid4().hex,
                           "model_id": model_id, "category": question.get("category"), "choices": [choice],
                           "tstamp": time.time()})
        with target_file.open("a") as handle:  # one write per finished question
            handle.write(line + "\n")
    return target_file
