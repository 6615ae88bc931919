"""``avspo-train``'s checks that span flag groups or concern OpenRLHF's flags (:func:`validate`),
after each group checked its own values when :func:`~avspo_openrlhf.trainer.run_settings.settings` built
it. A ``ValueError`` here is one ``avspo-train: error:`` line."""

from __future__ import annotations

from .run_settings import settings

# OpenRLHF estimators whose baseline is the prompt's group of n samples
GROUP_ESTIMATORS = ("group_norm", "dr_grpo", "rloo", "reinforce_baseline")


def _in_range(args) -> None:
    """Values no run can mean, refused before anything starts (each used to be accepted, then
    crashed after Ray, vLLM and DeepSpeed had started, or trained nonsense)."""
    a = args
    checks = [
        ("--actor.adam.lr", a.actor.adam.lr, a.actor.adam.lr > 0, "> 0"),
        ("--rollout.temperature", a.rollout.temperature, a.rollout.temperature >= 0, ">= 0"),
        ("--rollout.top_p", a.rollout.top_p, 0 < a.rollout.top_p <= 1, "in (0, 1]"),
        (
            "--rollout.max_new_tokens",
            a.rollout.max_new_tokens,
            a.rollout.max_new_tokens is None or a.rollout.max_new_tokens >= 1,
            ">= 1",
        ),
        ("--rollout.n_samples_per_prompt", a.rollout.n_samples_per_prompt, a.rollout.n_samples_per_prompt >= 1, ">= 1"),
        ("--train.batch_size", a.train.batch_size, a.train.batch_size >= 1, ">= 1"),
        ("--train.max_epochs", a.train.max_epochs, a.train.max_epochs >= 1, ">= 1"),
        ("--train.async_queue_size", a.train.async_queue_size, a.train.async_queue_size >= 1, ">= 1"),
        ("--ckpt.max_num", a.ckpt.max_num, a.ckpt.max_num >= 1, ">= 1 (0 would delete every checkpoint)"),
        (
            "--ckpt.save_steps",
            a.ckpt.save_steps,
            a.ckpt.save_steps == -1 or a.ckpt.save_steps >= 1,
            "-1 (never) or >= 1",
        ),
        ("--actor.eps_clip", a.actor.eps_clip, a.actor.eps_clip > 0, "> 0"),
        (
            "--actor.eps_clip_low_high",
            a.actor.eps_clip_low_high,
            a.actor.eps_clip_low_high is None or min(a.actor.eps_clip_low_high) >= 0,
            ">= 0 (both)",
        ),
        ("--train.micro_batch_size", a.train.micro_batch_size, a.train.micro_batch_size >= 1, ">= 1"),
        ("--rollout.micro_batch_size", a.rollout.micro_batch_size, a.rollout.micro_batch_size >= 1, ">= 1"),
        ("--actor.lr_warmup_ratio", a.actor.lr_warmup_ratio, 0 <= a.actor.lr_warmup_ratio <= 1, "in [0, 1]"),
        ("--actor.max_norm", a.actor.max_norm, a.actor.max_norm > 0, "> 0"),
        ("--algo.kl.init_coef", a.algo.kl.init_coef, a.algo.kl.init_coef >= 0, ">= 0"),
        ("--data.max_len", a.data.max_len, a.data.max_len >= 1, ">= 1"),
    ]
    for name, value, ok, want in checks:
        if not ok:
            raise ValueError(f"{name} must be {want}, got {value}")
    n = a.rollout.n_samples_per_prompt
    if a.algo.advantage.estimator in GROUP_ESTIMATORS and a.train.batch_size % n:
        raise ValueError(
            f"--train.batch_size {a.train.batch_size} must be a multiple of --rollout.n_samples_per_prompt {n}: "
            "each update should hold whole prompt groups (with 15 of G=8, groups straddle optimizer steps)"
        )


def validate(args) -> None:
    """Check our flags against OpenRLHF's (after ``hierarchize``); adjusts a few in place. Each of our
    groups checks its own values when :func:`settings` builds it; here only what spans groups or
    concerns OpenRLHF's flags. A ``ValueError`` here is one ``avspo-train: error:`` line."""
    cfg = settings(args)  # every group's own values (types, choices, ranges), named by flag
    _in_range(args)
    n = args.rollout.n_samples_per_prompt
    est = args.algo.advantage.estimator
    if cfg.remedy is not None:
        if est != "group_norm":
            raise ValueError(f"--remedy {cfg.remedy} needs --algo.advantage.estimator group_norm (GRPO), got {est!r}")
        if n < 2:
            raise ValueError(f"--remedy {cfg.remedy} needs --rollout.n_samples_per_prompt >= 2")
        if args.algo.advantage.gamma != 1.0:  # OpenRLHF's group_norm warns and uses 1.0 as well
            print(
                f"[avspo] --algo.advantage.gamma {args.algo.advantage.gamma} is ignored with group_norm: returns use 1.0"
            )
    if cfg.monitor.kl_bound is not None and cfg.monitor.kl_source == "ref" and args.algo.kl.init_coef == 0:
        # OpenRLHF loads the reference model only with a KL coefficient: without one its kl is logged as 0
        raise ValueError(
            "--monitor.kl_bound watches the KL to the reference model, which OpenRLHF computes only "
            "with --algo.kl.init_coef > 0 (it logs 0 otherwise): set --algo.kl.init_coef, or "
            "--monitor.kl_source old (the KL to the previous policy), or leave --monitor.kl_bound out"
        )
    if cfg.greso.enable and n < 2:
        raise ValueError("--greso.enable needs --rollout.n_samples_per_prompt >= 2 (it predicts collapsed groups)")
    max_len, new_tokens = args.data.max_len, args.rollout.max_new_tokens
    if max_len is not None and new_tokens is not None and max_len <= new_tokens:
        # vLLM refuses such requests only after start-up, inside the engine actor
        raise ValueError(
            f"--data.max_len {max_len} (prompt + response) leaves no room for a prompt beside "
            f"--rollout.max_new_tokens {new_tokens}"
        )
    if cfg.dynamic.std_filter:
        if args.algo.dynamic_filtering_enable:
            raise ValueError("use either --dynamic.std_filter or --algo.dynamic_filtering_enable, not both")
        if n < 2:
            raise ValueError("--dynamic.std_filter needs --rollout.n_samples_per_prompt >= 2")
    st = cfg.buffer.max_staleness
    if st is not None:
        if not args.train.async_enable:
            print(
                "[avspo] --buffer.max_staleness has no effect without --train.async_enable (sync batches are never stale)"
            )
        elif st < 1:
            raise ValueError(
                "--buffer.max_staleness must be >= 1 in async mode: with 0 the batches generated while the previous "
                "step trained (about every other one) would be rejected and regenerated, slower than sync mode and "
                "not the same; for on-policy batches use sync mode (drop --train.async_enable)"
            )
        elif st < args.train.async_queue_size:
            print(
                f"[avspo] --buffer.max_staleness {st} < --train.async_queue_size {args.train.async_queue_size}: "
                "batches queued behind others will often be over-stale and dropped/regenerated"
            )
