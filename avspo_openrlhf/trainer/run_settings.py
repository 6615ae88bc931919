"""The typed view of ``avspo-train``'s flags that every component reads (:func:`settings`: one
frozen :data:`Settings` per process, errors named by flag), and what the flags assemble through the
algorithm layer's one builder (``algo/build.py``): the run's controller (:func:`controller_from_flags`)
and GRESO's selector (:func:`build_greso`)."""

from __future__ import annotations

import dataclasses
from dataclasses import field, fields
from types import SimpleNamespace
from typing import Any

from avspo_openrlhf.algo.advantages import ESTIMATORS
from avspo_openrlhf.algo.build import Names, RemedyConfigs, build_controller, typed

from .flag_groups import FIXED_GROUPS
from .parser import remedy_choices
from .plugins import load_plugins, remedy_configs

Settings = dataclasses.make_dataclass(
    "Settings",
    [(ns, cls, field(default_factory=cls)) for ns, cls in FIXED_GROUPS.items()]
    + [("remedy", "str | None", field(default=None)), ("remedy_config", Any, field(default=None))],
    frozen=True,
)
Settings.__module__ = __name__  # pickles by reference, as a class written out would
Settings.__doc__ = """All our flag groups, typed (``settings(args).acr.window``): one field per
:data:`FIXED_GROUPS` entry, the chosen remedy's name (``remedy``, ``None`` for OpenRLHF's own
estimator) and its config (``remedy_config``, e.g. an ``AVSPOConfig``; ``None`` without options)."""


def _remedy_of(args) -> str | None:
    remedy = getattr(args, "remedy", None)
    if remedy in (None, "none"):
        return None
    if remedy not in remedy_choices():
        raise ValueError(
            f"--remedy {remedy}: no such estimator; choose from {', '.join(remedy_choices())} "
            "(a remedy of yours: --plugin MODULE)"
        )
    return remedy


def flag_names(remedy: str | None = None) -> Names:
    """How the one builder (``algo/build.py``) names an option in an error: by its flag,
    ``--acr.window``, ``--avspo.alpha`` (the ``remedy`` section is the chosen remedy's group)."""
    sections = {ns: f"--{ns}" for ns in [*FIXED_GROUPS, *remedy_configs()]}
    sections["remedy"] = f"--{remedy}" if remedy else "--remedy"
    return Names(sections, style="attr")


# the typed settings built in this process, by what they were built from: every reader of one run's
# flags (the validation, the trainer, the samples generator, the experience maker in a Ray worker)
# gets the one frozen object, and the --plugin modules are imported once per process
_BUILT: dict[tuple, Settings] = {}


def _flag_values(args) -> tuple:
    """What :func:`settings` reads from ``args``: the plugins, ``--remedy`` and our groups' values."""
    spaces = [*FIXED_GROUPS, *remedy_configs()]
    return (
        repr(getattr(args, "plugin", None)),
        repr(getattr(args, "remedy", None)),
        *(repr(sorted(vars(g).items())) for ns in spaces if isinstance(g := getattr(args, ns, None), SimpleNamespace)),
    )


def settings(args) -> Settings:
    """Our groups read from OpenRLHF's hierarchized ``args``, typed and frozen (lists become
    tuples), after importing the run's ``--plugin`` modules in this process; built once per process
    for the values ``args`` holds (a second call returns the same object). A group or field
    ``args`` lacks (objects built without our parser: tests, other launchers) takes its default.
    Each group's config checks its values when it is built (valid by construction): a mistake is
    one ``ValueError`` naming the flag, ``--avspo.alpha must be > 0, got -1.0``; so is an option of
    a remedy other than ``--remedy``'s."""
    load_plugins(getattr(args, "plugin", None))  # first: a plugin's remedy adds a group to read
    key = _flag_values(args)
    if key not in _BUILT:
        _BUILT[key] = _build_settings(args)
    return _BUILT[key]


def keep_settings(args, built: Settings) -> None:
    """``built`` is what :func:`settings` returns for ``args`` as they are now (``complete_args`` wrote
    the remedy's every option into them for the printed config: the same values, one object)."""
    _BUILT[_flag_values(args)] = built


def _build_settings(args) -> Settings:

    def given(ns: str) -> dict:
        group = getattr(args, ns, None)
        return vars(group) if isinstance(group, SimpleNamespace) else {}

    remedy = _remedy_of(args)
    names = flag_names(remedy)

    def build(ns: str, cls: type):
        have = given(ns)  # a namespace holds every field of its group once parsed: no unknown keys here
        return typed(cls, {f.name: have[f.name] for f in fields(cls) if f.name in have}, ns, names)

    out = {ns: build(ns, cls) for ns, cls in FIXED_GROUPS.items()}
    for ns, cls in remedy_configs().items():
        set_here = [f.name for f in fields(cls) if f.name in given(ns)]
        if ns != remedy and set_here:
            raise ValueError(
                f"--{ns}.{set_here[0]} is an option of --remedy {ns}, but --remedy is {args.remedy}: "
                f"drop it, or choose --remedy {ns}"
            )
    cls = ESTIMATORS[remedy].config if remedy else None
    return Settings(**out, remedy=remedy, remedy_config=build(remedy, cls) if cls is not None else None)


def remedy_configs_of(cfg: Settings) -> RemedyConfigs:
    """The remedy part of the typed settings, as the one builder returns it."""
    return RemedyConfigs(cfg.remedy, cfg.remedy_config, cfg.acr, cfg.monitor)


def controller_from_flags(args):
    """The :class:`~avspo_openrlhf.algo.CollapseController` that ``args`` describe: the ACR and
    monitor groups and the chosen remedy's group, typed by :func:`settings`, through the one builder;
    seeded by the run's seed (a remedy config's own seed wins: the controller's rule)."""
    return build_controller(remedy_configs_of(settings(args)), seed=getattr(getattr(args, "train", None), "seed", 0))


def build_greso(args):
    """The :class:`~avspo_openrlhf.algo.greso.GRESOSelector` that ``--greso.*`` describe (its
    collapse test is ``--acr.tol`` / ``--acr.reward_range``)."""
    from avspo_openrlhf.algo.greso import GRESOSelector

    cfg = settings(args)
    return GRESOSelector(cfg.greso, acr=cfg.acr, seed=getattr(getattr(args, "train", None), "seed", 0))
