"""Where a bf16 tree forward first rounds differently from a one-token decoding step.

At T = 0 in float32 the engine's tokens equal transformers' greedy `generate`
(`eagle-mdsd check-greedy`); in bf16 they drift apart after a few dozen tokens.
This script finds the first place that differs, for the root row of an
eagle_default tree (the row that sees exactly what a one-token step sees): the
embedded default in bf16 with the engine's packed kernels, the first turns of the
first N MT-Bench questions; after the prompt's prefill, the target runs (a) one
token, the greedy next one, and (b) that token as the root of an eagle_default
tree of random drafts, each from the same cache.  Per question it reports the
first module whose root-row output differs (forward hooks on every decoder
layer's attention and MLP), then tests that module's attention call two ways:
the tree's call with its keys cut to the root's own (the tree's masked entries
dropped), and the tree's query rows through the linear layers against one row.
Then the remedy the first part suggests, tested: every tree row's attention as a call of its own over
a gathered copy of the keys it sees (the one-token step's kernel; `per_row_sdpa`). Per question, the first
module whose root-row output still differs with it, and end to end (the shipped head, eagle_default, 128
tokens) whether the engine's tokens equal `generate`'s with the engine's attention and with per-row
attention. Last, each linear layer of decoder layer 0 on M random rows against M one-row products: the part
per-row attention leaves. Writes evaluation/results/bf16_rounding_<date>.md.

    .venv/bin/python lab/bf16_rounding.py [--questions 8]
"""

from __future__ import annotations

import argparse
import contextlib
import time

import torch
import torch.nn.functional as F

from transformers.integrations.sdpa_attention import sdpa_attention_forward

import harness
from eagle_mdsd import benchmarks, checks, engine, head, kernels, models, questions, tree
from eagle_mdsd.cache import KVCache


def per_row_sdpa(module, query, key, value, attention_mask, dropout=0.0, scaling=None, **kwargs):
    """Attention with a mask of several query rows as one call per row over a gathered copy of the keys that row
    sees, without a mask: the call a one-token step makes (transformers' SDPA attention)."""
    if query.shape[2] == 1 or attention_mask is None:
        return kernels.gqa_sdpa(module, query, key, value, attention_mask, dropout=dropout, scaling=scaling, **kwargs)
    visible = attention_mask[0, 0] == 0
    rows = []
    for row in range(query.shape[2]):
        keys = visible[row].nonzero()[:, 0]
        rows.append(sdpa_attention_forward(module, query[:, :, row : row + 1], key[:, :, keys], value[:, :, keys],
                                           None, dropout=dropout, scaling=scaling, **kwargs)[0])
    return torch.cat(rows, 1), None


PER_ROW = "bf16_rounding_per_row"


@contextlib.contextmanager
def attention_per_row(target, enabled: bool = True):
    """Inside, the target's attention runs `per_row_sdpa` (its masks: SDPA's)."""
    from transformers import AttentionInterface
    from transformers.masking_utils import AttentionMaskInterface, sdpa_mask

    AttentionInterface.register(PER_ROW, per_row_sdpa)
    AttentionMaskInterface.register(PER_ROW, sdpa_mask)
    previous = target.config._attn_implementation
    if enabled:
        target.config._attn_implementation = PER_ROW
    try:
        yield
    finally:
        target.config._attn_implementation = previous


def root_rows(target, prompt: list[int], topology, packed: bool) -> dict[int, tuple[dict, tuple]]:
    """For 1 row (the greedy next token) and for the whole tree (that token as its root): each module's
    root-row output and the forward's attention calls, layer by layer (query, key, value, mask, kwargs, output)."""
    decoder, keyword = target.get_decoder(), models.cache_keyword(target.get_decoder())
    outputs, calls, results = {}, [], {}

    def record(name):
        def hook(module, inputs, output):
            outputs[name] = (output[0] if isinstance(output, tuple) else output)[0, 0].clone()
        return hook

    handles = [module.register_forward_hook(record(f"layer {i} {part}"))
               for i, layer in enumerate(decoder.layers) for part, module in (("attention", layer.self_attn),
                                                                             ("mlp", layer.mlp))]
    sdpa = F.scaled_dot_product_attention

    def spy(query, key, value, attn_mask=None, **kwargs):
        output = sdpa(query, key, value, attn_mask=attn_mask, **kwargs)
        calls.append((query, key, value, attn_mask, kwargs, output))
        return output

    length, ids = len(prompt), torch.tensor(prompt)
    drafts = torch.randint(0, target.config.vocab_size, (topology.size,), generator=torch.Generator().manual_seed(0))
    cache = KVCache(target.config.num_hidden_layers, length + topology.size + 1)
    F.scaled_dot_product_attention = spy
    try:
        with torch.inference_mode(), kernels.packed(packed):  # masks as the engine passes them
            hidden = decoder(input_ids=ids[None], position_ids=torch.arange(length)[None], use_cache=True,
                             **{keyword: cache}).last_hidden_state
            root = target.get_output_embeddings()(hidden[0, -1]).argmax()[None]
            for rows in (1, topology.size + 1):
                cache.truncate(length)  # back to the prompt's entries alone
                visible = torch.cat([torch.ones(rows, length, dtype=torch.bool), topology.ancestors[:rows, :rows]], 1)
                outputs.clear()
                calls.clear()
                decoder(input_ids=torch.cat([root, drafts[: rows - 1]])[None],
                        position_ids=(length + torch.tensor(topology.depth[:rows]))[None],
                        attention_mask=None if rows == 1 else tree.additive_mask(visible, target.dtype)[None, None],
                        use_cache=True, **{keyword: cache})
                results[rows] = (dict(outputs), list(calls))
    finally:
        F.scaled_dot_product_attention = sdpa
        for handle in handles:
            handle.remove()
    return results


def first_differing_module(one: dict, other: dict) -> str:
    """The first module (in forward order) whose recorded root-row output differs between two forwards."""
    return next((name for name in one if not torch.equal(one[name], other[name])), "none")


def end_to_end(target, tokenizer, prompts: list[list[int]], max_new_tokens: int = 128) -> list[dict]:
    """Per prompt: whether the engine's T = 0 tokens (shipped head, eagle_default) equal `generate`'s, with the
    engine's attention and with `per_row_sdpa`; the first differing token and the engine's seconds."""
    decoder = engine.Decoder(target, head.load_head(models.DEFAULT_HEAD, target), tree.load("eagle_default"),
                             eos_token_ids=models.eos_token_ids(target, tokenizer))
    rows = []
    for prompt in prompts:
        with torch.inference_mode():
            reference = target.generate(torch.tensor([prompt]), max_new_tokens=max_new_tokens,
                                        do_sample=False)[0, len(prompt):].tolist()
        row = {}
        for arm, per_row in (("engine", False), ("per_row", True)):
            with attention_per_row(target, per_row):
                started = time.perf_counter()
                tokens = decoder.generate(prompt, max_new_tokens, 0.0).token_ids
                row[f"{arm}_s"] = time.perf_counter() - started
            differs = checks.first_difference(tokens, reference)
            row[arm] = "same" if differs is None else differs
        rows.append(row)
        print(row)
    return rows


def linear_rows(target, packed: bool, sizes=(2, 4, 8, 16, 26, 32)) -> list[str]:
    """For each linear layer of decoder layer 0: of M random rows (seed 0), how many differ from one-row
    products, bit for bit."""
    generator = torch.Generator().manual_seed(0)
    layer, lines = target.get_decoder().layers[0], []
    for name in ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"):
        module = getattr(layer.self_attn, name, None) or getattr(layer.mlp, name)
        counts = []
        for size in sizes:
            inputs = torch.randn(size, module.in_features, generator=generator).to(torch.bfloat16)
            with torch.inference_mode(), kernels.packed(packed):
                together = module(inputs)
                alone = torch.cat([module(inputs[i : i + 1]) for i in range(size)])
            counts.append(str(int((together != alone).any(-1).sum())))
        lines.append(f"| {name} ({module.in_features} -> {module.out_features}) | " + " | ".join(counts) + " |")
    return lines


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--questions", type=int, default=8)
    args = parser.parse_args()
    if args.questions < 1:
        parser.error("--questions must be at least 1")
    target, tokenizer = models.load_target(None, torch.bfloat16)
    packed = kernels.resolve("auto", target.get_output_embeddings().weight)
    if packed:
        kernels.pack(target)
    topology = tree.load("eagle_default")
    rows_out, prompts = [], []
    chosen = questions.load("mt_bench")[: args.questions]
    ids = [question["question_id"] for question in chosen]
    for question in chosen:
        prompt = models.chat_prompt_ids(tokenizer, question["turns"][0])
        prompts.append(prompt)
        (step_outputs, step_calls), (tree_outputs, tree_calls) = root_rows(target, prompt, topology, packed).values()
        first = first_differing_module(step_outputs, tree_outputs)
        layer = int(first.split()[1]) if first != "none" else 0
        query, key, value, mask, kwargs, output = tree_calls[layer]  # that layer's attention call
        step_query, step_key = step_calls[layer][:2]
        step_row = step_calls[layer][5].reshape(1, query.shape[1], -1)  # the step's call may fold heads into rows
        own_keys = len(prompt) + 1
        cut = F.scaled_dot_product_attention(query, key[:, :, :own_keys], value[:, :, :own_keys],
                                             attn_mask=None if mask is None else mask[..., :own_keys], **kwargs)
        alone = F.scaled_dot_product_attention(query[:, :, :1], key[:, :, :own_keys], value[:, :, :own_keys],
                                               attn_mask=None if mask is None else mask[:, :, :1, :own_keys], **kwargs)
        same_inputs = (torch.equal(step_query.reshape(1, query.shape[1], -1), query[:, :, 0])
                       and torch.equal(step_key, key[:, :, : step_key.shape[2]]))
        checks = [same_inputs] + [torch.equal(row[:, :, 0], step_row) for row in (output, cut, alone)]
        with attention_per_row(target):
            step, whole = root_rows(target, prompt, topology, packed).values()
        per_row = first_differing_module(step[0], whole[0])
        rows_out.append(f"| {question['question_id']} | {len(prompt)} | {first} | "
                        + " | ".join("yes" if check else "no" for check in checks) + f" | {per_row} |")
        print(rows_out[-1])
    ends = end_to_end(target, tokenizer, prompts)
    end_lines = [f"| {prompt_id} | {row['engine']} | {row['per_row']} | {row['per_row_s'] / row['engine_s']:.2f} |"
                 for prompt_id, row in zip(ids, ends)]
    same = [sum(row[arm] == "same" for row in ends) for arm in ("engine", "per_row")]
    slower = sum(row["per_row_s"] for row in ends) / sum(row["engine_s"] for row in ends)
    sizes = (2, 4, 8, 16, 26, 32)
    kind = "Packed" if packed else "Stock"
    page = benchmarks.write_page(
        harness.RESULTS, "bf16_rounding",
        "Where a bf16 tree forward first rounds differently from a one-token step",
        f"{kind} linear kernels. "
        f"Embedded default in bf16, the first turns of the first {args.questions} MT-Bench questions; after the "
        "prefill, the greedy next token alone and as the root of an eagle_default tree of random drafts, with the "
        "masks the engine passes (none for the prefill and the step, as `generate`; the tree's). 'First "
        "module' is the first attention or MLP whose root-row output differs; the next columns test that layer's "
        "attention call in the tree forward: whether its root row's query and the keys it shares with the step "
        "are the step's, and its root-row output against the one-token step's, bit for bit, as the tree computes "
        "it (26 query rows over the prompt, the root and 25 masked draft keys), recomputed over the prompt and "
        "the root only (26 rows), and for the root row alone over those keys. The last column: the first module "
        "that still differs when every tree row's attention is a call of its own over a gathered copy of the keys "
        "it sees, without a mask (`per_row_sdpa`: the call a one-token step makes). Command: "
        f"`.venv/bin/python lab/bf16_rounding.py --questions {args.questions}`.",
        ["| question | prompt tokens | first module | same inputs | tree call = step | over the root's own keys = "
         "step | the root row alone over them = step | first module, attention per row |",
         "|---|---|---|---|---|---|---|---|", *rows_out, "",
         "End to end: the engine at T = 0 (shipped head, eagle_default, 128 new tokens) against transformers' greedy "
         "`generate` from the same prompt, with the engine's attention and with attention per row: 'same' when "
         f"every token is `generate`'s, else the first token that differs. Identical: {same[0]} and {same[1]} of "
         f"{len(ends)}; attention per row took {slower:.2f}x the engine's time.", "",
         "| question | engine | attention per row | time, per row / engine |", "|---|---|---|---|", *end_lines, "",
         f"What attention per row leaves: {kind.lower()} linear layers of decoder layer 0 on M random bf16 rows "
         "(seed 0), the rows whose outputs differ from one-row products, bit for bit:", "",
         "| layer | " + " | ".join(f"M = {size}" for size in sizes) + " |", "|---" * (len(sizes) + 1) + "|",
         *linear_rows(target, packed, sizes)])
    print(f"wrote evaluation/results/{page.name}")


if __name__ == "__main__":
    main()
