#!/usr/bin/env bash
# Run one config on this machine, no SLURM (a single GPU node, or an interactive allocation):
# OpenRLHF starts a local Ray itself. Ctrl-C checkpoints and stops; rerunning resumes.
#
#   bash launch_scripts/slurm/run_local.sh CONFIG [--gpus N] [--out DIR] [--dry-run] [-- extra avspo-train flags]
#
# --gpus defaults to CUDA_VISIBLE_DEVICES's count, else the GPUs nvidia-smi lists (0 for a
# --backend cpu config). --dry-run prints the command and the parsed config.
# The wandb key is read from WANDB_API_KEY in your environment; never pass it as a flag.
set -euo pipefail
REPO=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
# shellcheck source-path=SCRIPTDIR
source "$REPO/launch_scripts/slurm/lib.sh"

[ $# -ge 1 ] && [ "${1:0:1}" != "-" ] || avspo_die "usage: run_local.sh CONFIG [--gpus N] [--out DIR] [--dry-run] [-- flags]"
CONFIG=$(avspo_config_path "$REPO" "$1")
shift
NAME=$(basename "$CONFIG" .args)
GPUS="" OUT="" DRY=0 EXTRA=()
while [ $# -gt 0 ]; do
  case "$1" in
    --gpus) GPUS=$2; shift 2 ;;
    --out) OUT=$2; shift 2 ;;
    --dry-run) DRY=1; shift ;;
    --) shift; EXTRA=("$@"); break ;;
    *) avspo_die "unknown option '$1' (avspo-train flags go after --)" ;;
  esac
done
avspo_refuse_secret_flags "${EXTRA[@]}"
if [ -z "$GPUS" ]; then
  # the GPUs this process may use: CUDA_VISIBLE_DEVICES when set (an allocation, a container),
  # else nvidia-smi's list
  if [ -n "${CUDA_VISIBLE_DEVICES:-}" ]; then
    GPUS=$(awk -F, '{ print NF }' <<<"$CUDA_VISIBLE_DEVICES")
  else
    GPUS=$(nvidia-smi -L 2>/dev/null | grep -c '^GPU' || true)
  fi
  if [ "$(avspo_config_flag "$CONFIG" --backend gpu)" = cpu ]; then
    GPUS=${GPUS:-0}
  else
    [ "$GPUS" -gt 0 ] || avspo_die "no GPU found (CUDA_VISIBLE_DEVICES, nvidia-smi); pass --gpus N, or use the CPU quickstart (bash quickstart.sh)"
  fi
fi
OUT=${OUT:-$REPO/runs/$NAME}
FLAGS=$(avspo_train_flags "$CONFIG" 1 "$GPUS" "$OUT") || exit 2
mapfile -t CMD <<<"$FLAGS"
CMD=(avspo-train "${CMD[@]}" "${EXTRA[@]}")
if [ "$DRY" = 1 ]; then
  printf '+'; printf ' %q' "${CMD[@]}"; echo
  exec "${CMD[0]}" --dry-run "${CMD[@]:1}"
fi
mkdir -p "$OUT"
exec "${CMD[@]}"
