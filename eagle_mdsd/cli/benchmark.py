"""`eagle-mdsd benchmark`: the embedded default on MT-Bench with every method, and its report page."""

from __future__ import annotations

import contextlib
from pathlib import Path

from .. import models, outputs, validate
from ..benchmark import plans, run as benchmark_run
from . import options


def add_parser(sub) -> None:
    parser = sub.add_parser("benchmark", help="the embedded-default MT-Bench benchmark: every method, report",
                            parents=[options.model(base_model=False, auto=True), options.engine(profile=False),
                                     options.run_folder("benchmark")])
    parser.add_argument("--bench", default="mt_bench")
    # None when not given, so that --all can refuse a --questions that equals the default
    parser.add_argument("--questions", type=options.count(1), default=None,
                        help=f"questions, spread over the categories (default {plans.BenchmarkPlan.count})")
    parser.add_argument("--all", action="store_true", help="every question of --bench (not with --questions)")
    parser.add_argument("--temperatures", default="0,1")
    parser.add_argument("--methods", default=",".join(options.METHODS))
    parser.add_argument("--max-new-tokens", type=options.count(1), default=128,
                        help="new tokens a turn at most (default 128, for a CPU; EAGLE's evaluation generates up to "
                             "512, Spec-Bench's up to 1024)")
    parser.add_argument("--seed", type=validate.seed, default=0)
    eagle = parser.add_argument_group("EAGLE options (eagle in --methods)")
    eagle.add_argument("--trees", nargs="+", default=["eagle_default", "chain2"],
                       help="EAGLE runs once per tree; TREE@SCHEME/VERIFIER gives a tree its own pair, "
                            "TREE+lookup adds prompt-lookup drafts")
    eagle.add_argument("--drafter", dest="scheme", default="topk", help="drafting scheme (`eagle-mdsd pairs`)")
    eagle.add_argument("--verifier", default="topk")
    eagle.add_argument("--draft-vocab", type=options.draft_vocab, default="auto", help=options.DRAFT_VOCAB_HELP)
    sampling = parser.add_argument_group("EAGLE at T > 0 (on static trees without a pair of their own)")
    sampling.add_argument("--sampling-pair", default=plans.SAMPLING_PAIR, metavar="SCHEME/VERIFIER",
                          help=f"the pair at T > 0 (default {plans.SAMPLING_PAIR}); 'same' keeps --drafter/--verifier")
    sampling.add_argument("--sampling-tree", default=plans.SAMPLING_TREE,
                          help=f"the static tree run at T > 0 in their place (default {plans.SAMPLING_TREE}); "
                               f"'same' keeps each tree")
    parser.set_defaults(fn=run, eagle_options=options.defaults(eagle) | options.defaults(sampling),
                        sampling_options=options.defaults(sampling))


def check_options(args, temperatures) -> None:
    """Refuse --questions with --all, EAGLE's options when no EAGLE runs and the sampling ones when no T > 0 does;
    check the trees and pairs before any model loads."""
    if args.all and args.questions is not None:
        options.refuse_unread([f"--questions {args.questions}"], f"with --all (every question of {args.bench})",
                              f"drop --all for {args.questions} spread over the categories")
    methods = args.methods.split(",")
    if "eagle" not in methods:
        options.refuse_unread(options.given(args, args.eagle_options), "without eagle in --methods")
        return
    if not any(t > 0 for t in temperatures):
        options.refuse_unread(options.given(args, args.sampling_options), "without a temperature above 0")
    sampled = plans.parse_sampling_pair(args.sampling_pair, args.scheme, args.verifier)
    plans.benchmark_setups(args.trees, args.scheme, args.verifier, sampled, args.sampling_tree, args.device)


def run(args) -> None:
    from accelerate import PartialState
    from accelerate.utils import broadcast_object_list

    temperatures = options.temperatures(args.temperatures)
    check_options(args, temperatures)
    models.check_device(args.device)  # before the run's folder is made
    # One process unless started by `accelerate launch` (GPUs) or `torchrun` (CPU processes, gloo): then each
    # answers a share of the questions, and the first names the run and reports.
    state = PartialState(cpu=args.device == "cpu")
    if state.num_processes > 1 and args.device == "cuda":
        args.device = str(state.device)  # one GPU per process
    run = [options.run_name(args, "benchmark"), args.answers, args.out] if state.is_main_process else [None] * 3
    if state.num_processes > 1:
        run = broadcast_object_list(run)
    name, args.answers, args.out = run
    plan = plans.BenchmarkPlan(
        bench_name=args.bench, count=None if args.all else args.questions or plans.BenchmarkPlan.count,
        temperatures=temperatures,
        methods=tuple(args.methods.split(",")), trees=tuple(args.trees), drafter=args.scheme, verifier=args.verifier,
        sampling_pair=args.sampling_pair, sampling_tree=args.sampling_tree, draft_vocab=args.draft_vocab,
        kernels_choice=args.kernels, cuda_graphs=args.cuda_graphs, dtype=args.dtype, device=args.device,
        max_new_tokens=args.max_new_tokens, seed=args.seed, name=name, new_run=not args.resume)
    # One writer a run: the main process locks it (the others write shards of their own), from before the model
    # loads until the page is written.
    with options.run_lock(args, name) if state.is_main_process else contextlib.nullcontext():
        result = benchmark_run.run_benchmark(Path(args.out), Path(args.answers), plan,
                                             (state.process_index, state.num_processes), state.wait_for_everyone,
                                             getattr(args, "command_line", None))
    if result is None:
        return
    stem = Path(args.out) / result["name"]
    print(outputs.stem_file(stem, ".md").read_text())
    print(f"wrote {stem}.md, .json and the charts")
