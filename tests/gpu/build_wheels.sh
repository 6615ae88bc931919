#!/usr/bin/env bash
# The wheel bundle tests/gpu/run_on_device.sh installs on a bare GPU machine (Python 3.12, CUDA torch
# and transformers, no network): OpenRLHF 0.11.2 without its GPU-only pins, DeepSpeed 0.19.6 built
# without ops (pure Python: it JIT-builds FusedAdam there), and OpenRLHF's module-level imports that
# such an image lacks. Run it on any Linux machine with pip and a network (docs/gpu.md#bare).
#
#   bash tests/gpu/build_wheels.sh [DIR]     # default DIR: .gpu_wheels (git-ignored)
set -euo pipefail

ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
DIR=${1:-$ROOT/.gpu_wheels}
PY=${PYTHON:-python3}
mkdir -p "$DIR"
BUILD=$(mktemp -d)
trap 'rm -rf "$BUILD"' EXIT

"$PY" -m pip download -q --no-deps --only-binary=:all: -d "$DIR" \
    --python-version 3.12 --implementation cp --platform manylinux_2_28_x86_64 --platform manylinux_2_27_x86_64 \
    --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64 --platform manylinux1_x86_64 \
    openrlhf==0.11.2 datasets==5.2.0 dill==0.4.1 multiprocess==0.70.19 pydantic==2.14.4 pydantic_core==2.50.5 \
    annotated_types==0.8.0 typing_inspection==0.4.5 optree==0.20.0 torchdata==0.11.0 hjson==3.1.0 pylatexenc==2.11

# DeepSpeed ships an sdist: build a py3-none-any wheel with no ops compiled (no torch needed here)
"$PY" -m venv "$BUILD/venv"
"$BUILD/venv/bin/pip" install -q wheel "setuptools>=77"
"$BUILD/venv/bin/pip" download -q --no-deps --no-binary=:all: -d "$BUILD" deepspeed==0.19.6
DS_BUILD_OPS=0 "$BUILD/venv/bin/pip" wheel -q --no-deps --no-build-isolation -w "$DIR" "$BUILD"/deepspeed-0.19.6.tar.gz

du -sh "$DIR"
ls "$DIR"
