#!/usr/bin/env bash
# Submit one config to SLURM: checks the config with the real parser and the offline preflight
# (avspo-train --dry-run: flags, model folder, dataset files and rows, reward file; seconds, before
# anything is queued; a mistake is one line and exit 2), then sbatch's avspo.sbatch with the
# resources you ask for (default: the config's own `# resources:` line).
#
#   bash launch_scripts/slurm/submit.sh CONFIG [options] [-- extra avspo-train flags]
#     --nodes N            nodes (default: the config's)
#     --gpus-per-node G    GPUs per node (default: the config's)
#     --partition P  --account A  --qos Q
#     --time HH:MM:SS      (default: the config's); USR1 (checkpoint, requeue) comes min(600 s, time/4) before it
#     --name NAME          job name (default: the config's name); logs go to logs/NAME-JOBID/
#     --out DIR            run folder (default: runs/<config>); a resubmission resumes from it
#     --dry-run            print the sbatch command and everything the job would run; submit nothing
#     --no-check           skip the avspo-train --dry-run check
#     --allow-missing-paths  a local path the check cannot find (one only the compute nodes see) is a
#                          warning, not a refusal (the same: AVSPO_ALLOW_MISSING_PATHS=1)
# The check runs in the repository, as the job does (relative paths in a config are from there).
#
# Examples:
#   bash launch_scripts/slurm/submit.sh qwen2.5-math-1.5b_avspo --partition gpu --account myproj
#   bash launch_scripts/slurm/submit.sh qwen2.5-14b_grpo --nodes 2 -- --rollout.max_new_tokens 2048
# The wandb key is read from WANDB_API_KEY in your environment; never pass it as a flag.
set -euo pipefail
REPO=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
# shellcheck source-path=SCRIPTDIR
source "$REPO/launch_scripts/slurm/lib.sh"

case "${1:-}" in -h | --help) sed -n '2,/^set -euo/{/^set -euo/d; s/^# \{0,1\}//; p}' "${BASH_SOURCE[0]}"; exit 0 ;; esac
[ $# -ge 1 ] && [ "${1:0:1}" != "-" ] || avspo_die "usage: submit.sh CONFIG [--nodes N] [--gpus-per-node G] [--partition P] [--account A] [--time T] [--dry-run] [--allow-missing-paths] [-- flags] (--help: all options)"
CONFIG=$(avspo_config_path "$REPO" "$1")
CONFIG=$(realpath "$CONFIG")  # the job runs in $REPO
shift
NAME=$(basename "$CONFIG" .args)
NODES=$(avspo_config_resource "$CONFIG" nodes 1)
GPUS=$(avspo_config_resource "$CONFIG" gpus_per_node 8)
TIME=$(avspo_config_resource "$CONFIG" time 24:00:00)
JOB_NAME=$NAME OUT="" DRY=0 CHECK=1 ALLOW_MISSING=${AVSPO_ALLOW_MISSING_PATHS:-0} SBATCH_OPTS=() EXTRA=()
while [ $# -gt 0 ]; do
  case "$1" in
    --nodes) NODES=$2; shift 2 ;;
    --gpus-per-node) GPUS=$2; shift 2 ;;
    --partition | --account | --qos) SBATCH_OPTS+=("$1=$2"); shift 2 ;;
    --time) TIME=$2; shift 2 ;;
    --name) JOB_NAME=$2; shift 2 ;;
    --out) OUT=$2; shift 2 ;;
    --dry-run) DRY=1; shift ;;
    --no-check) CHECK=0; shift ;;
    --allow-missing-paths) ALLOW_MISSING=1; shift ;;
    --) shift; EXTRA=("$@"); break ;;
    *) avspo_die "unknown option '$1' (avspo-train flags go after --)" ;;
  esac
done
avspo_refuse_secret_flags "${EXTRA[@]}"
[[ "$NODES" =~ ^[1-9][0-9]*$ ]] || avspo_die "--nodes must be a positive integer, got '$NODES'"
BACKEND=$(avspo_config_flag "$CONFIG" --backend gpu)
if [ "$BACKEND" = cpu ]; then
  [[ "$GPUS" =~ ^[0-9]+$ ]] || avspo_die "--gpus-per-node must be a non-negative integer, got '$GPUS'"
else
  [[ "$GPUS" =~ ^[1-9][0-9]*$ ]] || avspo_die "--gpus-per-node must be a positive integer, got '$GPUS'"
fi
SECS=$(avspo_time_seconds "$TIME")
[ -n "$SECS" ] && [ "$SECS" -gt 0 ] || avspo_die "--time '$TIME' is not a Slurm time limit (HH:MM:SS, D-HH:MM:SS, MM)"
LEAD=$(avspo_signal_lead "$TIME")
OUT=${OUT:-$REPO/runs/$NAME}
[ ! -e "$OUT/DONE" ] || avspo_die "$OUT already finished (DONE): a job would end at once and train nothing. Use --out NEW_FOLDER to train again, or delete $OUT/DONE to continue that run"

if [ "$CHECK" = 1 ]; then
  TRAIN_BIN=$(command -v avspo-train || true)
  [ -n "$TRAIN_BIN" ] || [ ! -x "$REPO/.venv/bin/avspo-train" ] || TRAIN_BIN=$REPO/.venv/bin/avspo-train
  [ -n "$TRAIN_BIN" ] || avspo_die "avspo-train is not on PATH (activate the environment the job will use), or pass --no-check to submit without checking the config"
  # the real parser and OpenRLHF's validation, with the flags the job will add: a typo fails here
  FLAGS=$(avspo_train_flags "$CONFIG" "$NODES" "$GPUS" "$OUT") || exit 2
  mapfile -t CHECK <<<"$FLAGS"
  ERR=$(mktemp)
  if ! (cd "$REPO" && AVSPO_ALLOW_MISSING_PATHS=$ALLOW_MISSING "$TRAIN_BIN" --dry-run "${CHECK[@]}" "${EXTRA[@]}") >/dev/null 2>"$ERR"; then
    MSG=$(sed -n 's/^avspo-train: error: //p' "$ERR" | tail -n1)
    [ -n "$MSG" ] || MSG="avspo-train --dry-run failed: $(grep -v '^\s*$' "$ERR" | tail -n1)"
    rm -f "$ERR"
    avspo_die "$(basename "$CONFIG" .args): ${MSG//AVSPO_ALLOW_MISSING_PATHS=1/--allow-missing-paths}; nothing was submitted"
  fi
  grep '^\[avspo\] warning' "$ERR" >&2 || true
  rm -f "$ERR"
fi

GRES=()
[ "$GPUS" = 0 ] || GRES=(--gres="gpu:$GPUS")
CMD=(sbatch --job-name="$JOB_NAME" --nodes="$NODES" "${GRES[@]}" --time="$TIME" --signal="B:USR1@$LEAD" "${SBATCH_OPTS[@]}"
  --output="$REPO/logs/%x-%j.out" --chdir="$REPO" --export="ALL,AVSPO_REPO=$REPO,AVSPO_OUT=$OUT"
  "$REPO/launch_scripts/slurm/avspo.sbatch" "$CONFIG" "${EXTRA[@]}")
if [ "$DRY" = 1 ]; then
  printf '+'; printf ' %q' "${CMD[@]}"; echo
  # the job to be, not the allocation this may run in (an interactive one has its own node list)
  env -u SLURM_JOB_NODELIST -u SLURM_JOB_ID SLURM_JOB_NUM_NODES="$NODES" SLURM_GPUS_ON_NODE="$GPUS" SLURM_JOB_NAME="$JOB_NAME" \
    AVSPO_REPO="$REPO" AVSPO_OUT="$OUT" bash "$REPO/launch_scripts/slurm/avspo.sbatch" --dry-run "$CONFIG" "${EXTRA[@]}"
  exit 0
fi
mkdir -p "$REPO/logs"  # SLURM does not create the --output folder
"${CMD[@]}"
echo "watch:  squeue --me; tail -f $REPO/logs/$JOB_NAME-<jobid>/train.log"
echo "stop and requeue later: scancel --signal=USR1 <jobid>   cancel: scancel <jobid>"
