"""The MT-Bench benchmark: every method answers the same questions, the report gives the speedups.

EAGLE, plain autoregressive decoding in the same loop (`baseline`), transformers `generate` and prompt lookup
answer question by question in turn (so slow drifts of a noisy machine hit every method alike), into one answer
file per method and temperature; then the page gives the speedups over each of them.  A run resumes from its
answer files, and only when those were made the same way: the run folder's settings.json records the head (a
checksum of its files), dtype, trees, pair, draft vocabulary, seed and length, and a rerun with other settings
under the same name is refused, and so is a file whose rows record other settings (`bench.check_answer_file`).
A fresh run's folder is made in one `os.mkdir` before the model loads and its pages must not exist yet; a
resumed run rewrites its own page, which lists the questions its table holds.  Ctrl-C ends in one line with
the `--resume` command that continues the run.

This module calls the parts below it in order - plans, selection, records, runners, answering, pages - and
none of them calls back up.
"""

from __future__ import annotations

import dataclasses
import datetime
from pathlib import Path

from .. import bench, checkpoint, head, models, questions
from ..errors import Interrupted
from . import answering, pages, records, runners, selection
from .plans import BenchmarkPlan, benchmark_setups, parse_sampling_pair


@dataclasses.dataclass(frozen=True)
class Run:
    """A benchmark run laid out before any model loads: its name, date, page stem and answer folder, its
    questions (`chosen` out of `all_questions`), EAGLE's setups and the pair it samples with at T > 0."""

    name: str
    date: str
    stem: Path
    folder: Path
    all_questions: list
    chosen: list
    setups: list
    sampled: tuple


def run_benchmark(out: Path, answers: Path, plan: BenchmarkPlan = BenchmarkPlan(), process: tuple[int, int] = (0, 1),
                  barrier=lambda: None, command: str | None = None) -> dict | None:
    """`answer_and_report`; Ctrl-C once the run's folder is there ends in one line (`Interrupted`) saying how
    many questions every method answered and the command that continues the run."""
    progress = {}  # set as the run goes: its folder, the questions this process answers, how many are done
    try:
        return answer_and_report(out, answers, plan, process, barrier, command, progress)
    except KeyboardInterrupt:
        if "folder" not in progress:
            raise  # nothing of the run is written yet
        done, mine = progress["answered"], progress["questions"]
        raise Interrupted(f"{done} of {mine} questions are answered by every method in {progress['folder']}, "
                          f"{mine - done} are not (answers under way are dropped whole) and the page is not "
                          f"written; continue with "
                          f"`{records.resume_command(command, progress['folder'].name, 'benchmark')}`") from None


def answer_and_report(out: Path, answers: Path, plan: BenchmarkPlan = BenchmarkPlan(),
                      process: tuple[int, int] = (0, 1), barrier=lambda: None, command: str | None = None,
                      progress: dict | None = None) -> dict | None:
    """Answer into answers/NAME/, then report into out/NAME.{json,md,_t*.png} (naming `command`, the command
    line that ran it, when given); a rerun with the same name resumes, and Ctrl-C names the command that does.
    process = (index, count) of processes started together (accelerate launch, torchrun): each answers
    every count-th question into shard files, `barrier` waits for all of them, and the first merges the shards
    and reports (the others return None)."""
    index, count = process
    progress = {} if progress is None else progress
    run = lay_out(out, answers, plan)
    if index == 0:  # (the others wait for it at their first barrier)
        records.open_run_folder(run.folder, pages.benchmark_pages(run.stem, plan.temperatures), plan.new_run,
                                "benchmark")
    progress.update(folder=run.folder, questions=len(run.chosen[index::count]), answered=0)
    target, tokenizer = models.load_target(None, models.parse_dtype(plan.dtype), plan.device)
    used_kernels = runners.kernels_used(plan.kernels_choice, target, plan.cuda_graphs)
    draft_head = head.load_head(models.DEFAULT_HEAD, target) if "eagle" in plan.methods else None
    by_label, made_with = runners.benchmark_runners(plan, run.setups, target, tokenizer, draft_head)
    draft_vocab = head.resolve_draft_vocab(draft_head, plan.draft_vocab)
    checksum = checkpoint.head_checksum(models.DEFAULT_HEAD) if draft_head is not None else None
    if index > 0:
        barrier()  # the first process records the settings and the machine before the others read them
    records.check_settings(run.folder, settings_record(run, plan, checksum, draft_vocab, used_kernels))
    files = {(t, label): run.folder / records.file_safe(
        f"{plan.bench_name}-{models.EMBEDDED_NAME}-{label}-{records.temperature_tag(t)}.jsonl")
        for t in plan.temperatures for sampled, label in by_label if sampled == (t > 0)}
    eagle = {key: value | {"draft_vocab": draft_vocab, "head": checksum} for key, value in made_with.items()}
    context = answering.base_context(plan.dtype)
    row_settings = {(t, label): bench.Settings(by_label[t > 0, label][0], plan.max_new_tokens, t, plan.seed,
                                               context=tuple((context | eagle.get((t > 0, label), {})).items()))
                    for t, label in files}
    timed_on = answering.check_files(run.folder, files, row_settings, run.chosen, plan.device, vouched=True)
    if index == 0:
        barrier()
    warmup = answer(run, plan, by_label, files, row_settings, tokenizer, process, progress)
    barrier()
    if index > 0:
        return None
    for answer_file in files.values():
        bench.merge_shards(answer_file)
    result = result_record(run, plan, timed_on, warmup, draft_vocab, used_kernels, files, command)
    pages.write_benchmark(run.stem, result, tables(plan, by_label, files))
    return result


def lay_out(out: Path, answers: Path, plan: BenchmarkPlan) -> Run:
    """The run of `plan`, its trees, pairs and questions checked before any model loads."""
    sampled = parse_sampling_pair(plan.sampling_pair, plan.drafter, plan.verifier)
    setups = benchmark_setups(plan.trees, plan.drafter, plan.verifier, sampled, plan.sampling_tree,
                              plan.device)
    all_questions = questions.load(plan.bench_name)
    date = datetime.date.today().isoformat()
    name = plan.name or f"benchmark_{date}_{plan.dtype}"
    return Run(name, date, Path(out) / name, Path(answers) / name, all_questions,
               selection.spread(all_questions, plan.count), setups, sampled)


def settings_record(run: Run, plan: BenchmarkPlan, checksum: str | None, draft_vocab, used_kernels: str) -> dict:
    """What the run folder's settings.json records of how its answers are made (`records.check_settings`)."""
    return {"head": checksum, "dtype": plan.dtype,
            "bench": plan.bench_name, "max_new_tokens": plan.max_new_tokens, "seed": plan.seed,
            "trees": [s[False][0] for s in run.setups], "drafter": plan.drafter, "verifier": plan.verifier,
            "draft_vocab": draft_vocab, "sampling_pair": "/".join(run.sampled), "kernels": used_kernels,
            **({} if plan.sampling_tree == "same" else {"sampling_tree": plan.sampling_tree}),  # older runs: none
            **({} if plan.cuda_graphs == "auto" else {"cuda_graphs": plan.cuda_graphs})}


def answer(run: Run, plan: BenchmarkPlan, by_label: dict, files: dict, row_settings: dict, tokenizer,
           process: tuple[int, int], progress: dict) -> dict | None:
    """This process's questions into `files`, every method in turn, after a warm-up on a question outside the
    set (`runners.warm_up`, whose record this returns; None when every answer is there and the run only
    reports)."""
    index, count = process
    mine = run.chosen[index::count]
    warmup = None
    if answering.unfinished(files, mine):
        spare = selection.warmup_question(run.all_questions, run.chosen)
        warmup = runners.warm_up(by_label, files, tokenizer, spare, plan,
                                 runners.longest_turn(tokenizer, run.chosen + [spare], plan.max_new_tokens))
    answering.answer_in_turn(by_label, tokenizer, mine, files, row_settings, process, progress,
                             f"{plan.bench_name} questions, each into {len(files)} answer files")
    return warmup


def result_record(run: Run, plan: BenchmarkPlan, timed_on: dict, warmup: dict | None, draft_vocab,
                  used_kernels: str, files: dict, command: str | None) -> dict:
    """The run's result, its tables still to come ('temperatures'): what its JSON holds and its page shows."""
    return {"name": run.name, "date": run.date, "machine": timed_on, **({"command": command} if command else {}),
            "bench": plan.bench_name, "warmup": warmup,
            "questions": records.held_questions(files.values()),
            "dtype": plan.dtype, "device": plan.device, "max_new_tokens": plan.max_new_tokens,
            "trees": [setup[False][0] for setup in run.setups],
            "drafter": plan.drafter, "verifier": plan.verifier,
            "sampling_pair": "/".join(run.sampled), "sampling_tree": plan.sampling_tree,
            "draft_vocab": draft_vocab, "kernels": used_kernels,
            "temperatures": {}}


def tables(plan: BenchmarkPlan, by_label: dict, files: dict) -> dict:
    """temperature -> (its answer files, their labels, the baseline's file or None): the page's tables."""
    result = {}
    for t in plan.temperatures:
        baseline = files[t, "baseline"] if "baseline" in plan.methods else None
        labels = [label for sampled, label in by_label if sampled == (t > 0) and (t, label) in files]
        result[t] = ([files[t, label] for label in labels], labels, baseline)
    return result
