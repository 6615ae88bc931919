"""ACR and every remedy of :mod:`avspo_openrlhf.algo` inside other trainers: TRL's ``GRPOTrainer``
(``integrations/trl.py``, docs/trl.md) and verl's advantage-estimator registry
(``integrations/verl.py``, docs/verl.md). This module imports neither framework.

Both adapters follow one rule: the framework's own GRPO number is kept for every group on which the
remedy's advantage equals the GRPO closed form (with the framework's std convention and eps), and
the remedy's number is used on the others. So a remedy whose gate is closed trains on the framework's
advantages bit for bit, and a remedy changes exactly the groups it is about.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from typing import Any

import torch

from avspo_openrlhf.algo import (
    ESTIMATORS,
    ACRConfig,
    CollapseController,
    GRPOConfig,
    MonitorConfig,
    group_advantages,
)
from avspo_openrlhf.algo.options import OptionError


def remedy_name(remedy: str | None) -> str | None:
    """``None``/``"none"`` (measure only) or a registered estimator's name; anything else: one line."""
    if remedy in (None, "", "none"):
        return None
    if not isinstance(remedy, str) or remedy not in ESTIMATORS:
        raise ValueError(f"unknown remedy {remedy!r}; choose from {sorted(ESTIMATORS)} or 'none'")
    return remedy


@dataclasses.dataclass(frozen=True)
class Names:
    """How a front-end names what its user set, for one-line errors: each section (``remedy``,
    ``acr``, ``monitor``) as the user wrote it (TRL: ``remedy_options``; verl: ``algorithm.avspo``),
    a field of it (``section_field(section, field)``: ``remedy_options['strategy']``,
    ``algorithm.acr.window``), and fields the front-end exposes under their own name (TRL's
    ``acr_threshold_init`` for ``("acr", "tau_init")``)."""

    sections: dict[str, str]
    style: str = "item"  # "item": section['field']; "attr": section.field
    renamed: dict[tuple[str, str], str] = dataclasses.field(default_factory=dict)

    def field(self, section: str, name: str) -> str:
        if (section, name) in self.renamed:
            return self.renamed[(section, name)]
        where = self.sections[section]
        return f"{where}[{name!r}]" if self.style == "item" else f"{where}.{name}"


GENERIC = Names({"remedy": "remedy options", "acr": "ACRConfig", "monitor": "MonitorConfig"}, style="attr")


def _typed(
    cls,
    options: Any,
    section: str,
    names: Names,
    fixed: dict[str, Any] | None = None,
    given: dict[str, Any] | None = None,
):
    """``cls(**options, **given)``, valid by construction, with one-line errors in the user's names:
    an unknown field, a field the framework fixes (``fixed`` fills those ``cls`` has), a value the
    config refuses. ``given``: fields the front-end sets from its own (renamed) options."""
    where = names.sections[section]
    if options is None:
        options = {}
    if not isinstance(options, Mapping):
        raise ValueError(f"{where} must be a mapping of options, got {type(options).__name__}")
    options = dict(options)
    allowed = {f.name for f in dataclasses.fields(cls)}
    unknown = sorted(set(options) - allowed)
    if unknown:
        takes = sorted(allowed - set(fixed or {}) - set(given or {}))
        raise ValueError(
            f"{where} has no option {', '.join(map(repr, unknown))}; "
            + (f"{cls.__name__} takes {', '.join(takes)}" if takes else "this remedy takes none")
        )
    for key in sorted(set(options) & set(given or {})):
        raise ValueError(f"set {names.field(section, key)}, not {where}[{key!r}]")
    fixed = {k: v for k, v in (fixed or {}).items() if k in allowed}
    for key in sorted(set(options) & set(fixed)):
        if options[key] != fixed[key]:
            raise ValueError(
                f"{names.field(section, key)} cannot be set: it follows the framework's GRPO "
                f"({key}={fixed[key]!r}), got {options[key]!r}"
            )
    try:
        return cls(**{**options, **fixed, **(given or {})})
    except OptionError as e:
        raise ValueError(e.render(lambda f: names.field(section, f))) from None


def build_configs(
    remedy: str | None,
    *,
    std_convention: str,
    eps: float,
    options: Any = None,
    acr: Any = None,
    monitor: Any = None,
    given: dict[str, dict[str, Any]] | None = None,
    names: Names = GENERIC,
) -> tuple[str | None, Any, ACRConfig, MonitorConfig]:
    """``(remedy, remedy config or None, ACRConfig, MonitorConfig)`` of one run, every value checked
    now (a front-end calls this when its own config is built, before a model loads).

    Args:
        remedy: an estimator name or ``None`` (measure only).
        std_convention, eps: the framework's GRPO conventions (TRL: ``unbiased``, 1e-4; verl:
            ``unbiased``, 1e-6); the remedy's config takes them, so the groups it leaves alone get
            exactly the GRPO closed form and :func:`remedy_groups` can keep the framework's numbers.
        options: fields of the remedy's config class (``AVSPOConfig``, ``NGRPOConfig``, ...).
        acr, monitor: fields of :class:`ACRConfig` and :class:`MonitorConfig`.
        given: per section (``remedy``, ``acr``, ``monitor``), fields the front-end sets from options
            of its own (TRL's ``acr_threshold_init``); the same field in the section is refused.
        names: how errors name what the user set.
    """
    remedy = remedy_name(remedy)
    given = given or {}
    config = None
    if remedy is not None and ESTIMATORS[remedy].config is not None:
        fixed = {"std_convention": std_convention, "eps": eps}
        config = _typed(ESTIMATORS[remedy].config, options, "remedy", names, fixed, given.get("remedy"))
    elif options:
        why = "measuring only (no remedy) takes none" if remedy is None else f"remedy {remedy!r} takes none"
        raise ValueError(f"{names.sections['remedy']} has option(s) {', '.join(map(repr, sorted(options)))}; {why}")
    acr_cfg = _typed(ACRConfig, acr, "acr", names, given=given.get("acr"))
    monitor_cfg = _typed(MonitorConfig, monitor, "monitor", names, given=given.get("monitor"))
    return remedy, config, acr_cfg, monitor_cfg


def build_controller(remedy: str | None, *, seed: int = 0, **configs: Any) -> CollapseController:
    """The :class:`CollapseController` of one run: ``configs`` are :func:`build_configs`'s keywords
    (every value checked there); ``seed`` seeds the generator of random virtual rewards (AVSPO
    ``random_uniform``), unless the remedy's config has a ``seed`` (CollapseController's rule)."""
    remedy, config, acr_cfg, monitor_cfg = build_configs(remedy, **configs)
    return CollapseController(remedy, config, acr=acr_cfg, monitor=monitor_cfg, seed=int(seed))


def base_advantages(rewards: torch.Tensor, controller: CollapseController, std_convention: str | None, eps: float):
    """``[N, G]`` closed form of the framework's own estimator on ``rewards``: GRPO with the framework's
    conventions, or Dr. GRPO (``std_convention=None``: no std division)."""
    if std_convention is None:
        adv, _ = group_advantages(rewards, "dr_grpo", tol=controller.tol, reward_range=controller.reward_range)
    else:
        cfg = GRPOConfig(std_convention=std_convention, eps=eps)
        adv, _ = group_advantages(rewards, "grpo", cfg, tol=controller.tol, reward_range=controller.reward_range)
    return adv


def remedy_groups(ours: torch.Tensor, base: torch.Tensor) -> torch.Tensor:
    """``[N]`` bool: the groups whose remedy advantages differ from the framework estimator's closed form."""
    return (ours != base).any(dim=1)


def framework_metrics(metrics: dict[str, float]) -> dict[str, float]:
    """The controller's metric names in the frameworks' slash convention: ``acr``, ``acr/all_wrong``,
    ``acr/effective``, ``acr/gate``, ``acr/cum``, ``acr/100_so_far``, ``acr/gate_open``,
    ``acr/tau_adapt``, ``alarm/acr_stall``, ``monitor/entropy``, ... (TRL prefixes ``train/`` in its
    loggers). ``frac_reward_zero_std`` is left out: TRL logs its own, and it equals ``acr/shaped``."""
    out = {}
    for key, value in metrics.items():
        if key == "frac_reward_zero_std":
            continue
        if key == "acr" or key.startswith(("alarm/", "monitor/")) or key.split("/")[0] in ESTIMATORS:
            out[key] = float(value)
        elif key.startswith("acr_"):
            out["acr/" + key[4:]] = float(value)
        else:
            out["acr/" + key] = float(value)
    return out


__all__ = [
    "GENERIC",
    "Names",
    "base_advantages",
    "build_configs",
    "build_controller",
    "framework_metrics",
    "remedy_groups",
    "remedy_name",
]
