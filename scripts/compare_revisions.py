"""Tokens/s of the decoding engine at an earlier git revision against the working tree, in one process.

Both engines run the same target and head, each on its own copy (each packs its own kernels); they
answer the same MT-Bench first turns in turn (alternating which goes first), so the ratio is free of
the machine's drift between runs.

    .venv/bin/python scripts/compare_revisions.py REV [--questions 8] [--temperatures 0 1]
        [--tree eagle_default] [--pair topk/topk] [--method eagle|baseline] [--max-new-tokens 128]
        [--first-cycles N] [--name NAME]

--first-cycles N also runs each question's first cycle N times a seed (a call of depth + 1 tokens) and compares
the mean accepted length: one context, so sampled answers that diverge do not make it noisy.

Writes evaluation/results/NAME.md (default engine_vs_REV_<date>_<dtype>).
"""

from __future__ import annotations

import argparse
import copy
import dataclasses
import datetime
import importlib
import subprocess
import sys
import tarfile
import tempfile
from io import BytesIO
from pathlib import Path

import torch

from eagle_mdsd import bench, benchmarks, drafting, dynamic, engine, head, lookup, models, questions, verification

ROOT = Path(__file__).resolve().parent.parent


def engine_at(revision: str, folder: Path):
    """The engine module of `revision`, imported as its own package (eagle_mdsd_at_REV)."""
    run = subprocess.run(["git", "archive", revision, "eagle_mdsd"], cwd=ROOT, capture_output=True)
    if run.returncode != 0:
        raise SystemExit(f"error: {revision!r} is not a revision of this repository with an eagle_mdsd package: "
                         "give a commit, tag or branch (git log --oneline lists them)")
    archive = run.stdout
    package = f"eagle_mdsd_at_{revision.replace('-', '_').replace('.', '_')}"
    with tarfile.open(fileobj=BytesIO(archive)) as tar:
        tar.extractall(folder, filter="data")
    (folder / "eagle_mdsd").rename(folder / package)
    sys.path.insert(0, str(folder))
    return importlib.import_module(f"{package}.engine")


def same_tree(old_engine, topology):
    """The topology as the revision's own classes (its engine tells dynamic and lookup trees by class); a static
    tree is read through its fields alone."""
    package = old_engine.__name__.rpartition(".")[0]
    if isinstance(topology, lookup.LookupTree):
        return importlib.import_module(f"{package}.lookup").LookupTree(same_tree(old_engine, topology.base),
                                                                      topology.tokens)
    if isinstance(topology, dynamic.DynamicTree):
        return importlib.import_module(f"{package}.dynamic").DynamicTree(**dataclasses.asdict(topology))
    return topology


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


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("revision", help="a git revision of this repository (commit, tag, branch)")
    parser.add_argument("--questions", type=int, default=8, help="MT-Bench first turns, one per 10 question ids")
    parser.add_argument("--temperatures", type=float, nargs="+", default=[0.0, 1.0])
    parser.add_argument("--tree", default="eagle_default",
                        help="a tree as --tree takes it: static, dynamic (eagle2, opt_tree) or TREE+lookup")
    parser.add_argument("--pair", default="topk/topk", help="DRAFTER/VERIFIER, as the benchmark's --sampling-pair")
    parser.add_argument("--static-shapes", action="store_true",
                        help="the working tree on static caches, as with CUDA graphs (its greedy cycle on the device)")
    parser.add_argument("--method", choices=["eagle", "baseline"], default="eagle",
                        help="baseline: the engines' plain decoding (no head, no tree)")
    parser.add_argument("--max-new-tokens", type=int, default=128)
    parser.add_argument("--first-cycles", type=int, default=0,
                        help="also the mean accepted length of each question's first cycle over this many seeds")
    parser.add_argument("--dtype", default="bfloat16")
    parser.add_argument("--name")
    args = parser.parse_args()
    if args.questions < 1 or args.max_new_tokens < 1 or args.first_cycles < 0:
        parser.error("--questions and --max-new-tokens must be at least 1, --first-cycles at least 0")
    known = subprocess.run(["git", "rev-parse", "--verify", "--quiet", f"{args.revision}^{{commit}}"], cwd=ROOT,
                           capture_output=True)
    if known.returncode != 0:
        parser.error(f"{args.revision!r} is not a commit of this repository: give a commit, tag or branch "
                     "(git log --oneline lists them)")
    drafter, _, verifier = args.pair.partition("/")
    try:
        tree = dynamic.load(args.tree)
        verification.check_pair(drafting.get(drafter), verification.get(verifier))
    except (ValueError, FileNotFoundError) as error:
        parser.error(str(error))
    dtype = models.parse_dtype(args.dtype)
    date = datetime.date.today().isoformat()
    name = args.name or f"engine_vs_{args.revision}_{date}_{args.dtype}_{args.tree.replace('/', '_')}"

    target, tokenizer = models.load_target(None, dtype, "cpu")
    draft_head = head.load_head(models.DEFAULT_HEAD, target)
    eos = models.eos_token_ids(target, tokenizer)
    with tempfile.TemporaryDirectory() as folder:
        old_engine = engine_at(args.revision, Path(folder))
        old_target, old_head = copy.deepcopy(target), copy.deepcopy(draft_head)  # packed by that revision's kernels
        decoders = {args.revision: old_engine.Decoder(old_target, old_head, same_tree(old_engine, tree), drafter,
                                                      verifier, eos_token_ids=eos, draft_vocab="auto"),
                    "working tree": engine.Decoder(target, draft_head, tree, drafter, verifier, eos_token_ids=eos,
                                                   draft_vocab="auto", static_shapes=args.static_shapes or None)}
        chosen = questions.load("mt_bench")[:: 10][: args.questions]
        prompts = [bench.conversation_ids(tokenizer, [q["turns"][0]], []) for q in chosen]
        rows, firsts = [], []
        for temperature in args.temperatures:
            totals = {label: [0, 0.0, 0] for label in decoders}  # new tokens, seconds, cycles
            for decoder in decoders.values():  # warm-up
                decoder.generate(prompts[0], 16, temperature, method=args.method)
            for i, prompt in enumerate(prompts):
                order = list(decoders) if i % 2 == 0 else list(reversed(decoders))
                for label in order:
                    result = decoders[label].generate(prompt, args.max_new_tokens, temperature, seed=i,
                                                      method=args.method)
                    totals[label][0] += result.new_tokens
                    totals[label][1] += result.wall_time_s
                    totals[label][2] += result.cycles
            speed = {label: t[0] / t[1] for label, t in totals.items()}
            for label, (tokens, _, cycles) in totals.items():
                rows.append(f"| {temperature:g} | {label} | {tokens} | {tokens / cycles:.2f} | {speed[label]:.1f} | "
                            f"{speed[label] / speed[args.revision]:.2f}x |")
            print(rows[-2], rows[-1], sep="\n")
            if args.first_cycles and args.method == "eagle":
                firsts.extend(first_cycle_rows(decoders, prompts, tree.max_depth + 1, temperature, args.first_cycles))
                print(*firsts[-2:], sep="\n")

    machine = benchmarks.machine()
    text = "\n".join([
        f"# Engine at {args.revision} against the working tree, {date}", "",
        f"Machine: {machine['cpu']}, {machine['threads']} torch threads, torch {machine['torch']}, {args.dtype}. "
        + (f"Embedded default with the shipped head, tree {args.tree}, {drafter} drafter, {verifier} verifier, draft "
           "vocabulary auto; " if args.method == "eagle" else "Embedded default, plain decoding (method baseline); ")
        + "MT-Bench first turns "
        f"{', '.join(str(q['question_id']) for q in chosen)}, at most {args.max_new_tokens} new tokens, "
        "both engines in one process answering each question in turn (alternating which goes first).", "",
        f"Command: `.venv/bin/python scripts/compare_revisions.py {args.revision} --questions {args.questions} "
        f"--temperatures {' '.join(f'{t:g}' for t in args.temperatures)} --tree {args.tree} --pair {args.pair} "
        f"--method {args.method}" + (" --static-shapes" if args.static_shapes else "")
        + (f" --max-new-tokens {args.max_new_tokens}" if args.max_new_tokens != 128 else "")
        + (f" --first-cycles {args.first_cycles}" if args.first_cycles else "")
        + (f" --name {args.name}" if args.name else "") + "`",
        *(["", "The working tree runs on static caches (its cycle on the device, cycle.py), the revision as its "
               "default on a CPU."] if args.static_shapes else []),
        "",
        "| T | engine | new tokens | tau | tokens/s | against the revision |",
        "|---|---|---|---|---|---|", *rows, "",
        *([f"First cycles: each question's first cycle, {args.first_cycles} seeds a question (1000 on), both engines "
           "on each seed in turn; accepted length counts the bonus token.", "",
           "| T | engine | first cycles | mean accepted length | standard error | against the revision |",
           "|---|---|---|---|---|---|", *firsts, ""] if firsts else [])])
    out = ROOT / "evaluation" / "results" / f"{name}.md"
    out.write_text(text)
    print(f"wrote {out.relative_to(ROOT)}")


if __name__ == "__main__":
    main()
