#!/usr/bin/env bash
# Evaluate a model (or a run's checkpoints) on every benchmark prepared in data/, paper settings:
# pass@1 at temperature 0.1, max 2048 new tokens. Examples:
#   bash eval/run_math_eval.sh Qwen/Qwen2.5-Math-1.5B
#   bash eval/run_math_eval.sh runs/level3_avspo --tp 1 --dp 8       # a run directory: every checkpoint
#   bash eval/run_math_eval.sh Qwen/Qwen2.5-Math-1.5B --greedy        # temperature 0
set -euo pipefail
TARGET=${1:?usage: run_math_eval.sh MODEL_OR_RUN_DIR [avspo-eval flags]}
shift
if [ -d "$TARGET" ] && [ ! -f "$TARGET/config.json" ]; then
  exec avspo-eval --run-dir "$TARGET" "$@"
fi
exec avspo-eval --model "$TARGET" "$@"
