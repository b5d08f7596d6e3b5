"""`eagle-mdsd generate`: answer one prompt with speculative (or plain) decoding."""

from __future__ import annotations

import json
import sys

from . import options, runners


def add_parser(sub) -> None:
    parser = runners.add_parser(sub, "generate", help="answer one prompt with speculative (or plain) decoding")
    parser.add_argument("--prompt", required=True, type=options.message,
                        help="one user message (not blank), put through the chat template")
    parser.add_argument("--json", action="store_true", help="print one JSON object with the text and the stats")
    parser.set_defaults(fn=run)


def run(args) -> None:
    from .. import models

    runner, tokenizer = runners.build(args)
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
    if result.profile and result.cycles:
        phases = ", ".join(f"{phase} {1000 * seconds / result.cycles:.1f}" for phase, seconds in result.profile.items())
        print(f"[ms per cycle: {phases}]", file=sys.stderr)
