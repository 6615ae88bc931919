"""Faults an operator or a second user causes: a second writer on a run or evaluation folder, a
lock left by a killed process, the Ray services of a CPU run reached from outside."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import textwrap
import time

import pytest
from helpers import FIXTURES
from test_preflight import GOOD, _fails, _flags, _rows

from avspo_openrlhf.folder_lock import LOCK_NAME, FolderBusy, lock_folder, release_folder

HOLD = textwrap.dedent(
    """
    import sys, time
    from avspo_openrlhf.folder_lock import lock_folder
    lock_folder(sys.argv[1], sys.argv[2])
    print("held", flush=True)
    time.sleep(600)
    """
)


def _holder(folder, what="avspo-train"):
    """Another process holding ``folder`` (as a second training or evaluation would)."""
    proc = subprocess.Popen([sys.executable, "-c", HOLD, str(folder), what], stdout=subprocess.PIPE, text=True)
    assert proc.stdout.readline().strip() == "held"
    return proc


def test_a_second_writer_is_refused_and_a_dead_holder_is_taken_over(tmp_path):
    folder = tmp_path / "run"
    holder = _holder(folder)
    try:
        with pytest.raises(FolderBusy) as e:
            lock_folder(str(folder), "avspo-train")
        assert f"PID {holder.pid}" in str(e.value) and "one avspo-train per folder" in str(e.value)
    finally:
        holder.send_signal(signal.SIGKILL)  # the OOM killer: no cleanup runs
        holder.wait()
    assert (folder / LOCK_NAME).exists()  # the stale file stays; its lock died with the process
    lock_folder(str(folder), "avspo-train")
    assert f"PID {os.getpid()}" in (folder / LOCK_NAME).read_text()
    release_folder(str(folder))


@pytest.mark.slow
def test_avspo_train_refuses_a_run_folder_in_use_before_ray(tmp_path, capsys):
    holder = _holder(tmp_path / "ckpt")
    try:
        msg = _fails(capsys, _flags(tmp_path, _rows(tmp_path, GOOD)))
    finally:
        holder.kill()
        holder.wait()
    assert f"{tmp_path / 'ckpt'} is in use by avspo-train (host" in msg and f"PID {holder.pid}" in msg


@pytest.mark.slow
def test_avspo_eval_refuses_an_output_folder_in_use(tmp_path):
    comps = tmp_path / "comps.jsonl"
    comps.write_text(json.dumps({"unique_id": "x", "completions": ["\\boxed{1}"]}) + "\n")
    out = tmp_path / "eval"
    holder = _holder(out, "avspo-eval")
    try:
        r = subprocess.run([sys.executable, "-m", "avspo_openrlhf.cli.evaluate", "--completions", str(comps),
                            "--benchmarks", "gsm8k", "--data", f"gsm8k={FIXTURES / 'gsm8k_20.jsonl'}", "--output",
                            str(out)], capture_output=True, text=True,
                           timeout=120)  # fmt: skip
    finally:
        holder.kill()
        holder.wait()
    err = r.stderr.strip().splitlines()
    assert r.returncode == 2 and err[-1].startswith("avspo-eval: error: ") and "in use by avspo-eval" in err[-1]
    assert not (out / "gsm8k").exists()  # nothing written


def _listening(pids: set[int]) -> list:
    import psutil

    return [c for c in psutil.net_connections("inet") if c.status == psutil.CONN_LISTEN and c.pid in pids]


PROBE = textwrap.dedent(
    """
    import json, time, psutil
    from avspo_openrlhf.ray_auth import enable_token_auth
    assert enable_token_auth() == "token"  # what avspo-train does first, before Ray is imported
    from avspo_openrlhf.cpu.compat import install_gpu_module_stubs
    install_gpu_module_stubs()
    import ray
    from avspo_openrlhf.cpu.ray_start import init_ray
    init_ray()
    ray.get(ray.remote(lambda: 1).remote())
    time.sleep(3)  # the reaper has seen every process
    kids = [(p.pid, p.create_time(), p.name()) for p in psutil.Process().children(recursive=True)]
    print("PROBE " + json.dumps({"kids": kids, "gcs": ray.get_runtime_context().gcs_address}), flush=True)
    time.sleep(600)  # until the test kills it
    """
)


@pytest.mark.slow
def test_the_cpu_backends_ray_refuses_outsiders_and_dies_with_its_driver(tmp_path):
    """Ray listens on every interface (GCS, raylet and worker gRPC, the agents' HTTP servers) and
    its job agent runs any entrypoint POSTed to it. The CPU backend turns on Ray's token
    authentication with a token only its own processes hold: a job POSTed to every listening port
    runs nothing, and a client without the token cannot join the cluster. And a driver killed with
    SIGKILL (no atexit, no Ray shutdown hook) takes every Ray process it started with it."""
    import http.client
    import urllib.error
    import urllib.request
    from concurrent.futures import ThreadPoolExecutor

    import psutil

    env = {k: v for k, v in os.environ.items() if not k.startswith("RAY_")}
    err = open(tmp_path / "probe.err", "w+")
    proc = subprocess.Popen(
        [sys.executable, "-c", PROBE],
        stdout=subprocess.PIPE,
        text=True,
        stderr=err,
        env=env,
        cwd=tmp_path,
    )
    try:
        line = "-"
        while line and not line.startswith("PROBE "):  # Ray and wandb print their own lines first
            line = proc.stdout.readline()
        assert line, (tmp_path / "probe.err").read_text()[-3000:]
        info = json.loads(line.removeprefix("PROBE "))
        kids = info["kids"]
        names = " ".join(n for _, _, n in kids)
        assert "raylet" in names and "gcs_server" in names
        socks = _listening({pid for pid, _, _ in kids})
        assert socks, "no listening socket found for the run's Ray processes"
        marker = tmp_path / "pwned"
        job = json.dumps({"entrypoint": f"touch {marker}", "submission_id": "probe"}).encode()

        def post(c) -> int | None:
            host = "127.0.0.1" if c.laddr.ip in ("0.0.0.0", "::") else c.laddr.ip
            url = f"http://{host}:{c.laddr.port}/api/job_agent/jobs/"
            try:
                with urllib.request.urlopen(urllib.request.Request(url, data=job, method="POST"), timeout=5) as r:
                    return r.status
            except urllib.error.HTTPError as e:
                return e.code
            except (OSError, ValueError, http.client.HTTPException):  # a gRPC port: not HTTP
                return None

        # every port at once: a gRPC port holds an HTTP request until its timeout
        with ThreadPoolExecutor(len(socks)) as pool:
            statuses = dict(zip((c.laddr.port for c in socks), pool.map(post, socks)))
        assert not any(s is not None and 200 <= s < 300 for s in statuses.values()), statuses
        assert 401 in statuses.values(), statuses  # the agents answered, and refused
        # a Ray client without the token is refused by the GCS (on loopback: without the switch, Ray's
        # client would swap 127.0.0.1 for the host's address, where nothing of the run listens)
        join = subprocess.run(
            [sys.executable, "-c", f"import ray; ray.init(address={info['gcs']!r})"],
            capture_output=True,
            text=True,
            timeout=120,
            cwd=tmp_path,
            env={**env, "RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER": "0"},
        )
        assert join.returncode != 0 and "auth" in (join.stdout + join.stderr).lower(), join.stderr[-2000:]
        time.sleep(1)
        assert not marker.exists()
    finally:
        proc.kill()  # SIGKILL: no atexit, no Ray shutdown hook
        proc.wait()
        err.close()

    def alive():
        out = []
        for pid, started, name in kids:
            try:
                if psutil.Process(pid).create_time() == started:
                    out.append(name)
            except psutil.NoSuchProcess:
                pass
        return out

    deadline = time.time() + 30
    while alive() and time.time() < deadline:
        time.sleep(0.5)
    assert not alive(), f"outlived the driver: {alive()}"


# ── checkpoints that survive a kill ──


def _ckpt_actor(args, model):
    import socket

    from openrlhf.trainer.ray.ppo_actor import PolicyModelActor

    from avspo_openrlhf.cpu.strategy import cpu_strategy  # the crash-safe strategy, as the CPU backend runs it

    with socket.socket() as s:
        s.bind(("", 0))
        port = s.getsockname()[1]
    actor = PolicyModelActor.__ray_actor_class__(1, 0, "127.0.0.1", port)
    actor.init_model_from_pretrained(cpu_strategy(args), model, max_steps=8)
    return actor


@pytest.mark.slow
def test_a_kill_during_a_checkpoint_loses_nothing_at_max_num_1(tmp_path, monkeypatch, capsys):
    """OpenRLHF deleted the old checkpoint before writing the new one: kill -9 mid-save with
    --ckpt.max_num 1 (the quickstart's) left none, and 'latest' named a deleted folder."""
    import copy

    from orl import parse

    from avspo_openrlhf.cli.preflight import PreflightError, check_checkpoints
    from avspo_openrlhf.cpu.tiny import build_tiny_model
    from avspo_openrlhf.install import installed
    from avspo_openrlhf.trainer.checkpoint import COMPLETE

    monkeypatch.setenv("LOCAL_RANK", "0")
    model = build_tiny_model(str(tmp_path / "tiny"))
    ckpt = tmp_path / "ckpt"
    args = parse("--actor.model_name_or_path", model, "--ds.zero_stage", "2", "--ds.attn_implementation", "eager",
                 "--backend", "cpu", "--cpu.dtype", "fp32", "--ckpt.path", str(ckpt), "--ckpt.max_num", "1",
                 "--rollout.n_samples_per_prompt", "4", "--train.batch_size", "8", "--train.micro_batch_size", "4",
                 base=["--reward.remote_url", "r.py", "--actor.num_gpus_per_node", "1",
                       "--algo.advantage.estimator", "group_norm"])  # fmt: skip
    d = ckpt / "_actor"

    def tags():
        return sorted(p.name for p in d.iterdir() if p.is_dir())

    with installed(cpu=True):
        actor = _ckpt_actor(args, model)
        for step in (1, 2):
            actor.save_checkpoint(f"global_step{step}", client_states={"global_step": step})
        assert tags() == ["global_step2"] and (d / "latest").read_text() == "global_step2"
        assert (d / "global_step2" / COMPLETE).exists()

        engine = actor.actor.model

        def killed(save_dir, tag=None, **kw):  # DeepSpeed wrote part of the folder, then SIGKILL
            os.makedirs(os.path.join(save_dir, tag), exist_ok=True)
            with open(os.path.join(save_dir, tag, "mp_rank_00_model_states.pt"), "wb") as f:
                f.write(b"torn")
            raise SystemExit("killed")  # nothing after this point of the save runs

        engine.save_checkpoint = killed
        with pytest.raises(SystemExit):
            actor.save_checkpoint("global_step3", client_states={"global_step": 3})
        del engine.save_checkpoint
        assert tags() == ["global_step2", "global_step3"] and (d / "latest").read_text() == "global_step2"

        resume = copy.deepcopy(args)
        resume.ckpt.load_enable = True
        check_checkpoints(resume)  # preflight: fine
        assert _ckpt_actor(resume, model).get_checkpoint_states()["global_step"] == 2
        # killed while 'latest' was rewritten: the newest complete checkpoint, said in one line
        (d / "latest").write_text("global_step3")
        capsys.readouterr()
        assert _ckpt_actor(resume, model).get_checkpoint_states()["global_step"] == 2
        assert "resuming from global_step2" in capsys.readouterr().out
        # the next save completes, then evicts the old and the torn folder
        actor.save_checkpoint("global_step4", client_states={"global_step": 4})
        assert tags() == ["global_step4"] and (d / "latest").read_text() == "global_step4"
    # the first save of a run killed: a torn folder, no 'latest': one line before Ray, what to do
    (d / "global_step4" / COMPLETE).unlink()
    (d / "latest").unlink()
    with pytest.raises(PreflightError, match="none is complete.*delete it to start over"):
        check_checkpoints(resume)


# ── user code under a deadline ──


@pytest.mark.slow
@pytest.mark.parametrize(
    "body, message",
    [
        (
            "import time\ntime.sleep(600)\ndef reward_func(queries, prompts, labels): pass\n",
            "no answer after 3 s (importing",
        ),
        (
            "def reward_func(queries, prompts, labels):\n    while True: pass\n",
            "no answer after 2 s (scoring the first row)",
        ),
        (
            "def reward_func(queries, prompts, labels):\n    return {'rewards': [1.0]}\n",
            "returned 1 rewards for 2 queries",
        ),
        (
            "def reward_func(queries, prompts, labels):\n    return {'rewards': [1.0, float('nan')]}\n",
            "non-finite reward",
        ),
        ("def reward_func(queries, prompts, labels):\n    return {'rewards': ['yes', 'no']}\n", "must be numbers"),
    ],
)
def test_a_reward_file_that_hangs_or_lies_fails_in_one_line_before_ray(tmp_path, monkeypatch, capsys, body, message):
    from avspo_openrlhf.cli import preflight

    reward = tmp_path / "reward.py"
    reward.write_text(body)
    monkeypatch.setattr(preflight, "REWARD_CHECK_TIMEOUT_S", 3.0)  # the import
    monkeypatch.setattr(preflight, "REWARD_CALL_TIMEOUT_S", 2.0)  # the call, once imported
    t0 = time.monotonic()
    msg = _fails(capsys, _flags(tmp_path, _rows(tmp_path, GOOD), reward=reward))
    assert message in msg and time.monotonic() - t0 < 30, msg


@pytest.mark.slow
def test_a_slow_import_does_not_eat_the_calls_deadline(tmp_path):
    """The import (torch, math-verify: seconds) and the call have separate deadlines, so a hanging
    reward_func fails in seconds without failing a file that is only slow to import."""
    from avspo_openrlhf.cli.preflight import check_reward_file

    reward = tmp_path / "slow_import.py"
    reward.write_text(
        "import time\ntime.sleep(3)\ndef reward_func(queries, prompts, labels):\n"
        "    return {'rewards': [0.0] * len(queries)}\n"
    )
    check_reward_file(str(reward), {"prompt": "q", "answer": "1"}, "prompt", "answer", timeout_s=10, call_timeout_s=2)


def test_a_build_lock_left_by_a_killed_process_is_cleared(tmp_path):
    """Seen here: a run SIGKILLed while DeepSpeed JIT-loaded its shm op left torch's bare `lock`
    file, and every later run (three at once) hung in init_model_from_pretrained, printing nothing."""
    import os

    from avspo_openrlhf.cli.preflight import clear_stale_build_locks

    stale = tmp_path / "py311_cpu" / "deepspeed_shm_comm" / "lock"
    fresh = tmp_path / "py311_cpu" / "fused_adam" / "lock"
    for f in (stale, fresh):
        f.parent.mkdir(parents=True)
        f.touch()
    os.utime(stale, (time.time() - 3600, time.time() - 3600))
    assert clear_stale_build_locks(str(tmp_path)) == [str(stale)]
    assert not stale.exists() and fresh.exists()  # a build in progress keeps its lock


def test_answer_parsing_is_linear_and_bounded():
    """Adversarial completions: 30k spaces before a word, 98k characters of unclosed boxes, a
    5,000-digit integer: each parses in well under a second (they took 7.9 s, 30 s, and raised)."""
    from avspo_openrlhf.rewards.arith_reward import score_arith
    from avspo_openrlhf.rewards.extract import all_boxes, last_boxed, response_from_query

    cases = [
        lambda: response_from_query("Q" + " " * 30_000 + "x", "P"),
        lambda: last_boxed("\\boxed{" * 14_000),
        lambda: all_boxes("\\boxed{" * 14_000),
        lambda: score_arith("the answer is " + "7" * 5_000, "7"),
        lambda: score_arith("\\boxed{" + "7" * 5_000 + "}", "7"),
    ]
    results = []
    for case in cases:
        t0 = time.perf_counter()
        results.append(case())
        assert time.perf_counter() - t0 < 1.0
    assert results[0] == "Q" + " " * 30_000 + "x" and results[1] is None and results[2] == []
    assert results[3] == "unparsable" and results[4] == "unparsable"
    # the fast paths give the old answers on ordinary text
    assert last_boxed("so \\boxed{\\frac{1}{2}} and \\boxed{3}") == "3"
    assert last_boxed("\\boxed{a} then \\boxed{ unclosed") == "a"
    assert response_from_query("P the answer <|im_end|>  </s>\n", "P") == "the answer"


def test_a_non_utf8_byte_is_named_by_file_and_line_before_ray(tmp_path, capsys):
    data = tmp_path / "prompts.jsonl"
    data.write_bytes(("\n".join(GOOD[:2]) + "\n").encode() + b'{"prompt": "caf\xe9", "answer": "1"}\n')
    msg = _fails(capsys, _flags(tmp_path, data))
    assert f"{data}:3: not UTF-8 (byte 0xe9 at column 16)" in msg, msg


def test_the_gpu_path_builds_crash_safe_checkpoints_and_takes_sigterm_back():
    """On --backend gpu, OpenRLHF's train(args) builds the strategy with the module's get_strategy
    right after its ray.init: ours there gives crash-safe checkpoints and the SIGTERM hand-back."""
    import ast
    import inspect

    from openrlhf.cli import train_ppo_ray
    from orl import parse

    from avspo_openrlhf.install import installed
    from avspo_openrlhf.trainer.checkpoint import CrashSafeStrategy

    body = ast.parse(inspect.getsource(train_ppo_ray.train)).body[0].body
    first = [ast.unparse(s) for s in body[:2]]
    assert first[0].startswith("if not ray.is_initialized():") and first[1] == "strategy = get_strategy(args)", (
        "OpenRLHF's train() changed where it builds the strategy: re-check install._strategy_factory"
    )
    calls = []
    args = parse()
    with installed(trainers=True, on_ray_started=lambda: calls.append("ray up")):
        strategy = train_ppo_ray.get_strategy(args)
    assert type(strategy) is CrashSafeStrategy and calls == ["ray up"]
    assert type(train_ppo_ray.get_strategy(args)) is not CrashSafeStrategy  # OpenRLHF's, restored


def test_a_missing_relative_model_path_offline_fails_before_ray(tmp_path, monkeypatch, capsys):
    """`models/final` that does not exist was taken for a hub id: 93 s and a 229-line traceback."""
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.chdir(tmp_path)
    msg = _fails(capsys, _flags(tmp_path, _rows(tmp_path, GOOD), model="models/final"))
    assert "models/final: no such local folder, and the hub is offline" in msg


def test_a_resumed_run_logs_each_step_once(tmp_path):
    """Killed after logging steps 5-6 but checkpointed at 4: the resume trains 5 and 6 again, so the
    log keeps rows up to the checkpoint only (a torn last line included in what goes)."""
    from avspo_openrlhf.report import JsonlLogger, read_metrics

    log = JsonlLogger(str(tmp_path))
    for step in range(1, 7):
        log.log_train(step, {"acr": step / 10})
    log.log_eval(4, {"add1/pass1": 0.5})
    with open(log.path, "a") as f:
        f.write('{"step": 7, "kind": "tr')  # killed mid-write
    assert log.truncate_after(4) == 3  # steps 5, 6 and the torn line, nothing else
    rows, evals = read_metrics(log.path)
    assert [r["step"] for r in rows] == [1, 2, 3, 4] and [e["step"] for e in evals] == [4]
    assert log.truncate_after(4) == 0
    log.log_train(5, {"acr": 0.9})
    assert [r["step"] for r in read_metrics(log.path)[0]] == [1, 2, 3, 4, 5]
