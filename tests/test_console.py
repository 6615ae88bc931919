"""The quiet console (cli/console.py): the project's lines on the terminal, everything else (vLLM,
DeepSpeed, Ray, OpenRLHF) in the run's log, redirected at the file-descriptor level so child
processes and C-level writes land there too; --verbose / AVSPO_VERBOSE=1 shows everything; a
failure shows the log's last lines. A real quiet avspo-train run's console is checked in
test_loopback.py (on that module's run); the quickstart's own run in test_cpu_pipeline.py
(its console line count, the log's upstream output, --verbose on its rerun); the CPU backend
compiles no DeepSpeed op (cpu/strategy.py), and the one --ds.adam_offload loads is built once into
the environment's folder (cpu/ops.py)."""

from __future__ import annotations

import contextlib
import importlib
import inspect
import os
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace

import pytest

from avspo_openrlhf.cli.console import OWN_MARKS, log_tail, own_line

ROOT = Path(__file__).resolve().parents[1]

# Writes the kinds of output a run has, inside quiet_console: our print, an upstream logger line,
# a C-level write to fd 2 (a progress bar), and a child process (as Ray's log relay prints an
# actor's lines: coloured "(Actor pid=N)" prefix, logger header).
SCRIPT = r"""
import os, subprocess, sys
from avspo_openrlhf.cli.console import quiet_console
log, mode = sys.argv[1], sys.argv[2]
with quiet_console(log, verbose=mode == "verbose"):
    print("[avspo] our line")
    print("INFO 11-26 07:47:44 [core.py:133] Initializing a V1 LLM engine with config: model='m'")
    os.write(2, b"forward: 100%|##########| 2/2 [00:00<00:00]\r\n")
    child = ("print('\x1b[36m(_TrainingActor pid=7)\x1b[0m INFO 11-26 07:47:44 trainers.py:246] [avspo] "
             "--run.max_steps 3 reached'); print('(_TrainingActor pid=7) Global step 1: {}')")
    subprocess.run([sys.executable, "-c", child], check=True)
    if mode == "fail":
        raise RuntimeError("boom")
print("[quickstart] after the block")
"""


def _script(tmp_path: Path, mode: str, **env) -> tuple[subprocess.CompletedProcess, str]:
    log = tmp_path / "run.log"
    r = subprocess.run(
        [sys.executable, "-c", SCRIPT, str(log), mode],
        capture_output=True,
        text=True,
        timeout=120,
        env={**os.environ, **env},
    )
    return r, log.read_text()


def test_the_terminal_gets_our_lines_and_the_log_everything(tmp_path):
    r, log = _script(tmp_path, "quiet")
    assert r.returncode == 0, r.stderr
    assert r.stdout.splitlines() == [
        "[avspo] our line",
        "[avspo] --run.max_steps 3 reached",
        "[quickstart] after the block",
    ]
    assert r.stderr == ""
    for upstream in ("Initializing a V1 LLM engine", "forward: 100%", "Global step 1", "(_TrainingActor pid=7)"):
        assert upstream in log
    assert "[avspo] our line" in log and "after the block" not in log  # the block's output only


def test_verbose_shows_everything_and_still_logs_it(tmp_path):
    r, log = _script(tmp_path, "verbose")
    assert r.returncode == 0, r.stderr
    for line in ("Initializing a V1 LLM engine", "forward: 100%", "Global step 1", "[avspo] our line"):
        assert line in r.stdout and line in log


def test_a_failure_shows_the_log_tail_once_and_the_traceback(tmp_path):
    r, log = _script(tmp_path, "fail")
    assert r.returncode == 1
    out = r.stdout + r.stderr
    assert f"[avspo] failed; the last lines of {tmp_path / 'run.log'}:" in r.stdout
    assert "  (_TrainingActor pid=7) Global step 1: {}" in r.stdout  # upstream context, from the log
    assert out.count("RuntimeError: boom") == 1 and "Traceback" in r.stderr  # printed once, by Python
    assert "RuntimeError: boom" in log  # and kept in the log


def test_own_line_and_tail():
    assert own_line("\x1b[36m(Actor pid=3, ip=10.0.0.2)\x1b[0m WARNING 11-26 07:47:44 t.py:9] [avspo] stale") == (
        "[avspo] stale"
    )
    assert own_line("avspo-train: error: x.jsonl: no such file") == "avspo-train: error: x.jsonl: no such file"
    for upstream in ("Generate samples: 50%|#####", "(pid=1) Global step 2: {'acr': 0.5}", "UserWarning: pin_memory"):
        assert own_line(upstream) is None
    assert all(own_line(f"{m} x") for m in OWN_MARKS)


def test_log_tail_splits_progress_redraws(tmp_path):
    p = tmp_path / "x.log"
    p.write_text("a\nbar 1%\rbar 50%\rbar 100%\n\nz\n")
    assert log_tail(p, 3) == ["bar 50%", "bar 100%", "z"]
    assert log_tail(tmp_path / "none.log") == []


def test_run_command_alone_relays_our_lines_and_the_tail_on_failure(tmp_path, capfd):
    """What the studies call (no quiet_console around it): the child's output goes to the log
    file itself, our lines to the terminal, the log's last lines when it fails."""
    from avspo_openrlhf.cli.quickstart import run_command

    log = tmp_path / "log.txt"
    run_command([sys.executable, "-c", "print('upstream noise'); print('[avspo] step done')"], log)
    out = capfd.readouterr().out
    assert "[avspo] step done" in out and "upstream noise" not in out
    assert "upstream noise" in log.read_text() and "$ " in log.read_text()  # the command, then its output
    with pytest.raises(SystemExit, match="failed \\(exit 3\\)"):
        run_command([sys.executable, "-c", "import sys; print('why it failed'); sys.exit(3)"], log)
    out = capfd.readouterr().out
    assert "[avspo] failed; the last lines of" in out and "  why it failed" in out
    assert "upstream noise" not in out  # the tail is this command's, not the log's whole history


def test_the_child_of_the_quickstart_prints_everything_into_its_log(tmp_path):
    """The quickstart's log is the child's console: AVSPO_VERBOSE=1 there, whatever the user set."""
    from avspo_openrlhf.cli.quickstart import run_command

    log = tmp_path / "log.txt"
    code = "import os; print('[avspo] child sees', os.environ['AVSPO_VERBOSE'])"
    env = os.environ.get("AVSPO_VERBOSE")
    os.environ["AVSPO_VERBOSE"] = "0"
    try:
        run_command([sys.executable, "-c", code], log)
    finally:
        os.environ.pop("AVSPO_VERBOSE") if env is None else os.environ.__setitem__("AVSPO_VERBOSE", env)
    assert "[avspo] child sees 1" in log.read_text()


@pytest.mark.parametrize(
    "env, tty, flag, quiet",
    [
        (None, True, False, True),  # a terminal: quiet
        (None, False, False, False),  # a pipe or a batch job's log: already a log, left as it is
        ("1", True, False, False),
        (None, True, True, False),  # --verbose
        ("0", False, False, True),  # forced quiet off a terminal
    ],
)
def test_avspo_train_quiet_only_on_a_terminal_unless_asked(monkeypatch, tmp_path, capsys, env, tty, flag, quiet):
    from avspo_openrlhf.cli import train

    if env is None:
        monkeypatch.delenv("AVSPO_VERBOSE", raising=False)
    else:
        monkeypatch.setenv("AVSPO_VERBOSE", env)
    monkeypatch.setattr(train.sys.stdout, "isatty", lambda: tty, raising=False)
    args = SimpleNamespace(verbose=flag, report=SimpleNamespace(dir=str(tmp_path)))
    ctx = train.cpu_console(args)
    assert isinstance(ctx, contextlib.nullcontext) != quiet
    printed = capsys.readouterr().out
    assert (str(tmp_path / "train.log") in printed) == quiet  # the log's path, once, when quiet


def test_deepspeed_ops_live_in_the_environment(monkeypatch, tmp_path):
    """Keyed by the environment (two checkouts never share a folder), handed to Ray's workers."""
    from avspo_openrlhf.cpu import ops
    from avspo_openrlhf.cpu.ray_start import CPU_ENV

    preset = os.environ.get("TORCH_EXTENSIONS_DIR")  # when ray_start.py was imported
    monkeypatch.delenv("TORCH_EXTENSIONS_DIR", raising=False)
    if sys.prefix != sys.base_prefix and os.access(sys.prefix, os.W_OK):
        assert ops.extensions_dir() == os.path.join(sys.prefix, "torch_extensions")
        assert CPU_ENV["TORCH_EXTENSIONS_DIR"] == (preset or ops.extensions_dir())
    monkeypatch.setenv("TORCH_EXTENSIONS_DIR", str(tmp_path))
    assert ops.extensions_dir() == str(tmp_path) and not ops.is_built("fused_adam")
    (tmp_path / "fused_adam").mkdir()
    (tmp_path / "fused_adam" / "fused_adam.so").write_bytes(b"")
    assert ops.is_built("fused_adam")
    assert ops.ops_for(False) == [] and ops.ops_for(True) == ["cpu_adam"]  # cpu/strategy.py: none by default
    # the builders DeepSpeed's CPU accelerator hands out for these names (what the actors load)
    from deepspeed.ops.op_builder import cpu as builders

    assert {getattr(builders, b)().name for b in ops.BUILDERS.values()} == set(ops.BUILDERS)


def test_the_cpu_strategy_asks_deepspeed_for_no_compiled_op(monkeypatch):
    """torch's AdamW for OpenRLHF's AdamW config (DeepSpeed's ``torch_adam``), cpu_adam kept for
    ``--ds.adam_offload``; and the two DeepSpeed names the strategy relies on still mean that."""
    pytest.importorskip("deepspeed")
    import deepspeed.ops
    from deepspeed.git_version_info import compatible_ops
    from deepspeed.runtime.config import TORCH_ADAM_PARAM
    from orl import parse

    from avspo_openrlhf.cpu.strategy import SHM_OP, CPUStrategy, cpu_strategy

    strategy = cpu_strategy(parse("--backend", "cpu"))
    assert isinstance(strategy, CPUStrategy)
    optim = {"type": "AdamW", "params": {"lr": 1e-3, "betas": [0.9, 0.95], "eps": 1e-8, "weight_decay": 0.0}}
    params = strategy.get_ds_train_config(optim)["optimizer"]["params"]
    assert params[TORCH_ADAM_PARAM] is True and params["fused"] is True
    assert TORCH_ADAM_PARAM not in optim["params"]  # OpenRLHF's dict left as it was
    assert "optimizer" not in strategy.get_ds_train_config(None)  # the model-loading call: no optimizer yet
    monkeypatch.setattr(strategy, "adam_offload", True)
    assert TORCH_ADAM_PARAM not in strategy.get_ds_train_config(optim)["optimizer"]["params"]
    # the shm op is built only where this dict marks it compatible, read when the backend starts
    assert deepspeed.ops.__compatible_ops__ is compatible_ops and SHM_OP in compatible_ops
    backend = importlib.import_module("deepspeed.comm.torch")  # (deepspeed.comm's `torch` is torch itself)
    assert "__compatible_ops__.get(builder.NAME" in inspect.getsource(backend.build_shm_op)
