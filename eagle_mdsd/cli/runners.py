"""The runner that `generate` and `bench` answer with, built from their shared options."""

from __future__ import annotations

from .. import peers, tree_specs, verification
from ..errors import UsageError, check_temperature
from . import options


def add_parser(sub, name: str, **keywords):
    """A subcommand parser with the options a runner is built from; it records which of them only EAGLE and
    only our decoders read, for `check_method_options`."""
    eagle, decoder = options.eagle(), options.engine()
    parser = sub.add_parser(name, parents=[options.model(auto=True), options.decoding(), eagle, decoder], **keywords)
    parser.set_defaults(eagle_options=options.defaults(eagle), decoder_options=options.defaults(decoder))
    return parser


def check_method_options(args) -> None:
    """Options of EAGLE with another --method, and of our decoders with a transformers peer, are refused: they
    would be parsed and ignored."""
    if args.method == "eagle":
        return
    given = options.given(args, args.eagle_options)
    if args.method in peers.METHODS:  # the peers run as users run them: stock kernels, no graphs, no phases
        given += options.given(args, args.decoder_options)
    options.refuse_unread(given, f"with --method {args.method}", "use --method eagle")


def topology(args):
    """The tree of --tree and its options (a static, dynamic or lookup tree)."""
    return tree_specs.load(args.tree, args.device, total_tokens=args.total_tokens, depth=args.depth, top_k=args.top_k,
                        nodes=args.nodes, threshold=args.threshold, max_depth=args.max_depth)


def build(args, device=None):
    """(runner, tokenizer): an engine.Decoder (eagle, baseline) or a peers.TransformersPeer (hf_generate,
    prompt_lookup); the options are checked before the model loads."""
    from transformers.utils import logging as hf_logging

    from .. import head, models
    from ..benchmark import plans, runners

    check_temperature(args.temperature, "--temperature")
    check_method_options(args)
    tree = topology(args) if args.method == "eagle" else None
    if tree is not None:
        verification.check_pair(args.scheme, args.verifier)
        plans.check_fits(tree, args.scheme, args.verifier)
        if args.ea_model is None and args.base_model not in (None, models.EMBEDDED):
            raise UsageError(f"--ea-model is required with --base-model {args.base_model}: give the folder or hub "
                             "id of an EAGLE-1 head trained for it, or --ea-model random")
        if args.ea_model is None and not models.DEFAULT_HEAD.exists():
            raise UsageError("no trained head for the embedded model ships with this version: "
                             "pass --ea-model FOLDER, or --ea-model random (lossless but accepts few drafts)")
        if args.ea_model != "random":
            head.inspect(args.ea_model or models.DEFAULT_HEAD)  # a bad head's files before the model loads
    hf_logging.disable_progress_bar()
    target, tokenizer = models.load_target(args.base_model, models.parse_dtype(args.dtype), device or args.device)
    draft_head = None
    if args.method == "eagle":
        draft_head = (head.random_head(target, seed=args.seed) if args.ea_model == "random"
                      else head.load_head(args.ea_model or models.DEFAULT_HEAD, target))
    runner = runners.make_runner(args.method, target, tokenizer, draft_head, tree, args.scheme, args.verifier,
                                 args.draft_vocab, args.kernels, args.cuda_graphs)
    return runner, tokenizer

