"""The algorithm's options, one frozen dataclass per flag group: the single home of every default
of the pure math. ``avspo-train`` generates its ``--acr.*``, ``--avspo.*``, ``--ngrpo.*``,
``--rl_zvp.*``, ``--sign.*``, ``--greso.*`` and ``--monitor.*`` flags and their ``--help`` from these
fields (``trainer/config.py``). Each advantage estimator is registered with its own config class
(``algo/advantages.py``) and reads only that; :class:`~avspo_openrlhf.algo.controller.CollapseController`
takes the ACR config, the chosen estimator's config and the monitor config as they are.
dataclasses only: no torch, no argparse.
"""

from __future__ import annotations

from dataclasses import dataclass, field

STD_CONVENTIONS = {"population": 0, "unbiased": 1}  # -> divide by G - correction
FIX_GROUPS = ("both", "all_wrong", "all_right")  # which collapsed groups AVSPO augments
ALARMS = ("acr_stall", "acr_volatility", "entropy_collapse", "kl_drift")
# the built-in virtual-reward strategies (algo/virtual.py registers exactly these)
STRATEGIES = ("exp_decay", "fixed_partial", "opposite", "random_uniform", "stratified")


def flag(default, help: str, **argparse_kwargs):
    """A config field that is also a flag: its default, ``--help`` text and argparse extras
    (``choices``, ``metavar``); type, ``nargs`` and ``store_true`` follow from the annotation."""
    return field(default=default, metadata=dict(help=help, **argparse_kwargs))


def std_convention_flag(default: str, help: str):
    """A remedy's ``std_convention`` field: population (divide by n) or unbiased (n - 1)."""
    return flag(default, help, choices=sorted(STD_CONVENTIONS))


def _require(ok: bool, message: str) -> None:
    if not ok:
        raise ValueError(message)


@dataclass(frozen=True)
class ACRConfig:
    """ACR monitoring (``--acr.*``)."""

    tol: float = flag(
        1e-06, "A group is collapsed when the population std of its rewards is below this (docs/algorithm.md#acr)."
    )
    reward_range: tuple[float, float] = flag(
        (0.0, 1.0),
        "Reward range: a collapsed group at HI is all-right, at LO all-wrong (any other constant counts as all-wrong for AVSPO).",
        metavar=("LO", "HI"),
    )
    smoothing: str = flag(
        "window",
        "How the per-batch ACR is smoothed into the gate input ACR_gate (AVSPO, gated NGRPO).",
        choices=["window", "ema"],
    )
    window: int = flag(25, "Steps in the ACR_gate window (use 1 with many prompt groups per step).")
    ema_decay: float = flag(0.9, "Decay of ACR_gate when --acr.smoothing ema.")
    gate_view: str = flag(
        "raw",
        "Reward view whose ACR drives the gate and the threshold: raw correctness (the paper's) or the shaped reward after overlong/stop penalties.",
        choices=["raw", "shaped"],
    )
    early_steps: int = flag(100, "Steps averaged into ACR_100, the early-warning statistic.")
    stall_threshold: float = flag(0.35, "Stall alarm: ACR above this ...")
    stall_patience: int = flag(50, "... for more than this many consecutive steps.")
    volatility_window: int = flag(25, "Window of the ACR volatility (population std of the last N ACRs).")
    volatility_threshold: float = flag(0.15, "Volatility alarm when the windowed ACR std exceeds this.")
    tau_init: float = flag(
        0.5,
        "Initial adaptive threshold tau_adapt(0): the gate is open while ACR_gate > tau_adapt (AVSPO, gated NGRPO).",
    )
    eta: float = flag(0.01, "Step size of the adaptive threshold; 0 keeps tau_adapt fixed at --acr.tau_init.")
    tau_bounds: tuple[float, float] = flag((0.1, 0.9), "Clip range of tau_adapt.", metavar=("LO", "HI"))
    reward_ema_decay: float = flag(
        0.9, "EMA of the mean reward whose change is dJ in the threshold update (0 = raw change)."
    )


@dataclass(frozen=True)
class AVSPOConfig:
    """AVSPO advantages (``--avspo.*``)."""

    enable: bool = flag(
        False,
        "Use AVSPO advantages: ACR-gated virtual samples in collapsed groups' statistics. Needs --algo.advantage.estimator group_norm.",
    )
    strategy: str = flag(
        "stratified",
        "Virtual reward values (docs/algorithm.md#strategies); 'opposite' reproduces the authors' released code.",
        choices=list(STRATEGIES),
    )
    alpha: float = flag(0.5, "K rule exponent: K = max(1, min(G, ceil(G * ACR_gate**alpha))).")
    num_virtual: int | None = flag(
        None,
        "Fixed number of virtual samples per augmented group instead of the K rule (the paper's fixed-K ablation: 1, 4, 8). Default: the K rule.",
        metavar="K",
    )
    fix_groups: str = flag(
        "both",
        "Which collapsed groups get virtual samples: both (AVSPO), all_wrong only or all_right only (the paper's mechanism isolation); the others keep GRPO's zero advantages.",
        choices=list(FIX_GROUPS),
    )
    r_anchor: float = flag(0.1, "Top virtual reward for all-wrong groups (stratified, exp_decay).")
    gamma: float = flag(0.5, "Decay of the exp_decay strategy.")
    std_convention: str = std_convention_flag(
        "population",
        "Std convention of the (augmented) group: population (divide by n, the paper's) or unbiased (n - 1, OpenRLHF group_norm's).",
    )
    eps: float = flag(
        1e-06,
        "Added to the group std. '--avspo.std_convention unbiased --avspo.eps 1e-9' equals OpenRLHF's group_norm when the gate is closed.",
    )
    seed: int | None = flag(None, "Seed of the random_uniform strategy (default: --train.seed).")

    def check(self) -> None:
        """Values no run can mean (``ValueError`` naming the field); the estimator's own checks."""
        _require(self.alpha > 0, f"alpha must be > 0, got {self.alpha}")
        _require(self.eps >= 0, f"eps must be >= 0, got {self.eps}")
        k = self.num_virtual
        _require(k is None or k >= 1, f"num_virtual must be >= 1, got {k}")
        _require(k is None or self.strategy != "opposite",
                 "num_virtual cannot be combined with strategy opposite (which uses K = 1)")  # fmt: skip


@dataclass(frozen=True)
class NGRPOConfig:
    """NGRPO advantages (``--ngrpo.*``)."""

    enable: bool = flag(
        False,
        "NGRPO (arXiv 2509.18851): --ngrpo.num_max virtual rewards at the reward maximum in every group's mean and std (all-wrong groups get a negative advantage, all-right stay 0). Pair with --actor.eps_clip_low_high 0.16 0.24 for the paper's asymmetric clip. Needs --algo.advantage.estimator group_norm; one advantage remedy at a time.",
    )
    num_max: int = flag(1, "Virtual maximum-reward samples per group (the paper's m = 1).", metavar="M")
    std_convention: str = std_convention_flag(
        "unbiased",
        "Std convention of the G + M values: unbiased (the paper's and its code's) or population.",
    )
    eps: float = flag(1e-06, "Added to the augmented std (the paper's code: 1e-6).")
    gated: bool = flag(
        False,
        "Add the virtual samples only while the ACR gate is open (ACR_gate > tau_adapt, with the --acr.* smoothing and threshold); default: every step, as the paper.",
    )

    def check(self) -> None:
        _require(self.num_max >= 1, f"num_max must be >= 1, got {self.num_max}")
        _require(self.eps >= 0, f"eps must be >= 0, got {self.eps}")


@dataclass(frozen=True)
class RLZVPConfig:
    """RL-ZVP advantages (``--rl_zvp.*``)."""

    enable: bool = flag(
        False,
        "RL-ZVP (arXiv 2509.21880): on zero-variance groups, token advantages +alpha*H_t (all-right) and -alpha*(max H - H_t) (all-wrong), H_t the policy's token entropy before the update; GRPO elsewhere. Needs --algo.advantage.estimator group_norm; one advantage remedy at a time.",
    )
    alpha: float = flag(0.1, "Scale of the entropy-shaped token advantages (the paper's 0.1).")
    std_convention: str = std_convention_flag(
        "unbiased",
        "Std convention of GRPO on the mixed groups: unbiased (OpenRLHF group_norm's, the paper's code) or population.",
    )
    eps: float = flag(1e-09, "Added to the mixed groups' std (OpenRLHF group_norm's 1e-9).")

    def check(self) -> None:
        _require(self.alpha > 0, f"alpha must be > 0, got {self.alpha}")
        _require(self.eps >= 0, f"eps must be >= 0, got {self.eps}")


@dataclass(frozen=True)
class SignConfig:
    """Sign advantage (``--sign.*``)."""

    enable: bool = flag(
        False,
        "Sign advantage (arXiv 2605.07689): A = 2r - 1 (r scaled to --acr.reward_range) on collapsed groups, GRPO on the others (or on every group with --sign.scope all): what every virtual-sample remedy gives a collapsed group, up to the magnitude. Needs --algo.advantage.estimator group_norm; one advantage remedy at a time.",
    )
    scope: str = flag(
        "collapsed",
        "Groups that get A = 2r - 1: collapsed (the rest keep GRPO) or all.",
        choices=["collapsed", "all"],
    )
    std_convention: str = std_convention_flag(
        "population",
        "Std convention of GRPO on the mixed groups (with --sign.scope collapsed): population or unbiased.",
    )
    eps: float = flag(1e-06, "Added to the mixed groups' std.")

    def check(self) -> None:
        _require(self.eps >= 0, f"eps must be >= 0, got {self.eps}")


@dataclass(frozen=True)
class GRPOConfig:
    """GRPO's group normalisation: A = (r - mean) / (std + eps). Not a flag group: in OpenRLHF,
    GRPO is OpenRLHF's own ``group_norm``; this config serves the pure estimator (TRL's GRPO is
    ``unbiased`` with eps 1e-4, OpenRLHF's ``unbiased`` with eps 1e-9)."""

    std_convention: str = field(default="population", metadata=dict(choices=sorted(STD_CONVENTIONS)))
    eps: float = 1e-06


@dataclass(frozen=True)
class GRESOConfig:
    """GRESO pre-rollout skipping (``--greso.*``)."""

    enable: bool = flag(
        False,
        "GRESO (arXiv 2506.02177): skip a prompt before rollout with probability 1 - max(p**z, --greso.min_keep), z = its consecutive all-right (p = p_easy) or all-wrong (p = p_hard) rollouts. Composes with --dynamic.std_filter (GRESO as published) and with --avspo.enable.",
    )
    p_easy: float = flag(0.5, "Initial base keep-probability of prompts whose recent groups were all right.")
    p_hard: float = flag(0.5, "Initial base keep-probability of prompts whose recent groups were all wrong.")
    target_easy: float = flag(
        1 / 12,
        "Target share of all-right groups per step: p_easy moves down by --greso.delta at or above it, up below it.",
    )
    target_hard: float = flag(1 / 6, "Target share of all-wrong groups per step (moves p_hard the same way).")
    delta: float = flag(0.01, "Step of the p_easy / p_hard adaptation per training step.")
    p_bounds: tuple[float, float] = flag((0.05, 0.95), "Clip range of p_easy and p_hard.", metavar=("LO", "HI"))
    min_keep: float = flag(0.01, "Floor of the keep probability p**z (every prompt keeps some chance).")
    audit: float = flag(
        0.0,
        "Share of skipped prompts rolled out anyway (never trained on; their tokens are counted apart) to measure false skips: skipped prompts whose group would have been mixed.",
    )
    seed: int | None = flag(None, "Seed of the skip and audit draws (default: --train.seed).")


@dataclass(frozen=True)
class MonitorConfig:
    """Health monitors (``--monitor.*``)."""

    entropy_threshold: float = flag(0.5, "Entropy-collapse alarm: mean token entropy (nats) below this ...")
    entropy_patience: int = flag(
        50, "... for more than this many steps. Entropy is measured by setting --actor.entropy_coef 0 when it is unset."
    )
    disable_entropy: bool = flag(False, "Do not measure entropy (leaves --actor.entropy_coef unset).")
    kl_bound: float | None = flag(None, "KL-drift alarm: KL above this ... (default: off).")
    kl_patience: int = flag(20, "... for more than this many steps.")
    kl_source: str = flag(
        "ref", "KL to the reference model ('kl') or to the previous policy ('ppo_kl').", choices=["ref", "old"]
    )
    stop_on_alarm: tuple[str, ...] = flag(
        (),
        "Alarms that save a checkpoint and stop the run.",
        nargs="+",
        choices=["any", *ALARMS],
    )
