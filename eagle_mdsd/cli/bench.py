"""`eagle-mdsd bench`: answer MT-Bench / Spec-Bench questions into an answer file, resumably."""

from __future__ import annotations

import json
from pathlib import Path

from .. import validate
from ..errors import UsageError
from . import options, runners


def add_parser(sub) -> None:
    parser = runners.add_parser(sub, "bench", help="answer MT-Bench / Spec-Bench questions into an answer file "
                                                   "(resumable)")
    parser.add_argument("--bench", default="mt_bench",
                        help="mt_bench, spec_bench, a category, or a .jsonl file of questions ('turns' or 'prompt' "
                             "records)")
    parser.add_argument("--question-begin", type=options.count(0), default=None)
    parser.add_argument("--question-end", type=options.count(0), default=None)
    parser.add_argument("--turns", type=options.count(0), default=None,
                        help="answer only the first N turns (default or 0: all)")
    parser.add_argument("--model-id", default=None, help="the answers' model_id (default: MODEL-METHOD)")
    parser.add_argument("--answer-file", type=options.output_file, default=None,
                        help="the .jsonl file answers are appended to (default runs/bench/BENCH/MODEL_ID.jsonl)")
    parser.add_argument("--json", action="store_true", help="print the summary as one JSON object")
    parser.set_defaults(fn=run)


def row_settings(args):
    """The bench.Settings of the command line, with the context its rows record; a bad tree, dtype or head is a
    one-line error here, before any model loads."""
    from .. import bench, checkpoint, models, tree
    from ..benchmark import plans

    context = {"dtype": str(models.parse_dtype(args.dtype)).removeprefix("torch."),
               "base_model": args.base_model or models.EMBEDDED}
    # where and how the timings were made, where not the defaults (rows of older files record none of these)
    context |= {key: value for key, value, default in (("device", args.device, "cpu"), ("kernels", args.kernels,
                "auto"), ("cuda_graphs", args.cuda_graphs, "auto")) if value != default}
    if args.bench.endswith(".jsonl"):  # its ids may be MT-Bench's for other questions (shipped benches record none)
        context["questions"] = Path(args.bench).name
    if args.method == "eagle":
        spec = args.ea_model or models.DEFAULT_HEAD
        topology = runners.topology(args)
        context |= {"tree": plans.tree_label(topology), **tree.file_record(topology), "drafter": args.scheme,
                    "verifier": args.verifier, "draft_vocab": args.draft_vocab,
                    "head": f"random:{args.seed}" if spec == "random" else
                    checkpoint.head_checksum(checkpoint.head_folder(str(spec)))}
    return bench.Settings(args.method, args.max_new_tokens, args.temperature, args.seed, args.profile, args.turns,
                          tuple(context.items()))


def run(args) -> None:
    from accelerate import PartialState

    from .. import bench, locks, models, questions, report

    if args.model_id is not None and not (args.model_id.strip() and validate.is_cell_text(args.model_id)):
        raise UsageError(f"--model-id {args.model_id!r}: a report names the answers' row by it: no blank one, no "
                         f"'|' and no line break")
    chosen = questions.select(args.bench, args.question_begin, args.question_end)
    # One process unless started by `accelerate launch` (GPUs) or `torchrun` (CPU processes, gloo).
    state = PartialState(cpu=args.device == "cpu")
    device = args.device
    if state.num_processes > 1 and device == "cuda":
        device = str(state.device)  # one GPU per process
    model_id = args.model_id or f"{models.model_name(args.base_model)}-{args.method}"
    answer_file = Path(args.answer_file or f"runs/bench/{args.bench}/{model_id}.jsonl")
    settings = row_settings(args)  # what every row records
    process = (state.process_index, state.num_processes)
    # One writer a file: the main process locks the answer file (it merges the shards into it), the others their
    # shards; from before the model loads to the end.
    locked = answer_file if state.is_main_process else bench.target_file(answer_file, process)
    with locks.held(locked, f"answer file {locked}", "run this command again"):
        bench.check_answer_file(answer_file, settings, chosen)  # before the model loads
        runner, tokenizer = runners.build(args, device)
        bench.run(runner, tokenizer, chosen, answer_file, model_id, settings,
                  bench.fastchat_template(args.base_model), process=process, command=args.command_line)
        state.wait_for_everyone()
        if not state.is_main_process:
            return
        bench.merge_shards(answer_file)
    summary = report.summarise(answer_file)
    print(json.dumps(summary["all"]) if args.json else
          "\n".join(f"{name:16s} questions {s['questions']:3d}  tau {s['tau']:.2f}  {s['tokens_per_s']:.1f} tokens/s"
                    for name, s in summary.items()))
