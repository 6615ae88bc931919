"""A user's reward file at run time: a hard timeout per call, a memory cap, errors that name the
file, and avspo-train pointing OpenRLHF at the guarded wrapper (rewards/guard.py)."""

from __future__ import annotations

import textwrap
import threading
import time

import pytest

from avspo_openrlhf.rewards.guard import GuardedReward, RewardFileError, guard_error_file, write_guard_file

BODY = """
import time
def reward_func(queries, prompts, labels):
    q = queries[0]
    if q == "hang":
        time.sleep(3600)
    if q == "hog":
        x = bytearray(2 * 1024 ** 3)
    if q == "raise":
        raise KeyError("no such label")
    return {"rewards": [float(len(q))], "scores": [float(len(q))]}
"""


@pytest.fixture
def user_file(tmp_path):
    path = tmp_path / "my_reward.py"
    path.write_text(textwrap.dedent(BODY))
    return str(path)


@pytest.mark.slow
def test_a_hanging_call_is_killed_in_time_and_the_next_call_works(user_file, tmp_path):
    err = tmp_path / "guard.error"
    g = GuardedReward(user_file, timeout_s=2, memory_mb=None, workers=1, error_file=str(err))
    try:
        assert g(["abc"], ["p"], ["l"])["rewards"] == [3.0]
        t0 = time.monotonic()
        with pytest.raises(RewardFileError, match=r"my_reward\.py: scoring 1 completion\(s\) took longer than 2 s"):
            g(["hang"], ["p"], ["l"])
        assert time.monotonic() - t0 < 10
        assert "my_reward.py" in err.read_text()  # where the samples generator reads the reason
        assert g(["abcd"], ["p"], ["l"])["rewards"] == [4.0]  # a fresh worker took the killed one's place
    finally:
        g.close()


def test_memory_cap_and_exceptions_are_named(user_file):
    g = GuardedReward(user_file, timeout_s=30, memory_mb=512, workers=1)
    try:
        with pytest.raises(RewardFileError, match="exceeded its memory cap of 512 MB"):
            g(["hog"], ["p"], ["l"])
        with pytest.raises(RewardFileError, match="my_reward.py: KeyError: 'no such label'"):
            g(["raise"], ["p"], ["l"])
        assert g(["ok"], ["p"], ["l"])["rewards"] == [2.0]
    finally:
        g.close()


def test_calls_from_threads_use_the_workers_in_parallel(user_file):
    g = GuardedReward(user_file, timeout_s=30, memory_mb=None, workers=2)
    out = {}
    try:
        threads = [threading.Thread(target=lambda i=i: out.update({i: g(["x" * i], [""], [""])})) for i in range(1, 7)]
        [t.start() for t in threads]
        [t.join(60) for t in threads]
        assert {i: r["rewards"][0] for i, r in out.items()} == {i: float(i) for i in range(1, 7)}
        assert len(g._all) <= 2
    finally:
        g.close()


def test_a_file_that_fails_to_import_is_named(tmp_path):
    bad = tmp_path / "bad.py"
    bad.write_text("import no_such_module_xyz\n")
    g = GuardedReward(str(bad), timeout_s=30, memory_mb=None, workers=1)
    with pytest.raises(RewardFileError, match=r"bad\.py: import failed: ModuleNotFoundError"):
        g(["q"], ["p"], ["l"])
    g.close()


def test_avspo_train_wraps_user_files_only(user_file, tmp_path):
    from types import SimpleNamespace as NS

    from avspo_openrlhf.rewards import arith_reward
    from avspo_openrlhf.trainer.reward_files import guard_reward_files

    args = NS(
        reward=NS(remote_url=[user_file, arith_reward.__file__]),
        ckpt=NS(path=str(tmp_path / "ckpt")),
        run=NS(reward_timeout_s=5.0, reward_memory_mb=1024, reward_workers=3),
    )
    (tmp_path / "ckpt" / ".avspo").mkdir(parents=True)
    stale = guard_error_file(str(tmp_path / "ckpt" / ".avspo"))
    open(stale, "w").write("from an earlier run")
    assert guard_reward_files(args) == [str(tmp_path / "ckpt" / ".avspo" / "reward_guard.py")]
    wrapper, ours = args.reward.remote_url
    assert ours == arith_reward.__file__  # ours have their own limits
    text = open(wrapper).read()
    assert repr(user_file) in text and "timeout_s=5.0" in text and "memory_mb=1024" in text and "workers=3" in text
    assert not __import__("os").path.exists(stale)
    # the wrapper is what OpenRLHF loads: it scores through the guard
    import importlib.util

    spec = importlib.util.spec_from_file_location("w", wrapper)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    try:
        assert mod.reward_func(["abc"], ["p"], ["l"])["rewards"] == [3.0]
    finally:
        mod.reward_func.close()
    assert write_guard_file(user_file, str(tmp_path / "x"), 1, None, 1).endswith("reward_guard.py")


HANGS_LATER = """
import os, time
COUNT = os.path.join(os.path.dirname(__file__), "calls")

def reward_func(queries, prompts, labels):
    with open(COUNT, "a") as f:  # one byte per call, from every worker process
        f.write(".")
    if os.path.getsize(COUNT) > 40:  # preflight and the first steps pass, then a call never returns
        time.sleep(3600)
    return {"rewards": [float(len(q) % 2) for q in queries]}
"""


@pytest.mark.slow
def test_a_reward_file_that_hangs_mid_run_stops_the_run_naming_it(tmp_path_factory):
    pytest.importorskip("vllm")
    import subprocess
    import sys

    import test_cpu_pipeline as pipeline
    from helpers import tiny_assets

    assets = tiny_assets(tmp_path_factory.mktemp("guard"))
    out = tmp_path_factory.mktemp("guard_run")
    reward = out / "late_hang.py"
    reward.write_text(textwrap.dedent(HANGS_LATER))
    flags = pipeline._flags(assets, out, "--run.reward_timeout_s", "3")
    flags[flags.index("--reward.remote_url") + 1] = str(reward)
    t0 = time.monotonic()
    r = subprocess.run(
        [sys.executable, "-m", "avspo_openrlhf.cli.train", *flags],
        capture_output=True,
        text=True,
        timeout=600,
        env=pipeline.ENV,
    )
    log = r.stdout + r.stderr
    assert r.returncode != 0, log[-3000:]
    assert "reward file under a 3 s timeout per call" in log
    assert f"no reward for a completion: reward file {reward}: scoring 1 completion(s) took longer than 3 s" in log
    assert time.monotonic() - t0 < 400


def test_ctrl_c_to_the_process_group_does_not_kill_the_workers(user_file):
    """Ctrl-C reaches every process of the group; the run checkpoints on it and needs its rewards
    until then (a dead worker used to turn the clean stop into a crash)."""
    import os
    import signal

    g = GuardedReward(user_file, timeout_s=30, memory_mb=None, workers=1)
    try:
        assert g(["ab"], ["p"], ["l"])["rewards"] == [2.0]
        ((proc, _),) = g._all
        os.kill(proc.pid, signal.SIGINT)
        os.kill(proc.pid, signal.SIGTERM)
        time.sleep(0.5)
        assert proc.is_alive() and g(["abc"], ["p"], ["l"])["rewards"] == [3.0]
    finally:
        g.close()
