# shellcheck shell=bash
# Shared helpers of the launch scripts (sourced, not run). Every function is plain bash + coreutils.

avspo_log() { printf '[avspo-launch %s] %s\n' "$(date +%H:%M:%S)" "$*" >&2; }
avspo_die() { printf 'avspo-launch: error: %s\n' "$*" >&2; exit 2; }

# A config name (qwen2.5-math-1.5b_avspo) or path -> the file's path.
avspo_config_path() {
  local repo=$1 name=$2
  if [ -f "$name" ]; then printf '%s\n' "$name"; return; fi
  if [ -f "$repo/launch_scripts/configs/$name.args" ]; then printf '%s\n' "$repo/launch_scripts/configs/$name.args"; return; fi
  local known=() f
  for f in "$repo"/launch_scripts/configs/*.args; do known+=("$(basename "$f" .args)"); done
  avspo_die "no config '$name' (a file, or one of launch_scripts/configs/: ${known[*]})"
}

# The value of a `# resources:` key in a config (nodes, gpus_per_node, time), or $3 when absent.
avspo_config_resource() {
  local file=$1 key=$2 default=$3 v
  v=$(sed -n "s/^# resources:.*\b$key=\([^ ]*\).*/\1/p" "$file" | head -n1)
  printf '%s\n' "${v:-$default}"
}

# The value of a flag set in a config (last one wins), or $3.
avspo_config_flag() {
  local file=$1 flag=$2 default=$3 v
  v=$(sed -e 's/#.*//' "$file" | tr -s ' \t' '\n' | awk -v f="$flag" 'prev == f { v = $0 } { prev = $0 } END { print v }')
  printf '%s\n' "${v:-$default}"
}

# The flags every launcher adds to a config, one per line: resources from the allocation (vLLM
# engines = GPUs / the config's tensor parallel size) and the run folder, resumable.
avspo_train_flags() {
  local config=$1 nodes=$2 gpus=$3 out=$4 tp
  tp=$(avspo_config_flag "$config" --vllm.tensor_parallel_size 1)
  [ $((nodes * gpus % tp)) -eq 0 ] || avspo_die "$nodes node(s) x $gpus GPU(s) is not a multiple of the config's --vllm.tensor_parallel_size $tp"
  printf '%s\n' "@$config" --actor.num_nodes "$nodes" --actor.num_gpus_per_node "$gpus" --ref.num_nodes "$nodes" \
    --ref.num_gpus_per_node "$gpus" --vllm.num_engines $((nodes * gpus / tp)) --ckpt.path "$out/ckpt" --ckpt.load_enable \
    --ckpt.output_dir "$out/final" --report.dir "$out/report" --logger.tensorboard_dir "$out/tensorboard"
}

# Seconds in a Slurm time limit (MM, MM:SS, HH:MM:SS, D-HH, D-HH:MM, D-HH:MM:SS); empty if unparsable.
avspo_time_seconds() {
  local t=$1 d=0 h=0 m=0 s=0
  if [[ "$t" =~ ^([0-9]+)-([0-9]+)(:([0-9]+))?(:([0-9]+))?$ ]]; then
    d=${BASH_REMATCH[1]} h=${BASH_REMATCH[2]} m=${BASH_REMATCH[4]:-0} s=${BASH_REMATCH[6]:-0}
  elif [[ "$t" =~ ^([0-9]+):([0-9]+):([0-9]+)$ ]]; then
    h=${BASH_REMATCH[1]} m=${BASH_REMATCH[2]} s=${BASH_REMATCH[3]}
  elif [[ "$t" =~ ^([0-9]+):([0-9]+)$ ]]; then
    m=${BASH_REMATCH[1]} s=${BASH_REMATCH[2]}
  elif [[ "$t" =~ ^([0-9]+)$ ]]; then
    m=${BASH_REMATCH[1]}
  else
    return 0
  fi
  printf '%s\n' $(((10#$d * 24 + 10#$h) * 3600 + 10#$m * 60 + 10#$s))
}

# How long before the time limit the USR1 (checkpoint and requeue) is sent: 600 s, but never more
# than a quarter of the limit (a 10-minute job would get it at its start, before anything trained).
avspo_signal_lead() {
  local secs
  secs=$(avspo_time_seconds "$1")
  [ -n "$secs" ] || { printf '600\n'; return; }
  local lead=$((secs / 4))
  [ "$lead" -le 600 ] || lead=600
  [ "$lead" -ge 30 ] || lead=30
  printf '%s\n' "$lead"
}

# Refuse a secret on a command line: it would show in `ps`, in shell history and in SLURM's job
# records. The wandb key comes from WANDB_API_KEY in the environment.
avspo_refuse_secret_flags() {
  local a
  for a in "$@"; do
    case "$a" in
      # a prefix of the key flag too (--logger.wandb.ke): avspo-train refuses abbreviations, but
      # only after the value has been on this command line and the printed sbatch line
      --logger.wandb.k | --logger.wandb.k=* | --logger.wandb.ke | --logger.wandb.ke=* | \
        --logger.wandb.key | --logger.wandb.key=* | --*api_key* | --*_token | --*_token=* | --*secret* | --*password*)
        avspo_die "'${a%%=*}' on a command line is visible to every user of the cluster (ps, sacct); export WANDB_API_KEY (or the token's environment variable) instead" ;;
    esac
  done
}

# GPUs per node from SLURM's variables: SLURM_GPUS_ON_NODE, else SLURM_GPUS_PER_NODE ("8" or
# "h100:8"), else the count in SLURM_JOB_GPUS / CUDA_VISIBLE_DEVICES, else 0. Read it inside a job
# step (avspo_step_gpus): under --exclusive the batch step sees every GPU of the node while a step
# gets only the ones the job asked for (Slurm 22.05: --exclusive --gpus-per-node=2 -> 8 vs 2).
avspo_gpus_per_node() {
  if [ -n "${SLURM_GPUS_ON_NODE:-}" ]; then printf '%s\n' "$SLURM_GPUS_ON_NODE"; return; fi
  if [ -n "${SLURM_GPUS_PER_NODE:-}" ]; then printf '%s\n' "${SLURM_GPUS_PER_NODE##*:}"; return; fi
  local list=${SLURM_JOB_GPUS:-${CUDA_VISIBLE_DEVICES:-}}
  if [ -n "$list" ]; then awk -F, '{ print NF }' <<<"$list"; return; fi
  printf '0\n'
}

# "<GPUs> <CUDA_VISIBLE_DEVICES>" as a job step on node $1 sees them: what Ray on that node may use.
avspo_step_gpus() {
  # shellcheck disable=SC2016  # expanded by the job step's shell, not this one
  srun --overlap --nodes=1 --ntasks=1 -w "$1" bash -c \
    'source "$0"; printf "%s %s\n" "$(avspo_gpus_per_node)" "${CUDA_VISIBLE_DEVICES:-}"' "${BASH_SOURCE[0]}"
}

# The host name of each Slurm node name (NodeHostName; `NodeName=gpu01 NodeHostname=vm` is common):
# Ray registers nodes by host name, so the join check must wait for those.
avspo_node_hostnames() {
  local n h
  for n in "$@"; do
    h=$(scontrol show node -o "$n" 2>/dev/null | tr ' ' '\n' | sed -n 's/^NodeHostName=//p')
    printf '%s\n' "${h:-$n}"
  done
}

# CPUs per node for `ray start --num-cpus`.
avspo_cpus_per_node() {
  printf '%s\n' "${SLURM_CPUS_ON_NODE:-${SLURM_CPUS_PER_TASK:-$(nproc)}}"
}

# This node's IP for Ray: RAY_NODE_IP if set, else the IPv4 address of AVSPO_IFACE (e.g. ib0)
# when the node has several interfaces, else the first IPv4 address of the host name.
avspo_node_ip() {
  if [ -n "${RAY_NODE_IP:-}" ]; then printf '%s\n' "$RAY_NODE_IP"; return; fi
  if [ -n "${AVSPO_IFACE:-}" ]; then
    local ip
    ip=$(ip -o -4 addr show dev "$AVSPO_IFACE" 2>/dev/null | awk '{ split($4, a, "/"); print a[1]; exit }')
    [ -n "$ip" ] || avspo_die "AVSPO_IFACE=$AVSPO_IFACE has no IPv4 address on $(hostname)"
    printf '%s\n' "$ip"
    return
  fi
  # IPv6 addresses and loopback are skipped (verl and NeMo-RL users hit both): the host name's
  # addresses, then every interface's (`hostname -I`: /etc/hosts often maps the name to 127.0.1.1).
  # Never loopback: the launcher would wait for 127.x while Ray registers the host address.
  local ip
  ip=$({ hostname --ip-address; hostname --all-ip-addresses; } 2>/dev/null | tr ' ' '\n' \
    | grep -E '^[0-9]+(\.[0-9]+){3}$' | grep -v '^127\.' | head -n1 || true)
  [ -n "$ip" ] || avspo_die "no non-loopback IPv4 address on $(hostname): set RAY_NODE_IP or AVSPO_IFACE (e.g. ib0)"
  printf '%s\n' "$ip"
}

# Ray's ports for one job: a block of 256 ports from the job id, so two jobs sharing a node never
# collide (ray#10154), all between 20000 and Linux's ephemeral range (32768-60999, where any outgoing
# connection may hold a port): a plain `ray start` on the node (anyone's, or a test's) gives its
# workers 10002-19999, and one of them held a job's metrics port once. AVSPO_PORT_BASE overrides the block.
avspo_port_base() {
  local job=${1//[!0-9]/}
  printf '%s\n' "${AVSPO_PORT_BASE:-$((20000 + (${job:-0} % 49) * 256))}"
}

# `ray start` flags that place every Ray port inside the job's block.
avspo_ray_port_flags() {
  local b=$1
  printf '%s\n' "--node-manager-port=$((b + 3))" "--object-manager-port=$((b + 4))" \
    "--metrics-export-port=$((b + 5))" "--dashboard-agent-listen-port=$((b + 6))" \
    "--dashboard-agent-grpc-port=$((b + 7))" "--runtime-env-agent-port=$((b + 8))" \
    "--min-worker-port=$((b + 16))" "--max-worker-port=$((b + 255))"
}

# Environment a Ray cluster job needs everywhere; only the interesting variables are printed, and
# secrets never (their names are printed, their values redacted).
avspo_print_env() {
  env | grep -E '^(NCCL|GLOO|RAY|CUDA|NVIDIA|VLLM|HF|TRANSFORMERS|WANDB|TORCH|OMP|AVSPO|DS)_' | sort \
    | sed -E 's/^([^=]*(KEY|TOKEN|SECRET|PASSWORD|PASSWD)[^=]*)=.*/\1=<redacted>/'
}
