"""One way to assemble a run's remedy, for every front-end: (remedy name, its options, the ACR and
monitor options, the seed, the names the user wrote) → typed configs (valid by construction) and a
:class:`CollapseController`.

``avspo-train`` (``trainer/run_settings.py``: ``--avspo.alpha``), TRL (``integrations/trl.py``:
``virtual_sample_alpha``, ``remedy_options['strategy']``), verl (``integrations/verl.py``:
``algorithm.avspo.alpha``) and the study loop (``study/loop.py``: ``Arm.options``) all build here,
so an unknown option, a fixed one and a refused value read the same everywhere, each in the user's
own spelling (:class:`Names`), and the controller's seed rule is the controller's own (a remedy
config's ``seed`` wins over the run's).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from typing import Any, NamedTuple

from .advantages import ESTIMATORS
from .controller import CollapseController
from .options import ACRConfig, MonitorConfig, OptionError


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
    ``acr``, ``monitor``, or a flag group of ``avspo-train``) as the user wrote it (TRL:
    ``remedy_options``; verl: ``algorithm.avspo``; avspo-train: ``--avspo``), a field of it
    (``field(section, name)``: ``remedy_options['strategy']``, ``algorithm.acr.window``,
    ``--acr.window``), and fields the front-end exposes under their own name (TRL's
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


def typed(
    cls,
    options: Any,
    section: str,
    names: Names = GENERIC,
    fixed: dict[str, Any] | None = None,
    given: dict[str, Any] | None = None,
):
    """``cls(**options, **given)``, valid by construction, with one-line errors in the user's names:
    an unknown field, a field the framework fixes (``fixed`` fills those ``cls`` has), a value the
    config refuses. ``given``: fields the front-end sets from its own (renamed) options. A list
    becomes a tuple (the configs are frozen); an instance of ``cls`` is taken as it is (it checked
    itself when built)."""
    if isinstance(options, cls) and not fixed and not given:
        return options
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
    values = {k: tuple(v) if isinstance(v, list) else v for k, v in {**options, **fixed, **(given or {})}.items()}
    try:
        return cls(**values)
    except OptionError as e:
        raise ValueError(e.render(lambda f: names.field(section, f))) from None


class RemedyConfigs(NamedTuple):
    """A run's remedy (estimator name or None: measure only) and its typed configs."""

    remedy: str | None
    config: Any
    acr: ACRConfig
    monitor: MonitorConfig


def build_configs(
    remedy: str | None,
    *,
    options: Any = None,
    acr: Any = None,
    monitor: Any = None,
    given: dict[str, dict[str, Any]] | None = None,
    names: Names = GENERIC,
    std_convention: str | None = None,
    eps: float | None = None,
) -> RemedyConfigs:
    """The remedy and its configs of one run, every value checked now (a front-end calls this when
    its own config is built, before a model loads).

    Args:
        remedy: an estimator name or ``None`` (measure only).
        options: fields of the remedy's config class (``AVSPOConfig``, ``NGRPOConfig``, ...), or
            that class's instance.
        acr, monitor: fields of :class:`ACRConfig` and :class:`MonitorConfig`, or instances.
        given: per section (``remedy``, ``acr``, ``monitor``), fields the front-end sets from options
            of its own (TRL's ``acr_threshold_init``); the same field in the section is refused.
        names: how errors name what the user set.
        std_convention, eps: a framework's GRPO conventions (TRL: ``unbiased``, 1e-4; verl:
            ``unbiased``, 1e-6), which the remedy's config then follows (set otherwise: refused), so
            the groups it leaves alone get the framework's GRPO numbers exactly; None: the config's own.
    """
    remedy = remedy_name(remedy)
    given = given or {}
    config = None
    if remedy is not None and ESTIMATORS[remedy].config is not None:
        fixed = {"std_convention": std_convention, "eps": eps} if std_convention is not None else None
        config = typed(ESTIMATORS[remedy].config, options, "remedy", names, fixed, given.get("remedy"))
    elif options:
        why = "measuring only (no remedy) takes none" if remedy is None else f"remedy {remedy!r} takes none"
        raise ValueError(f"{names.sections['remedy']} has option(s) {', '.join(map(repr, sorted(options)))}; {why}")
    acr_cfg = typed(ACRConfig, acr, "acr", names, given=given.get("acr"))
    monitor_cfg = typed(MonitorConfig, monitor, "monitor", names, given=given.get("monitor"))
    return RemedyConfigs(remedy, config, acr_cfg, monitor_cfg)


def build_controller(remedy: str | RemedyConfigs | None, *, seed: int = 0, **configs: Any) -> CollapseController:
    """The :class:`CollapseController` of one run: ``remedy`` and ``configs`` are :func:`build_configs`'s
    arguments (every value checked there), or ``remedy`` is what it returned; ``seed`` seeds the
    generator of random virtual rewards (AVSPO ``random_uniform``), unless the remedy's config has a
    ``seed`` (CollapseController's rule)."""
    if configs and isinstance(remedy, RemedyConfigs):
        raise TypeError("build_controller: give built configs or the options to build, not both")
    built = remedy if isinstance(remedy, RemedyConfigs) else build_configs(remedy, **configs)
    return CollapseController(built.remedy, built.config, acr=built.acr, monitor=built.monitor, seed=int(seed))


__all__ = ["GENERIC", "Names", "RemedyConfigs", "build_configs", "build_controller", "remedy_name", "typed"]
