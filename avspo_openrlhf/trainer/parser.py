"""``avspo-train``'s flags added to OpenRLHF's parser, generated from the flag groups: ``--remedy``,
``--plugin``, ``--acr.*``, one ``--NAME.*`` group per registered remedy with options (this package's
and a plugin's alike: no list of remedies is kept here), the run's groups; and the renamed flags.

Every flag is dotted like OpenRLHF's own (``--avspo.alpha``), so OpenRLHF's ``hierarchize`` turns
them into ``args.avspo.alpha`` and they travel to every Ray actor inside ``strategy.args``.
argparse, dataclasses and the pure algorithm only: importing this module pulls in neither OpenRLHF
nor Ray."""

from __future__ import annotations

import argparse
import dataclasses
from dataclasses import fields

from avspo_openrlhf.algo.advantages import ESTIMATORS
from avspo_openrlhf.algo.options import CHECK_KEYS, ACRConfig, annotation

from .flag_groups import FIXED_GROUPS
from .plugins import remedy_configs


def _title(cls: type) -> str:
    """A config's ``--help`` section title: its docstring's first line up to the flag pattern."""
    return (cls.__doc__ or cls.__name__).strip().splitlines()[0].split(" (``")[0] + " (avspo-openrlhf)"


def _description(cls: type) -> str | None:
    """A config's ``--help`` section text: its docstring after the first paragraph (``%`` escaped for argparse)."""
    parts = (cls.__doc__ or "").strip().split("\n\n", 1)
    text = " ".join(parts[1].split()) if len(parts) > 1 else ""
    return text.replace("%", "%%") or None


def groups() -> dict[str, tuple[str, type]]:
    """Flag namespace -> (``--help`` section title, config class), in the order ``--help`` shows them;
    the flag table of docs/flags.md lists the same flags (a test checks it)."""
    remedies = remedy_configs()
    clash = sorted(set(remedies) & set(FIXED_GROUPS))
    if clash:
        raise ValueError(
            f"estimator {clash[0]!r} has the name of the --{clash[0]}.* flag group: register it under another name"
        )
    order = {"acr": ACRConfig, **remedies, **{k: v for k, v in FIXED_GROUPS.items() if k != "acr"}}
    return {ns: (_title(cls), cls) for ns, cls in order.items()}


def _argparse_kwargs(f: dataclasses.Field) -> dict:
    # the field's range and order are checked when the config is built, by the config itself
    kw = dict({k: v for k, v in f.metadata.items() if k not in CHECK_KEYS}, default=f.default)
    ann = annotation(f)
    if ann == "bool":
        kw["action"] = "store_true"
    elif ann == "tuple[float, float]":
        kw.update(type=float, nargs=2)
    elif ann == "tuple[str, ...]":
        kw.update(nargs="+", default=list(f.default))
    elif ann.split(" | ")[0] in ("int", "float"):
        kw["type"] = {"int": int, "float": float}[ann.split(" | ")[0]]
    elif ann not in ("str", "str | None"):  # a new kind of field must say how it parses
        raise TypeError(f"config field {f.name}: no flag type for annotation {ann!r}")
    return kw


def flags() -> dict[str, list[tuple[str, dict]]]:
    """Flag namespace -> its ``(--ns.field, argparse keywords)``, from :func:`groups`."""
    return {ns: [(f"--{ns}.{f.name}", _argparse_kwargs(f)) for f in fields(cls)] for ns, (_, cls) in groups().items()}


def remedy_choices() -> list[str]:
    """``--remedy``'s choices: ``none`` and every registered estimator (a plugin's included)."""
    import avspo_openrlhf.algo  # noqa: F401  (importing the remedy modules registers them)

    return ["none", *ESTIMATORS]


def add_args(parser: argparse.ArgumentParser) -> argparse.ArgumentParser:
    """Add ``--remedy``, ``--plugin`` and our flag groups (:func:`groups`: ``--acr.*``, one per
    registered remedy with options, ``--greso.*``, ``--monitor.*``, ``--run.*``, ``--dynamic.*``,
    ``--buffer.*``, ``--report.*``, ``--cpu.*``) to an argparse parser. A remedy's flags have no
    argparse default (``args.<remedy>`` holds only what was set): :func:`settings` refuses those of
    a remedy that is not chosen and fills in the config's defaults for the chosen one."""
    remedies = remedy_configs()
    for ns in remedies:  # a remedy's group must not merge into one of OpenRLHF's (--train.*, --actor.*, ...)
        taken = next((s for s in parser._option_string_actions if s == f"--{ns}" or s.startswith(f"--{ns}.")), None)
        if taken is not None:
            raise ValueError(
                f"estimator {ns!r}: its --{ns}.* flags would join the parser's {taken}: register it under another name"
            )
    choose = parser.add_argument_group("Advantage remedy (avspo-openrlhf)")
    choose.add_argument(
        "--remedy",
        default="none",
        choices=remedy_choices(),
        help="The advantage estimator, by its name in the registry (avspo_openrlhf.algo.ESTIMATORS): none keeps "
        "OpenRLHF's own --algo.advantage.estimator (ACR is measured and logged either way); any other needs "
        "--algo.advantage.estimator group_norm, and its options are its --NAME.* group below (only the chosen "
        "remedy's may be given). What each does: docs/choosing.md.",
    )
    choose.add_argument(
        "--plugin",
        action="extend",
        nargs="+",
        default=[],
        metavar="MODULE",
        help="A module of yours (a.b.c on sys.path, or a .py file) that registers estimators with "
        "avspo_openrlhf.algo.register_estimator: imported before the flags are read (so --remedy and --help "
        "offer its remedies and their --NAME.* flags) and in every Ray worker. docs/add_a_remedy.md.",
    )
    for ns, (title, cls) in groups().items():
        group = parser.add_argument_group(title, _description(cls) if ns in remedies else None)
        for f in fields(cls):
            kwargs = _argparse_kwargs(f)
            if ns in remedies:  # set or absent: "given for another remedy" must be visible in args
                kwargs["default"] = argparse.SUPPRESS
            action = group.add_argument(f"--{ns}.{f.name}", **kwargs)
            action.field_default = f.default  # what docs/flags.md shows as its default
    return parser


# flags renamed since 0.1.0: the old spelling fails in one line naming the new one (and every
# remedy's old --NAME.enable switch names --remedy NAME: :func:`renamed_flags`)
RENAMED_FLAGS = {
    "--rlzvp.enable": "--remedy rl_zvp",
    "--rlzvp.alpha": "--rl_zvp.alpha",
    "--avspo.std": "--avspo.std_convention",
    "--ngrpo.std": "--ngrpo.std_convention",
    "--avspo.tau_init": "--acr.tau_init",
    "--avspo.eta": "--acr.eta",
    "--avspo.tau_bounds": "--acr.tau_bounds",
    "--avspo.reward_ema_decay": "--acr.reward_ema_decay",
}


def renamed_flags() -> dict[str, str]:
    """Old flag -> what replaced it: :data:`RENAMED_FLAGS` and ``--NAME.enable`` -> ``--remedy NAME``
    for every registered remedy (the switches before ``--remedy``; docs/flags.md#choosing-the-remedy)."""
    return {**{f"--{ns}.enable": f"--remedy {ns}" for ns in remedy_choices()[1:]}, **RENAMED_FLAGS}
