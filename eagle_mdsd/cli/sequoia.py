"""`eagle-mdsd sequoia`: measure the acceptance by child rank and write the best static tree for it."""

from __future__ import annotations

from .. import engine, errors
from ..tree import MAX_NODES
from . import options


def add_parser(sub) -> None:
    parser = sub.add_parser("sequoia", help="measure the acceptance by child rank, write the best static tree",
                            parents=[options.model(base_model=False)])
    parser.add_argument("--name", default="sequoia", help="writes runs/sequoia/NAME.json (give it to --tree)")
    parser.add_argument("--max-nodes", type=options.count(2), default=32)
    parser.add_argument("--max-depth", type=options.count(1), default=8)
    parser.add_argument("--hardware-aware", action="store_true",
                        help="pick size and depth by predicted tokens/s from timings on this machine")
    parser.add_argument("--temperature", type=float, default=0.0)
    parser.add_argument("--prompts", type=options.count(1), default=8, help="held-out training prompts to measure on")
    parser.add_argument("--max-new-tokens", type=options.count(1), default=96)
    parser.add_argument("--ea-model", default=None, help="EAGLE head folder or hub id (default: the shipped head)")
    parser.add_argument("--draft-vocab", type=options.draft_vocab, default="auto", help=options.DRAFT_VOCAB_HELP)
    parser.set_defaults(fn=run)


def run(args) -> None:
    from .. import head, models, sequoia

    errors.check_temperature(args.temperature, "--temperature")
    if args.max_nodes > MAX_NODES:  # the tree would be refused by every command that loads it
        raise errors.UsageError(f"--max-nodes {args.max_nodes}: a tree holds at most {MAX_NODES} nodes")
    out = sequoia.output_path(args.name)  # a bad --name before the model loads
    head.inspect(args.ea_model or models.DEFAULT_HEAD)  # and a bad head's files
    target, tokenizer = models.load_target(None, models.parse_dtype(args.dtype), args.device)
    draft_head = head.load_head(args.ea_model or models.DEFAULT_HEAD, target)
    eos = models.eos_token_ids(target, tokenizer)

    def decoder_for(topology):
        return engine.Decoder(target, draft_head, topology, eos_token_ids=eos, draft_vocab=args.draft_vocab)

    record = sequoia.build(decoder_for, tokenizer, out, args.max_nodes, args.max_depth, args.hardware_aware,
                           args.temperature, args.prompts, args.max_new_tokens)
    print(f"wrote {out}: {record['description']}; acceptance by rank "
          f"{', '.join(f'{a:.3f}' for a in record['acceptance'])} ({record['visits']} nodes)")
