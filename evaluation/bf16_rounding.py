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
Writes evaluation/results/bf16_rounding_<date>.md.

    .venv/bin/python evaluation/bf16_rounding.py [--questions 8]
"""

from __future__ import annotations

import argparse
from pathlib import Path

import torch
import torch.nn.functional as F

from eagle_mdsd import benchmarks, engine, kernels, models, questions, tree


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
    cache = engine.preallocated_cache(target.config.num_hidden_layers, length + topology.size + 1)
    F.scaled_dot_product_attention = spy
    try:
        with torch.inference_mode(), kernels.packed(packed):  # masks as the engine passes them
            hidden = decoder(input_ids=ids[None], position_ids=torch.arange(length)[None], use_cache=True,
                             **{keyword: cache}).last_hidden_state
            root = target.get_output_embeddings()(hidden[0, -1]).argmax()[None]
            for rows in (1, topology.size + 1):
                engine.keep(cache, length, ids[:0])  # back to the prompt's entries alone
                visible = torch.cat([torch.ones(rows, length, dtype=torch.bool), topology.ancestors[:rows, :rows]], 1)
                outputs.clear()
                calls.clear()
                decoder(input_ids=torch.cat([root, drafts[: rows - 1]])[None],
                        position_ids=(length + torch.tensor(topology.depth[:rows]))[None],
                        attention_mask=None if rows == 1 else engine.additive_mask(visible, target.dtype),
                        use_cache=True, **{keyword: cache})
                results[rows] = (dict(outputs), list(calls))
    finally:
        F.scaled_dot_product_attention = sdpa
        for handle in handles:
            handle.remove()
    return results


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
    rows_out = []
    for question in questions.load("mt_bench")[: args.questions]:
        prompt = models.chat_prompt_ids(tokenizer, question["turns"][0])
        (step_outputs, step_calls), (tree_outputs, tree_calls) = root_rows(target, prompt, topology, packed).values()
        first = next((name for name in step_outputs if not torch.equal(step_outputs[name], tree_outputs[name])), None)
        layer = int(first.split()[1]) if first else 0
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
        rows_out.append(f"| {question['question_id']} | {len(prompt)} | {first or 'none'} | "
                        + " | ".join("yes" if check else "no" for check in checks) + " |")
        print(rows_out[-1])
    weight = target.get_decoder().layers[0].mlp.gate_proj
    inputs = torch.randn(topology.size + 1, weight.in_features, dtype=torch.bfloat16)
    with torch.inference_mode(), kernels.packed(packed):
        invariant = torch.equal(weight(inputs)[:1], weight(inputs[:1]))
    page = benchmarks.write_page(
        Path(__file__).resolve().parent / "results", "bf16_rounding",
        "Where a bf16 tree forward first rounds differently from a one-token step",
        f"{'Packed' if packed else 'Stock'} linear kernels. "
        f"Embedded default in bf16, the first turns of the first {args.questions} MT-Bench questions; after the "
        "prefill, the greedy next token alone and as the root of an eagle_default tree of random drafts, with the "
        "masks the engine passes (none for the prefill and the step, as `generate`; the tree's). 'First "
        "module' is the first attention or MLP whose root-row output differs; the other columns test that layer's "
        "attention call in the tree forward: whether its root row's query and the keys it shares with the step "
        "are the step's, and its root-row output against the one-token step's, bit for bit, as the tree computes "
        "it (26 query rows over the prompt, the root and 25 masked draft keys), recomputed over the prompt and "
        "the root only (26 rows), and for the root row alone over those keys. Linear layer on 26 rows, first row "
        f"bit for bit the one-row product: "
        f"{'yes' if invariant else 'no'}. Command: `.venv/bin/python evaluation/bf16_rounding.py --questions "
        f"{args.questions}`.",
        ["| question | prompt tokens | first module | same inputs | tree call = step | over the root's own keys = "
         "step | the root row alone over them = step |", "|---|---|---|---|---|---|---|", *rows_out])
    print(f"wrote evaluation/results/{page.name}")


if __name__ == "__main__":
    main()
