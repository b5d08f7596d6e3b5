#!/usr/bin/env bash
# The embedded default's heads trained on GPU-scale data, in device-tool calls: the target writes its own prompts
# and answers them on the GPU, an EAGLE-1 and an EAGLE-3 head train there, and the heads, the logs and the data's
# token ids come back under $OUT.  .gpu/ (`scripts/gpu_run.sh bundle`, carried in parts) brings the wheels and
# the model.  STAGES (default "data train") splits the work into calls on one warm machine.
#
# data:
#  0. PREVIOUS_DATA (optional): a data.tar.xz an earlier call brought back (its parts joined); its prompts and
#     answers are put back as that run's shards, so the data stage below answers only the prompts it had not;
#  1. `train-head prompts` (without PREVIOUS_DATA): SELF_PROMPTS (default 90000) self-written prompts,
#     PROMPTS_BATCH (default 2048) a batch, at most PROMPTS_MINUTES (default 1.5);
#  2. `train-head data`: the target's greedy answers, 128 tokens, to those and to TRAIN_PROMPTS (default the
#     package's prompt files), token ids only (--no-features: the train stage computes the features on the GPU),
#     batches of DATA_BATCH (default 2048) sorted by length within shards of SHARD_SIZE (default 8192), at most
#     DATA_MINUTES (default 2);
#  3. MORE_PROMPTS (default 0) more self-written prompts of seed 1 in RUN/more (at most MORE_PROMPTS_MINUTES,
#     default 1) and their answers (at most MORE_DATA_MINUTES, default 2);
# train:
#  4. `train-head train --export` on all of it (a call of this stage alone on a fresh machine puts PREVIOUS_DATA back first):
#     EAGLE-1 from the shipped head (INIT_FROM; "none": a random head), EPOCHS (default 1) at lr 3e-4, at most
#     TRAIN_MINUTES (default 1.5; 0 skips it); EAGLE-3 (`--format eagle3`, skipped when
#     TRAIN3_MINUTES is 0) from a random head, EPOCHS3 (default 2) at lr 1e-3 with UNROLL3 (default 3) draft steps,
#     at most TRAIN3_MINUTES (default 2); the learning rate's cosine ends with the epochs or the minutes, whichever
#     come first (--schedule-minutes); both TOKENS_PER_BATCH (default 32768) tokens a batch, the draft
#     vocabulary's DRAFT_VOCAB (default 8192) tokens;
#  5. $OUT: machine.txt, train_head.log (each stage prints its answers/s or training tokens/s, which
#     size the next call), summary.json (a data call's counts, the loss and top-1 by step of each head), head.tgz and
#     head3.tgz (the exported heads, packed as soon as each is written), and a data call's data.tar.xz.NN (or
#     .gz.NN; the self-written prompts and every answer's token ids, in parts of 15 MiB, when they fit in four).
#
#     bash scripts/gpu_run.sh bundle   # here: prints the device calls, this script after calls A and B
#
# Every stage resumes in RUN (default /tmp/gpu-head), so a call cut short can be repeated on a warm machine.
# DEVICE=cpu with BASE_MODEL (a model folder), TRAIN_PROMPTS (a prompt file or folder) and small counts runs it
# all on a CPU (tests/test_gpu_train_head.py).  The Python it runs is scripts/gpu_train_head.py.
set -euo pipefail
cd "$(dirname "$0")/.."
python=${PYTHON:-python3}
device=${DEVICE:-cuda}
out=${OUT:?set OUT to the folder the results go to}
run=${RUN:-/tmp/gpu-head}
stages=${STAGES:-data train}
shipped=eagle_mdsd/heads/smollm2-135m-instruct
init=${INIT_FROM:-$shipped}
shard_size=${SHARD_SIZE:-8192}

# shellcheck source=scripts/gpu_site.sh
source scripts/gpu_site.sh
if [ -n "${BASE_MODEL:-}" ]; then gpu_site; else gpu_site model; fi
gpu_machine "$out/machine.txt"
train_prompts=${TRAIN_PROMPTS:-eagle_mdsd/data/prompts}  # (training.DEFAULT_PROMPTS)
export TQDM_MININTERVAL=${TQDM_MININTERVAL:-10}  # a progress line every 10 s in the log, not every batch
model=()
[ -z "${BASE_MODEL:-}" ] || model=(--base-model "$BASE_MODEL")
cli() { "$python" -m eagle_mdsd.cli "$1" "$2" "${model[@]}" "${@:3}"; }
more_runs() {  # RUN, and RUN/more where it has (or will have) answers
  runs=("$run")
  if [ "${MORE_PROMPTS:-0}" != 0 ] || [ -f "$run/more/data/shard_00000.pt" ]; then runs+=("$run/more"); fi
}
more_runs

restore() {  # PREVIOUS_DATA's prompts and answers (RUN's and RUN/more's), back as the shards of their data stages
  mkdir -p "$run/previous"
  tar xJf "$PREVIOUS_DATA" -C "$run/previous"
  for sub in . more; do
    [ -f "$run/previous/$sub/ids.npz" ] || continue
    mkdir -p "$run/$sub"
    cp "$run/previous/$sub/self_prompts.jsonl" "$run/$sub/self_prompts.jsonl"
    "$python" scripts/gpu_train_head.py restore "$run/$sub" "$run/previous/$sub" "$shard_size"
  done
  touch "$run/previous/restored"  # last: a restore cut short is done again
}

answer() {  # RUN MINUTES PROMPTS...: the data stage
  cli train-head data --run "$1" --prompts "${@:3}" ${MAX_PROMPTS:+--max-prompts "$MAX_PROMPTS"} \
    --max-new-tokens "${MAX_NEW_TOKENS:-128}" --batch-size "${DATA_BATCH:-2048}" --shard-size "$shard_size" \
    --sort-by-length --no-features --device "$device" --max-minutes "$2"
}

status=0
set +e  # (the stages stop at their first failure, inside; what they made is still summed up and packed below)
{
  set -e
  date -u +"start %FT%TZ"
  if [[ " $stages " == *" data "* ]]; then
    if [ -n "${PREVIOUS_DATA:-}" ]; then
      [ -f "$run/previous/restored" ] || restore
    else
      cli train-head prompts --run "$run" --count "${SELF_PROMPTS:-90000}" --batch-size "${PROMPTS_BATCH:-2048}" \
        --device "$device" --max-minutes "${PROMPTS_MINUTES:-1.5}"
    fi
    date -u +"prompts done %FT%TZ"
    answer "$run" "${DATA_MINUTES:-2}" "$run/self_prompts.jsonl" "$train_prompts"
    date -u +"data done %FT%TZ"
    if [ "${MORE_PROMPTS:-0}" != 0 ]; then
      cli train-head prompts --run "$run/more" --count "$MORE_PROMPTS" --seed 1 \
        --batch-size "${PROMPTS_BATCH:-2048}" --device "$device" --max-minutes "${MORE_PROMPTS_MINUTES:-1}"
      answer "$run/more" "${MORE_DATA_MINUTES:-2}" "$run/more/self_prompts.jsonl"
      date -u +"more data done %FT%TZ"
    fi
  fi
  if [[ " $stages " == *" train "* ]]; then
    if [ -n "${PREVIOUS_DATA:-}" ] && [ ! -f "$run/previous/restored" ]; then restore; fi
    more_runs
    common=(--data-from "${runs[@]}" --tokens-per-batch "${TOKENS_PER_BATCH:-32768}"
            --draft-vocab "${DRAFT_VOCAB:-8192}" --device "$device")
    init_args=()
    [ "$init" = none ] || init_args=(--init-from "$init")
    if [ "${TRAIN_MINUTES:-1.5}" != 0 ]; then
      cli train-head train --run "$run/eagle1" "${init_args[@]}" --epochs "${EPOCHS:-1}" --lr 3e-4 "${common[@]}" \
        --max-minutes "${TRAIN_MINUTES:-1.5}" --schedule-minutes "${TRAIN_MINUTES:-1.5}" --export
      tar czf "$out/head.tgz" -C "$run/eagle1" head  # at once: a call cut short later still brings it back
      date -u +"eagle1 done %FT%TZ"
    fi
    if [ "${TRAIN3_MINUTES:-2}" != 0 ]; then
      cli train-head train --run "$run/eagle3" --format eagle3 --unroll "${UNROLL3:-3}" --epochs "${EPOCHS3:-2}" \
        --lr 1e-3 "${common[@]}" --max-minutes "${TRAIN3_MINUTES:-2}" \
        --schedule-minutes "${TRAIN3_MINUTES:-2}" --export
      tar czf "$out/head3.tgz" -C "$run/eagle3" head
      date -u +"eagle3 done %FT%TZ"
    fi
  fi
} 2>&1 | tee "$out/train_head.log"
status=${PIPESTATUS[0]}
set -e
more_runs  # (again: a restore in the stages above may have brought RUN/more)

"$python" scripts/gpu_train_head.py summary "$out" "$stages" "${runs[@]}" || status=$?
[[ " $stages " == *" data "* ]] || { ls -l "$out"; exit "$status"; }  # (a train call's data came back before)
packed=()
for f in self_prompts.jsonl ids.npz more/self_prompts.jsonl more/ids.npz; do [ -f "$run/$f" ] && packed+=("$f"); done
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
