#!/usr/bin/env bash
# The embedded CPU default: sets up .venv on a fresh machine (bash setup.sh), then trains
# SmolLM2-135M-Instruct on synthetic arithmetic with GRPO + AVSPO on CPU (a few minutes on a
# 2-core machine; the measured times, with the machine named, are in docs/quickstart.md) and prints
# held-out accuracy before/after. The console shows the stages and the steps; everything else goes to
# <out>/quickstart.log (--verbose shows it too). Rerun to resume. Options: bash quickstart.sh --help
set -euo pipefail
cd "$(dirname "$0")"
if [ ! -x .venv/bin/avspo-train ]; then
  bash setup.sh
fi
exec .venv/bin/python -m avspo_openrlhf.cli.quickstart "$@"
