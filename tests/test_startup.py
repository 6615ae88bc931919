"""The start-up timeline (avspo_openrlhf/startup.py): the driver's phases follow one another from
the process's start, another process's phase is a span of its own, a later run in the same process
counts from its own start; the collector paused for the start-up and given back (startup_gc.py); Ray
started in a thread of its own once the input is checked (cpu/ray_start.py); wandb's run started early;
a start-up stuck past AVSPO_STARTUP_STACKS_S writes every thread's stack.
The timeline of a real run is checked in tests/test_cpu_pipeline.py."""

import json
import logging
import os
import threading
import time
import warnings
from pathlib import Path

import pytest

from avspo_openrlhf.startup import TIMELINE, StartupTimeline, process_start_time

FIXTURES = Path(__file__).resolve().parent / "fixtures"


def test_driver_phases_tile_the_time_from_the_process_start():
    t = StartupTimeline(t0=100.0)
    t.mark("imports", now=103.0)
    t.mark("Ray", now=110.5)
    t.span("vLLM engine", 104.0, 112.0, "engine 0")
    t.mark("engines attached", now=112.0)
    state = t.state_dict()
    driver = [s for s in state["spans"] if s["where"] == "driver"]
    assert [(s["phase"], s["start_s"], s["end_s"]) for s in driver] == [
        ("imports", 0.0, 3.0),
        ("Ray", 3.0, 10.5),
        ("engines attached", 10.5, 12.0),
    ]
    assert state["total_s"] == 12.0 and state["process_start"] == 100.0
    assert "start-up 12.0 s: imports 3.0, Ray 7.5, engines attached 1.5" in t.summary()
    assert "vLLM engine 8.0 (ready at 12.0)" in t.summary()


def test_a_later_run_in_the_same_process_counts_from_its_own_start():
    t = StartupTimeline(t0=time.time() - 50)
    t.begin_run()  # the first run: from the process's start
    assert t.t0 < time.time() - 40
    t.mark("imports")
    t.begin_run()  # a second run: its phases start now, the first run's are gone
    assert t.spans == [] and time.time() - t.t0 < 5


def test_the_process_start_is_before_this_test(tmp_path):
    assert process_start_time() < time.time() - 0.01
    t = StartupTimeline()
    t.mark("everything so far")
    t.write(str(tmp_path / "report"))
    state = json.loads((tmp_path / "report" / "startup.json").read_text())
    assert state["spans"][0]["start_s"] == 0.0 and state["total_s"] > 0
    assert not list((tmp_path / "report").glob("*.tmp"))
    t.write(None)  # no report folder: nothing written, no error


STUCK = """
import sys, threading, time
from avspo_openrlhf.startup import StartupTimeline
t = StartupTimeline()
print(t.stacks_if_stuck(), flush=True)
lock = threading.Lock()
lock.acquire()
def importer_waiting_for_the_lock():
    lock.acquire()
threading.Thread(target=importer_waiting_for_the_lock, name="held").start()
time.sleep(float(sys.argv[1]))  # a start-up that never reaches its first step, or one that does
if sys.argv[2] == "first-step":
    t.write(None)
    time.sleep(1.0)
lock.release()
"""


@pytest.mark.parametrize("outcome", ["stuck", "first-step", "off", "bad"])
def test_a_start_up_stuck_past_its_limit_writes_every_threads_stack(outcome):
    """AVSPO_STARTUP_STACKS_S after the start, a start-up that has not reached its first step writes
    each thread's stack (faulthandler, from a C thread: a held GIL cannot stop it) and goes on; the
    first step (``write``) disarms it, 0 turns it off, a value that is no number is refused by name."""
    import subprocess
    import sys

    limit = {"stuck": "0.3", "first-step": "0.8", "off": "0", "bad": "ten"}[outcome]
    sleep = "1.0" if outcome == "stuck" else "0.1"
    env = {**os.environ, "AVSPO_STARTUP_STACKS_S": limit}
    r = subprocess.run([sys.executable, "-c", STUCK, sleep, outcome], capture_output=True, text=True, env=env)
    if outcome == "bad":
        assert r.returncode != 0 and "AVSPO_STARTUP_STACKS_S='ten': expected seconds" in r.stderr
        return
    assert r.returncode == 0, r.stderr
    assert r.stdout.splitlines()[0] == {"stuck": "0.3", "first-step": "0.8", "off": "None"}[outcome]
    if outcome == "stuck":
        assert r.stderr.startswith("Timeout (0:00:00.300000)!"), r.stderr
        assert "importer_waiting_for_the_lock" in r.stderr and "<module>" in r.stderr  # both threads
    else:
        assert "Timeout" not in r.stderr and "Thread 0x" not in r.stderr, r.stderr


def test_the_collector_is_paused_for_the_start_up_and_given_back():
    import gc
    import sys
    import types

    from avspo_openrlhf import startup_gc

    assert gc.isenabled()
    startup_gc.pause()
    try:
        assert not gc.isenabled()
        startup_gc.pause()  # paused twice, resumed once: on again
    finally:
        startup_gc.resume()
    assert gc.isenabled()
    startup_gc.resume()  # idempotent
    assert gc.isenabled()
    gc.disable()  # a process that turned the collector off itself keeps it off
    try:
        startup_gc.pause()
        startup_gc.resume()
        assert not gc.isenabled()
    finally:
        gc.enable()
    # a worker without a point of its own: resumed once no module was imported for quiet_s
    startup_gc.pause()
    try:
        watch = startup_gc.resume_after_imports(quiet_s=0.3, poll_s=0.05)
        for k in range(4):  # imports keep it paused
            sys.modules[f"_avspo_test_import_{k}"] = types.ModuleType("x")
            watch.join(0.1)
            assert not gc.isenabled() and watch.is_alive()
        watch.join(5)
        assert gc.isenabled() and not watch.is_alive()
    finally:
        startup_gc.resume()
        for k in range(4):
            sys.modules.pop(f"_avspo_test_import_{k}", None)


def test_the_imports_are_frozen_out_of_the_collectors_sight():
    import gc

    from avspo_openrlhf import startup_gc

    gc.unfreeze()
    try:
        startup_gc.freeze_imports()
        assert gc.get_freeze_count() > 0
        # an imported object (this function) is no longer in any generation the collector walks
        assert not any(o is startup_gc.freeze_imports for o in gc.get_objects())
    finally:
        gc.unfreeze()


# ── Ray started in a thread of its own (cpu/ray_start.py) ──


class FakeRay:
    """``ray_start``'s view of Ray: up once ``_start`` ran, down after ``shutdown``."""

    def __init__(self, monkeypatch, start):
        from avspo_openrlhf.cpu import ray_start

        self.up, self.shutdowns, self.started = False, 0, threading.Event()

        def fake_start(env):
            start(env)
            self.up = True
            self.started.set()

        monkeypatch.setattr(os, "environ", dict(os.environ))  # the workers' defaults set in this process stay here
        monkeypatch.setattr(ray_start, "_start", fake_start)
        monkeypatch.setattr(ray_start.ray, "is_initialized", lambda: self.up)
        monkeypatch.setattr(ray_start.ray, "shutdown", self.shutdown)

    def shutdown(self):
        self.up, self.shutdowns = False, self.shutdowns + 1


def test_ray_starts_in_a_thread_that_lives_until_closed_and_holds_its_output_until_waited(monkeypatch):
    """What Ray logs and warns from the starter thread reaches the handlers only at ``wait()`` (inside
    the driver's console); other threads' lines pass at once. The thread outlives ``wait()``: Ray's GCS
    and raylet are killed when the thread that forked them ends (PR_SET_PDEATHSIG). ``close()`` shuts
    Ray down, then lets the thread end."""
    from avspo_openrlhf.cpu.ray_start import RayStart

    lines, shown = [], []
    monkeypatch.setattr(warnings, "showwarning", lambda message, *a, **k: shown.append(str(message)))
    handler = logging.Handler()
    handler.emit = lambda record: lines.append(record.getMessage())
    ray_logger = logging.getLogger("ray._private.worker")
    logging.getLogger("ray").addHandler(handler)
    try:

        def start(env):
            ray_logger.warning("Started a local Ray instance.")
            warnings.warn("a tip about accelerator variables", FutureWarning, stacklevel=1)

        fake = FakeRay(monkeypatch, start)
        rs = RayStart({"OMP_WAIT_POLICY": "PASSIVE"})
        assert fake.started.wait(10)
        ray_logger.warning("the driver's own line")
        assert lines == ["the driver's own line"]  # held, not lost
        assert shown == []
        assert os.environ["OMP_WAIT_POLICY"] == "PASSIVE" and os.environ["DS_ACCELERATOR"] == "cpu"
        rs.wait()
        assert lines == ["the driver's own line", "Started a local Ray instance."]
        assert shown == ["a tip about accelerator variables"]
        assert rs.span[0] <= rs.span[1] and rs._thread.is_alive()  # Ray's processes live with it
        rs.close()
        rs._thread.join(5)
        assert not rs._thread.is_alive() and fake.shutdowns == 1 and not fake.up
        rs.close()  # once closed, a no-op
        assert fake.shutdowns == 1
        ray_logger.warning("after")  # the hold is gone with the start
        assert lines[-1] == "after"
    finally:
        logging.getLogger("ray").removeHandler(handler)


def test_a_failed_ray_start_is_raised_where_the_driver_waits(monkeypatch):
    from avspo_openrlhf.cpu.ray_start import RayStart

    def start(env):
        raise RuntimeError("the GCS did not answer")

    FakeRay(monkeypatch, start)
    rs = RayStart()
    with pytest.raises(RuntimeError, match="the GCS did not answer"):
        rs.wait()
    rs.close()
    rs._thread.join(5)
    assert not rs._thread.is_alive()


def test_what_needs_ray_first_runs_in_the_starter_thread_once_ray_is_up(monkeypatch):
    """``RayStart(then=...)`` (the vLLM engines' launch): called in the starter thread after Ray's start,
    its result and the time it returned in ``launched``, the span ending when Ray was ready; its error is
    raised where the driver waits, like Ray's own."""
    from avspo_openrlhf.cpu.ray_start import RayStart

    fake = FakeRay(monkeypatch, lambda env: None)
    calls = []

    def launch():
        calls.append((fake.up, threading.current_thread().name))
        time.sleep(0.2)
        return ["engine"]

    rs = RayStart(then=launch)
    rs.wait()
    assert calls == [(True, "avspo-ray-start")]
    engines, launched = rs.launched
    assert engines == ["engine"] and launched - rs.span[1] >= 0.2  # the span: Ray's start alone
    rs.close()

    def broken():
        raise ImportError("vllm")

    FakeRay(monkeypatch, lambda env: None)
    rs = RayStart(then=broken)
    with pytest.raises(ImportError, match="vllm"):
        rs.wait()
    assert rs.launched is None
    rs.close()


@pytest.mark.slow  # the parser's imports, the reward probe: about 9 s
def test_the_cpu_backend_checks_the_input_before_ray_starts(monkeypatch, tmp_path, capsys):
    """A user's mistake fails before any Ray process starts (the backend's imports may begin beside
    the checks: they start nothing)."""
    from avspo_openrlhf.cli.train import main
    from avspo_openrlhf.cpu import ray_start

    def refuse(*a, **k):
        raise AssertionError("Ray started before the input was checked")

    monkeypatch.setattr(ray_start, "RayStart", refuse)
    model = tmp_path / "model"
    model.mkdir()
    (model / "config.json").write_text("{}")
    flags = ["--backend", "cpu", "--actor.model_name_or_path", str(model), "--rollout.n_samples_per_prompt", "4",
             "--rollout.batch_size", "2", "--rollout.micro_batch_size", "4", "--algo.advantage.estimator", "group_norm",
             "--data.prompt_dataset", str(tmp_path / "missing.jsonl"), "--data.input_key", "prompt",
             "--reward.remote_url", str(FIXTURES / "hash_reward.py"), "--ckpt.path", str(tmp_path / "ckpt")]  # fmt: skip
    real, armed = TIMELINE.stacks_if_stuck, []
    monkeypatch.setattr(TIMELINE, "stacks_if_stuck", lambda: armed.append(real()))
    monkeypatch.setenv("AVSPO_STARTUP_STACKS_S", "300")
    with pytest.raises(SystemExit) as e:
        main(flags)
    assert e.value.code == 2 and "no such file" in capsys.readouterr().err
    assert armed == [300.0] and not TIMELINE._stacks_armed  # the start-up's stack dump is off again
    monkeypatch.setenv("AVSPO_STARTUP_STACKS_S", "ten")  # refused by name, before anything is read
    with pytest.raises(SystemExit) as e:
        main(flags)
    err = capsys.readouterr().err
    assert e.value.code == 2 and "avspo-train: error: AVSPO_STARTUP_STACKS_S='ten': expected seconds" in err


@pytest.mark.slow  # wandb's service process: about 4 s
def test_the_trainer_takes_the_wandb_run_started_early(tmp_path, monkeypatch):
    """``WandbAutoLogger.start_early`` (the sync CPU driver, while Ray starts): the trainer's logger takes
    that run, one run in the folder, its config the trainer's args."""
    from types import SimpleNamespace as NS

    from avspo_openrlhf.report import WandbAutoLogger

    monkeypatch.setenv("WANDB_MODE", "offline")
    monkeypatch.setenv("WANDB_SILENT", "true")

    def args(max_steps):
        return NS(logger=NS(wandb=NS(project="avspo-test", run_name="early")), train=NS(max_steps=max_steps))

    WandbAutoLogger.start_early(args(-1), str(tmp_path))
    logger = WandbAutoLogger(args(float("inf")), str(tmp_path))
    try:
        assert logger.run.config["train"]["max_steps"] == float("inf")
        assert WandbAutoLogger._early == {}
        logger.log_train(1, {"acr": 0.5})
    finally:
        logger.close()
    assert len(list((tmp_path / "wandb").glob("offline-run-*"))) == 1


def test_wandb_skips_launch_inputs_only_where_none_can_be_staged(monkeypatch):
    """``report._skip_unstaged_launch_inputs``: wandb's ``Run`` looks for W&B Launch's staged inputs as it
    starts, importing ``wandb.sdk.launch`` (2-3 s in a driver holding torch and vLLM); inputs are staged
    only through that module, so the look runs where it is imported and not elsewhere. The private
    names it relies on are guarded here."""
    import inspect
    import sys
    import types

    pytest.importorskip("wandb")
    from wandb.sdk.wandb_run import Run

    from avspo_openrlhf import report

    assert "_detect_and_apply_job_inputs" in inspect.getsource(Run._on_ready)  # wandb still calls it there
    wandbs = getattr(Run._detect_and_apply_job_inputs, "wrapped", Run._detect_and_apply_job_inputs)  # ours or not yet
    assert report.LAUNCH_INPUTS_MODULE in inspect.getsource(wandbs)  # and it imports that module
    seen = []
    monkeypatch.setattr(Run, "_detect_and_apply_job_inputs", lambda self: seen.append(self))
    report._skip_unstaged_launch_inputs()
    report._skip_unstaged_launch_inputs()  # wrapped once
    run = object()
    monkeypatch.delitem(sys.modules, report.LAUNCH_INPUTS_MODULE, raising=False)
    Run._detect_and_apply_job_inputs(run)
    assert seen == []
    monkeypatch.setitem(sys.modules, report.LAUNCH_INPUTS_MODULE, types.ModuleType(report.LAUNCH_INPUTS_MODULE))
    Run._detect_and_apply_job_inputs(run)
    assert seen == [run]


@pytest.mark.slow  # a fresh interpreter importing torch: about 3 s
def test_parsing_the_flags_imports_neither_ray_nor_openrlhfs_trainers(tmp_path):
    """The flags are parsed and checked (``run(dry_run=True)``) on OpenRLHF's __main__ block read from its
    file: Ray, vLLM, DeepSpeed, OpenRLHF's trainers and ``openrlhf.utils`` load later, beside preflight
    (cpu/preload.py)."""
    import subprocess
    import sys

    model = tmp_path / "model"
    model.mkdir()
    (model / "config.json").write_text("{}")
    flags = ["--backend", "cpu", "--cpu.dtype", "fp32", "--actor.model_name_or_path", str(model),
             "--rollout.n_samples_per_prompt", "4", "--rollout.batch_size", "2", "--rollout.micro_batch_size", "4",
             "--algo.advantage.estimator", "group_norm", "--remedy", "avspo", "--data.prompt_dataset", "x.jsonl",
             "--reward.remote_url", str(FIXTURES / "hash_reward.py")]  # fmt: skip
    heavy = ["ray", "vllm", "deepspeed", "openrlhf.utils", "openrlhf.cli.train_ppo_ray", "openrlhf.trainer"]
    code = (
        "import sys\nfrom avspo_openrlhf.cli.train import run\n"
        f"args = run({flags!r}, dry_run=True)\n"
        f"print(args.remedy, args.cpu.dtype, [m for m in {heavy!r} if m in sys.modules])\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr[-2000:]
    assert out.stdout.strip().splitlines()[-1] == "avspo fp32 []"


def test_preload_imports_the_backend_in_a_thread(monkeypatch):
    """``preload_backend`` imports :data:`BACKEND_MODULES` in order in a daemon thread and stops at the
    first that fails (the driver's own import then fails with its traceback)."""
    import importlib

    from avspo_openrlhf.cpu import preload

    done = []

    def fake_import(name):
        if name == preload.BACKEND_MODULES[2]:
            raise ImportError(name)
        done.append((name, threading.current_thread().name))

    monkeypatch.setattr(importlib, "import_module", fake_import)
    thread = preload.preload_backend()
    thread.join(5)
    assert thread.daemon and not thread.is_alive()
    assert done == [(m, "avspo-backend-imports") for m in preload.BACKEND_MODULES[:2]]
    assert preload.BACKEND_MODULES[:2] == ("avspo_openrlhf.cpu.engine", "avspo_openrlhf.cpu.backend")
