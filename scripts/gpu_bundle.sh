#!/usr/bin/env bash
# Packs what the GPU scripts (scripts/gpu_table.sh, scripts/gpu_train_head.sh) need on a lent GPU machine that
# reaches no network: the wheels its image lacks (fschat, gguf), the shared training prompts and the embedded
# model's GGUF file, split into parts small enough that each `run` call of the device tool stays under its 64 MiB
# (the working tree travels with every call).  Writes .gpu/ (git-ignored) and prints the calls to make, one right
# after the other: the machine keeps files between calls only while it is warm, about 30 s after each.  The first
# call times the 7B-shaped cycle, which needs no model; the last two run the engine's checks and benchmark, then
# the head's training.
#
#     bash scripts/setup.sh && bash scripts/gpu_bundle.sh
set -euo pipefail
cd "$(dirname "$0")/.."
limit=$((60 * 1024 * 1024))  # under the tool's 64 MiB, for files a session adds before the calls
rm -rf .gpu
mkdir -p .gpu/wheels
# The device image runs Python 3.12 and has torch, transformers, accelerate and the rest of our dependencies.
python3 -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
  --platform manylinux_2_28_x86_64 --platform manylinux2014_x86_64 -d .gpu/wheels "fschat==0.2.36" "gguf==0.19.0"
prompts=$(.venv/bin/python -c "from eagle_mdsd import training; print(training.DEFAULT_PROMPTS)")
[ -d "$prompts" ] || { echo "no shared training prompts at $prompts: the checkout needs ../shared beside it" >&2; exit 2; }
tar cf - -C "$prompts" . | xz -9 >.gpu/train_prompts.tar.xz
gguf=$(.venv/bin/python -c "from eagle_mdsd import models; print(models.embedded_gguf())")
tree=$(git ls-files -z | du -cb --files0-from=- | tail -1 | cut -f1)
wheels=$(du -cb .gpu/wheels .gpu/train_prompts.tar.xz | tail -1 | cut -f1)
part=$((limit - tree - wheels))
if [ "$part" -lt $((4 * 1024 * 1024)) ]; then
  echo "the working tree ($((tree >> 20)) MiB) leaves no room under the device tool's 64 MiB for the model" >&2
  exit 1
fi
split -b "$part" -d -a 2 "$gguf" .gpu/model.part
(cd "$(dirname "$gguf")" && sha256sum "$(basename "$gguf")") >.gpu/model.sha256
parts=(.gpu/model.part*)
echo "tree $((tree >> 20)) MiB, wheels and prompts $((wheels >> 10)) KiB, model $(( $(stat -c %s "$gguf") >> 20 )) MiB" \
  "in ${#parts[@]} parts"
echo "device tool calls, one right after the other (files stay only while the machine is warm):"
echo "  run  carry=[\"${parts[0]}\", \".gpu/wheels\", \".gpu/model.sha256\", \".gpu/train_prompts.tar.xz\"]" \
  " command=\"STAGES=cycle CYCLE_MINUTES=1.5 bash scripts/gpu_table.sh\"  timeout_s=150"
for part in "${parts[@]:1}"; do
  echo "  run  carry=[\"$part\"]  command=\"ls -l .gpu\""
done
echo "  run  command=\"STAGES='greedy benchmark' GREEDY_MINUTES=0.6 GREEDY_DTYPES=float32,bfloat16" \
  "GPU_MINUTES=1.5 bash scripts/gpu_table.sh --sampling-tree same --questions 8 --trees eagle_default chain2 eagle2\"" \
  " timeout_s=200"
echo "  run  command=\"STAGES=data MORE_PROMPTS=34000 bash scripts/gpu_train_head.sh\"  timeout_s=540"
echo "  run  command=\"STAGES=train MORE_PROMPTS=34000 bash scripts/gpu_train_head.sh\"  timeout_s=400"
echo "The machine goes back after 30 s without a call: make each call as soon as the last returns. A train call on"
echo "a fresh machine needs PREVIOUS_DATA=.gpu/previous_data.tar.xz (a data call's data.tar.xz parts, joined, carried)."
