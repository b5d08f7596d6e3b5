"""A decoding cycle against a plain step on a target of a real shape, and how busy it keeps the device.

The target is a Llama built on the device with random weights (no download): `vicuna7b` has
Vicuna-7B's shape (hidden 4096, 32 layers, 32 heads, vocabulary 32000), `tiny` a small one for trying
the script on a CPU; the head is a random EAGLE-1 head.  A forward costs what the real model's costs,
so the milliseconds are real; the random head's drafts are seldom accepted, so tau is not.  Rows, in
one process, each the median of REPEATS calls of TOKENS new tokens after a PROMPT-token prompt, the
prefill subtracted:

- ms per plain step of our loop, and per eagle_default cycle, with CUDA graphs on (where the device is
  CUDA) and off;
- ms per step of transformers `generate` (greedy, its default cache);
- the cycle over the plain step, ours and `generate`'s.

With --profile on CUDA, torch's profiler over a few cycles gives the share of the wall time the GPU is
busy (the sum of kernel times over the elapsed time).

    python evaluation/gpu_cycle.py [--shape vicuna7b] [--device cuda] [--tokens 64] [--out DIR]

Writes DIR/gpu_cycle.md (default runs/gpu_cycle/DATE_HOST_TIME/).
"""

from __future__ import annotations

import argparse
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

from eagle_mdsd import benchmarks, engine, head, tree

SHAPES = {
    "vicuna7b": dict(hidden_size=4096, intermediate_size=11008, num_hidden_layers=32, num_attention_heads=32,
                     num_key_value_heads=32, vocab_size=32000, max_position_embeddings=2048),
    "tiny": dict(hidden_size=64, intermediate_size=128, num_hidden_layers=4, num_attention_heads=4,
                 num_key_value_heads=2, vocab_size=512, max_position_embeddings=2048),
}


def random_target(shape: str, device: str, dtype: torch.dtype):
    """A Llama of the named shape with random weights, made on the device (seconds, not a download)."""
    torch.manual_seed(0)
    config = LlamaConfig(**SHAPES[shape], tie_word_embeddings=False)
    with torch.device(device):
        model = LlamaForCausalLM._from_config(config, dtype=dtype)
    model.generation_config.eos_token_id = None
    return model.eval()


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


def busy_share(decoder, prompt, tokens: int) -> float:
    """The GPU's kernel time over the wall time of a call, from torch's profiler."""
    from torch.profiler import ProfilerActivity, profile

    decoder.generate(prompt, tokens, 0.0)
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
        start = time.perf_counter()
        decoder.generate(prompt, tokens, 0.0)
        torch.cuda.synchronize()
        wall = time.perf_counter() - start
    kernels = sum(event.self_device_time_total for event in prof.key_averages())
    return kernels / 1e6 / wall


def gpu_facts(device: str) -> str:
    if torch.device(device).type != "cuda":
        return "no GPU (device cpu)"
    try:
        driver = subprocess.run(["nvidia-smi", "--query-gpu=driver_version", "--format=csv,noheader"],
                                capture_output=True, text=True, timeout=30).stdout.strip()
    except (OSError, subprocess.SubprocessError):
        driver = "unknown"
    return f"{torch.cuda.get_device_name()}, driver {driver}, CUDA {torch.version.cuda}"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--shape", choices=sorted(SHAPES), default="vicuna7b")
    parser.add_argument("--device", default="cuda")
    parser.add_argument("--dtype", default="bfloat16", choices=("bfloat16", "float16", "float32"))
    parser.add_argument("--prompt", type=int, default=128, help="prompt tokens (default 128)")
    parser.add_argument("--tokens", type=int, default=64, help="new tokens a timed call (default 64)")
    parser.add_argument("--repeats", type=int, default=3, help="timed calls a row (default 3)")
    parser.add_argument("--profile", action="store_true", help="also the GPU's busy share of a call (CUDA)")
    parser.add_argument("--out", type=Path, help="folder for the page (default runs/gpu_cycle/DATE_HOST_TIME)")
    args = parser.parse_args()
    if args.device.startswith("cuda") and not torch.cuda.is_available():
        raise SystemExit("error: --device cuda but torch sees no CUDA device: use --device cpu (with --shape tiny)")
    stamp = datetime.now()
    out = args.out or Path("runs/gpu_cycle") / f"{stamp:%Y-%m-%d}_{socket.gethostname()}_{stamp:%H%M%S}"
    dtype = getattr(torch, args.dtype)
    start = time.perf_counter()
    target = random_target(args.shape, args.device, dtype)
    draft_head = head.random_head(target)
    build_s = time.perf_counter() - start
    prompt = torch.randint(3, target.config.vocab_size, (args.prompt,), generator=torch.Generator().manual_seed(1))
    prompt = prompt.tolist()
    cuda = torch.device(args.device).type == "cuda"
    best = "auto" if cuda else "off"
    rows = {}

    def write_page(share=None) -> None:
        """The page with the rows timed so far (rewritten after each, so a call cut short still leaves one)."""
        lines = [f"# One decoding cycle against a plain step, {args.shape}-shaped target, {stamp:%Y-%m-%d}", "",
                 f"Machine: {benchmarks.machine_line(benchmarks.machine(args.device))}; {gpu_facts(args.device)}; "
                 f"transformers {transformers.__version__}.", "",
                 f"Command: `python evaluation/gpu_cycle.py {' '.join(sys.argv[1:])}`", "",
                 f"Random {args.dtype} weights of the {args.shape} shape ({SHAPES[args.shape]}), built on the device "
                 f"in {build_s:.1f} s; a random EAGLE-1 head; a {args.prompt}-token prompt, {args.tokens} new tokens "
                 f"a call at T = 0, the median of {args.repeats} calls with the prefill subtracted. Warm-up: the first "
                 "call of each decoder, where CUDA graphs are captured (not timed).", "",
                 "| what | ms per cycle | cycles a call | warm-up s |", "|---|---|---|---|"]
        lines += [f"| {name} | {ms:.2f} | {cycles} | {warm:.1f} |" for name, (ms, cycles, warm) in rows.items()]
        hf = rows.get("transformers `generate`, step", (None,))[0]
        plain = rows.get(f"ours, plain step, CUDA graphs {best}", (None,))[0]
        cycle = rows.get(f"ours, eagle_default cycle, CUDA graphs {best}", (None,))[0]
        if plain and cycle:
            lines += ["", f"An eagle_default cycle over our plain step: **{cycle / plain:.2f}x** (CUDA graphs {best})."]
        if hf and plain and cycle:
            lines += [f"Over a `generate` step: **{cycle / hf:.2f}x**; our plain step over `generate`'s: "
                      f"{plain / hf:.2f}x."]
        if share is not None:
            lines += ["", f"GPU busy (kernel time over wall time, torch.profiler, one call of {args.tokens} tokens, "
                      f"eagle_default, graphs auto): **{100 * share:.0f}%**."]
        out.mkdir(parents=True, exist_ok=True)
        (out / "gpu_cycle.md").write_text("\n".join(lines) + "\n")

    prompt_tensor = torch.tensor([prompt], device=args.device)

    def hf_call(n):
        with torch.inference_mode():
            target.generate(prompt_tensor, max_new_tokens=n, min_new_tokens=n, do_sample=False, pad_token_id=0)
        return max(n - 1, 1)

    hf_call(4)  # the reference first: a call cut short still has it
    hf_ms, _ = per_cycle_ms(hf_call, args.tokens, args.repeats, args.device)
    rows["transformers `generate`, step"] = (hf_ms, args.tokens - 1, 0.0)
    print(f"generate step: {hf_ms:.2f} ms", flush=True)
    write_page()
    for graphs in (("auto", "off") if cuda else ("off",)):
        plain = engine.Decoder(target, cuda_graphs=graphs)
        cycle = engine.Decoder(target, draft_head, tree.load("eagle_default"), cuda_graphs=graphs)
        for name, decoder, method in (("plain step", plain, "baseline"), ("eagle_default cycle", cycle, "eagle")):
            captured = time.perf_counter()
            decoder.generate(prompt, args.tokens, 0.0, method=method)  # warm-up: graphs captured here
            warm_s = time.perf_counter() - captured

            def call(n, decoder=decoder, method=method):
                return decoder.generate(prompt, n, 0.0, method=method).cycles

            ms, cycles = per_cycle_ms(call, args.tokens, args.repeats, args.device)
            rows[f"ours, {name}, CUDA graphs {graphs}"] = (ms, cycles, warm_s)
            print(f"ours {name} graphs {graphs}: {ms:.2f} ms ({cycles} cycles; warm-up {warm_s:.1f} s)", flush=True)
            write_page()
    share = None
    if args.profile and cuda:
        share = busy_share(engine.Decoder(target, draft_head, tree.load("eagle_default")), prompt, args.tokens)
    write_page(share)
    print((out / "gpu_cycle.md").read_text())
    print(f"wrote {out / 'gpu_cycle.md'}")


if __name__ == "__main__":
    main()
