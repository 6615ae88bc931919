#!/usr/bin/env bash
# Runs the test suite in the setup.sh virtualenv. Extra arguments go to pytest (e.g. -k acr).
# pytest exits 5 when it collected no tests: that is a failure here, not a pass.
set -uo pipefail
cd "$(dirname "$0")" || exit 1
VENV=${AVSPO_VENV:-.venv}
export DS_ACCELERATOR=cpu WANDB_MODE=${WANDB_MODE:-offline} PYTHONUNBUFFERED=1
# the suite starts many Python processes that import the stack: with Python's bytecode cache
# off (PYTHONDONTWRITEBYTECODE, set by some CI images) each compiles it from source again, ~8 s apiece
unset PYTHONDONTWRITEBYTECODE
# a crash (even in the interpreter's exit, after the summary) prints every thread's Python stack
export PYTHONFAULTHANDLER=1
"$VENV/bin/python" -m pytest "$@"
rc=$?
if [ "$rc" -eq 5 ]; then
  echo "run_tests.sh: pytest collected no tests; failing" >&2
  exit 1
fi
exit "$rc"
