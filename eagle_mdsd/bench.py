"""Benchmark generation: answer files in the FastChat / EAGLE / Spec-Bench format.

One JSON line per finished question, appended as soon as the question is done:
{question_id, answer_id, model_id, category, choices: [{index, turns, idxs,
new_tokens, wall_time, accept_lengths}], tstamp, settings}, with `accept_lengths` one
flat list per choice (every cycle of every turn, in order; `idxs` says how
many belong to each turn), as Spec-Bench and EAGLE write it; files of ours
from before 2026-11-27 hold one list per turn, and both read (`turn_lengths`).
`settings` is ours (other readers skip it): the method, tree, drafter and
verifier, temperature, token limit, seed, head checksum, dtype and base model
that made the row; a file holds rows of one setting, and appending others is
refused.  `question` (ours too) is a digest of the question's turns, so that
a question file edited under the same name is not resumed as if its answers
were the new text's.  A rerun skips the question ids already in the file; an
interrupt never leaves a partial line.  Turns
after the first see the earlier turns and answers through the one prompt
builder (`prompts`): fastchat's template where fastchat knows the model
(vicuna, llama-2, ...), the tokenizer's chat template otherwise.

Under `accelerate launch` every process answers its share of the questions
into its own shard file next to the answer file; the main process merges the
shards into the answer file, sorted by question id, once all are done (and
any rerun merges shards an interrupted run left behind).  Each process holds the
lock of the file it appends to (`locks`), so a second command on the same
answer file is refused in one line instead of answering the same questions.
"""

from __future__ import annotations

import glob
import hashlib
import json
import time
import uuid
from dataclasses import dataclass
from pathlib import Path

from tqdm import tqdm

from . import jsonl, outputs, prompts, validate
from .errors import Interrupted, UsageError, check_context


@dataclass(frozen=True)
class Settings:
    """How each question is answered."""

    method: str = "eagle"
    max_new_tokens: int = 128
    temperature: float = 0.0
    seed: int = 0
    profile: bool = False
    turns: int | None = None  # answer only the first turns (None: all)
    # what else made the answers, as (name, value) pairs: tree, drafter, verifier, draft vocabulary, head
    # checksum, dtype, base model (`cli.bench.settings`; `benchmark` for its runs)
    context: tuple = ()

    def record(self) -> dict:
        """What every answer row records under 'settings': the settings that made it, as JSON values."""
        made = {"method": self.method, "temperature": float(self.temperature), "max_new_tokens": self.max_new_tokens,
                "seed": self.seed, "turns": self.turns, **({"profile": True} if self.profile else {}),
                **dict(self.context)}
        return json.loads(json.dumps(made))  # as a row reads back (tuples as lists)


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


def _is_accept_lengths(value) -> bool:
    """One flat list of counts (Spec-Bench's and ours), or one list a turn (our older files)."""
    return validate.is_counts(value) or (isinstance(value, list) and all(validate.is_counts(v) for v in value))


def _is_profile(value) -> bool:
    return isinstance(value, list) and all(isinstance(turn, dict) and all(validate.is_seconds(v) for v in turn.values())
                                           for turn in value)


# An answer line, field by field: what Spec-Bench's and EAGLE's speed.py and our reports read.  Other fields are
# kept and not read.
ROW_SCHEMA = {
    "question_id": validate.Field(validate.is_int, "a whole number"),
    "model_id": validate.Field(validate.is_text, "a text", required=False, nullable=True),
    "category": validate.Field(validate.is_cell_text, "a text without '|' or line breaks (a table cell)",
                               required=False, nullable=True),
    "choices": validate.Field(lambda v: isinstance(v, list) and bool(v) and isinstance(v[0], dict),
                              "a non-empty list of objects"),
    "settings": validate.Field(lambda v: isinstance(v, dict), "an object", required=False),
    "question": validate.Field(validate.is_text, "a text", required=False),
}
CHOICE_SCHEMA = {
    "turns": validate.Field(validate.is_texts, "a list of texts"),
    "new_tokens": validate.Field(validate.is_counts, "a list of whole numbers of 0 or more"),
    "idxs": validate.Field(validate.is_counts, "a list of whole numbers of 0 or more"),
    "wall_time": validate.Field(validate.is_seconds_list, "a list of finite seconds of 0 or more"),
    "accept_lengths": validate.Field(_is_accept_lengths, "a list of whole numbers (or one such list a turn)",
                                     required=False),
    "profile": validate.Field(_is_profile, "a list of {phase: seconds} objects", required=False),
    "graph_capture_time": validate.Field(validate.is_seconds_list, "a list of finite seconds", required=False),
}
ANSWER_LISTS = ("turns", "new_tokens", "idxs", "wall_time")  # one entry per turn in choices[0]
MAX_TURN_TOKENS = 1 << 24  # far above any context a model has
MAX_CYCLE_TOKENS = 1 << 16  # far above a path through the largest tree (1,024 nodes) with its lookup graft
MAX_TURN_SECONDS = 1e7  # 116 days: a longer turn is a damaged record, whose tokens/s would read as 0


def _spec_bench_steps(row) -> None:
    """Spec-Bench names a turn's cycles `decoding_steps` where EAGLE and this project write `idxs`: its files read
    as ours (the key is added beside its own)."""
    choices = row.get("choices") if isinstance(row, dict) else None
    if isinstance(choices, list) and choices and isinstance(choices[0], dict) and "idxs" not in choices[0] \
            and "decoding_steps" in choices[0]:
        choices[0]["idxs"] = choices[0]["decoding_steps"]


def _answer_fault(row) -> str | None:
    """What keeps `row` from being an answer record the reports can read (None when it is one)."""
    fault = validate.record_fault(row, ROW_SCHEMA) or validate.record_fault(row["choices"][0], CHOICE_SCHEMA,
                                                                             "choices[0].")
    if fault:
        return fault
    choice = row["choices"][0]
    if len({len(choice[key]) for key in ANSWER_LISTS}) > 1:
        return f"choices[0].{'/'.join(ANSWER_LISTS)} of different lengths"
    most = max(choice["new_tokens"], default=0)
    if most > MAX_TURN_TOKENS:
        return f"choices[0].new_tokens holds {most}, more than a turn can generate ({MAX_TURN_TOKENS})"
    if any(tokens > 0 and seconds == 0 for tokens, seconds in zip(choice["new_tokens"], choice["wall_time"])):
        return "choices[0].wall_time holds 0 s for a turn that made tokens"
    slowest = max(choice["wall_time"], default=0.0)
    if slowest > MAX_TURN_SECONDS:
        return f"choices[0].wall_time holds {slowest:g} s, more than a turn can take ({MAX_TURN_SECONDS:g} s)"
    longest = max((n for turn in turn_lengths(choice) for n in turn), default=0)
    if longest > max(most, MAX_CYCLE_TOKENS):  # (a cycle's path may run past a turn's token budget: not refused)
        return f"choices[0].accept_lengths holds {longest}, more than a cycle can accept"
    return None


def read_rows(answer_file: Path) -> list[dict]:
    """The finished questions of an answer file (none if it does not exist; a line cut short is not one, see
    jsonl.py); a line that is not an answer record (an edited or foreign file), or a question answered twice, is
    a one-line error naming it."""
    numbered = jsonl.checked(answer_file, f"answer file {answer_file}", "an answer record", _answer_fault,
                             "delete that line, and `eagle-mdsd bench` answers its question again", _spec_bench_steps)
    seen = {}
    for number, row in numbered:
        if row["question_id"] in seen:
            raise UsageError(f"answer file {answer_file} answers question {row['question_id']} twice (lines "
                             f"{seen[row['question_id']]} and {number}): delete one of them")
        seen[row["question_id"]] = number
    return [row for _, row in numbered]


def settings_difference(made: dict, wanted: dict) -> str:
    """'key made -> wanted; ...' over the keys whose values differ."""
    keys = list(dict.fromkeys([*made, *wanted]))
    return "; ".join(f"{key} {json.dumps(made.get(key))} -> {json.dumps(wanted.get(key))}" for key in keys
                     if made.get(key) != wanted.get(key))


def check_answer_file(answer_file: Path, settings: Settings, questions: list[dict], vouched: bool = False,
                      fix: str = "pass another --answer-file, or the settings of its answers") -> None:
    """One-line error unless `questions` can be answered into `answer_file`: a file (made if missing) whose rows
    (and its shards') were made with `settings` - a file holds the answers of one setting, or its summary would
    average two.  Rows from before rows recorded their settings are taken as made with these only when
    `vouched` (a benchmark's settings.json says so) or when none of `questions` is left to append to them.
    `fix`: how the error says to go on (a run's files are not chosen by --answer-file)."""
    answer_file = Path(answer_file)
    if answer_file.is_dir():
        raise UsageError(f"--answer-file {answer_file} is a folder: give a .jsonl file in it (made if missing)")
    wanted = settings.record()
    unrecorded, finished, texts = 0, set(), {q["question_id"]: question_digest(q) for q in questions}
    for path in [Path(answer_file), *shard_files(Path(answer_file))]:
        for row in read_rows(path):
            finished.add(row["question_id"])
            made = row.get("settings")
            if made is None:
                unrecorded += 1
            elif made != wanted:
                raise UsageError(f"answer file {answer_file} holds answers made with other settings "
                                 f"({settings_difference(made, wanted)}): {fix}")
            expected = texts.get(row["question_id"])  # (rows from before rows recorded it pass)
            if expected is not None and row.get("question", expected) != expected:
                raise UsageError(f"answer file {answer_file} answers question {row['question_id']} as it read "
                                 f"before its question file was edited: restore the question's text, or start "
                                 f"another answer file (--answer-file; for a run, --name)")
    if unrecorded and not vouched and any(q["question_id"] not in finished for q in questions):
        raise UsageError(f"answer file {answer_file} holds {unrecorded} answers that record no settings (written "
                         f"before rows recorded them): pass another --answer-file to answer with these settings")


def question_digest(question: dict) -> str:
    """What an answer row records of its question's text: a digest of its turns."""
    return hashlib.sha256(json.dumps(question["turns"]).encode()).hexdigest()[:16]


def shard_files(answer_file: Path) -> list[Path]:
    return sorted(answer_file.parent.glob(f"{glob.escape(answer_file.stem)}.shard*.jsonl"))  # ([ and * are its name's)


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
    outputs.write_atomically(answer_file, "".join(json.dumps(rows[qid]) + "\n" for qid in sorted(rows)))
    for path in shards:
        path.unlink()


def target_file(answer_file: Path, process: tuple[int, int] = (0, 1)) -> Path:
    """The file process (index, count) appends to: the answer file, or under several processes its shard."""
    index, count = process
    answer_file = Path(answer_file)
    return answer_file if count == 1 else answer_file.with_name(
        f"{answer_file.stem}.shard{index:03d}-of-{count:03d}.jsonl")


def check_first_turns(decoder, tokenizer, questions: list[dict], settings: Settings, template=None) -> None:
    """A one-line error unless every question's first turn fits the target's context (later turns hold answers
    not made yet): a question too long is refused before the first answer, not hours into a run."""
    depth = decoder.tree.max_depth if settings.method == "eagle" else 0
    for question in questions:
        prompt = conversation_ids(tokenizer, question["turns"][:1], [], template)
        try:
            check_context(decoder.target, len(prompt), settings.max_new_tokens, depth)
        except UsageError as error:
            raise UsageError(f"question {question['question_id']}: {error}") from None


def run(decoder, tokenizer, questions: list[dict], answer_file: Path, model_id: str, settings: Settings,
        template=None, warmup: bool = True, process: tuple[int, int] = (0, 1), progress: bool = True,
        share_out: bool = True, vouched: bool = False, command: str | None = None) -> Path:
    """Answer the unfinished `questions` into `answer_file`; process = (index, count) shares them out and writes
    this process's shard file (share_out False: the caller already gave this process its own questions).  Every
    row records `settings`; a file of answers made otherwise is refused (`check_answer_file`).  Ctrl-C ends in
    `Interrupted`, saying what was answered and `command`, which continues.  The caller holds the lock of the file
    it appends to (`target_file`; the command's, `locks.held`) or of the run it belongs to."""
    index, count = process
    answer_file = Path(answer_file)
    check_answer_file(answer_file, settings, questions, vouched)
    done = finished_ids(answer_file)
    # Share out the full list, not what is left: the shares must not depend on when each process looks.
    todo = [q for q in (questions[index::count] if share_out else questions) if q["question_id"] not in done]
    check_first_turns(decoder, tokenizer, todo, settings, template)
    appended_to = target_file(answer_file, process)
    jsonl.drop_cut_short_line(appended_to)
    answered = 0
    try:
        if todo and warmup:  # first calls pay one-off costs (allocations, kernels): not timed
            decoder.generate(conversation_ids(tokenizer, ["Hello!"], [], template), 16, settings.temperature,
                             settings.seed, settings.method)
        for question in tqdm(todo, desc=f"{model_id} {settings.method}", disable=index > 0 or not progress):
            choice = answer(decoder, tokenizer, question, settings, template)
            jsonl.append(appended_to, {"question_id": question["question_id"], "answer_id": uuid.uuid4().hex,
                                       "model_id": model_id, "category": question.get("category"),
                                       "choices": [choice], "tstamp": time.time(), "settings": settings.record(),
                                       "question": question_digest(question)})
            answered += 1
    except KeyboardInterrupt:
        left = len(todo) - answered
        again = f"run `{command}` again" if command else "run the same command again"
        raise Interrupted(f"{len(questions) - left} of {len(questions)} questions are answered in {appended_to}, "
                          f"{left} are not (the one under way is dropped whole); {again} to answer the rest") from None
    return appended_to
