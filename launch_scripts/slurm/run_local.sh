#!/usr/bin/env bash
# Run one config on this machine, no SLURM (a single GPU node, or an interactive allocation):
# OpenRLHF starts a local Ray itself. Ctrl-C checkpoints and stops; rerunning resumes.
#
#   bash launch_scripts/slurm/run_local.sh CONFIG [--gpus N] [--out DIR] [--dry-run] [-- extra avspo-train flags]
#
# --gpus defaults to the GPUs nvidia-smi lists. --dry-run prints the command and the parsed config.
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
  GPUS=$(nvidia-smi -L 2>/dev/null | grep -c '^GPU' || true)
  [ "$GPUS" -gt 0 ] || avspo_die "no GPU found (nvidia-smi); pass --gpus N, or use the CPU quickstart (bash quickstart.sh)"
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
