#!/usr/bin/env bash
# The GPU pages in the fewest device-tool calls.  Here, `bash scripts/gpu_run.sh bundle` packs .gpu/ (git-ignored:
# the wheels the device image lacks, the embedded model xz-compressed and split into parts that fit the tool's
# 64 MiB beside the working tree) and prints the calls to make back to back.  There,
# `CALL=A` and then `CALL=B` run their stages in priority order under one deadline; after every stage the call's
# page is rewritten and everything the call wrote is packed under $OUT, so a cut loses at most the stage running.
#
# Call A needs no weights (it carries the model's first part): evaluation/gpu_cycle.py on random targets of the
#   embedded default's shape (SmolLM2-135M, with tokens/s projected from the CPU headline's tau) and Vicuna-7B's:
#   ms per step of our loop, eager `generate` and hf_compiled, ms per cycle of EAGLE's trees at T = 0 and 1, the
#   weight-read floor and the profiler's busy share; then, in the time left, each shape's plain step and
#   eagle_default cycle with --cuda-graphs compile beside the same without it (COMPILED_SHAPES, default on CUDA
#   "smollm2 vicuna7b").
# Call B (it carries the last part, so the model is whole): `eagle-mdsd benchmark`, 8 questions, T = 0 and 1, every
#   method, EAGLE on eagle_default, chain2 and eagle2 (each tree at both temperatures), then `check-greedy` in
#   float32 with the shipped head (and, in the time left, with --cuda-graphs compile: COMPILED_GREEDY, default on
#   CUDA "baseline eagle_default"); a benchmark that fails (a crash, not the deadline) is resumed once by a fresh
#   process from the answers it wrote, and after check-greedy the method suspected of the crash (CRASH_METHODS,
#   default prompt_lookup) answers 3 questions alone with CUDA_LAUNCH_BLOCKING=1; one cut at the deadline is
#   reported from the answers it finished.
#
#     bash scripts/gpu_run.sh bundle    # here
#     CALL=A bash scripts/gpu_run.sh    # there, as `bundle` prints it
#
# DEADLINE_S: seconds the whole call may take, packing included (default A 300, B 480; for B, `bundle` says to
# pass the device time left less 45 s, as the machine's start may have taken what B counts on); a stage is stopped
# (SIGINT, then killed) when it would outlast it, and what it wrote is packed as cut.  $OUT receives
# gpu_run_CALL.md, results_CALL.tgz (the call's folder: pages, answers, logs) and machine_CALL.txt.  DEVICE
# (default cuda), PYTHON (default python3), WORK (default runs/gpu_CALL), SHAPES (default "smollm2 vicuna7b"),
# CYCLE_ARGS, BENCH_ARGS (in place of the benchmark's arguments above), GREEDY_ARGS (after check-greedy's) and
# TAU_FROM (default: the README's CPU headline result) let it run on a CPU at toy scale (tests/test_gpu_run.py);
# COMPRESS=none bundles the model uncompressed.
set -uo pipefail
cd "$(dirname "$0")/.."
python=${PYTHON:-python3}

bundle() {
  set -e
  local limit=$((63 * 1024 * 1024))  # under the tool's 64 MiB a call, with the working tree beside a part
  local gguf tree extra part
  mkdir -p .gpu/wheels
  rm -f .gpu/model.part* .gpu/model.xz.part* .gpu/model.sha256
  if [ -z "$(ls .gpu/wheels/*.whl 2>/dev/null)" ]; then  # the device image runs Python 3.12 and has the rest
    "$python" -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
      --platform manylinux_2_28_x86_64 --platform manylinux2014_x86_64 -d .gpu/wheels "fschat==0.2.36" "gguf==0.19.0"
  fi
  gguf=$("$python" -c "from eagle_mdsd import models; print(models.embedded_gguf())")
  (cd "$(dirname "$gguf")" && sha256sum "$(basename "$gguf")") >.gpu/model.sha256.tmp
  # What travels with every call: tracked files and untracked ones git does not ignore.
  tree=$(git ls-files -co --exclude-standard -z | du -cb --files0-from=- 2>/dev/null | tail -1 | cut -f1)
  extra=$(du -cb .gpu/wheels .gpu/model.sha256.tmp | tail -1 | cut -f1)
  part=$((limit - tree - extra))
  if [ "$part" -lt $((4 * 1024 * 1024)) ]; then
    echo "the working tree ($((tree >> 20)) MiB) leaves no room under the device tool's 64 MiB for the model" >&2
    exit 1
  fi
  if [ "${COMPRESS:-xz}" = none ]; then
    split -b "$part" -d -a 2 "$gguf" .gpu/model.part
  else  # (the quantised model shrinks by a tenth: two parts where three were needed)
    xz -9e -T1 -c "$gguf" | split -b "$part" -d -a 2 - .gpu/model.xz.part
  fi
  mv .gpu/model.sha256.tmp .gpu/model.sha256
  shopt -s nullglob
  local parts=(.gpu/model.part* .gpu/model.xz.part*)
  shopt -u nullglob
  echo "working tree $((tree >> 20)) MiB, wheels $((extra >> 10)) KiB, model $(( $(stat -c %s "$gguf") >> 20 )) MiB" \
    "in ${#parts[@]} parts of at most $((part >> 20)) MiB"
  echo "Device tool calls, back to back (the machine keeps .gpu/ only while warm, 30 s after a call):"
  echo "  run  carry=[\"${parts[0]}\", \".gpu/wheels\", \".gpu/model.sha256\"]  command=\"CALL=A bash" \
    "scripts/gpu_run.sh\"  timeout_s=330"
  local last=$((${#parts[@]} - 1)) k
  for ((k = 1; k < last; k++)); do
    echo "  run  carry=[\"${parts[k]}\"]  command=\"ls -l .gpu\"  timeout_s=60"
  done
  # the machine's start counts against the session's device time, so B may get less than its 480 s: told the
  # time left, it stops its stages and packs before the tool would kill it with nothing packed
  local carry_b=""
  [ "$last" -gt 0 ] && carry_b="carry=[\"${parts[last]}\"]  "
  echo "  run  ${carry_b}command=\"CALL=B DEADLINE_S=S bash scripts/gpu_run.sh\"  timeout_s=510"
  echo "       (S: status's budget_left_s less 45, at most 480)"
  echo "  give_back  (or, with 4 minutes of device time left, first the head's training:" \
    "run command=\"STAGES='data train' bash scripts/gpu_train_head.sh\")"
}

if [ "${1:-}" = bundle ]; then
  bundle
  exit
fi

call=${CALL:?set CALL=A or CALL=B (here: bash scripts/gpu_run.sh bundle)}
case $call in A) budget=${DEADLINE_S:-300} ;; B) budget=${DEADLINE_S:-480} ;;
  *) echo "CALL=$call: use CALL=A (no weights) or CALL=B (the model's parts all carried)" >&2; exit 2 ;; esac
out=${OUT:?set OUT to the folder the results go to}
device=${DEVICE:-cuda}
work=${WORK:-runs/gpu_$call}
started=$(date +%s)
deadline=$((started + budget))
reserve=${PACK_RESERVE_S:-15}  # kept back from every stage for the report of a cut benchmark and the packing
# shellcheck source=scripts/gpu_site.sh
source scripts/gpu_site.sh
if [ "$call" = A ]; then gpu_site || exit; else gpu_site model || exit; fi
rm -rf "$work"
mkdir -p "$work/logs"
gpu_machine "$out/machine_$call.txt"
: >"$work/stages.txt"

pack() {  # the call's page, then its folder, each replaced whole: a cut never leaves a half-written one
  {
    echo "# GPU call $call, $(date +%F)"
    echo
    echo "Command: \`CALL=$call bash scripts/gpu_run.sh\` (device $device, deadline $budget s); machine in" \
      "machine_$call.txt. Stages in priority order; each ran within the time left."
    echo
    echo "| stage | status | seconds |"
    echo "|---|---|---|"
    cat "$work/stages.txt"
    local stage page
    while IFS='|' read -r _ stage _; do
      for page in "$work/${stage// /}"/*.md; do
        [ -f "$page" ] && { echo; echo "---"; echo; cat "$page"; }
      done
    done <"$work/stages.txt"
  } >"$work/gpu_run_$call.md"
  cp "$work/gpu_run_$call.md" "$out/gpu_run_$call.md.tmp" && mv "$out/gpu_run_$call.md.tmp" "$out/gpu_run_$call.md"
  tar czf "$out/results_$call.tgz.tmp" -C "$(dirname "$work")" "$(basename "$work")" \
    && mv "$out/results_$call.tgz.tmp" "$out/results_$call.tgz"
  echo "packed after ${1}: $(tar tzf "$out/results_$call.tgz" | grep -c -v '/$') files" >&2
}

stage() {  # NAME COMMAND...: run within the time left (logged, output shown), then record, page and pack
  local name=$1 begun status state left
  shift
  begun=$(date +%s)
  left=$((deadline - reserve - begun))
  if [ "$left" -lt 5 ]; then
    echo "| $name | skipped: the deadline | 0 |" >>"$work/stages.txt"
    LAST=skipped
    return 0
  fi
  mkdir -p "$work/$name"
  echo "== $name (at most $left s)" >&2
  timeout --signal=INT --kill-after=10 "$left" "$@" 2>&1 | tee "$work/logs/$name.log"
  status=${PIPESTATUS[0]}
  case $status in
    0) state=done ;;
    124 | 137) state="cut at the deadline" ;;
    *) state="failed (exit $status; logs/$name.log)" ;;
  esac
  echo "| $name | $state | $(($(date +%s) - begun)) |" >>"$work/stages.txt"
  [ "$status" = 0 ] || STATUS=$status
  LAST=$state
}
STATUS=0
LAST=none

if [ "$call" = A ]; then
  tau=${TAU_FROM:-$(sed -n 's/.*\[CPU\](\(evaluation\/results\/[^)]*\)\.md).*/\1.json/p' README.md | head -1)}
  for shape in ${SHAPES:-smollm2 vicuna7b}; do
    projection=()  # (the CPU's tau belongs to the embedded default's shape; tiny: the toy run's stand-in)
    if [[ " smollm2 tiny " == *" $shape "* ]] && [ -f "$tau" ]; then projection=(--tau-from "$tau"); fi
    # shellcheck disable=SC2086  # CYCLE_ARGS: extra arguments, split
    stage "cycle_$shape" "$python" evaluation/gpu_cycle.py --device "$device" --shape "$shape" --profile \
      --out "$work/cycle_$shape" "${projection[@]}" ${CYCLE_ARGS:-}
    pack "cycle_$shape"
  done
  # Then, in the time left, our plain step and eagle_default cycle (T = 0) with --cuda-graphs compile beside the
  # same without it, in one process a shape: does compiling the forwards inside the graphs (fewer, fused kernels)
  # bring the step toward the floor?  (On CUDA by default: inductor costs a CPU minutes.)
  for shape in ${COMPILED_SHAPES-$([ "$device" = cuda ] && echo smollm2 vicuna7b)}; do
    stage "compiled_$shape" "$python" evaluation/gpu_cycle.py --device "$device" --shape "$shape" \
      --trees eagle_default --temperatures 0 --no-compiled --compile-ours --out "$work/compiled_$shape"
    pack "compiled_$shape"
  done
else
  # shellcheck disable=SC2206  # BENCH_ARGS: the benchmark's arguments, split
  bench=(-m eagle_mdsd.cli benchmark --device "$device" --out "$work/benchmark" --answers "$work/benchmark"
    ${BENCH_ARGS:---questions 8 --temperatures 0,1 --trees eagle_default chain2 eagle2 --sampling-tree same})
  stage benchmark "$python" "${bench[@]}" --name bench
  crashed=$([[ $LAST == failed* ]] && echo yes || true)
  if [ -n "$crashed" ]; then  # a crash (not the deadline): a fresh process goes on from the answers written
    stage benchmark_resumed "$python" "${bench[@]}" --resume bench
    [ "$LAST" != done ] || STATUS=0  # (the page's rows still say the first process failed, and its log stays)
  fi
  if [ "$LAST" != done ]; then  # the page from the answers finished: rows that differ in questions say so
    for tag in t0 t1; do
      files=("$work"/benchmark/bench/*-"$tag".jsonl)
      [ -f "${files[0]}" ] || continue
      "$python" -m eagle_mdsd.cli report "${files[@]}" --out "$work/benchmark/bench_${tag}_cut" \
        --title "Benchmark answers finished before the deadline, $tag" >>"$work/logs/benchmark.log" 2>&1 || true
    done
  fi
  pack benchmark
  # shellcheck disable=SC2086  # GREEDY_ARGS: extra arguments, split
  stage greedy "$python" -m eagle_mdsd.cli check-greedy --device "$device" --questions 1 --max-new-tokens 64 \
    --dtypes float32 --trees baseline eagle_default chain2 eagle2 hf_compiled \
    --ea-model eagle_mdsd/heads/smollm2-135m-instruct --out "$work/greedy" ${GREEDY_ARGS:-}
  pack greedy
  # After a crash (on the H200 of 2026-11-28 inside transformers' prompt lookup, after 3 questions): does that
  # method crash alone, in a fresh process without our graphs, with launches synchronous so that the error names
  # the op that failed?  Its timings mean nothing; it runs before the compiled check.
  if [ -n "$crashed" ]; then
    CUDA_LAUNCH_BLOCKING=1 stage crash_alone "$python" -m eagle_mdsd.cli benchmark --device "$device" \
      --methods "${CRASH_METHODS:-prompt_lookup}" --questions 3 --temperatures 0 --out "$work/crash_alone" \
      --answers "$work/crash_alone" --name alone
    pack crash_alone
  fi
  # In the time left, the same check with --cuda-graphs compile (its rows file of its own; on CUDA by default:
  # inductor costs a CPU minutes).
  compiled_trees=${COMPILED_GREEDY-$([ "$device" = cuda ] && echo baseline eagle_default)}
  if [ -n "$compiled_trees" ]; then
    # shellcheck disable=SC2086  # the trees, split
    stage greedy_compiled "$python" -m eagle_mdsd.cli check-greedy --device "$device" --questions 1 \
      --max-new-tokens 64 --dtypes float32 --trees $compiled_trees --cuda-graphs compile \
      --ea-model eagle_mdsd/heads/smollm2-135m-instruct --out "$work/greedy_compiled"
    pack greedy_compiled
  fi
fi
exit "$STATUS"
