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
# two workers (pytest-xdist), each test module whole on one of them (--dist loadscope: a module's
# fixtures are made once and the real-Slurm tests never queue behind each other). An end-to-end run
# keeps about one core busy (its generation and training take turns), so on 2 cores two at once
# took the full suite from 40 to 23 minutes (Intel Xeon, AVX-512, native bf16). AVSPO_TEST_WORKERS=0 runs in this
# process; a later -n in the arguments wins.
if ! "$VENV/bin/python" -c "import xdist" 2>/dev/null; then
  echo "run_tests.sh: pytest-xdist is missing from $VENV: bash setup.sh (or pip install -r requirements.txt) installs it" >&2
  exit 1
fi
# --durations=10: every run (CI's too) ends with its ten slowest tests, where the suite's time goes
"$VENV/bin/python" -m pytest -n "${AVSPO_TEST_WORKERS:-2}" --dist loadscope --durations=10 "$@"
rc=$?
if [ "$rc" -eq 5 ]; then
  echo "run_tests.sh: pytest collected no tests; failing" >&2
  exit 1
fi
exit "$rc"
