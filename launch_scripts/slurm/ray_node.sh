#!/usr/bin/env bash
# Ray on one node of the allocation (run by avspo.sbatch), blocking until stopped:
#   ray_node.sh head                 the head, in the batch step: GCS on $RAY_PORT, dashboard and client ports in the job's block
#   ray_node.sh worker HEAD_IP:PORT  a worker joining the head, as a job step (retried: workers can race the head's GCS)
#   ray_node.sh sentinel             a job step that only waits: it exits 0 when the job's steps are signalled
#                                    (a preemption's SIGTERM, `scancel --signal=USR1` without --batch), which
#                                    avspo.sbatch turns into a checkpoint-and-stop request
# Environment (set by avspo.sbatch): AVSPO_PORT_BASE, RAY_PORT, AVSPO_GPUS, AVSPO_CPUS, AVSPO_RAY_TMP,
# and optionally RAY_NODE_IP / AVSPO_IFACE for the node's address.
set -euo pipefail
# shellcheck source-path=SCRIPTDIR
source "$(dirname "${BASH_SOURCE[0]}")/lib.sh"

role=${1:?usage: ray_node.sh head | worker HEAD_IP:PORT | sentinel}
if [ "$role" = sentinel ]; then
  trap 'exit 0' TERM USR1 USR2 INT
  while :; do sleep 1; done
fi
# USR1 to every step (`scancel --signal=USR1 JOB`) is a stop request for the launcher, not a reason
# for Ray to die (it is Python's default action); SIG_IGN survives exec
trap '' USR1
ip=$(avspo_node_ip)
base=${AVSPO_PORT_BASE:?}
mapfile -t ports < <(avspo_ray_port_flags "$base")
common=(--node-ip-address="$ip" --num-gpus="${AVSPO_GPUS:?}" --num-cpus="${AVSPO_CPUS:?}" --disable-usage-stats "${ports[@]}" --block)
avspo_log "ray $role on $(hostname) ($ip): ${AVSPO_GPUS} GPU(s), ${AVSPO_CPUS} CPU(s), ports $base-$((base + 255))"

if [ "$role" = head ]; then
  # no dashboard: its HTTP and gRPC servers would take ports outside the job's block (ray start has
  # no flag for the gRPC one) and nothing of the launcher uses it
  exec ray start --head --port="${RAY_PORT:?}" --ray-client-server-port=$((base + 2)) --include-dashboard=false \
    --temp-dir="${AVSPO_RAY_TMP:-/tmp/ray}" "${common[@]}"
fi
address=${2:?worker needs HEAD_IP:PORT}
for attempt in 1 2 3 4 5; do
  # --block returns only when the node leaves the cluster; an immediate failure is a join failure
  start=$(date +%s)
  ray start --address="$address" "${common[@]}" && exit 0
  rc=$?
  [ $(($(date +%s) - start)) -gt 60 ] && exit "$rc"  # it had joined and then died: no retry
  avspo_log "worker on $(hostname) could not join $address (attempt $attempt, exit $rc); retrying in 10 s"
  sleep "${AVSPO_JOIN_RETRY_S:-10}"
done
exit 1
