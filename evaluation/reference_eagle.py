"""EAGLE's reference code (PyPI eagle-llm 1.2.1) against this engine: same target, head, tree and questions.

    bash scripts/setup_reference.sh && .venv/bin/python evaluation/reference_eagle.py [--questions 8]

The embedded default, its shipped head (written in the EAGLE-1 format the
reference reads), EAGLE's default tree, the main benchmark's MT-Bench
questions (one per category, both turns, 128 new tokens). Three arms answer
each turn:

- `reference`: eagle-llm's `EaModel.eagenerate`, in its own process under
  .venv-ref (it needs transformers 4.x; evaluation/reference_worker.py says
  what is set around it);
- `ours`: this engine as the main benchmark runs EAGLE (draft vocabulary
  auto; T = 0 top-k drafts, T > 0 drafts without replacement verified by
  rrs_wo; packed kernels in bf16);
- `ours_full_vocab`: the same, but drafting over the whole vocabulary as
  the reference does (it draws the top-k tokens of the head's distribution
  at T = 0 and samples them without replacement, verified by recursive
  rejection sampling, at T > 0: our topk/topk and without_replacement/rrs_wo
  pairs). At T = 0 in float32 it makes the reference's trees, so the same
  tokens and cycles, and the speed difference is the implementation's alone.

Question by question the arms take turns (the order rotates), never at the
same time: the reference's process waits on its input while this one runs.
Each arm continues its own conversation. Answers go to
evaluation/answers/reference_eagle/NAME/ (one FastChat line per question;
a rerun resumes), the report to evaluation/results/NAME.md with tokens/s,
tau, speedup over the reference, and how many answers the arms share.
"""

from __future__ import annotations

import argparse
import datetime
import json
import subprocess
import tempfile
from pathlib import Path

import torch
import transformers
from tqdm import tqdm

from eagle_mdsd import bench, benchmarks, checkpoint, engine, head, models, questions, report, tree
from eagle_mdsd.benchmark import plans, records, selection

ROOT = Path(__file__).resolve().parent.parent
REFERENCE_PYTHON = ROOT / ".venv-ref" / "bin" / "python"
WORKER = Path(__file__).resolve().parent / "reference_worker.py"
ARMS = ("reference", "ours", "ours_full_vocab")
RUNS = ("float32:0", "bfloat16:0", "bfloat16:1")


class ReferenceDecoder:
    """eagle-llm answering in a worker process, behind the engine's `generate`."""

    def __init__(self, target, head_folder: Path, dtype: str, eos: int):
        if not REFERENCE_PYTHON.exists():
            raise FileNotFoundError(f"{REFERENCE_PYTHON.relative_to(ROOT)} does not exist: run "
                                    f"`bash scripts/setup_reference.sh` first")
        self.worker = subprocess.Popen(
            [str(REFERENCE_PYTHON), str(WORKER), "--model", target.name_or_path, "--head", str(head_folder),
             "--dtype", dtype, "--eos", str(eos)], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
        started = json.loads(self.worker.stdout.readline() or "{}")
        if "ready" not in started:
            raise RuntimeError("the reference worker did not start: see its error above")
        self.transformers_version = started["transformers"]

    def generate(self, prompt_ids, max_new_tokens, temperature, seed=0, method="eagle", profile=False):
        request = {"ids": list(prompt_ids), "max_new_tokens": max_new_tokens, "temperature": temperature,
                   "seed": seed}
        self.worker.stdin.write(json.dumps(request) + "\n")
        self.worker.stdin.flush()
        line = self.worker.stdout.readline()
        if not line:
            raise RuntimeError("the reference worker stopped: see its error above")
        answer = json.loads(line)
        return engine.GenerationResult(list(prompt_ids), answer["token_ids"], answer["cycles"],
                                       answer["accept_lengths"], wall_time_s=answer["wall_time_s"])

    def close(self) -> None:
        self.worker.stdin.close()
        self.worker.wait()


def parse_run(text: str) -> tuple[str, float]:
    dtype, _, temperature = text.partition(":")
    if dtype not in ("float32", "bfloat16") or not temperature:
        raise ValueError(f"run {text!r}: write DTYPE:TEMPERATURE with DTYPE float32 or bfloat16, e.g. bfloat16:0")
    if float(temperature) < 0:
        raise ValueError(f"run {text!r}: the temperature must be >= 0")
    return dtype, float(temperature)


def answer_files(runs, folder: Path) -> dict:
    """{(dtype, temperature, arm): answer file} of every run and arm."""
    return {(dtype, t, arm): folder / f"{arm}-{dtype}-t{t:g}.jsonl" for dtype, t in runs for arm in ARMS}


def answer_all(runs, chosen, folder: Path, max_new_tokens: int) -> str:
    """Answer every (run, arm) into its answer file; returns the transformers version the reference ran on."""
    files, versions = answer_files(runs, folder), set()
    topology = tree.load("eagle_default")
    for dtype in dict.fromkeys(d for d, _ in runs):
        temperatures = [t for d, t in runs if d == dtype]
        target, tokenizer = models.load_target(None, models.parse_dtype(dtype))
        draft_head = head.load_head(models.DEFAULT_HEAD, target)
        eos = models.eos_token_ids(target, tokenizer)
        with tempfile.TemporaryDirectory() as scratch:
            head.save_head(draft_head, scratch, target)  # the EAGLE-1 format, as released heads come
            reference = ReferenceDecoder(target, Path(scratch), dtype, eos[0])
            versions.add(reference.transformers_version)
            pairs = {t: plans.SAMPLING_PAIR.split("/") if t > 0 else ("topk", "topk") for t in temperatures}
            ours = {(t, vocab): engine.Decoder(target, draft_head, topology, *pairs[t], eos, draft_vocab=vocab)
                    for t in temperatures for vocab in ("auto", None)}
            arms = {"reference": lambda t: reference, "ours": lambda t: ours[t, "auto"],
                    "ours_full_vocab": lambda t: ours[t, None]}
            warm = models.chat_prompt_ids(tokenizer, "Hello!")
            for t in temperatures:
                for arm in ARMS:  # one-off costs (allocations, kernels)
                    arms[arm](t).generate(warm, 16, t, 0)
            for index, question in enumerate(tqdm(chosen, desc=f"{dtype}: {len(ARMS)} arms x {temperatures}")):
                for t in temperatures:
                    order = ARMS[index % len(ARMS):] + ARMS[: index % len(ARMS)]
                    for arm in order:
                        bench.run(arms[arm](t), tokenizer, [question], files[dtype, t, arm],
                                  f"{models.EMBEDDED_NAME}-{arm}", bench.Settings("eagle", max_new_tokens, t),
                                  warmup=False, progress=False)
            reference.close()
    return ", ".join(sorted(versions))


def same_answers(first: Path, second: Path) -> tuple[int, int]:
    """(turns with the same text, turns answered by both)."""
    left = {row["question_id"]: row["choices"][0]["turns"] for row in bench.read_rows(first)}
    right = {row["question_id"]: row["choices"][0]["turns"] for row in bench.read_rows(second)}
    pairs = [(a, b) for qid in left.keys() & right.keys() for a, b in zip(left[qid], right[qid])]
    return sum(a == b for a, b in pairs), len(pairs)


def write_report(runs, files, folder_name: str, name: str, chosen, max_new_tokens: int,
                 reference_transformers: str, timed_on: dict) -> Path:
    lines = ["| dtype | T | arm | tokens/s | tau | ms per cycle | speedup over the reference | same answers as "
             "the reference |", "|---|---|---|---|---|---|---|---|"]
    for dtype, t in runs:
        reference = report.summarise(files[dtype, t, "reference"])["all"]
        for arm in ARMS:
            totals = report.summarise(files[dtype, t, arm])["all"]
            same = "-" if arm == "reference" else "{} / {}".format(*same_answers(files[dtype, t, "reference"],
                                                                                 files[dtype, t, arm]))
            lines.append(f"| {dtype} | {t:g} | {arm} | {totals['tokens_per_s']:.1f} | {totals['tau']:.2f} | "
                         f"{1000 * totals['wall_time_s'] / totals['cycles']:.1f} | "
                         f"{totals['tokens_per_s'] / reference['tokens_per_s']:.2f}x | {same} |")
    setup = (f"The reference: eagle-llm 1.2.1 on transformers {reference_transformers}, set up as "
             f"evaluation/reference_worker.py says (the model's rotary base; the EOS id); ours on transformers "
             f"{transformers.__version__}. Embedded default ({models.EMBEDDED_NAME}), shipped head, eagle_default "
             f"tree, MT-Bench questions {', '.join(str(q['question_id']) for q in chosen)} (both turns, each arm "
             f"its own conversation), at most {max_new_tokens} new tokens a turn, arms taking turns question by "
             f"question. Tokens/s = tokens / wall time (prefill included); tau = tokens / verification cycles; ms "
             f"per cycle = wall time / cycles. Answers: evaluation/answers/reference_eagle/{folder_name}/.")
    return benchmarks.write_page(ROOT / "evaluation" / "results", name,
                                 "EAGLE's reference code (eagle-llm 1.2.1) against this engine", setup, lines,
                                 timed_on)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--questions", type=int, default=8, help="MT-Bench questions, spread over the categories")
    parser.add_argument("--runs", default=",".join(RUNS), help="DTYPE:TEMPERATURE,... (default %(default)s)")
    parser.add_argument("--max-new-tokens", type=int, default=128)
    parser.add_argument("--name", default="reference_eagle",
                        help="answers go to evaluation/answers/reference_eagle/NAME_<date>/, the report to "
                             "evaluation/results/NAME_<date>.md (default %(default)s)")
    args = parser.parse_args()
    if args.questions < 1:
        parser.error(f"--questions is {args.questions}: pass 1 or more")
    try:
        runs = [parse_run(text) for text in args.runs.split(",") if text]
    except ValueError as error:
        parser.error(str(error))
    if not REFERENCE_PYTHON.exists():  # before any folder is made
        parser.error(f"{REFERENCE_PYTHON.relative_to(ROOT)} does not exist: run `bash scripts/setup_reference.sh` "
                     f"first")
    folder = ROOT / "evaluation" / "answers" / "reference_eagle" / f"{args.name}_{datetime.date.today().isoformat()}"
    chosen, files = selection.spread(questions.load("mt_bench"), args.questions), answer_files(runs, folder)
    try:
        records.check_settings(folder, {"head": checkpoint.head_checksum(models.DEFAULT_HEAD),
                                        "questions": args.questions, "max_new_tokens": args.max_new_tokens,
                                        "runs": [list(r) for r in runs]})
        timed_on = records.timing_machine(folder, files.values(), chosen)
    except ValueError as error:
        parser.error(str(error))
    reference_transformers = answer_all(runs, chosen, folder, args.max_new_tokens)
    print(write_report(runs, files, folder.name, args.name, chosen, args.max_new_tokens, reference_transformers,
                       timed_on).read_text())


if __name__ == "__main__":
    main()
