"""Steps and cycles on a target of a real shape with random weights, and how busy they keep the device.

The target is a Llama built on the device with random weights (no download): `smollm2` has the embedded
default's shape (SmolLM2-135M: hidden 576, 30 layers, vocabulary 49152, tied embeddings) and drafts with the
shipped head over its draft vocabulary, as the benchmark does; `vicuna7b` has Vicuna-7B's (hidden 4096, 32
layers, vocabulary 32000) and a random EAGLE-1 head; `tiny` is a small one for trying the script on a CPU.  A
forward costs what the real model's costs, so the milliseconds are real; the drafts of a random target are seldom
accepted, so tau is not.  Rows, in one process, each the median of REPEATS calls of TOKENS new tokens after a
PROMPT-token prompt, the prefill subtracted (a call of 1 token timed beside each):

- ms per step of our plain loop, of transformers `generate` (eager) and of `hf_compiled` (static cache and
  torch.compile; its compile and warm-up seconds apart);
- ms per cycle of EAGLE on each tree at each temperature, with the benchmark's drafter and verifier there;
- with --compile-ours, the same for our plain step and eagle_default with `--cuda-graphs compile` (the target's
  and head's forwards compiled by torch.compile inside the graphs; its compile seconds are the row's warm-up);
- the weight-read floor: the bytes a step reads (the weights; the KV cache is small at these lengths) over the
  device's copy bandwidth, measured here;
- how many CUDA graphs each of our rows captured (a refused capture ends the script in one line: graphs.py);
- with --profile on CUDA, the share of the wall time the GPU is busy (kernel time over elapsed, torch's
  profiler) and the device activities (kernels, copies) a step or cycle, in a plain step and an eagle_default
  cycle, and the profiler's trace of a short eagle_default call (trace_SHAPE.json.gz, for chrome://tracing or
  Perfetto): where a cycle's time goes when it is not what its kernels predict;
- with --tau-from RESULT.json (a benchmark's result), projected tokens/s: that run's tau for the row's method over
  these ms per cycle, a projection and labelled so.

The page is rewritten after every row, so a call cut short keeps what was timed.

    python evaluation/gpu_cycle.py [--shape vicuna7b] [--device cuda] [--tokens 64] [--out DIR]

Writes DIR/gpu_cycle_SHAPE.md (default runs/gpu_cycle/DATE_HOST_TIME/).
"""

from __future__ import annotations

import json
import socket
import statistics
import subprocess
import sys
import time
from datetime import datetime
from pathlib import Path

import torch
import transformers
from transformers import LlamaConfig, LlamaForCausalLM

from eagle_mdsd import benchmarks, engine, head, models, outputs, peers, validate
from eagle_mdsd.benchmark import plans
from eagle_mdsd.cli.options import count, output_folder
from eagle_mdsd.errors import UsageError, check_temperature

SHAPES = {
    "smollm2": dict(hidden_size=576, intermediate_size=1536, num_hidden_layers=30, num_attention_heads=9,
                    num_key_value_heads=3, vocab_size=49152, max_position_embeddings=8192, rope_theta=100000.0,
                    tie_word_embeddings=True),
    "vicuna7b": dict(hidden_size=4096, intermediate_size=11008, num_hidden_layers=32, num_attention_heads=32,
                     num_key_value_heads=32, vocab_size=32000, max_position_embeddings=2048,
                     tie_word_embeddings=False),
    "tiny": dict(hidden_size=64, intermediate_size=128, num_hidden_layers=4, num_attention_heads=4,
                 num_key_value_heads=2, vocab_size=512, max_position_embeddings=2048, tie_word_embeddings=False),
}
TREES = ("eagle_default", "chain2", "eagle2")


def random_target(shape: str, device: str, dtype: torch.dtype):
    """A Llama of the named shape with random weights, made on the device (seconds, not a download)."""
    torch.manual_seed(0)
    config = LlamaConfig(**SHAPES[shape])
    with torch.device(device):
        model = LlamaForCausalLM._from_config(config, dtype=dtype)
    model.generation_config.eos_token_id = None
    return model.eval()


def draft_head_for(shape: str, target):
    """The shipped head on the embedded default's shape (so drafts cost what the benchmark's cost), else random."""
    return head.load_head(models.DEFAULT_HEAD, target) if shape == "smollm2" else head.random_head(target)


def synchronise(device: str) -> None:
    if torch.device(device).type == "cuda":
        torch.cuda.synchronize()


def per_cycle_ms(call, tokens: int, repeats: int, device: str) -> tuple[float, int]:
    """Median ms per cycle of call(tokens) - call(1), and the cycles of the last call."""
    samples, cycles = [], 1
    for _ in range(repeats):
        synchronise(device)
        start = time.perf_counter()
        call(1)
        synchronise(device)
        middle = time.perf_counter()
        cycles = call(tokens)
        synchronise(device)
        samples.append(((time.perf_counter() - middle) - (middle - start)) / max(cycles, 1))
    return 1000 * statistics.median(samples), cycles


def device_activity(events) -> tuple[float, int]:
    """(seconds, count) of the profiler's raw device events (kernels, copies); host events are left out."""
    device = [event for event in events if event.device_type() == torch.autograd.DeviceType.CUDA]
    return sum(event.duration_ns() for event in device) / 1e9, len(device)


def busy_share(call) -> tuple[float, float]:
    """(the GPU's kernel time over the wall time of the cycles, device activities a cycle) from torch's profiler,
    as call(n) - call(1) so that the prefill and the call's setup drop out (as in `per_cycle_ms`): its device
    activity alone, read from the raw events (the event tree that key_averages() builds took longer than a call's
    deadline on a Vicuna-7B-shaped cycle).  call(n) returns its cycles.  The profiler slows the host's launches a
    little, so the share is a lower bound."""
    from torch.profiler import ProfilerActivity, profile

    measured = {}
    for tokens in (None, 1):
        call(tokens)
        torch.cuda.synchronize()
        with profile(activities=[ProfilerActivity.CUDA]) as prof:
            start = time.perf_counter()
            cycles = call(tokens)
            torch.cuda.synchronize()
            wall = time.perf_counter() - start
        measured[tokens] = (wall, *device_activity(prof.profiler.kineto_results.events()), cycles)
    (wall, seconds, count, cycles), (wall1, seconds1, count1, _) = measured[None], measured[1]
    return (seconds - seconds1) / (wall - wall1), (count - count1) / max(cycles, 1)


def save_trace(call, path: Path, device: str) -> None:
    """The profiler's trace (host and, on CUDA, device) of call(), gzipped: what the host issues between the
    graphs' replays and what the device runs."""
    import gzip
    import shutil

    from torch.profiler import ProfilerActivity, profile

    call()
    synchronise(device)
    cuda = [ProfilerActivity.CUDA] if torch.device(device).type == "cuda" else []
    with profile(activities=[ProfilerActivity.CPU, *cuda]) as prof:
        call()
        synchronise(device)
    raw = path.with_suffix("")
    prof.export_chrome_trace(str(raw))
    with open(raw, "rb") as source, gzip.open(path, "wb") as target:
        shutil.copyfileobj(source, target)
    raw.unlink()


def compilations() -> int:
    """Graphs torch.compile has made so far in this process (a recompilation makes one more)."""
    from torch._dynamo.utils import counters

    return int(counters["stats"]["unique_graphs"])


def graphs_note(decoder) -> str:
    """How a decoder's cycle ran: 'off' (no CUDA graphs: a CPU, or --cuda-graphs off), else the number of graphs
    captured."""
    return "off" if decoder.graphs is None else f"{len(decoder.graphs.entries)} captured"


def copy_bandwidth(device: str, megabytes: int, copies: int = 10) -> float:
    """Bytes per second a device-to-device copy moves (read and write counted), the best of 5 runs of `copies`
    back-to-back copies (one copy of a GiB takes half a millisecond on an H200: the clock's and launch's
    microseconds would weigh on it)."""
    source = torch.empty(megabytes << 20, dtype=torch.uint8, device=device)
    target = torch.empty_like(source)
    best = float("inf")
    for _ in range(5):
        synchronise(device)
        start = time.perf_counter()
        for _ in range(copies):
            target.copy_(source)
        synchronise(device)
        best = min(best, (time.perf_counter() - start) / copies)
    return 2 * source.numel() / best


def step_bytes(target) -> int:
    """The bytes of weights a one-token step reads: every parameter, but of an untied input embedding one row."""
    total = sum(p.numel() * p.element_size() for p in target.parameters())
    embedding = target.get_input_embeddings().weight
    if embedding.data_ptr() != target.get_output_embeddings().weight.data_ptr():
        total -= (embedding.shape[0] - 1) * embedding.shape[1] * embedding.element_size()
    return total


def gpu_facts(device: str) -> str:
    if torch.device(device).type != "cuda":
        return "no GPU (device cpu)"
    try:
        driver = subprocess.run(["nvidia-smi", "--query-gpu=driver_version", "--format=csv,noheader"],
                                capture_output=True, text=True, timeout=30).stdout.strip()
    except (OSError, subprocess.SubprocessError):
        driver = "unknown"
    return f"{torch.cuda.get_device_name()}, driver {driver}, CUDA {torch.version.cuda}"


def measured_tau(result_file: Path | None) -> dict:
    """{(row label, T): tau} from a benchmark's result JSON: EAGLE's trees, baseline and hf_generate."""
    if result_file is None:
        return {}
    result = json.loads(Path(result_file).read_text())
    taus = {}
    for tag, block in result["temperatures"].items():
        for entry in block["entries"]:
            label = entry["label"]
            tree = label[6:-1].split(":")[0] if label.startswith("eagle[") else None
            name = {"baseline": "ours, plain step", "hf_generate": "transformers `generate` (eager), step"}.get(
                label, f"ours, {tree} cycle" if tree else None)
            if name:
                taus[name, float(tag[1:])] = entry["categories"]["all"]["tau"]
    return taus


def main(argv=None) -> None:
    parser = validate.Parser(prog="gpu_cycle.py", description=__doc__.splitlines()[0])
    parser.add_argument("--shape", choices=sorted(SHAPES), default="vicuna7b")
    parser.add_argument("--device", default="cuda")
    parser.add_argument("--dtype", default="bfloat16", choices=("bfloat16", "float16", "float32"))
    parser.add_argument("--prompt", type=count(1), default=128, help="prompt tokens (default 128)")
    parser.add_argument("--tokens", type=count(1), default=64, help="new tokens a timed call (default 64)")
    parser.add_argument("--repeats", type=count(1), default=3, help="timed calls a row (default 3)")
    parser.add_argument("--temperatures", default="0,1", help="EAGLE's cycles at these temperatures (default 0,1)")
    parser.add_argument("--trees", nargs="+", default=list(TREES), help="EAGLE's trees (default: %(default)s)")
    parser.add_argument("--no-compiled", action="store_true", help="skip hf_compiled (its compile takes a while)")
    parser.add_argument("--compile-ours", action="store_true",
                        help="also our plain step and eagle_default with --cuda-graphs compile (minutes to compile)")
    parser.add_argument("--profile", action="store_true", help="also the GPU's busy share (CUDA)")
    parser.add_argument("--tau-from", type=Path, help="a benchmark's result JSON: projected tokens/s from its tau")
    parser.add_argument("--out", type=output_folder, help="folder for the page (default runs/gpu_cycle/DATE_HOST_TIME)")
    args = parser.parse_args(argv)
    # every option checked before the target is built: on a GPU a late refusal costs device time
    if args.device.startswith("cuda") and not torch.cuda.is_available():
        parser.error("--device cuda but torch sees no CUDA device: use --device cpu (with --shape tiny)")
    if args.tau_from is not None and not args.tau_from.is_file():
        parser.error(f"--tau-from {args.tau_from} is no file: give a benchmark's result JSON")
    try:
        temperatures = [float(t) for t in args.temperatures.split(",")]
    except ValueError as error:  # (float() names the text it could not read)
        parser.error(f"--temperatures {args.temperatures}: {error}")
    try:  # each names its option
        models.check_device(args.device)
        for temperature in temperatures:
            check_temperature(temperature, "each of --temperatures")
        plans.benchmark_setups(args.trees, "topk", "topk", tuple(plans.SAMPLING_PAIR.split("/")), device=args.device)
    except UsageError as error:
        parser.error(str(error))
    try:
        taus = measured_tau(args.tau_from)
    except (OSError, ValueError, KeyError, TypeError, AttributeError) as error:
        parser.error(f"--tau-from {args.tau_from} is no benchmark result JSON ({error!r})")
    stamp = datetime.now()
    out = Path(args.out or Path("runs/gpu_cycle") / f"{stamp:%Y-%m-%d}_{socket.gethostname()}_{stamp:%H%M%S}")
    page = out / f"gpu_cycle_{args.shape}.md"
    trace = out / f"trace_{args.shape}.json.gz"
    dtype = getattr(torch, args.dtype)
    start = time.perf_counter()
    target = random_target(args.shape, args.device, dtype)
    draft_head = draft_head_for(args.shape, target)
    build_s = time.perf_counter() - start
    cuda = torch.device(args.device).type == "cuda"
    weights = step_bytes(target)
    bandwidth = copy_bandwidth(args.device, 1024 if cuda else 128)
    floor_ms = 1000 * weights / bandwidth
    prompt = torch.randint(3, target.config.vocab_size, (args.prompt,), generator=torch.Generator().manual_seed(1))
    prompt = prompt.tolist()
    rows = {}  # label -> (ms, cycles, warm-up s, T, graphs: graphs_note or "-" for a peer)
    shares = {}  # what -> (busy share, device activities a step or cycle)

    def write_page() -> None:
        """The page with the rows timed so far (rewritten after each, so a call cut short still leaves one)."""
        lines = [f"# Steps and cycles, {args.shape}-shaped target with random weights, {stamp:%Y-%m-%d}", "",
                 f"Machine: {benchmarks.machine_line(benchmarks.machine(args.device))}; {gpu_facts(args.device)}; "
                 f"transformers {transformers.__version__}.", "",
                 f"Command: `python evaluation/gpu_cycle.py {' '.join(sys.argv[1:])}`", "",
                 f"Random {args.dtype} weights of the {args.shape} shape ({SHAPES[args.shape]}), built on the device "
                 f"in {build_s:.1f} s; {'the shipped head' if args.shape == 'smollm2' else 'a random EAGLE-1 head'}; "
                 f"a {args.prompt}-token prompt, {args.tokens} new tokens a call, the median of {args.repeats} calls "
                 "with the prefill subtracted. Warm-up: each method's first full call (CUDA graphs captured, "
                 "hf_compiled compiled), not timed. The drafts of a random target are seldom accepted: the ms are "
                 "real, tau is not.", "",
                 f"Weight-read floor: {weights / 1e6:.1f} MB a step over {bandwidth / 1e9:.0f} GB/s (a device copy's "
                 f"bandwidth, measured here) = **{floor_ms:.3f} ms** a step.", ""]
        # a row's CPU tau: by its tree and temperature, a compiled row's that of the same row uncompiled
        row_tau = {name: taus.get((name.split(", T = ")[0].replace("compiled ", ""), t))
                   for name, (_, _, _, t, _) in rows.items()}
        projected = any(tau is not None for tau in row_tau.values())
        lines += ["| what | ms per step or cycle | over the floor | cycles a call | warm-up s | CUDA graphs |"
                  + (" projected tokens/s |" if projected else ""),
                  "|---|---|---|---|---|---|" + ("---|" if projected else "")]
        for name, (ms, cycles, warm, _, note) in rows.items():
            tau = row_tau[name]
            lines.append(f"| {name} | {ms:.2f} | {ms / floor_ms:.2f}x | {cycles} | {warm:.1f} | {note} |"
                         + ((f" {1000 * tau / ms:.0f} (tau {tau:.2f}) |" if tau else " - |") if projected else ""))
        notes = [note for *_, note in rows.values() if note != "-"]
        if notes and all(note == "off" for note in notes):
            lines += ["", "CUDA graphs: off on this device; every row of ours ran eagerly."]
        elif notes:
            lines += ["", f"CUDA graphs: captured for every row of ours ({len(notes)} rows), none refused."]
        if projected:
            lines += ["", f"Projected tokens/s (a projection, not a measurement): the tau that "
                      f"`{args.tau_from}` measured for the row's method and temperature over the ms above (tau "
                      f"counts each turn's token sampled after its prefill too, which puts the projection about "
                      f"1% above the cycles' own rate at 128 new tokens a turn)."]
        plain = rows.get("ours, plain step", (None,))[0]
        eager = rows.get("transformers `generate` (eager), step", (None,))[0]
        compiled = rows.get("hf_compiled, step", (None,))[0]
        if plain and eager:
            lines += ["", f"Our plain step over `generate`'s: {plain / eager:.2f}x"
                      + (f"; over hf_compiled's: **{plain / compiled:.2f}x**." if compiled else ".")]
        for name, (share, activities) in shares.items():
            lines.append(f"GPU busy in {name} (kernel time over wall time, torch.profiler, a call of "
                         f"{args.tokens} tokens less a call of 1, so without the prefill; a lower bound, as the "
                         f"profiler slows the host): **{100 * share:.0f}%**; {activities:.0f} device activities "
                         f"(kernels, copies) a step or cycle.")
        if trace.exists():
            lines.append(f"The profiler's trace of an eagle_default call of 8 tokens, T = 0: `{trace.name}`.")
        out.mkdir(parents=True, exist_ok=True)
        outputs.write_atomically(page, "\n".join(lines) + "\n")  # a call cut mid-write keeps the last page

    def timed(name: str, call, t: float = 0.0, warm_s: float | None = None, decoder=None) -> None:
        """One row: call(n) answers n tokens and returns its cycles; its first call warms up, untimed.  decoder:
        ours, whose CUDA graphs the row reports."""
        if warm_s is None:  # both calls the timing makes (a compiled forward may meet a new shape in either)
            begun = time.perf_counter()
            call(args.tokens)
            call(1)
            warm_s = time.perf_counter() - begun
        compiled_before = compilations()
        ms, cycles = per_cycle_ms(call, args.tokens, args.repeats, args.device)
        label = name if name.endswith("step") else f"{name}, T = {t:g}"
        note = "-" if decoder is None else graphs_note(decoder)
        again = compilations() - compiled_before  # a shape the warm-up did not meet: its compiling was timed
        if again:
            note = f"**compiled {again}x while timed**" + ("" if note == "-" else f"; {note}")
        rows[label] = (ms, cycles, warm_s, t, note)
        print(f"{label}: {ms:.2f} ms ({cycles} cycles; warm-up {warm_s:.1f} s)", flush=True)
        write_page()

    write_page()
    prompt_tensor = torch.tensor([prompt], device=args.device)
    plain = engine.Decoder(target)
    timed("ours, plain step", lambda n: plain.generate(prompt, n, 0.0, method="baseline").cycles, decoder=plain)

    def eager_call(n):
        with torch.inference_mode():
            target.generate(prompt_tensor, max_new_tokens=n, min_new_tokens=n, do_sample=False, pad_token_id=0)
        return max(n - 1, 1)

    timed("transformers `generate` (eager), step", eager_call)
    sampled = tuple(plans.SAMPLING_PAIR.split("/"))
    setups = plans.benchmark_setups(args.trees, "topk", "topk", sampled, device=args.device)

    def eagle_row(setup, t: float, cuda_graphs: str = "auto") -> None:
        """The row of one benchmark setup (the tree and pair of each temperature) at T = t."""
        tree_name, topology, drafter, verifier = setup[t > 0]
        decoder = engine.Decoder(target, draft_head, topology, drafter, verifier, draft_vocab="auto",
                                 cuda_graphs=cuda_graphs)
        name = f"ours, {'compiled ' if cuda_graphs == 'compile' else ''}{tree_name.split(':')[0]} cycle"
        timed(name, lambda n: decoder.generate(prompt, n, t, method="eagle").cycles, t, decoder=decoder)

    for t in temperatures:
        for setup in setups:
            eagle_row(setup, t)
    if args.compile_ours:
        fused = engine.Decoder(target, cuda_graphs="compile")
        timed("ours, compiled plain step", lambda n: fused.generate(prompt, n, 0.0, method="baseline").cycles,
              decoder=fused)
        for t in temperatures:
            eagle_row(plans.benchmark_setups(["eagle_default"], "topk", "topk", sampled, device=args.device)[0], t,
                      "compile")
    if not args.no_compiled:
        compiled = peers.CompiledPeer(target, [], cache_tokens=args.prompt + args.tokens)
        warm_s = compiled.prepare()
        begun = time.perf_counter()
        compiled.generate(prompt, args.tokens, 0.0)
        warm_s += time.perf_counter() - begun
        timed("hf_compiled, step", lambda n: max(compiled.generate(prompt, n, 0.0).new_tokens - 1, 1), warm_s=warm_s)
    if args.profile and cuda:
        shares["our plain step"] = busy_share(
            lambda n: plain.generate(prompt, n or args.tokens, 0.0, method="baseline").cycles)
        write_page()
        default = next((s[False] for s in setups if s[False][0] == "eagle_default"), None)
        if default is not None:
            decoder = engine.Decoder(target, draft_head, default[1], draft_vocab="auto")
            shares["an eagle_default cycle, T = 0"] = busy_share(
                lambda n: decoder.generate(prompt, n or args.tokens, 0.0, method="eagle").cycles)
            write_page()
            save_trace(lambda: decoder.generate(prompt, 8, 0.0, method="eagle"), trace, args.device)
        write_page()
    print(page.read_text())
    print(f"wrote {page}")


if __name__ == "__main__":
    main()
