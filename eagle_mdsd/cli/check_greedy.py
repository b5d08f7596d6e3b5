"""`eagle-mdsd check-greedy`: T = 0 token equality of every tree with transformers' generate."""

from __future__ import annotations

import datetime
from pathlib import Path

from .. import checks, graphs, outputs, tree_specs, validate
from ..errors import UsageError
from . import options


def add_parser(sub) -> None:
    parser = sub.add_parser("check-greedy", help="T=0 token equality with transformers generate")
    parser.add_argument("--base-model", default=None,
                        help="hub id, folder or .gguf file (default: the embedded SmolLM2); names the results file")
    parser.add_argument("--questions", type=options.count(1), default=5)
    parser.add_argument("--max-new-tokens", type=options.count(1), default=128)
    parser.add_argument("--trees", nargs="+", default=list(checks.ALL_TREES),
                        help="trees, 'baseline' (our plain decoding), 'hf_compiled' (compiled generate); default: all")
    parser.add_argument("--dtypes", default="float32,bfloat16")
    parser.add_argument("--ea-model", default="random", help="head folder, or 'random' (default)")
    parser.add_argument("--device", default="cpu", type=validate.device,
                        help="cpu, or cuda, cuda:1, ... (the results file says which)")
    parser.add_argument("--cuda-graphs", default="auto", choices=graphs.CHOICES,
                        help="'auto': replay CUDA graphs on CUDA; 'off' (the results file says so): eagerly")
    parser.add_argument("--out", type=options.output_folder, default="runs/check-greedy")
    parser.set_defaults(fn=run)


def run(args) -> None:
    from .. import head, models

    repeated = sorted({name for name in args.trees if args.trees.count(name) > 1})
    if repeated:
        raise UsageError(f"--trees names {', '.join(repeated)} more than once: name each tree once")
    for name in args.trees:  # a bad tree name before any model loads
        if name not in checks.NOT_TREES:
            tree_specs.load(name)
    if args.ea_model != "random":
        head.inspect(args.ea_model)  # and a bad head's files
    out = Path(args.out)
    model = ("" if args.base_model in (None, models.EMBEDDED)
             else "_" + models.model_name(args.base_model).removesuffix(".gguf"))
    where = "" if args.device == "cpu" else "_" + args.device.replace(":", "")  # rows of one device a file
    if graphs.resolve(args.cuda_graphs, args.device) != graphs.resolve("auto", args.device):
        where += "_graphs-off"
    if args.cuda_graphs == "compile":  # compiled forwards round otherwise: rows of their own
        where += "_compiled"
    rows_file = out / f"greedy_check_{datetime.date.today().isoformat()}{model}{where}.jsonl"
    rows = checks.greedy_equivalence(rows_file, args.questions, args.max_new_tokens, args.trees,
                                     args.dtypes.split(","), args.ea_model, args.base_model, args.device,
                                     args.cuda_graphs)
    text = checks.summary_markdown(rows, args.max_new_tokens, args.ea_model, args.base_model, args.device)
    outputs.write_atomically(rows_file.with_suffix(".md"), text)
    print(text)
