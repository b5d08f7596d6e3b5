"""`eagle-mdsd sweep`: tau and tokens/s of every tree x scheme/verifier x temperature cell."""

from __future__ import annotations

from pathlib import Path

from .. import models, tree_specs, validate, verification
from ..benchmark import plans, sweep
from ..errors import UsageError
from . import options


def add_parser(sub) -> None:
    parser = sub.add_parser("sweep", help="tau and tokens/s of every tree x drafter/verifier x temperature cell",
                            parents=[options.model(base_model=False, auto=True), options.engine(profile=False),
                                     options.run_folder("sweep")])
    parser.add_argument("--trees", nargs="+", default=["chain4", "binary_depth4", "quad_depth3", "eagle_default"])
    parser.add_argument("--temperatures", default="0,0.1,0.6,1")
    parser.add_argument("--pairs", default="all", help="'all' or SCHEME/VERIFIER,... e.g. topk/topk,greedy/greedy")
    parser.add_argument("--bench", default="mt_bench")
    parser.add_argument("--questions", type=options.count(1), default=8)
    parser.add_argument("--turns", type=options.count(0), default=1, help="turns per question (0: all)")
    parser.add_argument("--max-new-tokens", type=options.count(1), default=64)
    parser.add_argument("--seed", type=validate.seed, default=0)
    parser.add_argument("--draft-vocab", type=options.draft_vocab, default="auto", help=options.DRAFT_VOCAB_HELP)
    parser.set_defaults(fn=run)


def run(args) -> None:
    pairs = None
    if args.pairs != "all":
        pairs = tuple(tuple(pair.split("/")) for pair in args.pairs.split(","))
        if any(len(pair) != 2 for pair in pairs):
            raise UsageError("--pairs must be 'all' or scheme/verifier pairs such as topk/topk,greedy/greedy")
    temperatures = options.temperatures(args.temperatures)
    models.check_device(args.device)  # before the run's folder is made
    for tree in args.trees:  # the trees and pairs before any model loads
        tree_specs.load(tree, args.device)
    for scheme, verifier in pairs or ():
        verification.check_pair(scheme, verifier)
    plan = plans.SweepPlan(
        trees=tuple(args.trees), temperatures=temperatures, pairs=pairs, bench_name=args.bench, count=args.questions,
        turns=args.turns or None, max_new_tokens=args.max_new_tokens, draft_vocab=args.draft_vocab,
        kernels_choice=args.kernels, cuda_graphs=args.cuda_graphs, dtype=args.dtype, device=args.device,
        seed=args.seed, name=options.run_name(args, "sweep"), new_run=not args.resume)
    with options.run_lock(args, plan.name):
        md = sweep.sweep(Path(args.out), Path(args.answers), plan, getattr(args, "command_line", None))
    print(md.read_text())
