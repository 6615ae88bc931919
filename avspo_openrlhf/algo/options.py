"""The algorithm's options, one frozen dataclass per flag group: the single home of every default
and every valid range of the pure math. ``avspo-train`` generates its ``--acr.*``, ``--avspo.*``,
``--ngrpo.*``, ``--rl_zvp.*``, ``--sign.*``, ``--greso.*`` and ``--monitor.*`` flags and their
``--help`` from these fields (``trainer/parser.py``). Each advantage estimator is registered with its
own config class (``algo/advantages.py``) and reads only that;
:class:`~avspo_openrlhf.algo.controller.CollapseController` takes the ACR config, the chosen
estimator's config and the monitor config as they are.

Valid by construction: every config checks itself when it is built (``__post_init__``): each field's
type, its ``choices`` (the same list argparse offers) and its ``valid`` range (``flag(..., valid=">0")``),
then the checks that span fields. A mistake is one :class:`OptionError` (a ``ValueError``) naming the
class and the field, ``AVSPOConfig.alpha must be > 0, got -1``; the front-ends re-render it with the
name the user set (``--avspo.alpha``, TRL's ``virtual_sample_alpha``, verl's ``algorithm.avspo.alpha``).
dataclasses only: no torch, no argparse.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable
from dataclasses import dataclass, field
from numbers import Integral, Real

STD_CONVENTIONS = {"population": 0, "unbiased": 1}  # -> divide by G - correction
FIX_GROUPS = ("both", "all_wrong", "all_right")  # which collapsed groups AVSPO augments
ALARMS = ("acr_stall", "acr_volatility", "entropy_collapse", "kl_drift")
# the built-in virtual-reward strategies (algo/virtual.py registers exactly these)
STRATEGIES = ("exp_decay", "fixed_partial", "opposite", "random_uniform", "stratified")
# the strategies AVSPOConfig.strategy (and --avspo.strategy) accepts: the built-in ones plus every
# strategy registered later with algo.virtual.register_virtual_strategy (which appends here)
STRATEGY_CHOICES: list[str] = list(STRATEGIES)


class OptionError(ValueError):
    """A value no run can mean, found when a config is built: ``config`` (the class name), ``field``,
    and ``detail`` (``"must be > 0, got -1"``), whose ``{other}`` placeholders name the other fields
    involved. ``str(e)`` names them as ``Class.field``; :meth:`render` with the front-end's names."""

    def __init__(self, config: str, field: str, detail: str, others: tuple[str, ...] = ()):
        self.config, self.field, self.detail, self.others = config, field, detail, tuple(others)
        super().__init__(self.render())

    def render(self, name: Callable[[str], str] | None = None) -> str:
        """One line, each field named by ``name(field)`` (default ``Class.field``)."""
        name = name or (lambda f: f"{self.config}.{f}")
        detail = self.detail
        for other in self.others:  # not str.format: a value in the detail may hold braces
            detail = detail.replace("{" + other + "}", name(other))
        return f"{name(self.field)} {detail}"


# metadata of a field that is not argparse's: its range and, for a (LO, HI) pair, its order
CHECK_KEYS = ("valid", "order")


def flag(default, help: str, valid: str | None = None, order: str | None = None, **argparse_kwargs):
    """A config field that is also a flag: its default, ``--help`` text, valid range (``valid``: ``>0``,
    ``>=0``, ``>=1``, ``[0,1]``, ``[0,1)``, ``(0,1]``, ``(0,1)``; checked when the config is built) and
    argparse extras (``choices``, also checked when built; ``metavar``); type, ``nargs`` and
    ``store_true`` follow from the annotation."""
    meta = dict(help=help, **argparse_kwargs)
    if valid is not None:
        meta["valid"] = valid
    if order is not None:  # "<": a (LO, HI) pair needs LO < HI (default LO <= HI)
        meta["order"] = order
    return field(default=default, metadata=meta)


def std_convention_flag(default: str, help: str):
    """A remedy's ``std_convention`` field: population (divide by n) or unbiased (n - 1)."""
    return flag(default, help, choices=sorted(STD_CONVENTIONS))


def _fmt(v) -> str:
    """A value as an error line shows it: numbers as written, anything else as its repr, cut short."""
    text = str(v) if isinstance(v, (int, float)) else repr(v)
    return text if len(text) <= 80 else text[:77] + "..."


def _range_ok(valid: str, x: float) -> tuple[bool, str]:
    """``(x satisfies the range, its text)`` for a ``valid`` spec of :func:`flag`."""
    if valid[0] in "[(":
        lo, hi = (float(v) for v in valid[1:-1].split(","))
        ok = (lo <= x if valid[0] == "[" else lo < x) and (x <= hi if valid[-1] == "]" else x < hi)
        return ok, f"in {valid[0]}{valid[1:-1].replace(',', ', ')}{valid[-1]}"
    op = ">=" if valid.startswith(">=") else ">"
    bound = float(valid[len(op) :])
    text = f"{op} {int(bound) if bound == int(bound) else bound}"
    return (x >= bound if op == ">=" else x > bound), text


def _number(value, kind: str):
    """``value`` as a ``kind`` (``int``/``float``) or ``None`` when it is not one (bools never are)."""
    if isinstance(value, bool):
        return None
    if kind == "int":
        return int(value) if isinstance(value, Integral) else None
    try:
        x = float(value) if isinstance(value, Real) else math.nan
    except OverflowError:  # an int beyond float's range
        return None
    return x if math.isfinite(x) else None


def annotation(f: dataclasses.Field) -> str:
    """A field's annotation as text (``"float"``, ``"int | None"``), also in a module without
    ``from __future__ import annotations`` (a user's config class)."""
    t = f.type
    return t if isinstance(t, str) else t.__name__ if isinstance(t, type) else str(t).replace("typing.", "")


def config_of(cls: type, value, name: str):
    """``value`` when it is a ``cls`` (``None``: ``cls()``, its defaults); anything else, a dict of
    its fields included, is refused in one line (a component takes its config object, built and so
    checked by the caller)."""
    if value is None:
        return cls()
    if not isinstance(value, cls):
        raise TypeError(f"{name} must be a config object {cls.__name__}(...), got {type(value).__name__}")
    return value


class Options:
    """Base of every options dataclass: checks each field against its annotation, ``choices`` and
    ``valid`` range when the config is built, then the class's :meth:`_check` (cross-field rules).
    Numbers are normalised (an int for a float field becomes a float, a list for a tuple field a
    tuple) so that configs built from JSON or YAML compare equal to the same config built in Python."""

    def __post_init__(self) -> None:
        for f in dataclasses.fields(self):
            value = self._field_value(f, getattr(self, f.name))
            object.__setattr__(self, f.name, value)
        self._check()

    def _fail(self, name: str, detail: str, others: tuple[str, ...] = ()) -> None:
        raise OptionError(type(self).__name__, name, detail, others)

    def _field_value(self, f: dataclasses.Field, value):
        ann, name = annotation(f), f.name
        optional = ann.endswith(" | None")
        kind = ann.removesuffix(" | None")
        if value is None:
            if optional:
                return None
            self._fail(name, f"must be set ({kind}), got None")
        choices = f.metadata.get("choices")
        if kind == "bool":
            if not isinstance(value, bool):
                self._fail(name, f"must be True or False, got {_fmt(value)}")
            return value
        if kind in ("int", "float"):
            x = _number(value, kind)
            if x is None:
                want = "an integer" if kind == "int" else "a finite number"
                self._fail(name, f"must be {want}, got {_fmt(value)}")
            valid = f.metadata.get("valid")
            if valid is not None:
                ok, text = _range_ok(valid, x)
                if not ok:
                    self._fail(name, f"must be {text}, got {_fmt(value)}")
            return x
        if kind == "str":
            if not isinstance(value, str):
                self._fail(name, f"must be a string, got {_fmt(value)}")
            if choices is not None and value not in choices:
                self._fail(name, f"must be one of {', '.join(choices)}, got {_fmt(value)}")
            return value
        if kind == "tuple[float, float]":
            pair = tuple(value) if isinstance(value, (list, tuple)) else None
            nums = None if pair is None or len(pair) != 2 else [_number(v, "float") for v in pair]
            if nums is None or None in nums:
                self._fail(name, f"must be two finite numbers (LO, HI), got {_fmt(value)}")
            if f.metadata.get("order") == "<" and not nums[0] < nums[1]:
                self._fail(name, f"needs LO < HI, got {nums[0]} {nums[1]}")
            if nums[0] > nums[1]:
                self._fail(name, f"must have LO <= HI, got {nums[0]} > {nums[1]}")
            valid = f.metadata.get("valid")
            if valid is not None:
                for x in nums:
                    ok, text = _range_ok(valid, x)
                    if not ok:
                        self._fail(name, f"must lie {text}, got {tuple(nums)}")
            return tuple(nums)
        if kind == "tuple[str, ...]":
            if isinstance(value, str) or not isinstance(value, (list, tuple)):
                self._fail(name, f"must be a list of names, got {_fmt(value)}")
            bad = [v for v in value if not isinstance(v, str) or (choices is not None and v not in choices)]
            if bad:
                self._fail(name, f"must name only {', '.join(choices or ())}, got {_fmt(bad[0])}")
            return tuple(value)
        raise TypeError(f"{type(self).__name__}.{name}: no check for annotation {ann!r}")  # a new kind of field

    def _check(self) -> None:
        """Rules that span fields (one-line :class:`OptionError` naming the field to change)."""


@dataclass(frozen=True)
class ACRConfig(Options):
    """ACR monitoring (``--acr.*``)."""

    tol: float = flag(
        1e-06,
        "A group is collapsed when the population std of its rewards is below this (docs/algorithm.md#acr).",
        valid=">0",
    )
    reward_range: tuple[float, float] = flag(
        (0.0, 1.0),
        "Reward range: a collapsed group at HI is all-right, at LO all-wrong (any other constant counts as all-wrong for AVSPO).",
        metavar=("LO", "HI"),
        order="<",
    )
    smoothing: str = flag(
        "window",
        "How the per-batch ACR is smoothed into the gate input ACR_gate (AVSPO, gated NGRPO).",
        choices=["window", "ema"],
    )
    window: int = flag(25, "Steps in the ACR_gate window (use 1 with many prompt groups per step).", valid=">=1")
    ema_decay: float = flag(0.9, "Decay of ACR_gate when --acr.smoothing ema.", valid="[0,1)")
    gate_view: str = flag(
        "raw",
        "Reward view whose ACR drives the gate and the threshold: raw correctness (the paper's) or the shaped reward after overlong/stop penalties.",
        choices=["raw", "shaped"],
    )
    early_steps: int = flag(100, "Steps averaged into ACR_100, the early-warning statistic.", valid=">=1")
    stall_threshold: float = flag(0.35, "Stall alarm: ACR above this ...", valid="[0,1]")
    stall_patience: int = flag(50, "... for more than this many consecutive steps.", valid=">=0")
    volatility_window: int = flag(25, "Window of the ACR volatility (population std of the last N ACRs).", valid=">=2")
    volatility_threshold: float = flag(0.15, "Volatility alarm when the windowed ACR std exceeds this.", valid="[0,1]")
    tau_init: float = flag(
        0.5,
        "Initial adaptive threshold tau_adapt(0): the gate is open while ACR_gate > tau_adapt (AVSPO, gated NGRPO).",
        valid="[0,1]",
    )
    eta: float = flag(
        0.01, "Step size of the adaptive threshold; 0 keeps tau_adapt fixed at --acr.tau_init.", valid="[0,1]"
    )
    tau_bounds: tuple[float, float] = flag((0.1, 0.9), "Clip range of tau_adapt.", valid="[0,1]", metavar=("LO", "HI"))
    reward_ema_decay: float = flag(
        0.9, "EMA of the mean reward whose change is dJ in the threshold update (0 = raw change).", valid="[0,1)"
    )

    def _check(self) -> None:
        tlo, thi = self.tau_bounds
        if not tlo <= self.tau_init <= thi:
            self._fail(
                "tau_init", f"must lie within {{tau_bounds}} [{tlo}, {thi}], got {self.tau_init}", ("tau_bounds",)
            )


@dataclass(frozen=True)
class AVSPOConfig(Options):
    """AVSPO advantages (``--avspo.*``).

    AVSPO: ACR-gated virtual samples in collapsed groups' statistics (docs/algorithm.md#avspo).
    """

    strategy: str = flag(
        "stratified",
        "Virtual reward values (docs/algorithm.md#strategies); 'opposite' reproduces the authors' released code.",
        choices=STRATEGY_CHOICES,
    )
    alpha: float = flag(0.5, "K rule exponent: K = max(1, min(G, ceil(G * ACR_gate**alpha))).", valid=">0")
    num_virtual: int | None = flag(
        None,
        "Fixed number of virtual samples per augmented group instead of the K rule (the paper's fixed-K ablation: 1, 4, 8). Default: the K rule.",
        valid=">=1",
        metavar="K",
    )
    fix_groups: str = flag(
        "both",
        "Which collapsed groups get virtual samples: both (AVSPO), all_wrong only or all_right only (the paper's mechanism isolation); the others keep GRPO's zero advantages.",
        choices=list(FIX_GROUPS),
    )
    r_anchor: float = flag(0.1, "Top virtual reward for all-wrong groups (stratified, exp_decay).", valid="(0,1]")
    gamma: float = flag(0.5, "Decay of the exp_decay strategy.", valid="(0,1)")
    std_convention: str = std_convention_flag(
        "population",
        "Std convention of the (augmented) group: population (divide by n, the paper's) or unbiased (n - 1, OpenRLHF group_norm's).",
    )
    eps: float = flag(
        1e-06,
        "Added to the group std. '--avspo.std_convention unbiased --avspo.eps 1e-9' equals OpenRLHF's group_norm when the gate is closed.",
        valid=">=0",
    )
    seed: int | None = flag(None, "Seed of the random_uniform strategy (default: --train.seed).", valid=">=0")

    def _check(self) -> None:
        if self.num_virtual is not None and self.strategy == "opposite":
            self._fail("num_virtual", "cannot be combined with {strategy} opposite (which uses K = 1)", ("strategy",))


@dataclass(frozen=True)
class NGRPOConfig(Options):
    """NGRPO advantages (``--ngrpo.*``).

    NGRPO (arXiv 2509.18851): --ngrpo.num_max virtual rewards at the reward maximum in every group's
    mean and std (all-wrong groups get a negative advantage, all-right stay 0). Pair with
    --actor.eps_clip_low_high 0.16 0.24 for the paper's asymmetric clip.
    """

    num_max: int = flag(1, "Virtual maximum-reward samples per group (the paper's m = 1).", valid=">=1", metavar="M")
    std_convention: str = std_convention_flag(
        "unbiased",
        "Std convention of the G + M values: unbiased (the paper's and its code's) or population.",
    )
    eps: float = flag(1e-06, "Added to the augmented std (the paper's code: 1e-6).", valid=">=0")
    gated: bool = flag(
        False,
        "Add the virtual samples only while the ACR gate is open (ACR_gate > tau_adapt, with the --acr.* smoothing and threshold); default: every step, as the paper.",
    )


@dataclass(frozen=True)
class RLZVPConfig(Options):
    """RL-ZVP advantages (``--rl_zvp.*``).

    RL-ZVP (arXiv 2509.21880): on zero-variance groups, token advantages +alpha*H_t (all-right) and
    -alpha*(max H - H_t) (all-wrong), H_t the policy's token entropy before the update; GRPO elsewhere.
    """

    alpha: float = flag(0.1, "Scale of the entropy-shaped token advantages (the paper's 0.1).", valid=">0")
    std_convention: str = std_convention_flag(
        "unbiased",
        "Std convention of GRPO on the mixed groups: unbiased (OpenRLHF group_norm's, the paper's code) or population.",
    )
    eps: float = flag(1e-09, "Added to the mixed groups' std (OpenRLHF group_norm's 1e-9).", valid=">=0")


@dataclass(frozen=True)
class SignConfig(Options):
    """Sign advantage (``--sign.*``).

    Sign advantage (arXiv 2605.07689): A = 2r - 1 (r scaled to --acr.reward_range) on collapsed groups,
    GRPO on the others (or on every group with --sign.scope all): what every virtual-sample remedy
    gives a collapsed group, up to the magnitude.
    """

    scope: str = flag(
        "collapsed",
        "Groups that get A = 2r - 1: collapsed (the rest keep GRPO) or all.",
        choices=["collapsed", "all"],
    )
    std_convention: str = std_convention_flag(
        "population",
        "Std convention of GRPO on the mixed groups (with --sign.scope collapsed): population or unbiased.",
    )
    eps: float = flag(1e-06, "Added to the mixed groups' std.", valid=">=0")


@dataclass(frozen=True)
class GroupNormConfig(Options):
    """GRPO computed by this package (``--grpo.*``).

    GRPO's group normalisation A = (r - mean) / (std + eps) from the estimator registry instead of
    OpenRLHF's own group_norm (which --remedy none keeps; unbiased std, eps 1e-9). TRL's GRPO is
    unbiased with eps 1e-4.
    """

    std_convention: str = std_convention_flag(
        "population", "Std convention of the group: population (divide by G, the paper's) or unbiased (G - 1)."
    )
    eps: float = flag(1e-06, "Added to the group std.", valid=">=0")


@dataclass(frozen=True)
class GRESOConfig(Options):
    """GRESO pre-rollout skipping (``--greso.*``)."""

    enable: bool = flag(
        False,
        "GRESO (arXiv 2506.02177): skip a prompt before rollout with probability 1 - max(p**z, --greso.min_keep), z = its consecutive all-right (p = p_easy) or all-wrong (p = p_hard) rollouts. Composes with --dynamic.std_filter (GRESO as published) and with every --remedy.",
    )
    p_easy: float = flag(
        0.5, "Initial base keep-probability of prompts whose recent groups were all right.", valid="(0,1)"
    )
    p_hard: float = flag(
        0.5, "Initial base keep-probability of prompts whose recent groups were all wrong.", valid="(0,1)"
    )
    target_easy: float = flag(
        1 / 12,
        "Target share of all-right groups per step: p_easy moves down by --greso.delta at or above it, up below it.",
        valid="[0,1]",
    )
    target_hard: float = flag(
        1 / 6, "Target share of all-wrong groups per step (moves p_hard the same way).", valid="[0,1]"
    )
    delta: float = flag(0.01, "Step of the p_easy / p_hard adaptation per training step.", valid="[0,1]")
    p_bounds: tuple[float, float] = flag(
        (0.05, 0.95), "Clip range of p_easy and p_hard.", valid="(0,1)", metavar=("LO", "HI")
    )
    min_keep: float = flag(0.01, "Floor of the keep probability p**z (every prompt keeps some chance).", valid="[0,1]")
    audit: float = flag(
        0.0,
        "Share of skipped prompts rolled out anyway (never trained on; their tokens are counted apart) to measure false skips: skipped prompts whose group would have been mixed.",
        valid="[0,1]",
    )
    seed: int | None = flag(None, "Seed of the skip and audit draws (default: --train.seed).", valid=">=0")

    def _check(self) -> None:
        lo, hi = self.p_bounds
        for name in ("p_easy", "p_hard"):
            v = getattr(self, name)
            if not lo <= v <= hi:
                self._fail(name, f"must lie within {{p_bounds}} [{lo}, {hi}], got {v}", ("p_bounds",))


@dataclass(frozen=True)
class MonitorConfig(Options):
    """Health monitors (``--monitor.*``)."""

    entropy_threshold: float = flag(
        0.5, "Entropy-collapse alarm: mean token entropy (nats) below this ...", valid=">=0"
    )
    entropy_patience: int = flag(
        50,
        "... for more than this many steps. Entropy is measured by setting --actor.entropy_coef 0 when it is unset.",
        valid=">=0",
    )
    disable_entropy: bool = flag(False, "Do not measure entropy (leaves --actor.entropy_coef unset).")
    kl_bound: float | None = flag(None, "KL-drift alarm: KL above this ... (default: off).", valid=">=0")
    kl_patience: int = flag(20, "... for more than this many steps.", valid=">=0")
    kl_source: str = flag(
        "ref",
        "Which KL the drift alarm watches: ref, the KL to the reference model (logged as kl; needs a KL "
        "coefficient > 0); old, the KL to the previous policy (logged as ppo_kl).",
        choices=["ref", "old"],
    )
    stop_on_alarm: tuple[str, ...] = flag(
        (),
        "Alarms that save a checkpoint and stop the run.",
        nargs="+",
        choices=["any", *ALARMS],
    )

    def _check(self) -> None:
        # a kl_drift stop without a bound would wait for an alarm that is never measured
        if "kl_drift" in self.stop_on_alarm and self.kl_bound is None:
            self._fail(
                "stop_on_alarm", "names kl_drift, which needs {kl_bound} (the KL-drift alarm is off)", ("kl_bound",)
            )
