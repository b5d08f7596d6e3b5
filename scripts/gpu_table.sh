#!/usr/bin/env bash
# The GPU checks and timings of the embedded default, in one call of the device tool (at most about 9 minutes):
# its image has torch and transformers, and .gpu/ (made here by scripts/gpu_bundle.sh, carried there in parts)
# brings the wheels and the model.
#
# 1. `eagle-mdsd check-greedy` (GREEDY_QUESTIONS, default 1, x 64 tokens; GREEDY_TREES; each of GREEDY_DTYPES,
#    default float32 and bf16; the shipped head or GREEDY_HEAD, so that drafts are accepted), once with CUDA graphs
#    and once without; each at most GREEDY_MINUTES, default 1, and 0 skips both;
# 2. `evaluation/gpu_cycle.py`: a Vicuna-7B-shaped target with random bf16 weights, built on the GPU: ms per
#    eagle_default cycle over ms per plain step, ours and `generate`'s, and the GPU's busy share (CYCLE_MINUTES,
#    default 2; CYCLE_SHAPE, default vicuna7b);
# 3. `eagle-mdsd benchmark`, which takes the extra arguments and stops cleanly after GPU_MINUTES (default 4;
#    answer files keep finished questions, and a rerun with --resume NAME continues them).
# Pages, JSON, answers and the check's rows go to $OUT/results.tgz, with nvidia-smi's output and the logs beside it.
# STAGES (default "greedy cycle benchmark") picks some of them: "cycle" alone needs no model, so it can run in the
# first of the calls that carry the model's parts.
#
#     bash scripts/gpu_table.sh --sampling-tree same --questions 8 --trees eagle_default chain2 eagle2 ...
#
# (--sampling-tree same: EAGLE keeps its trees at T = 1 as well, where the main command's default, tuned for a
# 2-core CPU, runs chain2 there.)
#
# PYTHON (default python3) and DEVICE (default cuda) let it be tried on a CPU machine first (DEVICE=cpu with
# CYCLE_SHAPE=tiny).
set -euo pipefail
cd "$(dirname "$0")/.."
python=${PYTHON:-python3}
device=${DEVICE:-cuda}
out=${OUT:?set OUT to the folder the results go to}
stages=${STAGES:-greedy cycle benchmark}
# shellcheck source=scripts/gpu_site.sh
source scripts/gpu_site.sh
if [ "$stages" = cycle ]; then gpu_site; else gpu_site model; fi  # (the 7B-shaped cycle needs no model)
gpu_machine "$out/machine.txt"
status=0
mkdir -p evaluation/results evaluation/answers runs  # (a run that fails at once leaves find something to read)
# What the runs below write or change is what this listing lacks (a file's time alone would miss one written
# within the clock tick of a marker's).
listing() { find evaluation/results evaluation/answers runs -type f -printf '%T@ %s %p\n' | LC_ALL=C sort; }
before=$(mktemp)
listing >"$before"
# First whether the engine is lossless there: T = 0 tokens against generate's, with CUDA graphs and without.
greedy_minutes=${GREEDY_MINUTES:-1}
if [[ " $stages " == *" greedy "* ]] && [ "$greedy_minutes" != 0 ]; then  # (timeout reads 0 as no limit)
  for graphs in auto off; do
    timeout --signal=INT "${greedy_minutes}m" "$python" -m eagle_mdsd.cli check-greedy --device "$device" \
      --questions "${GREEDY_QUESTIONS:-1}" --max-new-tokens 64 --dtypes "${GREEDY_DTYPES:-float32,bfloat16}" \
      --trees ${GREEDY_TREES:-baseline eagle_default chain2 eagle2 eagle_default+lookup} --cuda-graphs "$graphs" \
      --ea-model "${GREEDY_HEAD:-eagle_mdsd/heads/smollm2-135m-instruct}" 2>&1 \
      | tee "$out/check_greedy_graphs-$graphs.log" || status=$?
  done
fi
# A cycle against a plain step on a 7B-shaped target, and how busy the GPU is.
if [[ " $stages " == *" cycle "* ]]; then
  timeout --signal=INT "${CYCLE_MINUTES:-2}m" "$python" evaluation/gpu_cycle.py --device "$device" \
    --shape "${CYCLE_SHAPE:-vicuna7b}" --profile --out evaluation/results/gpu_cycle 2>&1 | tee "$out/gpu_cycle.log" \
    || status=$?
fi
# (a --name among the arguments comes later and wins)
if [[ " $stages " == *" benchmark "* ]]; then
  timeout --signal=INT "${GPU_MINUTES:-4}m" "$python" -m eagle_mdsd.cli benchmark --device "$device" \
    --name "benchmark_$(date +%F)_bfloat16_${device}" "$@" 2>&1 | tee "$out/benchmark.log" || status=$?
fi
made=$(listing | LC_ALL=C comm -13 "$before" - | cut -d' ' -f3-)
[ -z "$made" ] || tar czf "$out/results.tgz" $made
exit "$status"
