"""EAGLE's reference code (PyPI eagle-llm 1.2.1) answering requests for evaluation/reference_eagle.py.

Runs in .venv-ref (scripts/setup_reference.sh: transformers 4.40), so it
imports neither eagle_mdsd nor anything from .venv. One JSON request per
stdin line: {"ids": prompt token ids, "max_new_tokens", "temperature",
"seed"}; one JSON answer per stdout line: {"token_ids", "cycles",
"accept_lengths", "wall_time_s"}.

Two things are set around the package, not changed in it:
- its Llama copy and its head build rotary embeddings with base 10000
  whatever the config says; SmolLM2 uses rope_theta 100000, so every rotary
  module is rebuilt, in float32, with the model's theta (without this it
  decodes another model; with it, its float32 greedy answers are the
  target's);
- it loads the model folder's tokenizer only to read the EOS id, and
  transformers 4.40 cannot read a tokenizer saved by transformers 5: the EOS
  id comes from the command line instead.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
import types
from pathlib import Path

import torch


def rope_theta(model_folder: Path) -> float:
    config = json.loads((model_folder / "config.json").read_text())
    return float((config.get("rope_parameters") or {}).get("rope_theta") or config.get("rope_theta") or 10000.0)


def load(model_folder: Path, head_folder: Path, dtype: torch.dtype, eos: int):
    import eagle.model.ea_model as ea
    import transformers

    transformers.logging.set_verbosity_error()  # its rotary buffers, not in the checkpoint, read as missing weights
    ea.AutoTokenizer = types.SimpleNamespace(from_pretrained=lambda path: types.SimpleNamespace(eos_token_id=eos))
    model = ea.EaModel.from_pretrained(base_model_path=str(model_folder), ea_model_path=str(head_folder),
                                       torch_dtype=dtype).eval()
    theta = rope_theta(model_folder)
    for module in model.modules():
        if type(module).__name__.endswith("RotaryEmbedding"):
            module.__init__(module.dim, module.max_position_embeddings, base=theta)
    cycles = []  # accepted drafts + 1 of each verification cycle

    def counted(update):
        def wrapper(*args, **kwargs):
            cycles.append(int(args[3]) + 1)  # update_inference_inputs(input_ids, candidates, best, accept_length, ..)
            return update(*args, **kwargs)
        return wrapper

    ea.update_inference_inputs = counted(ea.update_inference_inputs)
    return model, cycles


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", type=Path, required=True, help="transformers folder of the target")
    parser.add_argument("--head", type=Path, required=True, help="EAGLE-1 head folder (pytorch_model.bin)")
    parser.add_argument("--dtype", default="bfloat16", choices=["float32", "bfloat16"])
    parser.add_argument("--eos", type=int, required=True)
    args = parser.parse_args()
    model, cycles = load(args.model, args.head, getattr(torch, args.dtype), args.eos)
    import transformers

    print(json.dumps({"ready": True, "transformers": transformers.__version__}), flush=True)
    for line in sys.stdin:
        request = json.loads(line)
        prompt = torch.tensor([request["ids"]])
        torch.manual_seed(request["seed"])
        cycles.clear()
        start = time.perf_counter()
        output = model.eagenerate(prompt, temperature=request["temperature"],
                                  max_new_tokens=request["max_new_tokens"])
        wall = time.perf_counter() - start
        # Cut as the engine cuts its own: at max_new_tokens (the reference stops once past it) and after the
        # first EOS (a cycle may accept tokens past the EOS it stops at).
        tokens = output[0, prompt.shape[1]:].tolist()[: request["max_new_tokens"]]
        if args.eos in tokens:
            tokens = tokens[: tokens.index(args.eos) + 1]
        print(json.dumps({"token_ids": tokens, "cycles": len(cycles), "accept_lengths": list(cycles),
                          "wall_time_s": wall}), flush=True)


if __name__ == "__main__":
    main()
