"""The `eagle-mdsd` command."""

from __future__ import annotations

import argparse
import json
import math
import os
import shlex
import sys
from pathlib import Path

# torch's CPU allocator asks for transparent huge pages for tensors of 2 MB and more (read once, before
# the first allocation).  Head training allocates large logits every step, whose page faults with 4 KB pages
# cost a large share of a CPU step (measured: docs/training.md).
os.environ.setdefault("THP_MEM_ALLOC_ENABLE", "1")

from . import checks, drafting, engine, graphs, kernels, theory, verification  # noqa: E402  (imports torch)
from .suite import METHODS  # noqa: E402  (the methods every subcommand offers, defined once)
DRAFT_VOCAB_HELP = ("draft over the head's N most frequent tokens (FR-Spec; q is 0 elsewhere, still exact): N, "
                    "'full', or 'auto' (default: 8192 when the head ships draft_vocab.json, else full)")


def _draft_vocab(text: str):
    if text in ("auto", "full"):
        return None if text == "full" else text
    try:
        return int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a number of tokens, 'full' or 'auto', got {text!r}") from None


def _train_draft_vocab(text: str):
    """train-head's --draft-vocab: a number of tokens or 'full' (None); no 'auto', it trains the ranking."""
    if text == "full":
        return None
    try:
        return int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a number of tokens or 'full', got {text!r}") from None


def _count(minimum: int):
    """argparse type: an integer of at least `minimum`."""
    def parse(text: str) -> int:
        try:
            value = int(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"expected a whole number, got {text!r}") from None
        if value < minimum:
            raise argparse.ArgumentTypeError(f"must be at least {minimum}, got {value}")
        return value
    return parse


def _positive(text: str) -> float:
    """argparse type: a finite number above 0."""
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a number, got {text!r}") from None
    if not (math.isfinite(value) and value > 0):
        raise argparse.ArgumentTypeError(f"must be a number above 0, got {text}")
    return value


def _distribution(text: str, what: str) -> list[float]:
    try:
        values = json.loads(text)
    except json.JSONDecodeError:
        raise ValueError(f"--{what} must be a JSON list of probabilities such as [0.5, 0.3, 0.2]") from None
    if not isinstance(values, list) or not values or not all(isinstance(v, (int, float)) for v in values):
        raise ValueError(f"--{what} must be a JSON list of probabilities such as [0.5, 0.3, 0.2]")
    values = [float(v) for v in values]
    if not all(math.isfinite(v) and v >= 0 for v in values):
        raise ValueError(f"--{what} must hold finite, non-negative probabilities, got {text}")
    total = math.fsum(values)
    if abs(total - 1) > 1e-6:  # a typo in one entry would otherwise be normalised away unseen
        raise ValueError(f"--{what} sums to {total:g}, not 1: give probabilities that add up to 1")
    return values


def cmd_pairs(args) -> None:
    print("drafting schemes:")
    for scheme in drafting.SCHEMES.values():
        print(f"  {scheme.name:20s} {scheme.reference}")
    print("verifiers:")
    for verifier in verification.VERIFIERS.values():
        print(f"  {verifier.name:20s} {verifier.reference}")
    print("compatible (scheme, verifier) pairs:")
    for scheme, verifier in verification.pairs():
        print(f"  {scheme} + {verifier}")


def cmd_acceptance(args) -> None:
    p, q = _distribution(args.p, "p"), _distribution(args.q, "q")
    if len(p) != len(q):
        raise ValueError(f"--p has {len(p)} tokens but --q has {len(q)}: give both over the same vocabulary")
    rows = []
    for scheme, verifier in verification.pairs():
        n = 2 if scheme == "spechub" else args.n
        if scheme == "spechub" and args.n != 2:
            continue
        try:
            drafting.get(scheme).check(n, len(p))
        except ValueError:
            continue
        rate = theory.acceptance_rate(scheme, verifier, p, q, n)
        rows.append({"scheme": scheme, "verifier": verifier, "n": n, "acceptance": float(rate),
                     "ci95_half_width": rate.half_width,
                     "alpha_star": theory.optimal_acceptance(p, q, n, scheme)})
    if args.json:
        print(json.dumps(rows))
        return
    print(f"{'scheme':20s} {'verifier':8s} {'acceptance':>10s} {'alpha*':>8s}")
    for row in rows:
        print(f"{row['scheme']:20s} {row['verifier']:8s} {row['acceptance']:10.6f} {row['alpha_star']:8.6f}")


def cmd_bench_core(args) -> None:
    from .benchmarks import run_core_benchmark

    result = run_core_benchmark(Path(args.out), draft_counts=tuple(range(2, args.max_drafts + 1)))
    print(f"wrote {Path(args.out) / ('core_bench_' + result['date'])}.{{json,md}}")
    for line in result["summary"]:
        print(line)


def _runner(args, device=None):
    """(runner, tokenizer) for the shared generate/bench options; cheap checks before loading.

    The runner is an engine.Decoder (eagle, baseline) or a peers.TransformersPeer (hf_generate, prompt_lookup).
    """
    from transformers.utils import logging as hf_logging

    from . import head, models, suite

    engine.check_temperature(args.temperature, "--temperature")
    _check_method_options(args)
    topology = _topology(args) if args.method == "eagle" else None
    verification.check_pair(args.drafter, args.verifier)
    if topology is not None:
        suite.check_fits(topology, args.drafter, args.verifier)
        if args.ea_model is None and args.base_model not in (None, models.EMBEDDED):
            raise ValueError(f"--ea-model is required with --base-model {args.base_model}: give the folder or hub id "
                             "of an EAGLE-1 head trained for it, or --ea-model random")
        if args.ea_model is None and not models.DEFAULT_HEAD.exists():
            raise ValueError("no trained head for the embedded model ships with this version: "
                             "pass --ea-model FOLDER, or --ea-model random (lossless but accepts few drafts)")
    hf_logging.disable_progress_bar()
    target, tokenizer = models.load_target(args.base_model, models.parse_dtype(args.dtype), device or args.device)
    draft_head = None
    if args.method == "eagle":
        draft_head = (head.random_head(target, seed=args.seed) if args.ea_model == "random"
                      else head.load_head(args.ea_model or models.DEFAULT_HEAD, target))
    return suite.make_runner(args.method, target, tokenizer, draft_head, topology, args.drafter, args.verifier,
                             args.draft_vocab, args.kernels, args.cuda_graphs), tokenizer


def _print_profile(profile: dict, cycles: int) -> None:
    if profile and cycles:
        phases = ", ".join(f"{phase} {1000 * seconds / cycles:.1f}" for phase, seconds in profile.items())
        print(f"[ms per cycle: {phases}]", file=sys.stderr)


def cmd_generate(args) -> None:
    from . import models

    runner, tokenizer = _runner(args)
    prompt = models.chat_prompt_ids(tokenizer, args.prompt)
    result = runner.generate(prompt, args.max_new_tokens, args.temperature, args.seed, args.method,
                             profile=args.profile)
    text = tokenizer.decode(result.token_ids, skip_special_tokens=True)
    if args.json:
        print(json.dumps({"text": text} | result.to_dict()))
        return
    print(text)
    print(f"[{result.new_tokens} tokens, {result.cycles} cycles, tau {result.tau:.2f}, "
          f"{result.tokens_per_s:.1f} tokens/s]", file=sys.stderr)
    _print_profile(result.profile, result.cycles)


def cmd_check_greedy(args) -> None:
    import datetime

    from . import models

    out = Path(args.out)
    model = ("" if args.base_model in (None, models.EMBEDDED)
             else "_" + models.model_name(args.base_model).removesuffix(".gguf"))
    where = "" if args.device == "cpu" else "_" + args.device.replace(":", "")  # rows of one device a file
    if graphs.resolve(args.cuda_graphs, args.device) != graphs.resolve("auto", args.device):
        where += "_graphs-off"
    rows_file = out / f"greedy_check_{datetime.date.today().isoformat()}{model}{where}.jsonl"
    rows = checks.greedy_equivalence(rows_file, args.questions, args.max_new_tokens, args.trees,
                                     args.dtypes.split(","), args.ea_model, args.base_model, args.device,
                                     args.cuda_graphs)
    text = checks.summary_markdown(rows, args.max_new_tokens, args.ea_model, args.base_model, args.device)
    rows_file.with_suffix(".md").write_text(text)
    print(text)


def _openers(path) -> list[str] | None:
    """The lines of an openers file (`train-head prompts --openers`), or None without one."""
    if path is None:
        return None
    if not Path(path).is_file():
        raise ValueError(f"openers file {path} does not exist: give a text file with one message opener a line")
    openers = [line.strip() for line in Path(path).read_text().splitlines() if line.strip()]
    if not openers:
        raise ValueError(f"openers file {path} has no lines: write one message opener a line (e.g. 'Write a')")
    return openers


def _does_nothing(flags: list[str], where: str, remedy: str = "") -> ValueError:
    """The one-line error for options parsed and then ignored: '--a, --b do nothing WHERE: drop them[, REMEDY]'."""
    one = len(flags) == 1
    return ValueError(f"{', '.join(flags)} {'does' if one else 'do'} nothing {where}: drop {'it' if one else 'them'}"
                      + (f", or {remedy.format(it='it' if one else 'them')}" if remedy else ""))


# The train-head options each stage reads, besides --run and --base-model; `all` runs data, train and export.
STAGE_OPTIONS = {
    "prompts": {"count", "openers", "batch_size", "seed", "dtype", "device", "max_minutes"},
    "data": {"prompts", "max_prompts", "max_new_tokens", "batch_size", "shard_size", "mix_reference",
             "data_temperature", "sort_by_length", "no_features", "seed", "dtype", "device", "max_minutes"},
    "train": {"data_from", "format", "unroll", "token_weight", "token_loss", "train_draft_vocab", "init_from",
              "epochs", "lr", "tokens_per_batch", "seed", "device", "max_minutes", "schedule_minutes"},
    "export": {"export_to", "eagle1_format"},
    "evaluate": {"export_to"},
}
STAGE_OPTIONS["all"] = STAGE_OPTIONS["data"] | STAGE_OPTIONS["train"] | STAGE_OPTIONS["export"]
_RENAMED = {"data_temperature": "--temperature", "train_draft_vocab": "--draft-vocab"}  # dest -> its flag


def _flag(name: str) -> str:
    """The command-line flag of an argparse destination: 'max_new_tokens' -> '--max-new-tokens'."""
    return _RENAMED.get(name, "--" + name.replace("_", "-"))


def _check_stage_options(args) -> None:
    """A one-line error for train-head options given to a stage that does not read them (parsed and ignored)."""
    defaults = vars(build_parser().parse_args(["train-head", args.stage]))
    unread = [name for name, value in vars(args).items()
              if name in defaults and value != defaults[name] and name not in ("run", "base_model")
              and name not in STAGE_OPTIONS[args.stage]]
    if unread:
        readers = {name: " / ".join(s for s in STAGE_OPTIONS if s != "all" and name in STAGE_OPTIONS[s])
                   for name in unread}
        described = [f"{_flag(name)} ({stages})" for name, stages in readers.items()]
        raise _does_nothing(described, f"in train-head {args.stage}", "give {it} to the stage in parentheses")


def cmd_train_head(args) -> None:
    from . import training

    _check_stage_options(args)
    out = Path(args.run)
    # both recipes are checked before any stage runs, so `all` does not fail on a training option after the data
    data_recipe = training.DataRecipe(max_prompts=args.max_prompts, max_new_tokens=args.max_new_tokens,
                                      batch_size=args.batch_size or 128, shard_size=args.shard_size,
                                      mix_reference=args.mix_reference, seed=args.seed,
                                      temperature=args.data_temperature, sort_by_length=args.sort_by_length,
                                      features=not args.no_features)
    train_recipe = training.TrainRecipe(epochs=args.epochs, lr=args.lr, tokens_per_batch=args.tokens_per_batch,
                                        seed=args.seed, data_from=args.data_from, unroll=args.unroll,
                                        init_from=args.init_from, token_weight=args.token_weight,
                                        draft_vocab=args.train_draft_vocab, token_loss=args.token_loss,
                                        format=args.format)
    if args.stage == "prompts":
        path = training.self_prompts(out, args.count, args.base_model, args.dtype, batch_size=args.batch_size or 64,
                                     seed=args.seed, max_minutes=args.max_minutes, openers=_openers(args.openers),
                                     device=args.device)
        print(f"{len(training.load_prompts([path]))} self-written prompts in {path}")
    if args.stage in ("data", "all"):
        prompts = args.prompts or [training.DEFAULT_PROMPTS]
        shards = training.make_data(out, prompts, data_recipe, args.base_model, args.dtype, args.max_minutes,
                                    args.device)
        print(f"{len(shards)} data shards in {out / 'data'}")
    if args.stage in ("train", "all"):
        state = training.train(out, train_recipe, args.base_model, args.device, args.max_minutes,
                               schedule_minutes=args.schedule_minutes)
        recent = state["log"][-20:]
        if recent:
            print(f"step {state['step']}: loss {sum(r['loss'] for r in recent) / len(recent):.4f}, "
                  f"top-1 {sum(r['top1'] for r in recent) / len(recent):.3f} (mean of the last {len(recent)} steps)")
    if args.stage in ("export", "all"):
        destination = Path(args.export_to) if args.export_to else out / "head"
        print(f"wrote {training.export(out, destination, args.base_model, compact=not args.eagle1_format)}")
    if args.stage == "evaluate":
        head_spec = Path(args.export_to) if args.export_to else out / "head"
        print(json.dumps(training.evaluate(out, head_spec, args.base_model)))


def cmd_bench(args) -> None:
    from accelerate import PartialState

    from . import bench, models, questions, report

    chosen = questions.select(args.bench, args.question_begin, args.question_end)
    # One process unless started by `accelerate launch` (GPUs) or `torchrun` (CPU processes, gloo).
    state = PartialState(cpu=args.device == "cpu")
    device = args.device
    if state.num_processes > 1 and device == "cuda":
        device = str(state.device)  # one GPU per process
    model_id = args.model_id or f"{models.model_name(args.base_model)}-{args.method}"
    answer_file = Path(args.answer_file or f"runs/bench/{args.bench}/{model_id}.jsonl")
    if answer_file.is_dir():  # before the model loads
        raise ValueError(f"--answer-file {answer_file} is a folder: give a .jsonl file in it (made if missing)")
    runner, tokenizer = _runner(args, device)
    settings = bench.Settings(args.method, args.max_new_tokens, args.temperature, args.seed, args.profile,
                              args.turns)
    bench.run(runner, tokenizer, chosen, answer_file, model_id, settings, bench.fastchat_template(args.base_model),
              process=(state.process_index, state.num_processes))
    state.wait_for_everyone()
    if not state.is_main_process:
        return
    bench.merge_shards(answer_file)
    summary = report.summarise(answer_file)
    print(json.dumps(summary["all"]) if args.json else
          "\n".join(f"{name:16s} questions {s['questions']:3d}  tau {s['tau']:.2f}  {s['tokens_per_s']:.1f} tokens/s"
                    for name, s in summary.items()))


def cmd_report(args) -> None:
    from . import report

    baseline = Path(args.baseline) if args.baseline else None
    labels = args.labels.split(",") if args.labels else None
    if labels and len(labels) != len(args.answer_files):
        raise ValueError(f"--labels names {len(labels)} rows for {len(args.answer_files)} answer files: give one each")
    md, png = report.write([Path(f) for f in args.answer_files], Path(args.out), baseline, args.title, labels,
                           args.paired, args.window)
    print(md.read_text())
    print(f"wrote {md} and {png}")


def _floats(text: str, what: str) -> list[float]:
    try:
        values = [float(v) for v in text.split(",") if v.strip()]
    except ValueError:
        raise ValueError(f"--{what} must be comma-separated numbers such as 0,0.6,1") from None
    if not values:
        raise ValueError(f"--{what} names no temperature: give at least one, such as 0,1")
    for value in values:
        engine.check_temperature(value, f"each of --{what}")
    return values


def _check_benchmark_options(args, temperatures) -> None:
    """A one-line error for EAGLE's options when no EAGLE runs, and for the sampling ones when no T > 0 does."""
    defaults = vars(build_parser().parse_args(["benchmark"]))
    sampling = ["sampling_pair", "sampling_tree"]
    if "eagle" not in args.methods.split(","):
        unread, why = ["trees", "drafter", "verifier", *sampling, "draft_vocab"], "without eagle in --methods"
    elif not any(t > 0 for t in temperatures):
        unread, why = sampling, "without a temperature above 0"
    else:
        return
    unread = [_flag(name) for name in unread if getattr(args, name) != defaults[name]]
    if unread:
        raise _does_nothing(unread, why)


def _run_name(args, kind: str) -> str:
    """The run a `benchmark` or `sweep` writes: a fresh one, named by --name or DATE_HOST_TIME, whose folder must
    not exist yet (so a clone's committed or earlier answers are never re-reported as a new measurement), or, with
    --resume NAME|PATH, an existing one it continues.  A PATH (a run's answer folder) sends the answers and the
    page to its parent folder."""
    import datetime
    import socket

    answers = Path(args.answers)
    if args.resume:
        if args.name:
            raise ValueError(f"--name and --resume both name the {kind} run: give --resume NAME|PATH to continue "
                             f"one, or --name NAME for a fresh one")
        folder = Path(args.resume)
        if len(folder.parts) > 1 or not (answers / folder).is_dir():  # a path, or a name not under --answers
            if not folder.is_dir():
                raise ValueError(f"--resume {args.resume}: no run folder there nor under {answers}: give the name "
                                 f"of a run under {answers} or the path of its folder")
            if args.out == args.answers:  # the report stays beside the answers, as for a fresh run
                args.out = str(folder.parent)
            args.answers = str(folder.parent)
        return folder.name
    stamp = datetime.datetime.now()
    name = args.name or f"{stamp:%Y-%m-%d}_{socket.gethostname()}_{stamp:%H%M%S}"
    if len(Path(name).parts) != 1 or name in (".", ".."):
        raise ValueError(f"--name {name!r} is a path: give a plain name (--resume takes a run folder's path)")
    if (answers / name).exists():
        raise ValueError(f"{answers / name} exists: pass --resume {name} to continue that run, or another --name")
    return name


def cmd_benchmark(args) -> None:
    from accelerate import PartialState
    from accelerate.utils import broadcast_object_list

    from . import suite

    temperatures = tuple(_floats(args.temperatures, "temperatures"))
    _check_benchmark_options(args, temperatures)
    # One process unless started by `accelerate launch` (GPUs) or `torchrun` (CPU processes, gloo): then each
    # answers a share of the questions, and the first names the run and reports.
    state = PartialState(cpu=args.device == "cpu")
    if state.num_processes > 1 and args.device == "cuda":
        args.device = str(state.device)  # one GPU per process
    run = [_run_name(args, "benchmark"), args.answers, args.out] if state.is_main_process else [None] * 3
    if state.num_processes > 1:
        run = broadcast_object_list(run)
    name, args.answers, args.out = run
    plan = suite.BenchmarkPlan(
        bench_name=args.bench, count=None if args.all else args.questions, temperatures=temperatures,
        methods=tuple(args.methods.split(",")),
        trees=tuple(args.trees), drafter=args.drafter, verifier=args.verifier, sampling_pair=args.sampling_pair,
        sampling_tree=args.sampling_tree, draft_vocab=args.draft_vocab, kernels_choice=args.kernels,
        cuda_graphs=args.cuda_graphs, dtype=args.dtype, device=args.device, max_new_tokens=args.max_new_tokens,
        seed=args.seed, name=name)
    result = suite.run_benchmark(Path(args.out), Path(args.answers), plan,
                                 (state.process_index, state.num_processes), state.wait_for_everyone,
                                 getattr(args, "command_line", None))
    if result is None:
        return
    stem = Path(args.out) / result["name"]
    print(stem.with_suffix(".md").read_text())
    print(f"wrote {stem}.md, .json and the charts")


def cmd_sequoia(args) -> None:
    from . import head, models, sequoia

    engine.check_temperature(args.temperature, "--temperature")
    out = sequoia.output_path(args.name)  # a bad --name before the model loads
    target, tokenizer = models.load_target(None, models.parse_dtype(args.dtype), args.device)
    draft_head = head.load_head(args.ea_model or models.DEFAULT_HEAD, target)
    eos = models.eos_token_ids(target, tokenizer)

    def decoder_for(topology):
        return engine.Decoder(target, draft_head, topology, eos_token_ids=eos, draft_vocab=args.draft_vocab)

    record = sequoia.build(decoder_for, tokenizer, out, args.max_nodes, args.max_depth, args.hardware_aware,
                           args.temperature, args.prompts, args.max_new_tokens)
    print(f"wrote {out}: {record['description']}; acceptance by rank "
          f"{', '.join(f'{a:.3f}' for a in record['acceptance'])} ({record['visits']} nodes)")


def cmd_study(args) -> None:
    from . import study

    if args.stage in ("collect", "all"):
        files = study.collect(Path(args.run), args.positions, args.max_new_tokens, args.dtype)
        print(f"{len(files)} tasks collected in {args.run}")
    if args.stage in ("analyse", "all"):
        engine.check_temperature(args.temperature, "--temperature")
        md = study.analyse(Path(args.run), Path(args.out), args.temperature, args.n, args.draws, args.sweep_positions,
                           table_positions=args.table_positions)
        print(md.read_text())


def cmd_sweep(args) -> None:
    from . import suite

    pairs = None
    if args.pairs != "all":
        pairs = tuple(tuple(pair.split("/")) for pair in args.pairs.split(","))
        if any(len(pair) != 2 for pair in pairs):
            raise ValueError("--pairs must be 'all' or drafter/verifier pairs such as topk/topk,greedy/greedy")
    plan = suite.SweepPlan(
        trees=tuple(args.trees), temperatures=tuple(_floats(args.temperatures, "temperatures")), pairs=pairs,
        bench_name=args.bench, count=args.questions, turns=args.turns or None, max_new_tokens=args.max_new_tokens,
        draft_vocab=args.draft_vocab, kernels_choice=args.kernels, cuda_graphs=args.cuda_graphs, dtype=args.dtype,
        device=args.device, seed=args.seed, name=_run_name(args, "sweep"))
    md = suite.sweep(Path(args.out), Path(args.answers), plan)
    print(md.read_text())


# Options that shape EAGLE's drafts only, with their defaults: another --method given one of them is refused.
EAGLE_OPTIONS = {"tree": "eagle_default", "drafter": "topk", "verifier": "topk", "draft_vocab": "auto",
                 "ea_model": None, "total_tokens": None, "depth": None, "top_k": None, "nodes": None, "threshold": None,
                 "max_depth": None}


def _check_method_options(args) -> None:
    """A one-line error when --method is not eagle but EAGLE-only options (or, for the transformers peers,
    --kernels or --profile) were given: they would be parsed and ignored."""
    from . import peers

    if args.method == "eagle":
        return
    given = [name for name, default in EAGLE_OPTIONS.items() if getattr(args, name, default) != default]
    if args.method in peers.METHODS:  # the peers run as users run them: stock kernels, no graphs, no phases
        given += [name for name, unset in (("kernels", "auto"), ("cuda_graphs", "auto"), ("profile", False))
                  if getattr(args, name, unset) != unset]
    if given:
        raise _does_nothing([_flag(name) for name in given], f"with --method {args.method}", "use --method eagle")


def _add_tree_options(parser) -> None:
    parser.add_argument("--tree", default=EAGLE_OPTIONS["tree"],
                        help="tree name (tree_configs/), chainN, a .json file, or a dynamic tree: eagle2, opt_tree; "
                             "+lookup or +lookupN after any of them adds prompt-lookup drafts")
    parser.add_argument("--drafter", default=EAGLE_OPTIONS["drafter"],
                        help="drafting scheme (eagle-mdsd pairs lists them)")
    parser.add_argument("--verifier", default=EAGLE_OPTIONS["verifier"], help="verifier (eagle-mdsd pairs lists them)")
    parser.add_argument("--draft-vocab", type=_draft_vocab, default=EAGLE_OPTIONS["draft_vocab"],
                        help=DRAFT_VOCAB_HELP)
    parser.add_argument("--total-tokens", type=int, default=None, help="eagle2: tokens verified per cycle (60)")
    parser.add_argument("--depth", type=int, default=None, help="eagle2: draft levels (6)")
    parser.add_argument("--top-k", type=int, default=None, help="eagle2 / opt_tree: children per expanded node (10 / 8)")
    parser.add_argument("--nodes", type=int, default=None, help="opt_tree: draft nodes per cycle (40)")
    parser.add_argument("--threshold", type=float, default=None,
                        help="opt_tree: stop growing when a level adds less expected length (0.1)")
    parser.add_argument("--max-depth", type=int, default=None, help="opt_tree: most draft levels (10)")


def _add_kernels_option(parser) -> None:
    parser.add_argument("--kernels", default="auto", choices=kernels.CHOICES,
                        help="linear layers of our decoders: 'auto' (default) packs bf16 weights for oneDNN on a "
                             "CPU that supports it (the same tokens, a third faster per step), 'packed' insists, "
                             "'stock' uses torch's default kernels; transformers peers always run stock")
    parser.add_argument("--cuda-graphs", default="auto", choices=graphs.CHOICES,
                        help="our decoders' fixed-shape calls (the target's tree forward and plain step, the head's "
                             "steps): 'auto' (default) captures them as CUDA graphs on CUDA, 'off' runs them eagerly")


def _topology(args, spec: str | None = None):
    from . import dynamic

    return dynamic.load(spec or args.tree, total_tokens=args.total_tokens, depth=args.depth, top_k=args.top_k,
                        nodes=args.nodes, threshold=args.threshold, max_depth=args.max_depth)


def _add_run_options(parser, kind: str) -> None:
    """--name, --resume, --out and --answers of a resumable run (benchmark, sweep): a fresh run folder by default."""
    parser.add_argument("--name", default=None,
                        help=f"a fresh run's name (default DATE_HOST_TIME): answers in runs/{kind}/NAME/, the report "
                             f"beside them as NAME.md")
    parser.add_argument("--resume", default=None, metavar="NAME|PATH",
                        help="continue an earlier run (its name under --answers, or its folder's path); it resumes "
                             "only answers made with the same settings on the same machine")
    parser.add_argument("--out", default=f"runs/{kind}", help=f"folder of the report (default runs/{kind}; a "
                                                               f"published run: evaluation/results)")
    parser.add_argument("--answers", default=f"runs/{kind}", help=f"folder of the run folders (default runs/{kind})")


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="eagle-mdsd", description=__doc__)
    sub = parser.add_subparsers(dest="command", required=True)
    sub.add_parser("pairs", help="list drafting schemes, verifiers and the lossless pairs").set_defaults(fn=cmd_pairs)
    acc = sub.add_parser("acceptance", help="acceptance of every pair and alpha* for one node's p and q")
    acc.add_argument("--p", required=True, help="target distribution, JSON list")
    acc.add_argument("--q", required=True, help="draft distribution, JSON list")
    acc.add_argument("--n", type=_count(1), default=2, help="number of drafts (default 2)")
    acc.add_argument("--json", action="store_true")
    acc.set_defaults(fn=cmd_acceptance)
    gen = sub.add_parser("generate", help="answer one prompt with speculative (or plain) decoding")
    gen.add_argument("--prompt", required=True, help="one user message, put through the chat template")
    gen.add_argument("--base-model", default=None, help="hub id, folder or .gguf file (default: embedded SmolLM2)")
    gen.add_argument("--ea-model", default=None,
                     help="EAGLE-1 head folder or hub id (default: the shipped head; 'random' for an untrained one)")
    _add_tree_options(gen)
    gen.add_argument("--temperature", type=float, default=0.0)
    gen.add_argument("--max-new-tokens", type=_count(1), default=128)
    gen.add_argument("--seed", type=int, default=0)
    gen.add_argument("--dtype", default="float32", help="float32, bfloat16 or float16")
    gen.add_argument("--device", default="cpu")
    gen.add_argument("--method", default="eagle", choices=METHODS)
    _add_kernels_option(gen)
    gen.add_argument("--profile", action="store_true", help="time the phases of a cycle (draft, target, verify, commit)")
    gen.add_argument("--json", action="store_true", help="print one JSON object with the text and the stats")
    gen.set_defaults(fn=cmd_generate)
    greedy = sub.add_parser("check-greedy", help="T=0 token equality with transformers generate")
    greedy.add_argument("--base-model", default=None,
                        help="hub id, folder or .gguf file (default: embedded SmolLM2); the results file is named "
                             "after it")
    greedy.add_argument("--questions", type=_count(1), default=5)
    greedy.add_argument("--max-new-tokens", type=_count(1), default=128)
    greedy.add_argument("--trees", nargs="+", default=list(checks.ALL_TREES),
                        help="trees to check, 'baseline' for the engine's plain decoding and 'hf_compiled' for "
                             "transformers' compiled generate (default: all)")
    greedy.add_argument("--dtypes", default="float32,bfloat16")
    greedy.add_argument("--ea-model", default="random", help="head folder, or 'random' (default)")
    greedy.add_argument("--device", default="cpu", help="cpu, or cuda, cuda:1, ... (the results file says which)")
    greedy.add_argument("--cuda-graphs", default="auto", choices=graphs.CHOICES,
                        help="'auto' (default): the engine replays CUDA graphs on CUDA; 'off' (the results file "
                             "says so): eagerly")
    greedy.add_argument("--out", default="runs/check-greedy")
    greedy.set_defaults(fn=cmd_check_greedy)
    train = sub.add_parser("train-head", help="train an EAGLE-1 or EAGLE-3 head: data, train and export stages (resumable)")
    train.add_argument("stage", choices=["prompts", "data", "train", "export", "all", "evaluate"])
    train.add_argument("--run", default="runs/smollm2-head", help="folder for shards, checkpoint and exports")
    train.add_argument("--base-model", default=None)
    train.add_argument("--prompts", nargs="*", help="JSON/JSONL files or folders (default: shared/data/train_prompts)")
    train.add_argument("--max-prompts", type=_count(1), default=None)
    train.add_argument("--count", type=_count(1), default=2560, help="prompts stage: how many prompts the target writes")
    train.add_argument("--openers", default=None,
                       help="prompts stage: a text file of message openers, one a line; batch b's messages start "
                            "with line b (cycling), steering the kind of task the target writes")
    train.add_argument("--data-from", nargs="*", default=[],
                       help="train stage: other runs whose data shards are trained on too")
    train.add_argument("--format", choices=["eagle1", "eagle3"], default="eagle1",
                       help="train stage: eagle1 (EAGLE-1's head and loss, default) or eagle3 (EAGLE-3's head over "
                            "three target layers, the token loss alone over --draft-vocab, exported in the "
                            "released layout)")
    train.add_argument("--unroll", type=int, default=1,
                       help="train stage: draft depths trained on the head's own predictions (1: EAGLE-1's loss; "
                            "EAGLE-3's training-time test is 2 or more)")
    train.add_argument("--token-weight", type=float, default=0.1,
                       help="train stage: weight of the token term against the feature term (EAGLE: 0.1)")
    train.add_argument("--token-loss", choices=["ce", "tv", "top1"], default="ce",
                       help="train stage: the token term, ce (EAGLE's cross-entropy against the target's "
                            "distribution, default), tv (total variation: 1 - a sampled draft's acceptance rate) "
                            "or top1 (cross-entropy against the target's most probable token, T = 0's draft)")
    train.add_argument("--draft-vocab", dest="train_draft_vocab", type=_train_draft_vocab, default=None,
                       help="train stage: score the cross-entropy over the N most frequent answer tokens only, "
                            "the vocabulary the decoder drafts from, and skip most of the full-vocabulary logits that "
                            "dominate a step on a small target; 'full' (default) scores all tokens")
    train.add_argument("--init-from", default=None,
                       help="train stage: start from this run's checkpoint or exported head, not a random head")
    train.add_argument("--max-new-tokens", type=_count(1), default=128, help="response length in the data stage")
    train.add_argument("--batch-size", type=_count(1), default=None,
                       help="generation batch: data stage answers (default 128), prompts stage messages (default 64; "
                            "batch b of a seed is the same prompts only at the same batch size)")
    train.add_argument("--shard-size", type=_count(1), default=256)
    train.add_argument("--sort-by-length", action="store_true",
                       help="data stage: batch each shard's prompts shortest first, so batches pad less and answer "
                            "faster (in bf16 some answers change with their batch)")
    train.add_argument("--mix-reference", action="store_true", help="also train on the datasets' responses")
    train.add_argument("--no-features", action="store_true",
                       help="data stage: keep the token ids alone; the train stage computes the target's features "
                            "on its device each epoch (for large data on a GPU)")
    train.add_argument("--temperature", dest="data_temperature", type=float, default=0.0,
                       help="data stage: sample the answers at this temperature (default 0: greedy)")
    train.add_argument("--dtype", default="bfloat16", help="target dtype for the data stage")
    train.add_argument("--epochs", type=_positive, default=1.0)
    train.add_argument("--lr", type=_positive, default=5e-4)
    train.add_argument("--tokens-per-batch", type=_count(1), default=4096)
    train.add_argument("--max-minutes", type=_positive, default=None, help="stop (resumably) after this long")
    train.add_argument("--schedule-minutes", type=_positive, default=None,
                       help="train stage: the cosine decay of the learning rate ends after this many minutes of the "
                            "call if the epochs have not ended it first, and training stops there (a run boxed in time)")
    train.add_argument("--device", default="cpu", help="prompts, data and train stages: cpu, or cuda on a GPU")
    train.add_argument("--seed", type=int, default=0,
                       help="train stage: the head's initialisation and batch order; prompts stage: the sampling; "
                            "data stage: the prompts' shuffle, so which of them --max-prompts takes")
    train.add_argument("--export-to", default=None, help="export folder (default RUN/head)")
    train.add_argument("--eagle1-format", action="store_true", help="export pytorch_model.bin with the embedding copy")
    train.set_defaults(fn=cmd_train_head)
    run = sub.add_parser("bench", help="answer MT-Bench / Spec-Bench questions into an answer file (resumable)")
    run.add_argument("--bench", default="mt_bench",
                     help="mt_bench, spec_bench, a category, or a .jsonl file of your own questions (Spec-Bench "
                          "records with 'turns', or 'prompt' records as `train-head prompts` writes)")
    run.add_argument("--question-begin", type=int, default=None)
    run.add_argument("--question-end", type=int, default=None)
    run.add_argument("--method", default="eagle", choices=METHODS,
                     help="eagle, baseline (autoregressive, same loop), hf_generate, hf_compiled (static cache + "
                          "torch.compile) or prompt_lookup (transformers)")
    run.add_argument("--base-model", default=None)
    run.add_argument("--ea-model", default=None)
    _add_tree_options(run)
    run.add_argument("--temperature", type=float, default=0.0)
    run.add_argument("--max-new-tokens", type=_count(1), default=128)
    run.add_argument("--seed", type=int, default=0)
    run.add_argument("--dtype", default="bfloat16")
    run.add_argument("--device", default="cpu", help="cpu, cuda (one GPU per process under accelerate launch), auto")
    run.add_argument("--turns", type=_count(0), default=None, help="answer only the first N turns (default or 0: all)")
    _add_kernels_option(run)
    run.add_argument("--profile", action="store_true", help="record where each cycle's time goes")
    run.add_argument("--model-id", default=None)
    run.add_argument("--answer-file", default=None)
    run.add_argument("--json", action="store_true")
    run.set_defaults(fn=cmd_bench)
    rep = sub.add_parser("report", help="tokens/s, speedup, tau per category from answer files: markdown + PNG")
    rep.add_argument("answer_files", nargs="+")
    rep.add_argument("--baseline", default=None, help="answer file of the baseline the speedups are against")
    rep.add_argument("--out", default="runs/report/report", help="writes OUT.md and OUT.png")
    rep.add_argument("--title", default="")
    rep.add_argument("--labels", default=None, help="comma-separated row names, one per answer file "
                                                     "(default: each file's model_id)")
    rep.add_argument("--paired", action="store_true",
                     help="also each drafting file's tau per question against the first one's: mean difference, "
                          "standard error, questions higher and lower (how two heads compare)")
    rep.add_argument("--window", type=int, default=None,
                     help="also tau by position in the answer turn, N tokens a column (how acceptance changes "
                          "along long answers)")
    rep.set_defaults(fn=cmd_report)
    suite_parser = sub.add_parser("benchmark", help="the embedded-default MT-Bench benchmark: every method, report")
    suite_parser.add_argument("--bench", default="mt_bench")
    suite_parser.add_argument("--questions", type=_count(1), default=8, help="questions, spread over the categories")
    suite_parser.add_argument("--all", action="store_true", help="every question of --bench")
    suite_parser.add_argument("--temperatures", default="0,1")
    suite_parser.add_argument("--methods", default=",".join(METHODS))
    suite_parser.add_argument("--dtype", default="bfloat16")
    suite_parser.add_argument("--device", default="cpu")
    suite_parser.add_argument("--max-new-tokens", type=_count(1), default=128)
    suite_parser.add_argument("--trees", nargs="+", default=["eagle_default", "chain2"],
                              help="EAGLE runs once per tree (default eagle_default, EAGLE's own tree, and "
                                   "chain2, a chain of two drafts, which suits a CPU, where every tree row costs; "
                                   "dynamic ones with options, "
                                   "and optionally the tree's own drafter/verifier pair, e.g. eagle_default "
                                   "eagle2:total_tokens=16,depth=5,top_k=4@greedy/greedy; TREE+lookup adds "
                                   "prompt-lookup drafts, on the sampling tree at T > 0 for a static TREE)")
    suite_parser.add_argument("--drafter", default="topk")
    suite_parser.add_argument("--verifier", default="topk")
    suite_parser.add_argument("--sampling-pair", default="without_replacement/rrs_wo",
                              help="DRAFTER/VERIFIER of EAGLE at T > 0 on static trees without their own pair "
                                   "(default without_replacement/rrs_wo: sampled drafts beat deterministic top-k ones at T = 1); "
                                   "'same' keeps --drafter/--verifier")
    suite_parser.add_argument("--sampling-tree", default="chain2",
                              help="the static tree EAGLE runs at T > 0, once, in place of the static --trees "
                                   "entries without their own pair (default chain2: where every tree row costs target compute, "
                                   "as on a CPU, a short chain outruns a wide tree at T = 1); 'same' keeps each "
                                   "tree")
    suite_parser.add_argument("--seed", type=int, default=0)
    suite_parser.add_argument("--draft-vocab", type=_draft_vocab, default="auto", help=DRAFT_VOCAB_HELP)
    _add_kernels_option(suite_parser)
    _add_run_options(suite_parser, "benchmark")
    suite_parser.set_defaults(fn=cmd_benchmark)
    sw = sub.add_parser("sweep", help="tau and tokens/s of every tree x drafter/verifier x temperature cell")
    sw.add_argument("--trees", nargs="+", default=["chain4", "binary_depth4", "quad_depth3", "eagle_default"])
    sw.add_argument("--temperatures", default="0,0.1,0.6,1")
    sw.add_argument("--pairs", default="all", help="'all' or drafter/verifier,... e.g. topk/topk,greedy/greedy")
    sw.add_argument("--bench", default="mt_bench")
    sw.add_argument("--questions", type=_count(1), default=8)
    sw.add_argument("--turns", type=_count(0), default=1, help="turns per question (0: all)")
    sw.add_argument("--max-new-tokens", type=_count(1), default=64)
    sw.add_argument("--dtype", default="bfloat16")
    sw.add_argument("--device", default="cpu")
    sw.add_argument("--seed", type=int, default=0)
    sw.add_argument("--draft-vocab", type=_draft_vocab, default="auto", help=DRAFT_VOCAB_HELP)
    _add_kernels_option(sw)
    _add_run_options(sw, "sweep")
    sw.set_defaults(fn=cmd_sweep)
    seq = sub.add_parser("sequoia", help="measure the acceptance by child rank, write the best static tree")
    seq.add_argument("--name", default="sequoia", help="writes tree_configs/NAME.json")
    seq.add_argument("--max-nodes", type=_count(2), default=32)
    seq.add_argument("--max-depth", type=_count(1), default=8)
    seq.add_argument("--hardware-aware", action="store_true",
                     help="pick size and depth by predicted tokens/s from timings on this machine")
    seq.add_argument("--temperature", type=float, default=0.0)
    seq.add_argument("--prompts", type=_count(1), default=8, help="held-out training prompts to measure on")
    seq.add_argument("--max-new-tokens", type=_count(1), default=96)
    seq.add_argument("--ea-model", default=None)
    seq.add_argument("--draft-vocab", type=_draft_vocab, default="auto", help=DRAFT_VOCAB_HELP)
    seq.add_argument("--dtype", default="bfloat16")
    seq.add_argument("--device", default="cpu")
    seq.set_defaults(fn=cmd_sequoia)
    st = sub.add_parser("study", help="acceptance of every verifier against alpha* on real p and q (resumable)")
    st.add_argument("stage", choices=["collect", "analyse", "all"])
    st.add_argument("--run", default="runs/study", help="folder for the collected logits and cached rates")
    st.add_argument("--positions", type=_count(1), default=1024, help="answer positions per task")
    st.add_argument("--max-new-tokens", type=_count(1), default=128)
    st.add_argument("--dtype", default="bfloat16")
    st.add_argument("--temperature", type=float, default=0.7)
    st.add_argument("--n", type=_count(1), default=3, help="drafts per node for the table")
    st.add_argument("--draws", type=_count(1), default=8, help="sampled draft tuples per position")
    st.add_argument("--sweep-positions", type=_count(1), default=48, help="positions per task in the sweeps")
    st.add_argument("--table-positions", type=_count(1), default=None,
                    help="positions per task in the table (default: all collected)")
    st.add_argument("--out", default="runs/study")
    st.set_defaults(fn=cmd_study)
    bench = sub.add_parser("bench-core", help="time one node's drafting/verification and alpha* on this machine")
    bench.add_argument("--out", default="runs/bench-core", help="results folder")
    bench.add_argument("--max-drafts", type=_count(2), default=8, help="largest n timed, from 2 (default 8)")
    bench.set_defaults(fn=cmd_bench_core)
    return parser


def main(argv=None) -> int:
    args = build_parser().parse_args(argv)
    args.command_line = "eagle-mdsd " + shlex.join(sys.argv[1:] if argv is None else argv)  # what pages name
    try:
        args.fn(args)
    except (ValueError, OSError) as error:
        print(f"eagle-mdsd: error: {error}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
