#!/usr/bin/env bash
# The embedded default's head trained on GPU-scale data, in one call of the device tool: the target writes its
# own prompts and answers them on the GPU, the head trains there, and the head, the logs and the data's token ids
# come back under $OUT.  .gpu/ (scripts/gpu_bundle.sh, carried in parts) brings the wheels, the model and the
# shared prompt files.
#
#  1. `train-head prompts`: SELF_PROMPTS (default 90000) self-written prompts, PROMPTS_BATCH (default 2048) a
#     batch, at most PROMPTS_MINUTES (default 1.5);
#  2. `train-head data`: the target's greedy answers, 128 tokens, to those and to the shared prompt files, token ids
#     only (--no-features: the train stage computes the features on the GPU), batches of DATA_BATCH (default 2048)
#     sorted by length within shards of 8192, at most DATA_MINUTES (default 2);
#  3. `train-head train`: from the shipped head (INIT_FROM; "none" starts from a random head), EPOCHS (default 1)
#     at lr 3e-4, 32768 tokens a batch, the draft vocabulary's 8192 tokens, at most TRAIN_MINUTES (default 1.5);
#  4. export, then $OUT: machine.txt, train_head.log (each stage prints its answers/s or training tokens/s, which
#     size the next call), summary.json (counts, the loss and top-1 by step), head.tgz (the exported head) and
#     data.tar.xz.NN (or .gz.NN; the self-written prompts and every answer's token ids, in parts of 15 MiB, when they fit in
#     four parts).
#
#     bash scripts/gpu_bundle.sh   # here: prints the device calls, this script in the last
#
# Every stage resumes in RUN (default /tmp/gpu-head), so a call cut short can be repeated on a warm machine.
# DEVICE=cpu with BASE_MODEL (a model folder), PROMPTS_ARCHIVE (a .tar.xz of prompt files) and small counts runs
# it all on a CPU (tests/test_gpu_train_head.py).
set -euo pipefail
cd "$(dirname "$0")/.."
python=${PYTHON:-python3}
device=${DEVICE:-cuda}
out=${OUT:?set OUT to the folder the results go to}
run=${RUN:-/tmp/gpu-head}
shipped=eagle_mdsd/heads/smollm2-135m-instruct
init=${INIT_FROM:-$shipped}

# shellcheck source=scripts/gpu_site.sh
source scripts/gpu_site.sh
if [ -n "${BASE_MODEL:-}" ]; then gpu_site; else gpu_site model; fi
gpu_machine "$out/machine.txt"
archive=${PROMPTS_ARCHIVE:-.gpu/train_prompts.tar.xz}
if [ ! -f "$archive" ]; then
  echo "missing $archive: run scripts/gpu_bundle.sh here and carry what it names" >&2
  exit 2
fi
mkdir -p "$run/train_prompts"
tar xJf "$archive" -C "$run/train_prompts"
export TQDM_MININTERVAL=${TQDM_MININTERVAL:-10}  # a progress line every 10 s in the log, not every batch
model=()
[ -z "${BASE_MODEL:-}" ] || model=(--base-model "$BASE_MODEL")
cli() { "$python" -m eagle_mdsd.cli "$1" "$2" --run "$run" "${model[@]}" "${@:3}"; }
init_args=()
[ "$init" = none ] || init_args=(--init-from "$init")
status=0
{
  date -u +"start %FT%TZ"
  cli train-head prompts --count "${SELF_PROMPTS:-90000}" --batch-size "${PROMPTS_BATCH:-2048}" \
    --device "$device" --max-minutes "${PROMPTS_MINUTES:-1.5}"
  date -u +"prompts done %FT%TZ"
  cli train-head data --prompts "$run/self_prompts.jsonl" "$run/train_prompts" ${MAX_PROMPTS:+--max-prompts "$MAX_PROMPTS"} \
    --max-new-tokens "${MAX_NEW_TOKENS:-128}" --batch-size "${DATA_BATCH:-2048}" --shard-size "${SHARD_SIZE:-8192}" \
    --sort-by-length --no-features --device "$device" --max-minutes "${DATA_MINUTES:-2}"
  date -u +"data done %FT%TZ"
  cli train-head train "${init_args[@]}" --epochs "${EPOCHS:-1}" --lr 3e-4 \
    --tokens-per-batch "${TOKENS_PER_BATCH:-32768}" --draft-vocab "${DRAFT_VOCAB:-8192}" --device "$device" \
    --max-minutes "${TRAIN_MINUTES:-1.5}"
  date -u +"train done %FT%TZ"
  cli train-head export
} 2>&1 | tee "$out/train_head.log" || status=$?

"$python" - "$run" "$out" <<'EOF' || status=$?
import json, sys
from pathlib import Path
import numpy, torch
from eagle_mdsd import jsonl
run, out = Path(sys.argv[1]), Path(sys.argv[2])
shards = sorted((run / "data").glob("shard_*.pt"))
samples = [s for shard in shards for s in torch.load(shard, weights_only=True)]
summary = {"self_prompts": len(jsonl.records(run / "self_prompts.jsonl")) if (run / "self_prompts.jsonl").exists() else 0,
           "answers": len(samples), "answer_tokens": sum(len(s["ids"]) - s["start"] for s in samples),
           "tokens": sum(len(s["ids"]) for s in samples), "shards": len(shards)}
if (run / "checkpoint.pt").exists():
    state = torch.load(run / "checkpoint.pt", weights_only=False)["state"]
    summary |= {"steps": state["step"], "epochs_done": state["epoch"], "train_s": state.get("wall_time_s"),
                "log": state["log"]}
(out / "summary.json").write_text(json.dumps(summary))
if samples:  # every sample's ids (uint16 when the vocabulary fits) and where its answer starts
    ids = torch.cat([s["ids"] for s in samples]).numpy()
    ids = ids.astype(numpy.uint16) if ids.max() < 2**16 else ids
    numpy.savez(run / "ids.npz", ids=ids, lengths=numpy.array([len(s["ids"]) for s in samples], numpy.int32),
                starts=numpy.array([s["start"] for s in samples], numpy.int32))
print(json.dumps({k: v for k, v in summary.items() if k != "log"}))
EOF
if [ -d "$run/head" ]; then tar czf "$out/head.tgz" -C "$run" head; fi
packed=()
for f in self_prompts.jsonl ids.npz; do [ -f "$run/$f" ] && packed+=("$f"); done
if [ ${#packed[@]} -gt 0 ]; then
  packer=(xz -T0 -6) suffix=xz
  command -v xz >/dev/null || packer=(gzip -6) suffix=gz
  tar cf - -C "$run" "${packed[@]}" | "${packer[@]}" >"$run/data.tar.$suffix"
  split -b 15M -d -a 2 "$run/data.tar.$suffix" "$out/data.tar.$suffix."
  if [ "$(ls "$out"/data.tar.* | wc -l)" -gt 4 ]; then  # the tool brings back 8 files at most
    rm -f "$out"/data.tar.*
    echo "the data's token ids ($(($(stat -c %s "$run/data.tar.$suffix") >> 20)) MiB compressed) are over four" \
      "15 MiB parts: not brought back"
  fi
fi
ls -l "$out"
exit "$status"
