"""Benchmark generation: answer files in the FastChat / EAGLE / Spec-Bench format.

One JSON line per finished question, appended as soon as the question is done:
{question_id, answer_id, model_id, category, choices: [{index, turns, idxs,
new_tokens, wall_time, accept_lengths}], tstamp}.  A rerun skips the question
ids already in the file; an interrupt never leaves a partial line.  Turns
after the first see the earlier turns and answers through the chat template.
"""

from __future__ import annotations

import json
import time
import uuid
from pathlib import Path

from tqdm import tqdm

from . import models


def conversation_ids(tokenizer, turns: list[str], answers: list[str]) -> list[int]:
    messages = []
    for i, turn in enumerate(turns):
        messages.append({"role": "user", "content": turn})
        if i < len(answers):
            messages.append({"role": "assistant", "content": answers[i]})
    ids = tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=True)
    return [int(i) for i in (ids["input_ids"] if hasattr(ids, "keys") else ids)]


def answer(decoder, tokenizer, question: dict, max_new_tokens: int, temperature: float, seed: int,
           method: str) -> dict:
    turns, idxs, new_tokens, wall_time, accept_lengths = [], [], [], [], []
    for index in range(len(question["turns"])):
        prompt = conversation_ids(tokenizer, question["turns"][: index + 1], turns)
        result = decoder.generate(prompt, max_new_tokens, temperature, seed + index, method)
        turns.append(tokenizer.decode(result.token_ids, skip_special_tokens=True).strip())
        idxs.append(result.cycles)
        new_tokens.append(result.new_tokens)
        wall_time.append(result.wall_time_s)
        accept_lengths.append(result.accept_lengths)
    return {"index": 0, "turns": turns, "idxs": idxs, "new_tokens": new_tokens, "wall_time": wall_time,
            "accept_lengths": accept_lengths}


def finished_ids(answer_file: Path) -> set[int]:
    if not answer_file.exists():
        return set()
    return {json.loads(line)["question_id"] for line in answer_file.read_text().splitlines() if line.strip()}


def run(decoder, tokenizer, questions: list[dict], answer_file: Path, model_id: str, max_new_tokens: int = 128,
        temperature: float = 0.0, seed: int = 0, method: str = "eagle", warmup: bool = True) -> Path:
    answer_file.parent.mkdir(parents=True, exist_ok=True)
    done = finished_ids(answer_file)
    todo = [q for q in questions if q["question_id"] not in done]
    if todo and warmup:  # first calls pay one-off costs (allocations, kernels): not timed
        decoder.generate(models.chat_prompt_ids(tokenizer, "Hello!"), 16, temperature, seed, method)
    for question in tqdm(todo, desc=f"{model_id} {method}"):
        choice = answer(decoder, tokenizer, question, max_new_tokens, temperature, seed, method)
        line = json.dumps({"question_id": question["question_id"], "answer_id": uuid.uuid4().hex,
                           "model_id": model_id, "category": question.get("category"), "choices": [choice],
                           "tstamp": time.time()})
        with answer_file.open("a") as handle:  # one write per finished question
            handle.write(line + "\n")
    return answer_file


def summarise(answer_file: Path) -> dict:
    """tau, tokens/s and totals per category and overall, recomputed from the file."""
    rows = [json.loads(line) for line in Path(answer_file).read_text().splitlines() if line.strip()]
    groups: dict[str, list[dict]] = {"all": rows}
    for row in rows:
        groups.setdefault(row.get("category") or "unknown", []).append(row)
    summary = {}
    for name, group in groups.items():
        tokens = sum(sum(r["choices"][0]["new_tokens"]) for r in group)
        cycles = sum(sum(r["choices"][0]["idxs"]) for r in group)
        seconds = sum(sum(r["choices"][0]["wall_time"]) for r in group)
        summary[name] = {"questions": len(group), "new_tokens": tokens, "cycles": cycles,
                         "tau": tokens / max(cycles, 1), "tokens_per_s": tokens / seconds if seconds else 0.0,
                         "wall_time_s": seconds}
    return summary
