"""What the decoding loop costs the host, per cycle: transfers, launched ops and milliseconds.

The target is a random Llama with SmolLM2-135M's layer count and heads but a hidden size of 72 and a
vocabulary of 2,048, and a random EAGLE-1 head: its arithmetic is negligible, so the milliseconds are the
host's cost of issuing the work, the part a GPU cannot hide (the op and transfer counts do not depend on
the sizes).  Per cycle (a plain step for the baselines), at T = 0
unless the row says otherwise:

- transfers: device-to-host transfers (item, tolist, nonzero, bool(), int(), ...; hostsync.syncs), each
  of which drains the launch queue on a GPU;
- uploads: tensors made from host data (a copy that waits for the stream on CUDA);
- aten ops: top-level aten ops that launch a kernel (hostsync.top_level_ops), each a launch on a GPU;
- ms: wall time per cycle.

Each row is counted twice: with graphs off (the cycle run eagerly, every op issued from Python, as on a CPU) and
with graphs emulated (graphs.Emulated, which counts each captured phase as one replay): the ops outside replays,
the replays and the transfers are what a GPU host issues with CUDA graphs on.

A row's figures are (a call of N tokens) - (a call of 1 token, the prefill alone), over its cycles.
transformers `generate` (greedy, DynamicCache, the same model) is the per-step reference.

    .venv/bin/python evaluation/host_overhead.py [--tokens 48] [--out DIR]

Writes DIR/host_overhead.md (default runs/host_overhead/DATE_HOST_TIME/), whole after every row: a run cut short
leaves the rows it finished, on a page that names the rows it did not measure.
"""

from __future__ import annotations

import platform
import socket
import statistics
import sys
import time
from datetime import datetime
from pathlib import Path

import torch
import transformers
from transformers import LlamaConfig, LlamaForCausalLM

from eagle_mdsd import benchmarks, engine, head, hostsync, outputs, tree_specs, verification
from eagle_mdsd import validate
from eagle_mdsd.cli.options import count, output_folder
from eagle_mdsd.errors import UsageError

ROWS = [  # (label, method, tree, drafter, verifier, temperature)
    ("our plain step", "baseline", None, "topk", "topk", 0.0),
    ("eagle_default", "eagle", "eagle_default", "topk", "topk", 0.0),
    ("chain2", "eagle", "chain2", "topk", "topk", 0.0),
    ("eagle2", "eagle", "eagle2", "topk", "topk", 0.0),
    ("eagle2, 16 tokens", "eagle", "eagle2:total_tokens=16,depth=5,top_k=4", "topk", "topk", 0.0),
    ("opt_tree", "eagle", "opt_tree", "topk", "topk", 0.0),
    ("eagle_default+lookup", "eagle", "eagle_default+lookup", "topk", "topk", 0.0),
    ("chain2+lookup", "eagle", "chain2+lookup", "topk", "topk", 0.0),
    ("our plain step, T = 1", "baseline", None, "topk", "topk", 1.0),
    ("opt_tree, T = 1, topk/topk", "eagle", "opt_tree", "topk", "topk", 1.0),
    ("eagle_default+lookup, T = 1, without_replacement/rrs_wo", "eagle", "eagle_default+lookup",
     "without_replacement", "rrs_wo", 1.0),
    *((f"{tree}, T = 1, {scheme}/{verifier}", "eagle", tree, scheme, verifier, 1.0)
      for usual, two_children in (("eagle_default", "binary_depth4"), ("eagle2", "eagle2:top_k=2"))
      for scheme, verifier in verification.pairs()
      for tree in [two_children if scheme == "spechub" else usual]),  # SpecHub drafts two children a node
]
PROMPT = list(range(3, 40))


def tiny_smollm_shape(seed: int = 0):
    """SmolLM2-135M's 30 layers and 9 query and 3 key/value heads, at hidden size 72 (head dim 8), 2,048 tokens."""
    torch.manual_seed(seed)
    config = LlamaConfig(vocab_size=2048, hidden_size=72, intermediate_size=128, num_hidden_layers=30,
                         num_attention_heads=9, num_key_value_heads=3, max_position_embeddings=2048,
                         tie_word_embeddings=True)
    return LlamaForCausalLM(config).eval()


class Runner:
    """One row: a generate(tokens) call against a generate(1) call, per cycle."""

    def __init__(self, call, tokens: int):
        self.call, self.tokens = call, tokens

    def counts(self) -> dict:
        return hostsync.per_cycle(self.call, self.tokens)

    def ms(self, repeats: int) -> float:
        samples = []
        for _ in range(repeats):
            start = time.perf_counter()
            self.call(1)
            middle = time.perf_counter()
            cycles = self.call(self.tokens)
            samples.append(((time.perf_counter() - middle) - (middle - start)) / cycles)
        return 1000 * statistics.median(samples)


def ours(target, draft_head, row, tokens: int, kernels: str, cuda_graphs: str = "off") -> Runner:
    """cuda_graphs 'emulate': graphs.Emulated, whose replays count as one launch each."""
    _, method, tree_name, drafter, verifier, temperature = row
    topology = tree_specs.load(tree_name, "cuda") if tree_name else None  # the host's cost a GPU's trees make
    decoder = engine.Decoder(target, draft_head if method == "eagle" else None, topology, drafter, verifier,
                             kernels_choice=kernels, cuda_graphs=cuda_graphs)

    def call(n):
        return decoder.generate(PROMPT, n, temperature, seed=1, method=method).cycles or 1

    return Runner(call, tokens)


def transformers_generate(target, tokens: int) -> Runner:
    prompt = torch.tensor([PROMPT])

    def call(n):
        with torch.inference_mode():
            target.generate(prompt, max_new_tokens=n, min_new_tokens=n, do_sample=False, pad_token_id=0)
        return max(n - 1, 1)

    return Runner(call, tokens)


def main() -> None:
    parser = validate.Parser(prog="host_overhead.py", description=__doc__.splitlines()[0])
    parser.add_argument("--tokens", type=count(2), default=48, help="new tokens a call (default 48)")
    parser.add_argument("--repeats", type=count(1), default=5, help="timed calls a row; the median counts (default 5)")
    parser.add_argument("--out", type=output_folder,
                        help="folder for the page (default runs/host_overhead/DATE_HOST_TIME)")
    parser.add_argument("--dtype", choices=("float32", "bfloat16"), default="float32")
    parser.add_argument("--kernels", choices=("stock", "auto"), default="stock",
                        help="our decoders' linear layers and attention: 'stock' (default) or 'auto' (in bf16 on a "
                             "CPU with oneDNN: packed weights, and attention on the shared key/value heads)")
    args = parser.parse_args()
    stamp = datetime.now()
    out = Path(args.out or Path("runs/host_overhead") / f"{stamp:%Y-%m-%d}_{socket.gethostname()}_{stamp:%H%M%S}")
    target = tiny_smollm_shape().to(getattr(torch, args.dtype))
    target.generation_config.eos_token_id = None
    draft_head = head.random_head(target)
    with torch.no_grad():
        draft_head.fc.weight.mul_(20.0)
    rows = []
    runners = [("transformers `generate` step", transformers_generate(target, args.tokens), None)]
    runners += [(row[0], ours(target, draft_head, row, args.tokens, args.kernels),
                 ours(target, draft_head, row, args.tokens, args.kernels, "emulate")) for row in ROWS]
    page = out / "host_overhead.md"
    for done, (label, runner, emulated) in enumerate(runners, 1):
        runner.ms(1)  # warm-up; with graphs it also captures them
        graphed = None
        if emulated is not None:
            emulated.ms(1)
            graphed = emulated.counts()
        rows.append((label, runner.counts(), runner.ms(args.repeats), graphed))
        print(f"{label}: {rows[-1][1]} {rows[-1][2]:.2f} ms; graphs emulated: {graphed}", flush=True)
        outputs.write_atomically(page, markdown(rows, [label for label, _, _ in runners[done:]], args, stamp))
    print(f"wrote {page}")


def markdown(rows: list[tuple], left: list[str], args, stamp: datetime) -> str:
    """The page of the rows measured so far, (label, counts, ms, counts with graphs emulated or None) each; `left`
    the labels of the rows not measured yet (empty: the run is complete).  The ratios to our plain step are '-'
    until it is measured."""
    plain = next(((counts, ms) for label, counts, ms, _ in rows if label == "our plain step"), None)
    lines = [
        "# Host cost of the decoding loop, per cycle",
        "",
        *([f"Partial: {len(rows)} of the run's {len(rows) + len(left)} rows measured (it was cut short, or is still "
           f"running); not measured: {'; '.join(left)}.", ""] if left else []),
        f"Machine: {benchmarks.machine_line(benchmarks.machine())}, transformers {transformers.__version__}, "
        f"Python {platform.python_version()}; {stamp:%Y-%m-%d}.",
        "",
        "Command: `" + " ".join([".venv/bin/python evaluation/host_overhead.py", *sys.argv[1:]]) + "`",
        "",
        "Target: a random Llama with SmolLM2-135M's 30 layers and 9/3 heads at hidden size 72 and 2,048 tokens, "
        f"{args.dtype}, {args.kernels} kernels (transformers `generate`: stock); a random EAGLE-1 head. Its "
        "arithmetic is negligible, so the milliseconds are "
        f"the host's. Each row: a call of {args.tokens} new tokens minus a call of 1 (the prefill), over its "
        "cycles (plain steps for the baselines); ms the median of "
        f"{args.repeats} calls.",
        "",
        "Graphs off: the cycle run eagerly, every op issued from Python (the CPU's own loop; at T > 0 the walk "
        "computes the outputs of the nodes it visits, on the host). Graphs emulated: `graphs.Emulated`, which "
        "runs each captured phase inside one profiler range that counts as one replay; the ops outside replays "
        "are what a GPU host issues one by one.",
        "",
        "| per cycle | graphs off: transfers to the host | tensors from host data | top-level aten ops "
        "| ops / our plain step | ms | ms / our plain step | graphs emulated: ops outside graphs | replays "
        "| transfers |",
        "|---|---|---|---|---|---|---|---|---|---|",
    ]
    for label, counts, ms, graphed in rows:
        emulated = ("| - | - | - |" if graphed is None else
                    f"| {graphed['ops']:.0f} | {graphed['replays']:.1f} | {graphed['transfers']:.2f} |")
        ops_ratio, ms_ratio = ("-", "-") if plain is None else (f"{counts['ops'] / plain[0]['ops']:.2f}x",
                                                              f"{ms / plain[1]:.2f}x")
        lines.append(f"| {label} | {counts['transfers']:.2f} | {counts['uploads']:.2f} | {counts['ops']:.0f} | "
                     f"{ops_ratio} | {ms:.2f} | {ms_ratio} {emulated}")
    lines += ["", "Transfers: item, tolist, nonzero, numpy, bool(), int(), float(), a tensor as an index "
              "(eagle_mdsd/hostsync.py). Tensors from host data: torch.tensor and torch.as_tensor of Python "
              "values.", ""]
    return "\n".join(lines)


if __name__ == "__main__":
    try:
        main()
    except UsageError as error:  # a page that cannot be written: one line, exit 2, as the command's own errors
        print(f"host_overhead.py: error: {error}", file=sys.stderr)
        raise SystemExit(2) from None
