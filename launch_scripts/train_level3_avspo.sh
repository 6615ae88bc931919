#!/usr/bin/env bash
# AVSPO on Qwen2.5-Math-1.5B, Level3-500, the paper's settings (docs/algorithm.md#one-step): G=8, T=1.0,
# lr 1e-6, eps_clip 0.2, no KL, one prompt group per step, 500 steps, 1024 new tokens.
# One node, 8 GPUs, everything colocated. Run inside a Ray cluster (`ray start --head`) or alone.
# For wandb, export WANDB_API_KEY and add --report.wandb --logger.wandb.project avspo (never put the key on a
# command line). The same run as a config: launch_scripts/configs/qwen2.5-math-1.5b_avspo.args.
# Prepare the data first (datasets/README.md):
#   avspo-prepare-data level3-select --model Qwen/Qwen2.5-Math-1.5B --input data/math_train.jsonl --output data/level3_500.jsonl
set -euo pipefail
REWARD=$(python -c "import avspo_openrlhf.rewards.openrlhf_reward as m; print(m.__file__)")

avspo-train \
  --actor.model_name_or_path "${MODEL:-Qwen/Qwen2.5-Math-1.5B}" \
  --data.prompt_dataset "${DATA:-data/level3_500.jsonl}" \
  --data.input_key prompt --data.label_key answer --data.apply_chat_template \
  --reward.remote_url "${REWARD:-avspo_openrlhf/rewards/openrlhf_reward.py}" \
  --actor.num_nodes 1 --actor.num_gpus_per_node 8 \
  --vllm.num_engines 8 --vllm.tensor_parallel_size 1 --vllm.gpu_memory_utilization 0.5 \
  --train.colocate_all --vllm.enable_sleep --ds.enable_sleep \
  --ds.zero_stage 2 --ds.param_dtype bf16 --actor.gradient_checkpointing_enable \
  --algo.advantage.estimator group_norm --rollout.n_samples_per_prompt 8 \
  --rollout.batch_size 1 --rollout.micro_batch_size 1 --train.batch_size 8 --train.micro_batch_size 1 \
  --train.num_episodes 1 --data.max_samples 500 \
  --rollout.temperature 1.0 --rollout.max_new_tokens 1024 --data.max_len 2048 \
  --actor.adam.lr 1e-6 --actor.eps_clip 0.2 --algo.kl.init_coef 0 \
  --remedy avspo --avspo.strategy stratified --acr.window 25 \
  --logger.tensorboard_dir "${OUT:-runs/level3_avspo}"/tb \
  --ckpt.path "${OUT:-runs/level3_avspo}"/ckpt --ckpt.save_steps 50 --ckpt.load_enable \
  --ckpt.output_dir "${OUT:-runs/level3_avspo}"/final
