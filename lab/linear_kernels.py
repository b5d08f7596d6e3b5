"""The linear layers of one embedded-default decoding step on stock and prepacked kernels.

Times the 210 products of SmolLM2-135M's 30 decoder layers (q, k, v, o, gate,
up, down; random weights of the real shapes, the lm_head aside) for 1 and 26
input rows - a decoding step and an eagle_default tree - with
`torch.nn.functional.linear` in bf16 and fp32 and with eagle_mdsd.kernels'
packed bf16 weights, best of 7 passes, and writes
evaluation/results/kernels_<date>.md with the weights read per second, the
26 rows' arithmetic rate and, for scale, the rate of one large product (this
CPU's ceiling for matrix products in that dtype).

    .venv/bin/python lab/linear_kernels.py
"""

from __future__ import annotations

import time

import torch

import harness
from eagle_mdsd import benchmarks, kernels

SHAPES = [(576, 576), (192, 576), (192, 576), (576, 576), (1536, 576), (1536, 576), (576, 1536)] * 30  # (out, in)


def best_pass_seconds(layers, rows: int, dtype: torch.dtype, packed: bool) -> float:
    inputs = {features: torch.randn(rows, features, dtype=dtype) for features in (576, 1536)}
    best = float("inf")
    with torch.inference_mode(), kernels.packed(packed):
        for _ in range(7):
            start = time.perf_counter()
            for layer in layers:
                layer(inputs[layer.in_features])
            best = min(best, time.perf_counter() - start)
    return best


def large_product_gflops(dtype: torch.dtype, size: int = 2048) -> float:
    a, b = torch.randn(size, size, dtype=dtype), torch.randn(size, size, dtype=dtype)
    a @ b
    best = float("inf")
    for _ in range(5):
        start = time.perf_counter()
        a @ b
        best = min(best, time.perf_counter() - start)
    return 2 * size ** 3 / best / 1e9


def main() -> None:
    torch.manual_seed(0)
    rows_out = []
    for label, dtype, packed in (("fp32, stock", torch.float32, False), ("bf16, stock", torch.bfloat16, False),
                                 ("bf16, packed", torch.bfloat16, True)):
        if packed and not kernels.available(torch.zeros(1, dtype=dtype)):
            rows_out.append(f"| {label} | not available on this CPU | | | | |")
            continue
        layers = [torch.nn.Linear(i, o, bias=False).to(dtype) for o, i in SHAPES]
        if packed:
            for layer in layers:
                kernels.pack(layer)
        weight_bytes = sum(layer.weight.numel() * layer.weight.element_size() for layer in layers)
        cells = []
        for rows in (1, 26):
            seconds = best_pass_seconds(layers, rows, dtype, packed)
            cells += [f"{1000 * seconds:.1f}", f"{weight_bytes / seconds / 1e9:.1f}"]
        flops = 2 * rows * sum(layer.weight.numel() for layer in layers)
        cells.append(f"{flops / seconds / 1e9:.0f}")
        rows_out.append(f"| {label} | " + " | ".join(cells) + " |")
        print(rows_out[-1])
    page = benchmarks.write_page(
        harness.RESULTS, "kernels",
        "Linear layers of one SmolLM2-135M step, stock and packed kernels",
        "The 210 products of the 30 decoder layers (random weights of the real shapes, no lm_head), best of 7 "
        "passes. Command: `.venv/bin/python lab/linear_kernels.py`.",
        ["| kernel | 1 row: ms | GB/s | 26 rows: ms | GB/s | 26 rows: GFLOP/s |", "|---|---|---|---|---|---|",
         *rows_out, "", "For scale, one 2048 x 2048 x 2048 product (best of 5): "
         + ", ".join(f"{name} {large_product_gflops(dtype):.0f} GFLOP/s"
                     for name, dtype in (("bf16", torch.bfloat16), ("fp32", torch.float32))) + "."])
    print(f"wrote evaluation/results/{page.name}")


if __name__ == "__main__":
    main()
