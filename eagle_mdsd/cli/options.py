"""What several subcommands share: argparse types, parent parsers of shared options, and the usage errors of
options that would be parsed and ignored."""

from __future__ import annotations

import argparse
import math
import os
from pathlib import Path

from .. import graphs, kernels, models, tree_specs, validate
from ..errors import UsageError, check_temperature
from ..benchmark.plans import METHODS  # the methods every subcommand offers, defined once

DTYPE_HELP = "float32, bfloat16 (default) or float16 (what EAGLE's and Spec-Bench's evaluation scripts load)"


def add_dtype(parser) -> None:
    """--dtype, the target's weights: bfloat16 by default in every subcommand."""
    parser.add_argument("--dtype", default="bfloat16", choices=list(models.DTYPES), metavar="DTYPE", help=DTYPE_HELP)
DRAFT_VOCAB_HELP = ("draft over the head's N most frequent tokens (FR-Spec; exact): N, 'full', or 'auto' "
                    "(default: 8192 where the head ships draft_vocab.json, else full)")


def count(minimum: int):
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


def positive(text: str) -> float:
    """argparse type: a finite number above 0."""
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a number, got {text!r}") from None
    if not (math.isfinite(value) and value > 0):
        raise argparse.ArgumentTypeError(f"must be a number above 0, got {text}")
    return value


def message(text: str) -> str:
    """argparse type of a user message (--prompt): text that is not blank, as a question file's turns."""
    if not text.strip():
        raise argparse.ArgumentTypeError("is blank: give the text of the message")
    return text


def _writable(text: str, folder: bool) -> str:
    """A path the command writes (a folder, or a file) can be made: the nearest part of it that exists is a
    folder the user can write in (or, for a file, the file itself)."""
    path = Path(text)
    existing = next(part for part in (path, *path.parents) if part.exists() or part == Path(part.anchor or "."))
    if existing.exists() and not existing.is_dir() and (folder or existing != path):
        raise argparse.ArgumentTypeError(f"{text} is a file: give a folder" if existing == path else
                                         f"{existing} is a file, so {text} cannot be made: give another path")
    if existing == path and path.exists() and not path.is_dir() and not path.is_file():
        raise argparse.ArgumentTypeError(f"{text} is not a regular file (a device, a pipe or a socket), which "
                                         f"would never end when read back: give the path of a file")
    where = existing if existing.is_dir() else existing.parent
    if not os.access(where, os.W_OK):
        raise argparse.ArgumentTypeError(f"cannot write in {where}: give a path in a folder you can write in")
    return text


def output_folder(text: str) -> str:
    """argparse type of a folder the command writes into (made if missing)."""
    return _writable(text, folder=True)


def output_file(text: str) -> str:
    """argparse type of a file the command writes (its folder made if missing)."""
    return _writable(text, folder=False)


def draft_vocab(text: str):
    """argparse type of the decoders' --draft-vocab: a number of tokens, 'full' (None) or 'auto'."""
    if text in ("auto", "full"):
        return None if text == "full" else text
    if not text.strip().lstrip("+-").isdigit():
        raise argparse.ArgumentTypeError(f"expected a number of tokens, 'full' or 'auto', got {text!r}")
    return count(1)(text)


def model(base_model: bool = True, dtype: bool = True, device: bool = True, auto: bool = False
          ) -> argparse.ArgumentParser:
    """Parent parser of the target's options, those of them the command reads: --base-model, --dtype, --device
    (with `auto`, also --device auto: the target's layers spread over the visible GPUs)."""
    parser = argparse.ArgumentParser(add_help=False)
    if base_model:
        parser.add_argument("--base-model", default=None,
                            help="hub id, folder or .gguf file (default: the embedded SmolLM2)")
    if dtype:
        add_dtype(parser)
    if device:
        parser.add_argument("--device", default="cpu", type=validate.device_or_auto if auto else validate.device,
                            help="cpu (default), cuda, cuda:N" + " or auto (layers spread over the GPUs)" * auto)
    return parser


def eagle() -> argparse.ArgumentParser:
    """Parent parser of the options that shape EAGLE's drafts (only --method eagle reads them)."""
    parser = argparse.ArgumentParser(add_help=False)
    group = parser.add_argument_group("EAGLE options (--method eagle)")
    group.add_argument("--ea-model", default=None,
                       help="EAGLE head folder or hub id (default: the shipped head; 'random': an untrained one)")
    group.add_argument("--tree", default="eagle_default",
                       help="a name (shipped, or ./tree_configs/NAME.json: refused where it differs from a shipped "
                            "NAME), chainN, a .json file, eagle2, opt_tree; +lookup[N]: lookup drafts")
    group.add_argument("--drafter", dest="scheme", default="topk", help="drafting scheme (`eagle-mdsd pairs`)")
    group.add_argument("--verifier", default="topk", help="verifier (`eagle-mdsd pairs`)")
    group.add_argument("--draft-vocab", type=draft_vocab, default="auto", help=DRAFT_VOCAB_HELP)
    for option, text in DYNAMIC_HELP.items():  # which tree takes it, its type and defaults: tree_specs.DEFAULTS
        trees = [name for name, values in tree_specs.DEFAULTS["cpu"].items() if option in values]
        shown = ", ".join(f"{name} {_default(name, option)}" for name in trees)
        group.add_argument("--" + option.replace("_", "-"), type=type(tree_specs.DEFAULTS["cpu"][trees[0]][option]),
                           default=None, help=f"{text} ({shown})")
    return parser


DYNAMIC_HELP = {"total_tokens": "tokens verified per cycle", "depth": "draft levels",
                "top_k": "children per expanded node", "nodes": "draft nodes per cycle",
                "max_depth": "most draft levels", "threshold": "stop growing when a level adds less expected length"}


def _default(tree: str, option: str) -> str:
    """A dynamic tree option's default by device, 'cuda 60/cpu 12', or the one value where they agree."""
    values = {kind: defaults[tree][option] for kind, defaults in tree_specs.DEFAULTS.items()}
    if len(set(values.values())) == 1:
        return f"{values['cpu']:g}"
    return "/".join(f"{kind} {value:g}" for kind, value in values.items())


def engine(profile: bool = True) -> argparse.ArgumentParser:
    """Parent parser of the options of our own decoders (eagle, baseline), which transformers' peers do not read."""
    parser = argparse.ArgumentParser(add_help=False)
    group = parser.add_argument_group("decoder options (not for the transformers peers)")
    group.add_argument("--kernels", default="auto", choices=kernels.CHOICES,
                       help="linear layers: 'auto' packs bf16 weights for oneDNN where the CPU supports it, "
                            "'packed' insists, 'stock' keeps torch's own")
    group.add_argument("--cuda-graphs", default="auto", choices=graphs.CHOICES,
                       help="'auto': the cycle as CUDA graphs on CUDA; 'off': eagerly; 'compile': also the "
                            "models' forwards torch.compiled (fused kernels; minutes to compile)")
    if profile:
        group.add_argument("--profile", action="store_true", help="time the phases of each cycle")
    return parser


def decoding(max_new_tokens: int = 128) -> argparse.ArgumentParser:
    """Parent parser of one decoding's options: --method, --temperature, --max-new-tokens, --seed."""
    parser = argparse.ArgumentParser(add_help=False)
    parser.add_argument("--method", default="eagle", choices=METHODS,
                        help="eagle, baseline (plain decoding, same loop), or transformers' hf_generate, prompt_lookup")
    parser.add_argument("--temperature", type=float, default=0.0)
    parser.add_argument("--max-new-tokens", type=count(1), default=max_new_tokens, help=f"new tokens a turn at "
                        f"most (default {max_new_tokens}; EAGLE's evaluation: up to 512, Spec-Bench's: 1024)")
    parser.add_argument("--seed", type=validate.seed, default=0)
    return parser


def run_folder(kind: str) -> argparse.ArgumentParser:
    """Parent parser of a resumable run's --name, --resume, --out and --answers (benchmark, sweep)."""
    parser = argparse.ArgumentParser(add_help=False)
    parser.add_argument("--name", default=None,
                        help=f"a fresh run's name (default DATE_HOST_TIME_RANDOM): answers in runs/{kind}/NAME/")
    parser.add_argument("--resume", default=None, metavar="NAME|PATH",
                        help="continue an earlier run made with the same settings: its name or its folder")
    parser.add_argument("--out", type=output_folder, default=f"runs/{kind}", help="folder of the report NAME.md")
    parser.add_argument("--answers", type=output_folder, default=f"runs/{kind}", help="folder of the run folders")
    return parser


def defaults(container) -> dict[str, tuple[str, object]]:
    """{destination: (flag, default)} of a parser's or argument group's options, read from the parser itself."""
    actions = container._group_actions if hasattr(container, "_group_actions") else container._actions
    return {action.dest: (action.option_strings[0], action.default) for action in actions if action.option_strings}


def given(args, options: dict[str, tuple[str, object]]) -> list[str]:
    """The flags of `options` (as `defaults` gives them) whose value in `args` is not their default."""
    return [flag for dest, (flag, default) in options.items() if getattr(args, dest, default) != default]


def refuse_unread(flags: list[str], where: str, remedy: str = "") -> None:
    """Options given and then ignored are a usage error: '--a, --b do nothing WHERE: drop them[, or REMEDY]'."""
    if not flags:
        return
    one = len(flags) == 1
    raise UsageError(f"{', '.join(flags)} {'does' if one else 'do'} nothing {where}: drop {'it' if one else 'them'}"
                     + (f", or {remedy}" if remedy else ""))


def run_name(args, kind: str) -> str:
    """The run a `benchmark` or `sweep` writes: a fresh one, named by --name or DATE_HOST_TIME_RANDOM, whose folder
    must not exist yet (so earlier answers are never re-reported as a new measurement), or, with --resume
    NAME|PATH, an existing one it continues.  A PATH (a run's answer folder) sends the answers and the page to its parent."""
    import datetime
    import secrets
    import socket

    answers = Path(args.answers)
    if args.resume is not None:  # (an empty --resume or --name is refused, not read as absent)
        if args.name is not None or not args.resume.strip():
            raise UsageError(f"--name and --resume both name the {kind} run, or --resume is empty: give --resume "
                             f"NAME|PATH to continue one, or --name NAME for a fresh one")
        folder = Path(args.resume)
        if len(folder.parts) > 1 or not (answers / folder).is_dir():  # a path, or a name not under --answers
            if not folder.is_dir():
                raise UsageError(f"--resume {args.resume}: no run folder there nor under {answers}: give the name "
                                 f"of a run under {answers} or the path of its folder")
            if args.out == args.answers:  # the report stays beside the answers, as for a fresh run
                args.out = str(folder.parent)
            args.answers = str(folder.parent)
        return folder.name
    stamp = datetime.datetime.now()  # and a random part: two runs started in one second get two names
    name = f"{stamp:%Y-%m-%d}_{socket.gethostname()}_{stamp:%H%M%S}_{secrets.token_hex(3)}" if args.name is None \
        else args.name
    if len(Path(name).parts) != 1 or name in (".", ".."):
        raise UsageError(f"--name {name!r} is a path: give a plain name (--resume takes a run folder's path)")
    if (answers / name).exists():
        raise UsageError(f"{answers / name} exists: pass --resume {name} to continue that run, or another --name")
    return name


def run_lock(args, name: str):
    """The lock of run `name` under --answers (`locks.held`): a second process on it is refused in one line."""
    from .. import locks

    fix = "run this command again" if args.resume else f"pass another --name, or --resume {name} once it has ended"
    return locks.held(Path(args.answers) / name, f"run {name}", fix)


def temperatures(text: str, what: str = "temperatures") -> tuple[float, ...]:
    """The comma-separated temperatures of --temperatures: at least one, each finite and >= 0."""
    try:
        values = [float(v) for v in text.split(",") if v.strip()]
    except ValueError:
        raise UsageError(f"--{what} must be comma-separated numbers such as 0,0.6,1") from None
    if not values:
        raise UsageError(f"--{what} names no temperature: give at least one, such as 0,1")
    for value in values:
        check_temperature(value, f"each of --{what}")
    return tuple(values)
