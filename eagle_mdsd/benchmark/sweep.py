"""The sweep: EAGLE with every (tree, drafter, verifier, temperature) cell of a plan that fits, tau and tokens/s
per cell on one page.  It resumes from its answer files like the benchmark (`records`), answering cell by cell
(`answering.answer_cells`)."""

from __future__ import annotations

import datetime
from pathlib import Path

from .. import bench, checkpoint, head, models, questions
from .. import tree as static_trees
from ..errors import Interrupted
from . import answering, pages, records, runners, selection
from .plans import SweepPlan, sweep_cells


def sweep(out: Path, answers: Path, plan: SweepPlan = SweepPlan(), command: str | None = None) -> Path:
    """EAGLE with every (tree, pair, temperature) of `plan` that fits; tau and tokens/s per cell into
    out/<name>.{md,json}; Ctrl-C names the command (`command`, the one that ran it, made to resume) that
    continues."""
    topologies, cells = sweep_cells(plan)
    chosen = selection.spread(questions.load(plan.bench_name), plan.count)
    name = plan.name or f"sweep_{datetime.date.today().isoformat()}_{plan.dtype}"
    out, folder = Path(out), Path(answers) / name
    records.open_run_folder(folder, [out / f"{name}.md", out / f"{name}.json"], plan.new_run, "sweep")
    rows = []
    try:  # from here on, the run's folder is there (empty while the model loads) and resumes
        target, tokenizer = models.load_target(None, models.parse_dtype(plan.dtype), plan.device)
        draft_head = head.load_head(models.DEFAULT_HEAD, target)
        draft_vocab = head.resolve_draft_vocab(draft_head, plan.draft_vocab)
        files, row_settings = cell_files(folder, plan, cells, draft_vocab, topologies)
        timed_on = answering.check_files(folder, files, row_settings, chosen, plan.device)

        def make_runner(cell):
            t, tree_name, drafter, verifier = cell
            return runners.make_runner("eagle", target, tokenizer, draft_head, topologies[tree_name], drafter,
                                       verifier, plan.draft_vocab, plan.kernels_choice, plan.cuda_graphs)

        answering.answer_cells(make_runner, tokenizer, chosen, files, row_settings, rows)
    except KeyboardInterrupt:
        raise Interrupted(f"{len(rows)} of {len(cells)} cells are answered in {folder}, "
                          f"{len(cells) - len(rows)} are not (an answer under way is dropped whole) and the page is "
                          f"not written; continue with `{records.resume_command(command, name, 'sweep')}`") from None
    result = {"machine": timed_on, "dtype": plan.dtype, "bench": plan.bench_name, "draft_vocab": draft_vocab,
              "kernels": runners.kernels_used(plan.kernels_choice, target, plan.cuda_graphs),
              "questions": records.held_questions(files.values()), "turns": plan.turns,
              "max_new_tokens": plan.max_new_tokens, "rows": rows}
    return pages.write_sweep(out, name, result)


def cell_files(folder: Path, plan: SweepPlan, cells: list[tuple], draft_vocab, topologies: dict) -> tuple[dict, dict]:
    """({cell: its answer file}, {cell: the bench.Settings its rows record}) of every cell.  The files are not
    named by the bench, so the rows record it: a resumed sweep of another bench is refused."""
    context = answering.base_context(plan.dtype) | {"bench": plan.bench_name, "draft_vocab": draft_vocab,
                                                     "head": checkpoint.head_checksum(models.DEFAULT_HEAD)}
    files, row_settings = {}, {}
    for cell in cells:
        t, name, drafter, verifier = cell
        cell_context = context | {"tree": name, **static_trees.file_record(topologies[name]), "drafter": drafter,
                                  "verifier": verifier}
        files[cell] = folder / records.file_safe(f"{name}-{drafter}-{verifier}-{records.temperature_tag(t)}.jsonl")
        row_settings[cell] = bench.Settings("eagle", plan.max_new_tokens, t, plan.seed, turns=plan.turns,
                                            context=tuple(cell_context.items()))
    return files, row_settings
