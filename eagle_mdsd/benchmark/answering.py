"""Answering into a run's files: the settings every row records, the check of the files before any answer, and
the two orders runs answer in - question by question with every method in turn (the benchmark, so slow drifts
of a noisy machine hit every method alike) and cell by cell (the sweep)."""

from __future__ import annotations

from pathlib import Path

from tqdm import tqdm

from .. import bench, models, report
from . import records


def base_context(dtype: str) -> dict:
    """What every row of a run records beside its method's settings: the target's dtype and the model."""
    return {"dtype": str(models.parse_dtype(dtype)).removeprefix("torch."), "base_model": models.EMBEDDED}


def check_files(folder: Path, files: dict, row_settings: dict, chosen: list[dict], device: str,
                vouched: bool = False) -> dict:
    """Before any answer: every answer file of `files` (key -> path) holds only rows made with its
    `row_settings` (a file of other settings is refused, `bench.check_answer_file`); returns the machine the
    folder's answers are timed on (`records.timing_machine`)."""
    for key, answer_file in files.items():
        bench.check_answer_file(answer_file, row_settings[key], chosen, vouched=vouched,
                                fix="continue the run with the options it was made with, or pass --name NAME for a "
                                    "fresh run")
    return records.timing_machine(folder, files.values(), chosen, device)


def unfinished(files: dict, chosen: list[dict]) -> bool:
    """Whether any answer file of `files` lacks a question of `chosen`."""
    wanted = {q["question_id"] for q in chosen}
    return any(not wanted <= bench.finished_ids(answer_file) for answer_file in files.values())


def answer_in_turn(runners: dict, tokenizer, chosen: list[dict], files: dict, row_settings: dict,
                   process: tuple[int, int], progress: dict, desc: str) -> None:
    """Question by question, each into every (temperature, label) answer file of `files` in turn, with the
    runner of runners[sampled, label]; progress['answered'] counts the questions every method answered.
    `chosen` are this process's questions: each writes its own shard files."""
    for question in tqdm(chosen, desc=desc, disable=process[0] > 0):
        for (t, label), answer_file in files.items():
            method, runner = runners[t > 0, label]
            bench.run(runner, tokenizer, [question], answer_file, f"{models.EMBEDDED_NAME}-{label}",
                      row_settings[t, label], warmup=False, progress=False, process=process, share_out=False,
                      vouched=True)
        progress["answered"] += 1


def answer_cells(make_runner, tokenizer, chosen: list[dict], files: dict, row_settings: dict,
                 rows: list) -> None:
    """Cell by cell, (temperature, tree, drafter, verifier) -> answer file of `files`: `make_runner(cell)`
    answers `chosen` into it, and its totals (tau, tokens/s, new tokens) join `rows` as it finishes."""
    for cell in tqdm(files, desc="sweep cells"):
        t, tree_name, drafter, verifier = cell
        bench.run(make_runner(cell), tokenizer, chosen, files[cell], f"{models.EMBEDDED_NAME}-eagle",
                  row_settings[cell], progress=False)
        totals = report.summarise(files[cell])["all"]
        rows.append({"temperature": t, "tree": tree_name, "drafter": drafter, "verifier": verifier,
                     "tau": totals["tau"], "tokens_per_s": totals["tokens_per_s"],
                     "new_tokens": totals["new_tokens"]})
