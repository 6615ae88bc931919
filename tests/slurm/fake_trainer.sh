#!/usr/bin/env bash
# Stands in for avspo-train in the real-Slurm launcher tests (tests/test_slurm_real.py): a real Ray
# cluster and real Slurm signals, no model. FAKE_TRAIN selects the behaviour:
#   ok            exit 0 at once
#   crash         exit 1 at once
#   until_stop    run until <ckpt>/STOP appears (then "checkpoint" and exit 130), or FAKE_SECONDS pass (exit 0;
#                 with FAKE_RECHECK=1 only if Ray still answers)
#   ignore_stop   never read STOP; run FAKE_SECONDS (default 600)
#   crash_on_stop exit 1 when STOP appears
# Every mode first records, in <ckpt>/../fake_train.json, its flags, RAY_ADDRESS and the Ray cluster's
# resources as the trainer sees them (a real ray.init with the job's token).
set -uo pipefail
ckpt="" prev=""
for a in "$@"; do [ "$prev" = --ckpt.path ] && ckpt=$a; prev=$a; done
out=$(dirname "$ckpt")
mkdir -p "$ckpt"
record() {
  "${AVSPO_PYTHON:-python3}" - "$out/fake_train.json" "$@" <<'PY'
import json, os, sys
import ray
ray.init(address=os.environ["RAY_ADDRESS"], logging_level="ERROR", log_to_driver=False)
rec = {"argv": sys.argv[2:], "ray_address": os.environ["RAY_ADDRESS"], "resources": ray.cluster_resources(),
       "nodes": [n["NodeManagerHostname"] for n in ray.nodes() if n["Alive"]], "tag": os.environ.get("AVSPO_JOB_TAG")}
with open(sys.argv[1], "a") as f:
    f.write(json.dumps(rec) + "\n")
ray.shutdown()
PY
}
record "$@" || { echo "fake trainer: no Ray cluster at $RAY_ADDRESS"; exit 1; }
echo "fake trainer: recorded; mode ${FAKE_TRAIN:-ok}"
end=$((SECONDS + ${FAKE_SECONDS:-600}))
case "${FAKE_TRAIN:-ok}" in
  ok) exit 0 ;;
  crash) echo "fake trainer: crashing"; exit 1 ;;
  until_stop | crash_on_stop)
    while [ "$SECONDS" -lt "$end" ]; do
      if [ -e "$ckpt/STOP" ]; then
        rm -f "$ckpt/STOP"
        [ "$FAKE_TRAIN" = crash_on_stop ] && { echo "fake trainer: crashing on STOP"; exit 1; }
        echo "fake trainer: checkpointed and stopped"; touch "$ckpt/STOPPED"; exit 130
      fi
      sleep 0.2
    done
    # FAKE_RECHECK=1: the cluster must still answer at the end (another job's teardown spared it)
    if [ "${FAKE_RECHECK:-0}" = 1 ]; then record "$@" || { echo "fake trainer: Ray is gone"; exit 1; }; fi
    exit 0 ;;
  ignore_stop)
    trap 'echo "fake trainer: terminated"; exit 143' TERM
    while [ "$SECONDS" -lt "$end" ]; do sleep 0.2; done
    exit 0 ;;
esac
