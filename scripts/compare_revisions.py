"""Tokens/s of the decoding engine at an earlier git revision against the working tree, in one process.

Both engines run the same target and head, each on its own copy (each packs its own kernels); they
answer the same MT-Bench first turns in turn (alternating which goes first), so the ratio is free of
the machine's drift between runs.

    .venv/bin/python scripts/compare_revisions.py REV [--questions 8] [--temperatures 0 1]
        [--trees eagle_default ...] [--pair topk/topk] [--method eagle|baseline] [--max-new-tokens 128]
        [--first-cycles N] [--name NAME]

--pair is the drafter and verifier at T > 0 (at T = 0 every tree drafts and verifies by topk); a tree that
refuses it (opt_tree takes deterministic children only) samples with topk/topk, as the page says.

--first-cycles N also runs each question's first cycle N times a seed (a call of depth + 1 tokens) and compares
the mean accepted length: one context, so sampled answers that diverge do not make it noisy.

Writes evaluation/results/NAME.md (default engine_vs_REV_<date>_<dtype>), whole after every cell (a tree at a
temperature): a run cut short leaves the cells it finished, on a page that names the cells it did not measure.
"""

from __future__ import annotations

import argparse
import copy
import dataclasses
import datetime
import importlib
import math
import re
import subprocess
import sys
import tarfile
import tempfile
from io import BytesIO
from pathlib import Path

import torch

from eagle_mdsd import (bench, benchmarks, drafting, dynamic, engine, head, lookup, models, outputs, questions,
                        tree_specs, verification)
from eagle_mdsd.errors import check_temperature

ROOT = Path(__file__).resolve().parent.parent
RESULTS = ROOT / "evaluation" / "results"


def engine_at(revision: str, folder: Path):
    """The engine module of `revision`, imported as its own package (eagle_mdsd_at_REV)."""
    run = subprocess.run(["git", "archive", revision, "eagle_mdsd"], cwd=ROOT, capture_output=True)
    if run.returncode != 0:
        raise SystemExit(f"error: {revision!r} is not a revision of this repository with an eagle_mdsd package: "
                         "give a commit, tag or branch (git log --oneline lists them)")
    archive = run.stdout
    package = f"eagle_mdsd_at_{re.sub(r'[^A-Za-z0-9_]', '_', revision)}"  # heads/main, v1.0, HEAD~2: a name
    with tarfile.open(fileobj=BytesIO(archive)) as tar:
        tar.extractall(folder, filter="data")
    (folder / "eagle_mdsd").rename(folder / package)
    sys.path.insert(0, str(folder))
    return importlib.import_module(f"{package}.engine")


def same_tree(old_engine, topology):
    """The topology as the revision's own classes (its engine tells trees by class and checks its own schemes)."""
    package = old_engine.__name__.rpartition(".")[0]
    if isinstance(topology, lookup.LookupTree):
        return importlib.import_module(f"{package}.lookup").LookupTree(same_tree(old_engine, topology.base),
                                                                      topology.tokens)
    if isinstance(topology, dynamic.DynamicTree):
        return importlib.import_module(f"{package}.dynamic").DynamicTree(**dataclasses.asdict(topology))
    return importlib.import_module(f"{package}.tree").compile_tree([list(path) for path in topology.paths],
                                                                   topology.name)


def first_cycle_rows(decoders: dict, prompts: list, tokens: int, temperature: float, seeds: int) -> list[str]:
    """Table rows: each engine's mean accepted length over the first cycle of every prompt and seed."""
    lengths = {label: [] for label in decoders}
    for prompt in prompts:
        for seed in range(1000, 1000 + seeds):
            for label, decoder in decoders.items():
                lengths[label].append(decoder.generate(prompt, tokens, temperature, seed=seed).accept_lengths[0])
    rows, reference = [], None
    for label, values in lengths.items():
        values = torch.tensor(values, dtype=torch.float64)
        mean, error = values.mean().item(), (values.std() / len(values) ** 0.5).item()
        reference = mean if reference is None else reference
        rows.append(f"| {temperature:g} | {label} | {len(values)} | {mean:.3f} | {error:.3f} | {mean - reference:+.3f} |")
    return rows


def decoders_for(old_engine, target, draft_head, topology, pair: str, eos) -> dict:
    """Both engines' decoders of one tree and pair, each on its own copy of the models."""
    drafter, _, verifier = pair.partition("/")
    old_target, old_head = copy.deepcopy(target), copy.deepcopy(draft_head)  # packed by that revision's kernels
    return {"revision": old_engine.Decoder(old_target, old_head, same_tree(old_engine, topology), drafter, verifier,
                                           eos_token_ids=eos, draft_vocab="auto"),
            "working tree": engine.Decoder(copy.deepcopy(target), copy.deepcopy(draft_head), topology, drafter,
                                           verifier, eos_token_ids=eos, draft_vocab="auto")}


def pair_for(topology, pair: str, temperature: float) -> str:
    """The pair a tree runs at a temperature: topk/topk at T = 0 and wherever the tree refuses `pair`."""
    if temperature == 0:
        return "topk/topk"
    try:
        topology.check_scheme(drafting.get(pair.partition("/")[0]))
    except ValueError:
        return "topk/topk"
    return pair


def paired_ratio(new: list[float], old: list[float]) -> tuple[float, float, float]:
    """The geometric mean of the per-question ratios new / old and its 95% interval (Student's t over the log
    ratios): the questions are the samples, so the interval states how far the machine's noise moves the ratio."""
    from scipy import stats

    logs = torch.tensor(new, dtype=torch.float64).log() - torch.tensor(old, dtype=torch.float64).log()
    mean = logs.mean().item()
    half = stats.t.ppf(0.975, len(logs) - 1) * (logs.std() / len(logs) ** 0.5).item() if len(logs) > 1 else 0.0
    return math.exp(mean), math.exp(mean - half), math.exp(mean + half)


def timed_rows(decoders: dict, prompts: list, label: str, temperature: float, args) -> list[str]:
    """Both engines on every prompt in turn (alternating which goes first), after one warm-up call each.  A row's
    tokens/s is tau over its ms a cycle (the prefill apart), so a ratio says whether the cycle or tau moved."""
    totals = {name: [0, 0.0, 0, 0.0] for name in decoders}  # new tokens, seconds, cycles, prefill seconds
    speeds = {name: [] for name in decoders}  # each question's tokens/s
    for decoder in decoders.values():
        decoder.generate(prompts[0], 16, temperature, method=args.method)
    for i, prompt in enumerate(prompts):
        for name in (list(decoders) if i % 2 == 0 else list(reversed(decoders))):
            result = decoders[name].generate(prompt, args.max_new_tokens, temperature, seed=i, method=args.method)
            totals[name][0] += result.new_tokens
            totals[name][1] += result.wall_time_s
            totals[name][2] += result.cycles
            totals[name][3] += result.prefill_time_s
            speeds[name].append(result.new_tokens / result.wall_time_s)
    speed = {name: tokens / seconds for name, (tokens, seconds, _, _) in totals.items()}
    rows = []
    for name, (tokens, seconds, cycles, prefill) in totals.items():
        ratio, low, high = paired_ratio(speeds[name], speeds["revision"])
        per_question = "-" if name == "revision" else f"{ratio:.2f}x ({low:.2f}-{high:.2f})"
        rows.append(f"| {label} | {temperature:g} | {name} | {tokens} | {tokens / cycles:.2f} | "
                    f"{1000 * (seconds - prefill) / cycles:.1f} | {speed[name]:.1f} | "
                    f"{speed[name] / speed['revision']:.2f}x | {per_question} |")
    print(*rows, sep="\n", flush=True)
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("revision", help="a git revision of this repository (commit, tag, branch)")
    parser.add_argument("--questions", type=int, default=8,
                        help="MT-Bench first turns, one per 10 question ids (more than 8: one per 80 / N)")
    parser.add_argument("--temperatures", type=float, nargs="+", default=[0.0, 1.0])
    parser.add_argument("--trees", nargs="+", default=["eagle_default"],
                        help="trees as --tree takes them: static, dynamic (eagle2, opt_tree) or TREE+lookup")
    parser.add_argument("--pair", default="topk/topk", help="DRAFTER/VERIFIER at T > 0, as the benchmark's "
                        "--sampling-pair")
    parser.add_argument("--method", choices=["eagle", "baseline"], default="eagle",
                        help="baseline: the engines' plain decoding (no head, no tree)")
    parser.add_argument("--max-new-tokens", type=int, default=128)
    parser.add_argument("--first-cycles", type=int, default=0,
                        help="also the mean accepted length of each question's first cycle over this many seeds")
    parser.add_argument("--dtype", default="bfloat16")
    parser.add_argument("--name", help="the page's name, evaluation/results/NAME.md (default: "
                        "engine_vs_REV_DATE_TIME_DTYPE; a name given again replaces its page)")
    args = parser.parse_args()
    if args.questions < 1 or args.max_new_tokens < 1 or args.first_cycles < 0:
        parser.error("--questions and --max-new-tokens must be at least 1, --first-cycles at least 0")
    known = subprocess.run(["git", "rev-parse", "--verify", "--quiet", f"{args.revision}^{{commit}}"], cwd=ROOT,
                           capture_output=True)
    if known.returncode != 0:
        parser.error(f"{args.revision!r} is not a commit of this repository: give a commit, tag or branch "
                     "(git log --oneline lists them)")
    try:
        trees = {spec: tree_specs.load(spec) for spec in args.trees}
        drafter, _, verifier = args.pair.partition("/")
        verification.check_pair(drafting.get(drafter), verification.get(verifier))
        dtype = models.parse_dtype(args.dtype)
        for temperature in args.temperatures:
            check_temperature(temperature, "each of --temperatures")
    except (ValueError, FileNotFoundError) as error:
        parser.error(str(error))
    date = datetime.date.today().isoformat()
    # by default a name of its own (a second run of the day kept the first's name, and replaced its page); a
    # --name given again replaces its page, as a rerun of a cut run does
    stamp = datetime.datetime.now().strftime("%H%M%S")
    name = args.name if args.name is not None else \
        f"engine_vs_{args.revision}_{date}_{stamp}_{args.dtype}".replace("/", "-")
    if not name or "/" in name or name in (".", ".."):
        parser.error(f"--name {name!r} must be a plain file name (the page is evaluation/results/NAME.md)")

    target, tokenizer = models.load_target(None, dtype, "cpu")
    draft_head = head.load_head(models.DEFAULT_HEAD, target)
    eos = models.eos_token_ids(target, tokenizer)
    every = questions.load("mt_bench")
    chosen = every[:: max(1, min(10, len(every) // args.questions))][: args.questions]  # spread over the categories
    prompts = [bench.conversation_ids(tokenizer, [q["turns"][0]], []) for q in chosen]
    machine = benchmarks.machine()
    out = RESULTS / f"{name}.md"
    measured = cells(trees, args)
    rows, firsts = [], []
    with tempfile.TemporaryDirectory() as folder:
        old_engine = engine_at(args.revision, Path(folder))
        for done, (spec, topology, temperature) in enumerate(measured, 1):
            pair = pair_for(topology, args.pair, temperature)
            decoders = decoders_for(old_engine, target, draft_head, topology, pair, eos)
            label = spec if args.method == "eagle" else "plain decoding"
            rows += timed_rows(decoders, prompts, f"{label}, {pair}" if args.method == "eagle" else label,
                               temperature, args)
            if args.first_cycles and args.method == "eagle":
                firsts += [f"| {spec} " + row for row in first_cycle_rows(
                    decoders, prompts, topology.max_depth + 1, temperature, args.first_cycles)]
                print(*firsts[-2:], sep="\n")
            del decoders
            left = [f"{spec if args.method == 'eagle' else 'plain decoding'} at T = {t:g}" for spec, _, t in
                    measured[done:]]
            outputs.write_atomically(out, page(args, date, machine, chosen, rows, firsts, left, len(measured)))
            print(f"wrote {out} ({done} of {len(measured)} cells)", flush=True)


def cells(trees: dict, args) -> list[tuple]:
    """(spec, topology, temperature) of each cell in the order measured; plain decoding drafts no tree, so it
    measures the first tree's temperatures alone."""
    every = [(spec, topology, temperature) for spec, topology in trees.items() for temperature in args.temperatures]
    return every if args.method == "eagle" else every[: len(args.temperatures)]


def page(args, date: str, machine: dict, chosen: list, rows: list[str], firsts: list[str], left: list[str],
         total: int) -> str:
    """The page of the cells measured so far: `rows` and `firsts` their table rows, `left` the names of the
    `total` cells not measured yet (empty: the run is complete)."""
    return "\n".join([
        f"# Engine at {args.revision} against the working tree, {date}", "",
        *([f"Partial: {total - len(left)} of the run's {total} cells measured (it was cut short, or is still "
           f"running); not measured: {', '.join(left)}.", ""] if left else []),
        f"Machine: {machine['cpu']}, {machine['threads']} torch threads, torch {machine['torch']}, {args.dtype}. "
        + ("Embedded default with the shipped head, draft vocabulary auto; " if args.method == "eagle" else
           "Embedded default, plain decoding (method baseline); ")
        + "MT-Bench first turns "
        f"{', '.join(str(q['question_id']) for q in chosen)}, at most {args.max_new_tokens} new tokens, "
        "both engines in one process answering each question in turn (alternating which goes first), each after "
        "one warm-up call; at T = 0 every tree drafts and verifies by topk.", "",
        f"Command: `.venv/bin/python scripts/compare_revisions.py {args.revision} --questions {args.questions} "
        f"--temperatures {' '.join(f'{t:g}' for t in args.temperatures)} --trees {' '.join(args.trees)} "
        f"--pair {args.pair} --method {args.method}"
        + (f" --max-new-tokens {args.max_new_tokens}" if args.max_new_tokens != 128 else "")
        + (f" --first-cycles {args.first_cycles}" if args.first_cycles else "")
        + (f" --name {args.name}" if args.name else "") + "`", "",
        "| tree, pair | T | engine | new tokens | tau | ms a cycle | tokens/s | against the revision | per question: "
        "geometric mean (95% interval) |",
        "|---|---|---|---|---|---|---|---|---|", *rows, "",
        "ms a cycle: the answers' time with their prefills taken out, over their cycles (tokens/s is about tau over "
        "it).  Against the revision: total tokens over total time, each engine's.  Per question: the geometric mean of "
        "the questions' tokens/s ratios, with the 95% interval of Student's t over their logarithms (the questions "
        "as samples; at T > 0 the engines' sampled answers differ, so their lengths and tau add to the spread).", "",
        *([f"First cycles: each question's first cycle, {args.first_cycles} seeds a question (1000 on), both engines "
           "on each seed in turn; accepted length counts the bonus token.", "",
           "| tree | T | engine | first cycles | mean accepted length | standard error | against the revision |",
           "|---|---|---|---|---|---|---|", *firsts, ""] if firsts else [])])


if __name__ == "__main__":
    main()
