#!/usr/bin/env bash
# The head recipe from nothing, in one command, measured against the shipped head on this machine.  Every stage
# resumes where an interrupted run stopped (each saves in pieces of at most a few minutes), so rerun the script
# after an interruption, e.g. at the end of a machine session.
#
#     bash scripts/reproduce_head.sh        # about 6.5 hours on a 2-core CPU; RUN=DIR to put it elsewhere
#
#  1. self-written prompts of seeds 2-10 (`train-head prompts`) and the target's greedy answers to them
#     (`train-head data`, 128 tokens): 99 shards, about 30 minutes a seed;
#  2. four epochs from a random head, EAGLE's token term (`train-head train`, lr 1e-3): about 40 minutes;
#  3. two more epochs from there at lr 3e-4 (RUN/more), as the lineage's last fine-tunes were: about 21 minutes;
#  4. two epochs more again from there, the same way (RUN/more2): about 22 minutes;
#  5. one finishing epoch with the token term 2 x total variation (lr 3e-4): about 13 minutes;
#  6. export (compact form, RUN/finish/head), and its draft_vocab.json (the answer tokens ranked by count) against
#     the shipped head's, which the shipped head's last epoch made from the data of these same commands;
#     teacher-forced top-1 on 16 MT-Bench first turns of both heads (`train-head evaluate`); tau of both on all
#     80 MT-Bench questions, both turns, T = 0, eagle_default (`bench`, about 5 minutes each); the paired
#     comparison (`report --paired`) to RUN/compare.md.
#
# The GPU-scale steps (scripts/gpu_train_head.sh: self-written prompts and answers in a data call, then an EAGLE-1
# head from this recipe's head (INIT_FROM) and an EAGLE-3 head in a train call) are device calls of their own; the
# first GPU-trained head did not beat the shipped head (evaluation/results/gpu_head_2026-11-27.md) and the second
# session's EAGLE-3 head was lost (gpu_head_data_2026-11-27.md), so the shipped head is still this recipe's.
#
# PYTHON picks the interpreter (default .venv/bin/python, which scripts/setup.sh makes).
set -euo pipefail
cd "$(dirname "$0")/.."
python=${PYTHON:-.venv/bin/python}
[ -x "$python" ] || { echo "no interpreter at $python: run bash scripts/setup.sh first (or set PYTHON)" >&2; exit 2; }
run=${RUN:-runs/repro}
shipped=eagle_mdsd/heads/smollm2-135m-instruct
mkdir -p "$run"
cli() { "$python" -m eagle_mdsd.cli "$@"; }

data=()
for seed in 2 3 4 5 6 7 8 9 10; do
  self=$run/self$seed
  data+=("$self")
  cli train-head prompts --run "$self" --count 2560 --seed "$seed"
  cli train-head data --run "$self" --prompts "$self/self_prompts.jsonl" --batch-size 128 --max-new-tokens 128
done
common=(--data-from "${data[@]}" --tokens-per-batch 4096 --draft-vocab 8192)
cli train-head train --run "$run/head" --epochs 4 --lr 1e-3 "${common[@]}"
cli train-head train --run "$run/more" --init-from "$run/head" --epochs 2 --lr 3e-4 "${common[@]}"
cli train-head train --run "$run/more2" --init-from "$run/more" --epochs 2 --lr 3e-4 "${common[@]}"
cli train-head train --run "$run/finish" --init-from "$run/more2" --epochs 1 --lr 3e-4 --token-loss tv \
  --token-weight 2 "${common[@]}"
cli train-head export --run "$run/finish"

measure() {  # NAME HEAD: its teacher-forced top-1 and its MT-Bench answers at T = 0
  cli train-head evaluate --run "$run/finish" --export-to "$2" | tail -1 >"$run/evaluate_$1.json"
  cli bench --bench mt_bench --tree eagle_default --temperature 0 --ea-model "$2" --model-id "$1-eagle_default-t0" \
    --answer-file "$run/mt_bench_t0_$1.jsonl"
}
measure shipped "$shipped"
measure rerun "$run/finish/head"
cli report "$run/mt_bench_t0_shipped.jsonl" "$run/mt_bench_t0_rerun.jsonl" --labels "shipped head,rerun" --paired \
  --title "The head recipe rerun from nothing against the shipped head: all 80 MT-Bench, T = 0, eagle_default" \
  --out "$run/compare"
"$python" - "$run" "$shipped" <<'EOF'
import json, sys
from pathlib import Path
from eagle_mdsd import report
run = Path(sys.argv[1])
top1 = {h: json.loads((run / f"evaluate_{h}.json").read_text())["top1_mt_bench"] for h in ("shipped", "rerun")}
shipped, rerun = (report.compare([run / f"mt_bench_t0_{h}.jsonl"])[0]["categories"]["all"]["tau"]
                  for h in ("shipped", "rerun"))
within = abs(rerun - shipped) <= 0.05 and abs(top1["rerun"] - top1["shipped"]) <= 0.02
# The export ranks the answer tokens of the data it trained on; the shipped head's last epoch trained on the data of
# these same commands, so the same ranking says the data stages made the same answers again.
ranks = [json.loads((head / "draft_vocab.json").read_text())["token_ids"]
         for head in (Path(sys.argv[2]), run / "finish" / "head")]
first_unequal = None if len(ranks[0]) == len(ranks[1]) else min(map(len, ranks))  # one ranking ends early
differ = next((k for k, (a, b) in enumerate(zip(*ranks)) if a != b), first_unequal)
print("data: the answer tokens rank " + ("exactly as in the shipped head's training data (draft_vocab.json)"
      if differ is None else
      f"otherwise than in the shipped head's training data (draft_vocab.json), from rank {differ} on"))
print(f"rerun against the shipped head: tau {rerun:.2f} against {shipped:.2f}, teacher-forced MT-Bench top-1 "
      f"{top1['rerun']:.3f} against {top1['shipped']:.3f}: {'within' if within else 'outside'} docs/training.md's "
      f"tolerance (tau +-0.05, top-1 +-0.02); per question: {run}/compare.md")
EOF
