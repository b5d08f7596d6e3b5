"""`eagle-mdsd train-head STAGE`: train an EAGLE-1 or EAGLE-3 head in resumable stages.

Each stage is a subcommand with only the options it reads (`all` runs data, train and export), so the parser
refuses an option given to a stage that would ignore it.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from .. import validate
from ..errors import MissingFile, UsageError, read_text
from . import options


def _draft_vocab(text: str):
    """The train stage's --draft-vocab: a number of tokens or 'full' (None); no 'auto', the data rank the tokens."""
    if text == "full":
        return None
    if not text.strip().lstrip("+-").isdigit():
        raise argparse.ArgumentTypeError(f"expected a number of tokens or 'full', got {text!r}")
    return options.count(1)(text)


def _common(parser, seed_help: str) -> None:
    """--seed and --max-minutes, which the prompts, data and train stages read."""
    parser.add_argument("--seed", type=validate.seed, default=0, help=seed_help)
    parser.add_argument("--max-minutes", type=options.positive, default=None, help="stop (resumably) after this long")


def _prompts_options(parser) -> None:
    parser.add_argument("--count", type=options.count(1), default=2560, help="how many prompts the target writes")
    parser.add_argument("--openers", default=None,
                        help="a text file of message openers, one a line: batch b's messages start with line b")
    parser.add_argument("--batch-size", type=options.count(1), default=64,
                        help="messages a batch (a seed repeats its prompts only at the same batch size)")


def _data_options(parser) -> None:
    parser.add_argument("--prompts", nargs="*", help="JSON/JSONL files or folders (default: the training prompt set)")
    parser.add_argument("--max-prompts", type=options.count(1), default=None,
                        help="answer this many of the prompts, shuffled by --seed")
    parser.add_argument("--max-new-tokens", type=options.count(1), default=128, help="answer length")
    parser.add_argument("--batch-size", type=options.count(1), default=128, help="answers a batch")
    parser.add_argument("--shard-size", type=options.count(1), default=256, help="prompts a data shard")
    parser.add_argument("--sort-by-length", action="store_true",
                        help="batch each shard's prompts shortest first (in bf16 some answers change with their batch)")
    parser.add_argument("--mix-reference", action="store_true", help="also train on the datasets' responses")
    parser.add_argument("--no-features", action="store_true",
                        help="keep the token ids alone; the train stage computes the features on its device")
    parser.add_argument("--temperature", type=float, default=0.0, help="sample the answers (default 0: greedy)")


def _train_options(parser) -> None:
    parser.add_argument("--data-from", nargs="*", default=[], help="other runs whose data shards are trained on too")
    parser.add_argument("--format", choices=["eagle1", "eagle3"], default="eagle1",
                        help="eagle1: EAGLE-1's head and loss; eagle3: EAGLE-3's head over three target layers, "
                             "the token loss alone")
    parser.add_argument("--unroll", type=int, default=1,
                        help="draft depths trained on the head's own predictions (1: EAGLE-1's loss)")
    parser.add_argument("--token-weight", type=float, default=0.1, help="weight of the token term (EAGLE: 0.1)")
    parser.add_argument("--token-loss", choices=["ce", "tv", "top1"], default="ce",
                        help="ce: cross-entropy against the target's distribution; tv: total variation; "
                             "top1: cross-entropy against its most probable token")
    parser.add_argument("--draft-vocab", type=_draft_vocab, default=None,
                        help="score the cross-entropy over the N most frequent answer tokens; 'full' (default): all")
    parser.add_argument("--init-from", default=None, help="start from this run's checkpoint or an exported head")
    parser.add_argument("--epochs", type=options.positive, default=1.0)
    parser.add_argument("--lr", type=options.positive, default=5e-4)
    parser.add_argument("--tokens-per-batch", type=options.count(1), default=4096)
    parser.add_argument("--schedule-minutes", type=options.positive, default=None,
                        help="end the learning rate's decay, and the training, after this many minutes")


def _export_options(parser, evaluate: bool = False) -> None:
    parser.add_argument("--export-to", type=None if evaluate else options.output_folder, default=None,
                        help=f"{'the exported head to evaluate' if evaluate else 'export folder'} (default RUN/head)")
    if not evaluate:
        parser.add_argument("--eagle1-format", action="store_true",
                            help="export pytorch_model.bin with the embedding copy")


def add_parser(sub) -> None:
    parser = sub.add_parser("train-head", help="train an EAGLE-1 or EAGLE-3 head: data, train and export (resumable)")
    stages = parser.add_subparsers(dest="stage", required=True, metavar="STAGE")
    run = argparse.ArgumentParser(add_help=False)  # every stage's
    run.add_argument("--run", type=options.output_folder, default="runs/smollm2-head",
                     help="folder for shards, checkpoint and exports")
    target = options.model()  # the stages that run the target; train and export read its config alone
    prompts = stages.add_parser("prompts", parents=[run, target], help="the target writes its own training prompts")
    _prompts_options(prompts)
    _common(prompts, "the sampling's seed")
    data = stages.add_parser("data", parents=[run, target], help="the target answers the prompts into data shards")
    _data_options(data)
    _common(data, "the prompts' shuffle, so which of them --max-prompts takes")
    train = stages.add_parser("train", parents=[run, options.model(dtype=False)],
                              help="train the head on the data shards")
    _train_options(train)
    train.add_argument("--export", action="store_true",
                       help="then export the head to RUN/head, as the export stage does (one process, not two)")
    _common(train, "the head's initialisation and the batch order")
    export = stages.add_parser("export", parents=[run, options.model(dtype=False, device=False)],
                               help="write the trained head as a head folder")
    _export_options(export)
    every = stages.add_parser("all", parents=[run, target], help="data, train and export in one call")
    _data_options(every)
    _train_options(every)
    _export_options(every)
    _common(every, "the prompts' shuffle, the head's initialisation and the batch order")
    evaluate = stages.add_parser("evaluate", parents=[run, options.model(dtype=False, device=False)],
                                 help="teacher-forced top-1 of an exported head")
    _export_options(evaluate, evaluate=True)
    for stage, fn in ((prompts, run_prompts), (data, run_data), (train, run_train), (export, run_export),
                      (every, run_all)):
        stage.set_defaults(fn=_locked(fn))
    evaluate.set_defaults(fn=run_evaluate)  # (reads the run)


def _locked(stage):
    """The stage, run while it holds the lock of --run (`locks.held`): one process writes a run at a time."""
    def run(args) -> None:
        from .. import locks

        with locks.held(Path(args.run), f"run {args.run}", "run this command again"):
            stage(args)
    return run


def _openers(path) -> list[str] | None:
    """The lines of an openers file, or None without one."""
    if path is None:
        return None
    if not Path(path).exists():
        raise MissingFile(f"openers file {path} does not exist: give a text file with one message opener a line")
    openers = [line.strip() for line in read_text(path, "openers file").splitlines() if line.strip()]
    if not openers:
        raise UsageError(f"openers file {path} has no lines: write one message opener a line (e.g. 'Write a')")
    return openers


def _data_recipe(args):
    from .. import training

    return training.DataRecipe(max_prompts=args.max_prompts, max_new_tokens=args.max_new_tokens,
                               batch_size=args.batch_size, shard_size=args.shard_size,
                               mix_reference=args.mix_reference, seed=args.seed, temperature=args.temperature,
                               sort_by_length=args.sort_by_length, features=not args.no_features)


def _train_recipe(args):
    from .. import training

    return training.TrainRecipe(epochs=args.epochs, lr=args.lr, tokens_per_batch=args.tokens_per_batch,
                                seed=args.seed, data_from=args.data_from, unroll=args.unroll,
                                init_from=args.init_from, token_weight=args.token_weight,
                                draft_vocab=args.draft_vocab, token_loss=args.token_loss, format=args.format)


def run_prompts(args) -> None:
    from .. import training

    path = training.self_prompts(Path(args.run), args.count, args.base_model, args.dtype,
                                 batch_size=args.batch_size, seed=args.seed, max_minutes=args.max_minutes,
                                 openers=_openers(args.openers), device=args.device)
    print(f"{len(training.load_prompts([path]))} self-written prompts in {path}")


def _make_data(args, recipe) -> None:
    from .. import training

    shards = training.make_data(Path(args.run), args.prompts or [training.DEFAULT_PROMPTS], recipe, args.base_model,
                                args.dtype, args.max_minutes, args.device)
    print(f"{len(shards)} data shards in {Path(args.run) / 'data'}")


def _train(args, recipe) -> None:
    from .. import training

    state = training.train(Path(args.run), recipe, args.base_model, args.device, args.max_minutes,
                           schedule_minutes=args.schedule_minutes)
    recent = state["log"][-20:]
    if recent:
        print(f"step {state['step']}: loss {sum(r['loss'] for r in recent) / len(recent):.4f}, "
              f"top-1 {sum(r['top1'] for r in recent) / len(recent):.3f} (mean of the last {len(recent)} steps)")


def run_data(args) -> None:
    _make_data(args, _data_recipe(args))


def run_train(args) -> None:
    _train(args, _train_recipe(args))
    if args.export:
        _export(args.run, args.base_model)


def _export(run, base_model, export_to=None, eagle1_format: bool = False) -> None:
    from .. import training

    destination = Path(export_to) if export_to else Path(run) / "head"
    print(f"wrote {training.export(Path(run), destination, base_model, compact=not eagle1_format)}")


def run_export(args) -> None:
    _export(args.run, args.base_model, args.export_to, args.eagle1_format)


def run_all(args) -> None:
    from .. import training

    data_recipe, train_recipe = _data_recipe(args), _train_recipe(args)  # both checked before the data stage runs
    training.check_before_data(train_recipe, args.base_model)
    _make_data(args, data_recipe)
    _train(args, train_recipe)
    run_export(args)


def run_evaluate(args) -> None:
    from .. import training

    head_spec = Path(args.export_to) if args.export_to else Path(args.run) / "head"
    print(json.dumps(training.evaluate(Path(args.run), head_spec, args.base_model)))
