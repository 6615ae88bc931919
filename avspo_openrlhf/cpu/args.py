"""What the CPU backend makes of OpenRLHF's parsed ``args`` (``cli/train.py``: ``complete_args``,
``check_config``): its settings written in, what it cannot run refused. Light on purpose: it runs while
the flags are parsed, before preflight, where importing the backend (Ray, OpenRLHF's trainers, vLLM)
would delay the checks and Ray's start by seconds."""

from __future__ import annotations

from avspo_openrlhf.cpu.cores import cpulist, resolve_split
from avspo_openrlhf.cpu.dtype import describe_cpu_dtype, resolve_cpu_dtype


def complete_cpu_args(args) -> None:
    """The settings the CPU backend needs (OpenRLHF's defaults assume 8 GPUs and flash-attn), written
    into OpenRLHF's args while they are parsed (``cli/train.py: complete_args``)."""
    if args.actor.num_nodes * args.actor.num_gpus_per_node != 1:
        print("[avspo] CPU backend: one DeepSpeed actor process (--actor.num_gpus_per_node 1)")
        args.actor.num_nodes, args.actor.num_gpus_per_node = 1, 1
    args.ref.num_nodes, args.ref.num_gpus_per_node = 1, 1
    model = args.actor.model_name_or_path
    dtype = resolve_cpu_dtype(args.cpu.dtype, model=model)
    if dtype != args.cpu.dtype:
        print(f"[avspo] CPU backend: --cpu.dtype {describe_cpu_dtype(args.cpu.dtype, dtype, model=model)}")
    # one dtype for the DeepSpeed actors (fp32: bf16 and fp16 both off) and the engine; cuda_shims
    # teaches OpenRLHF's convert_to_torch_dtype the "fp32" name
    args.cpu.dtype = args.ds.param_dtype = dtype
    if "flash" in args.ds.attn_implementation:
        args.ds.attn_implementation = "sdpa"
    args.vllm.num_engines = args.vllm.num_engines or 1
    args.vllm.sync_backend = "gloo"
    engine_cores, train_cores = resolve_split(args.cpu.engine_cores, args.cpu.train_cores)
    if engine_cores:  # normalized, so the dump and the run config show the cores really used
        args.cpu.engine_cores, args.cpu.train_cores = cpulist(engine_cores), cpulist(train_cores)


def validate_cpu_args(args) -> None:
    """What the CPU backend cannot run, refused (after :func:`complete_cpu_args`; reads ``args`` only)."""
    if args.ds.zero_stage > 2:
        raise ValueError("the CPU backend syncs weights from a single ZeRO-0/1/2 process: use --ds.zero_stage <= 2")
    for flag, on in [
        ("--ds.packing_samples", args.ds.packing_samples),
        ("--train.partial_rollout_enable", args.train.partial_rollout_enable),
        ("--vllm.enable_sleep", args.vllm.enable_sleep),
        ("--train.colocate_all", args.train.colocate_all),
        ("critic models (--algo.advantage.estimator gae)", args.critic.model_name_or_path),
    ]:
        if on:
            raise ValueError(f"{flag} is not supported by the CPU backend")
    if not args.reward.remote_url:
        raise ValueError("the CPU backend needs rule-based rewards: --reward.remote_url <file.py>")
