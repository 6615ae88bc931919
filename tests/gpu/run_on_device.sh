#!/usr/bin/env bash
# The GPU suite on a bare single-GPU machine that has Python, CUDA torch and transformers but none of
# OpenRLHF's other needs and no network (docs/gpu.md#bare): installs the wheel bundle (.gpu_wheels/,
# built on a machine with pip: docs/gpu.md says how) into a folder on PYTHONPATH, installs this
# package, runs `pytest -m gpu -rs` with durations and, with --bench, the RL-ZVP step benchmark on a
# Qwen2-0.5B-shaped random model. Output goes to $OUT (default: /tmp/avspo_gpu_run).
#
#   bash tests/gpu/run_on_device.sh [--bench] [--whole] [pytest args...]
#
# --whole: also collect the whole tree's gpu tests (`pytest -m gpu` from the repository root) and
# report what fails to import there; the default run collects tests/gpu and tests/test_algo_on_cpu.py.
set -uo pipefail

ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
OUT=${OUT:-${TMPDIR:-/tmp}/avspo_gpu_run}
WHEELS=${WHEELS:-$ROOT/.gpu_wheels}
SITE=${SITE:-${TMPDIR:-/tmp}/avspo_gpu_site}
PY=${PYTHON:-python3}
BENCH=0
WHOLE=0
while [[ $# -gt 0 ]]; do
    case $1 in
        --bench) BENCH=1 ;;
        --whole) WHOLE=1 ;;
        *) break ;;
    esac
    shift
done
mkdir -p "$OUT"
cd "$ROOT" || exit 2

shopt -s nullglob
wheels=("$WHEELS"/*.whl)
if [[ ${#wheels[@]} -gt 0 ]]; then
    "$PY" -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target "$SITE" "${wheels[@]}" \
        || { echo "[run_on_device] installing the wheels of $WHEELS failed" >&2; exit 2; }
    export PYTHONPATH="$SITE${PYTHONPATH:+:$PYTHONPATH}"
else
    echo "[run_on_device] no wheels in $WHEELS: using what this Python has"
fi
# this package: installed next to the wheels when this Python can build it, else imported from here
if "$PY" -m pip install -q --no-index --no-deps --no-build-isolation --no-cache-dir --upgrade --target "$SITE/pkg" . \
    >"$OUT/install.log" 2>&1; then
    export PYTHONPATH="$SITE/pkg:${PYTHONPATH:-}"
else
    echo "[run_on_device] package not built here (see $OUT/install.log): importing it from $ROOT"
    export PYTHONPATH="$ROOT:${PYTHONPATH:-}"
fi
# DeepSpeed's JIT build parses TORCH_CUDA_ARCH_LIST as numbers: the '9.0a' some images set breaks it
# (tests/gpu/conftest.py does the same for a plain pytest run); DeepSpeed on CUDA (the CPU suite's
# conftest would default it to the CPU accelerator)
# (unset, DeepSpeed builds for the GPU it finds)
if [ -n "${TORCH_CUDA_ARCH_LIST:-}" ]; then
    TORCH_CUDA_ARCH_LIST=$(printf '%s' "$TORCH_CUDA_ARCH_LIST" | sed -E 's/([0-9])[af]\b/\1/g')
    export TORCH_CUDA_ARCH_LIST
fi
export DS_ACCELERATOR=cuda WANDB_MODE=offline PYTHONUNBUFFERED=1

{
    nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader
    "$PY" - <<'EOF'
import importlib.metadata as md, sys, torch
print(f"python {sys.version.split()[0]}, torch {torch.__version__}, cuda {torch.version.cuda}, "
      f"device {torch.cuda.get_device_name(0) if torch.cuda.is_available() else None}")
for name in ("transformers", "deepspeed", "openrlhf", "ray", "vllm", "flash-attn"):
    try:
        print(f"{name} {md.version(name)}")
    except md.PackageNotFoundError:
        print(f"{name}: not installed")
EOF
} 2>&1 | tee "$OUT/env.txt"

start=$(date +%s)
"$PY" -m pytest -m gpu -rs --durations=0 -p no:cacheprovider --junitxml "$OUT/junit.xml" \
    tests/gpu tests/test_algo_on_cpu.py "$@" 2>&1 | tee "$OUT/pytest.log"
status=${PIPESTATUS[0]}
echo "[run_on_device] pytest exit $status in $(($(date +%s) - start)) s" | tee -a "$OUT/pytest.log"

if [[ $WHOLE == 1 ]]; then
    "$PY" -m pytest -m gpu --collect-only -q -p no:cacheprovider 2>&1 | tail -40 >"$OUT/collect_whole.log"
fi
if [[ $BENCH == 1 ]]; then
    "$PY" benchmarks/bench_rl_zvp_step.py --model qwen2-0.5b --device cuda --dtype bf16 --batch 8 \
        --prompt-len 256 --response-len 768 --repeats 10 >"$OUT/bench_rl_zvp_qwen05b.json" 2>"$OUT/bench.log" \
        || echo "[run_on_device] benchmark failed: see $OUT/bench.log"
    cat "$OUT/bench_rl_zvp_qwen05b.json"
fi
exit "$status"
