"""The GPU remedies study's loop, scheduler and report, on the CPU with the tiny random model: every
arm trains, every run stops within one step's tokens of the budget, DAPO-DS pays for its refills,
a killed run resumes exactly, runs side by side equal runs one at a time."""

from __future__ import annotations

import dataclasses
import json
import math
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest
import torch
from helpers import small_study

from avspo_openrlhf import stats
from avspo_openrlhf.study import hf_engine, loop
from avspo_openrlhf.study.compare import per_seed_diffs, seeds_for_halfwidth
from avspo_openrlhf.study.remedies_gpu import GPURemediesStudy
from avspo_openrlhf.study.remedies_gpu_report import paired_t
from avspo_openrlhf.study.scheduler import Job, run_jobs
from avspo_openrlhf.study.spec import Arm, RunSpec, StudySettings, check_loop_arm
from avspo_openrlhf.study.store import StudyError, level_lookup
from avspo_openrlhf.study.task import levels_by_id

pytest.importorskip("transformers")
REPO = Path(__file__).resolve().parents[1]
TESTS = Path(__file__).resolve().parent
# the subprocesses import the test rewards from this folder
ENV = {"PYTHONPATH": os.pathsep.join([str(TESTS), os.environ.get("PYTHONPATH", "")])}

ARMS = {  # the study's arms (experiments/remedies_gpu/run.py) and each estimator family
    "GRPO": Arm("grpo"),
    "AVSPO": Arm("avspo", {"strategy": "stratified"}),
    "AVSPO-opposite": Arm("avspo", {"strategy": "opposite"}),
    "AVSPO-random": Arm("avspo", {"strategy": "random_uniform"}),
    "sign": Arm("sign"),
    "RL-ZVP": Arm("rl_zvp", {"std_convention": "population", "eps": 1e-6}),
    "NGRPO": Arm("ngrpo"),
    "DAPO-DS": Arm("grpo", dynamic=True),
    "GRESO": Arm("grpo", dynamic=True, greso={}),
    "random-reward": Arm("grpo", reward="random"),
    "format-reward": Arm("grpo", reward="format"),
    "random-sign": Arm("grpo", control="random_sign"),
}
SMALL = small_study(temperature=1.0)


@pytest.fixture(scope="module")
def assets(study_assets):
    return study_assets


pytestmark = pytest.mark.usefixtures("study_rewards")


def spec(assets, method="GRPO", seed=0, arm=None, **settings) -> RunSpec:
    return RunSpec(
        method=method,
        seed=seed,
        arm=arm or ARMS[method],
        settings=dataclasses.replace(SMALL, **settings),
        model=assets["model"],
        train=assets["train"],
        heldout=assets["heldout"],
    )


def trajectory(res: dict) -> dict:
    """What a run computed, without its clocks, its resume count and its companions."""
    drop = {"train_s", "eval_s", "resumed", "batch"}  # the clocks, and what shared the device
    return {
        **{k: v for k, v in res.items() if k not in drop},
        "curve": [{k: v for k, v in c.items() if k != "wall_s"} for c in res["curve"]],
    }


@pytest.mark.parametrize("method", list(ARMS))
def test_every_arm_trains_and_stops_at_the_token_budget(assets, tmp_path, method):
    # the format control needs a reward with an answer extraction: arith's (the tiny model writes digits)
    s = spec(assets, method, **({"reward": "arith"} if method == "format-reward" else {}))
    run = loop.Run(s, tmp_path / "run")
    start = [p.detach().clone() for p in run.policy.model.parameters()]
    run.train(log=lambda _: None)
    res = run.result()
    budget = s.settings.token_budget
    # the first step whose tokens reach the budget is the last: within one step's tokens of it
    assert budget <= res["generated_tokens"] < budget + res["last_step_tokens"]
    assert res["generated_tokens"] == sum(c["step_tokens"] for c in res["curve"]) and res["steps"] == len(res["curve"])
    assert res["heldout_problems"] == 6 and 0.0 <= res["heldout_pass1"] <= 1.0
    assert set(res["heldout_by_level"]) == {"add1", "mul1"} and res["mid_evals"]
    assert all(math.isfinite(c["loss"]) for c in res["curve"] if c["groups_trained"])
    assert res["precision"] == {"weights": "fp32", "compute": "fp32"} and "cores" in res["device"]
    # it trained: the weights moved
    assert any(not torch.equal(a, b) for a, b in zip(run.policy.model.parameters(), start))
    if method == "random-reward":  # trained on the coin, while the task reward is still measured
        assert any(c["reward"] != c["task_reward"] for c in res["curve"])
    if method == "format-reward":  # trained on "has an answer", while the task reward is still measured
        assert any(c["reward"] != c["task_reward"] for c in res["curve"])
    if method in ("sign", "RL-ZVP", "DAPO-DS", "random-sign"):
        # every trained group carries a signal: these act on every collapsed group, DS drops them
        assert res["groups_signal"] == res["groups_trained"] > 0
    else:
        assert 0 < res["groups_signal"] <= res["groups_trained"]
    # what every arm reports about its generation, over every generated group
    assert 0.0 <= res["acr_generated"] <= 1.0 and 0.0 <= res["truncation_rate"] <= 1.0
    assert res["completion_tokens_mean"] == pytest.approx(
        res["generated_tokens"] / sum(c["groups_generated"] * s.settings.group_size for c in res["curve"])
    )
    assert all({"truncation_rate", "completion_tokens_mean", "acr_generated"} <= set(c) for c in res["curve"])
    # provenance: the whole settings, hashed without arm and seed
    assert res["settings"]["settings"]["token_budget"] == budget and res["settings_hash"]
    assert res["nonfinite_steps"] == [] and res["flagged"] is False


def test_dapo_ds_counts_the_refill_generation(assets, tmp_path, monkeypatch):
    """Every generated token is charged to the budget, also those of groups DS dropped."""
    generated = []
    real = hf_engine.Policy.generate

    def counting(self, problems, n, *a, **k):
        ro = real(self, problems, n, *a, **k)
        generated.append((len(problems), ro.tokens))
        return ro

    monkeypatch.setattr(hf_engine.Policy, "generate", counting)
    s = spec(
        assets, "DAPO-DS", reward="study_reward:half_collapsed", final_eval=False, mid_eval_tokens=0, token_budget=300
    )
    res = loop.run(s, tmp_path / "run", log=lambda _: None)
    assert res["generated_tokens"] == sum(t for _, t in generated)
    assert res["groups_generated"] == sum(p for p, _ in generated)
    # odd answers collapse: DS dropped groups and generated more than it trained on
    assert res["groups_generated"] > res["groups_trained"] == res["groups_signal"]
    assert any(c["groups_generated"] > s.settings.prompts_per_step for c in res["curve"])
    # no refill round starts once the budget is reached: the overshoot is less than the last round's tokens
    assert 0 <= res["generated_tokens"] - s.settings.token_budget < generated[-1][1]
    grpo = loop.run(
        spec(
            assets, "GRPO", reward="study_reward:half_collapsed", final_eval=False, mid_eval_tokens=0, token_budget=300
        ),
        tmp_path / "grpo",
        log=lambda _: None,
    )
    assert grpo["groups_generated"] == grpo["groups_trained"] > grpo["groups_signal"]
    # every arm's ACR counts every generated group: DS's too, not only the groups it kept
    assert res["acr_generated"] > 0 and all(c["acr"] == 0 for c in res["curve"] if c["groups_trained"])


def _start(spec_: RunSpec, run_dir: Path, env: dict) -> subprocess.Popen:
    run_dir.mkdir(parents=True, exist_ok=True)
    (run_dir / "request.json").write_text(spec_.to_json())
    cmd = [sys.executable, "-m", "avspo_openrlhf.study.loop", str(run_dir / "request.json"), str(run_dir)]
    env = {**os.environ, **ENV, **env}
    return subprocess.Popen(
        [*cmd, "--threads", "1"], env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True
    )


@pytest.mark.slow
def test_a_killed_run_resumes_exactly(assets, tmp_path):
    s = spec(assets, "AVSPO", reward="study_reward:parity_then_hang", ckpt_every=1, token_budget=600, mid_eval_tokens=0)
    whole = _start(s, tmp_path / "whole", {})
    out, _ = whole.communicate(timeout=300)  # read as it runs: a full pipe would stall the run
    assert whole.returncode == 0, out
    # the same run, hung in its 5th step's reward (4 steps x 2 prompts x G 4 = 32 calls before it), killed there
    hung = tmp_path / "hung"
    proc = _start(s, tmp_path / "killed", {"STUDY_TEST_HANG_AT": "33", "STUDY_TEST_HUNG_FILE": str(hung)})
    deadline = time.monotonic() + 300
    while not hung.exists():
        assert proc.poll() is None and time.monotonic() < deadline, proc.stdout.read() if proc.poll() else "no hang"
        time.sleep(0.05)
    # while it lives, a second process on its folder (an orphan of a killed scheduler) fails at once
    second = _start(s, tmp_path / "killed", {})
    out, _ = second.communicate(timeout=120)
    assert second.returncode != 0 and "in use by" in out, out
    # step 4's checkpoint is written in the background while step 5 runs: on disk before the kill
    ckpt = tmp_path / "killed" / "ckpt.pt"
    while not ckpt.exists() or torch.load(ckpt, weights_only=False)["state"]["step"] != 4:
        assert time.monotonic() < deadline, "step 4's checkpoint was never written"
        time.sleep(0.05)
    proc.send_signal(signal.SIGKILL)
    proc.wait(timeout=30)
    assert ckpt.exists() and not (tmp_path / "killed" / "result.json").exists()
    again = _start(s, tmp_path / "killed", {})
    out, _ = again.communicate(timeout=300)
    assert again.returncode == 0 and "resumed at step 4" in out, out
    a = json.loads((tmp_path / "whole" / "result.json").read_text())
    b = json.loads((tmp_path / "killed" / "result.json").read_text())
    assert b["resumed"] == 1 and a["resumed"] == 0
    assert trajectory(a) == trajectory(b)  # bit for bit: advantages, losses, evaluations
    # the live log holds each step once: the steps after the checkpoint were not kept twice
    lines = (tmp_path / "killed" / "metrics.jsonl").read_text().splitlines()
    assert [json.loads(x)["step"] for x in lines] == list(range(1, b["steps"] + 1))


def test_a_checkpoint_is_the_state_when_taken_though_written_later(assets, tmp_path):
    """The checkpoint is written in the background while training goes on: what it holds is the run
    at the moment it was taken (a snapshot), not what the weights and the curve became before the
    write. The writer thread is held busy here so the write comes after the changes."""
    import threading

    r = loop.Run(spec(assets, token_budget=40, final_eval=False, ckpt_every=0, mid_eval_tokens=0), tmp_path / "r")
    r.train(log=lambda _: None)
    weights = {k: v.clone() for k, v in r.engine.model_state().items()}
    steps = len(r.state["curve"])
    gate = threading.Event()
    blocker = loop.save_in_background({}, tmp_path / "unused.pt")  # makes the writer thread
    loop._writer.submit(gate.wait)  # the checkpoint's write waits behind this
    r._checkpoint()
    with torch.no_grad():
        for p in r.policy.model.parameters():
            p.add_(1.0)  # training goes on
    r.state["curve"].append({"step": steps + 1})
    gate.set()
    r.wait_checkpoint()
    blocker.result()
    ck = torch.load(tmp_path / "r" / "ckpt.pt", weights_only=False)
    assert len(ck["state"]["curve"]) == steps
    assert all(torch.equal(ck["model"][k], v.cpu()) for k, v in weights.items())


def test_a_snapshot_copies_every_tensor_once_and_keeps_tied_weights_tied():
    w = torch.arange(6.0).reshape(2, 3)
    state = {"embed": w, "lm_head": w, "moments": [w.clone()], "step": 3, "curve": [{"step": 1}]}
    snap = loop.snapshot(state)
    assert snap["embed"] is snap["lm_head"] and snap["embed"] is not w and torch.equal(snap["embed"], w)
    w.add_(1.0)
    state["curve"].append({"step": 2})
    assert snap["embed"][0, 0] == 0.0 and snap["moments"][0][0, 0] == 0.0 and snap["curve"] == [{"step": 1}]


def test_a_changed_spec_is_refused_in_a_run_folder(assets, tmp_path):
    loop.run(spec(assets, token_budget=40, final_eval=False), tmp_path / "r", log=lambda _: None)
    (tmp_path / "r" / "result.json").unlink()
    with pytest.raises(ValueError, match="holds a run of another spec"):
        loop.run(spec(assets, token_budget=80, final_eval=False), tmp_path / "r", log=lambda _: None)


@pytest.mark.slow
def test_runs_side_by_side_equal_runs_one_at_a_time(assets, tmp_path):
    def jobs(folder):
        return [
            Job(spec(assets, m, seed=sd), tmp_path / folder / f"{m}_seed{sd}") for m, sd in (("GRPO", 0), ("AVSPO", 1))
        ]

    log = []
    assert run_jobs(jobs("one"), 1, threads=1, env=ENV, log=log.append) == []
    assert run_jobs(jobs("two"), 2, threads=1, env=ENV, log=log.append) == []
    assert any("2 running" in line for line in log)  # the second call really ran them at once
    for a, b in zip(jobs("one"), jobs("two")):
        assert trajectory(a.result()) == trajectory(b.result())
    # a finished run is not started again
    log.clear()
    assert run_jobs(jobs("two"), 2, threads=1, env=ENV, log=log.append) == [] and not log


@pytest.mark.slow
def test_a_failing_run_is_reported_and_the_others_finish(assets, tmp_path):
    bad = dataclasses.replace(spec(assets), model=str(tmp_path / "no-model"))
    jobs = [Job(bad, tmp_path / "bad"), Job(spec(assets, token_budget=40), tmp_path / "good")]
    log = []
    assert run_jobs(jobs, 2, threads=1, env=ENV, log=log.append) == ["bad"]
    assert jobs[1].done() and "see " in " ".join(log)


# ── configuration mistakes, refused when built ──


@pytest.mark.parametrize(
    "build, field",
    [
        (lambda: Arm("bogus"), "Arm.estimator"),
        (lambda: Arm("avspo", {"alpha": -1}), "alpha"),
        (lambda: Arm("avspo", {"alfa": 0.5}), "alfa"),
        (lambda: Arm("grpo", reward="coin"), "Arm.reward"),
        (lambda: check_loop_arm(Arm("grpo", greso={"audit": 0.1})), "Arm.greso.audit"),
        (lambda: StudySettings(group_size=1), "StudySettings.group_size"),
        (lambda: StudySettings(token_budget=0), "StudySettings.token_budget"),
        (lambda: StudySettings(dtype="fp16"), "StudySettings.dtype"),
        (lambda: StudySettings(acr={"windoww": 3}), "windoww"),
        (lambda: StudySettings(reward="nonsense"), "StudySettings.reward"),
    ],
)
def test_a_mistake_is_refused_naming_the_field(build, field):
    with pytest.raises(ValueError, match=field):
        build()


def test_a_malformed_problem_row_names_file_and_line(tmp_path):
    f = tmp_path / "p.jsonl"
    f.write_text('{"problem": "1+1", "answer": "2"}\n{"problem": "x"}\n')
    with pytest.raises(ValueError, match=r"p\.jsonl:2: a row needs"):
        loop.read_rows(str(f))


# ── the study: its statistics, report, command ──


def _fake_run(method: str, seed: int, per: dict[str, float], mid=(), settings_hash="h1", budget=1000) -> dict:
    by_level: dict[str, list[float]] = {}
    for k, v in per.items():
        by_level.setdefault(k.split("/")[1], []).append(v)
    levels = {lv: sum(v) / len(v) for lv, v in by_level.items()}
    return {
        "method": method,
        "seed": seed,
        "per_problem": per,
        "eval_n": 4,
        "heldout_pass1": sum(levels.values()) / len(levels),
        "heldout_by_level": levels,
        "heldout_problems": len(per),
        "steps": 10,
        "generated_tokens": budget,
        "acr_raw": 0.5,
        "acr_all_wrong": 0.4,
        "acr_all_right": 0.1,
        "curve": [{"step": 10, "tokens": budget, "wall_s": 60.0, "reward": 0.5, "acr": 0.5, "acr_effective": 0.1}],
        "signal_groups_per_mtok": 500.0,
        "acr_generated": 0.5,
        "acr_effective": 0.1,
        "truncation_rate": 0.0,
        "completion_tokens_mean": 12.0,
        "train_s": 60.0,
        "mid_evals": list(mid),
        "device": "NVIDIA H100 80GB HBM3",
        "commit": "abc",
        "precision": {"weights": "fp32", "compute": "bf16 autocast"},
        "resumed": 0,
        "flagged": False,
        "nonfinite_steps": [],
        "settings_hash": settings_hash,
        "settings": {
            "settings": {**dataclasses.asdict(SMALL), "token_budget": budget},
            "model": "m",
            "train": "t",
            "heldout": "h",
            "plugins": [],
            "code": "c",
            "precision": "bf16 autocast",
        },
    }


IDS = [f"heldout/{lv}/{i}" for lv in ("add1", "mul1") for i in range(2)]
LEVEL = level_lookup({i: i.split("/")[1] for i in IDS})


def test_paired_t_and_power_closed_forms():
    base = {i: 0.5 for i in IDS}
    runs = [_fake_run("GRPO", s, base) for s in range(3)]
    runs += [_fake_run("AVSPO", s, {i: 0.5 + d for i in IDS}) for s, d in enumerate([0.0, 0.25, 0.5])]
    c = paired_t(runs, "AVSPO", "GRPO", LEVEL)
    assert c["seeds"] == 3 and c["diff"] == pytest.approx(0.25) and c["sd"] == pytest.approx(0.25)
    half = stats.t_quantile(0.975, 2) * 0.25 / math.sqrt(3)  # t(0.975, 2) = 4.303
    assert c["halfwidth"] == pytest.approx(half) and c["ci95"] == pytest.approx([0.25 - half, 0.25 + half])
    assert c["p_sign_flip"] == pytest.approx(4 / 8)  # d = (0, .25, .5): |sum| = .75 when .25 and .5 share a sign
    assert (
        paired_t(runs, "GRPO", "GRPO", LEVEL) is None and paired_t(runs[:1] + runs[3:4], "AVSPO", "GRPO", LEVEL) is None
    )
    # paired sd 5.5 points (the CPU study's): 16 seeds for a half-width of 3 points, 32 for 2 (with the t
    # quantile; the normal's 1.96 would say 29); the study plans for sd 7: 24 seeds
    assert seeds_for_halfwidth(0.055, 0.03) == 16 and seeds_for_halfwidth(0.055, 0.02) == 32
    assert seeds_for_halfwidth(0.07, 0.03) == 24
    assert stats.t_quantile(0.975, 14) * 0.055 / math.sqrt(15) > 0.03


def test_each_level_weighs_the_same_in_the_paired_difference():
    """A level with 1 problem and one with 3: the per-seed difference is the mean of the two levels'."""
    ids = ["heldout/add1/0", "heldout/mul1/0", "heldout/mul1/1", "heldout/mul1/2"]
    a = [_fake_run("AVSPO", s, {"heldout/add1/0": 1.0, **{i: 0.0 for i in ids[1:]}}) for s in range(2)]
    b = [_fake_run("GRPO", s, {i: 0.0 for i in ids}) for s in range(2)]
    rows = [{"unique_id": i, "level": i.split("/")[1]} for i in ids]
    level = level_lookup(levels_by_id(rows))
    assert per_seed_diffs(a + b, "AVSPO", "GRPO", level) == {0: 0.5, 1: 0.5}  # not 0.25, the mean over problems
    assert a[0]["heldout_pass1"] == loop.level_mean(a[0]["per_problem"], rows) == 0.5  # the runs' own rule
    # a run scored on problems the report does not hold is named, not paired under a wrong level
    other = [_fake_run(m, s, {"other/7": 1.0}) for m in ("AVSPO", "GRPO") for s in range(2)]
    with pytest.raises(StudyError, match="'other/7'.*another held-out set"):
        per_seed_diffs(other, "AVSPO", "GRPO", level)


def test_sign_flip_p_is_exact_beyond_twenty_pairs():
    rng = torch.Generator().manual_seed(0)
    for n in (1, 2, 7, 12):  # against the enumeration of every pattern
        d = (torch.rand(n, generator=rng) - 0.4).tolist()
        signs = torch.tensor([[1 - 2 * ((m >> j) & 1) for j in range(n)] for m in range(2**n)], dtype=torch.float64)
        brute = float(((signs @ torch.tensor(d, dtype=torch.float64)).abs() >= abs(sum(d)) - 1e-12).double().mean())
        assert stats.sign_flip_p(d) == pytest.approx(brute, abs=1e-15)
    assert stats.sign_flip_p([0.01] * 29) == 2 / 2**29  # all one way: only the two extreme patterns reach it


@pytest.mark.slow
def test_sign_flip_p_beyond_forty_pairs_draws_patterns_and_agrees_with_the_exact_one():
    """Beyond 40 pairs the exact count would hold 2 x 2^21 sums: 2^20 random patterns instead, a valid
    permutation p ((1 + reaching) / (1 + draws)); at 40 pairs it agrees with the exact p."""
    rng = torch.Generator().manual_seed(1)
    d = (torch.randn(40, generator=rng) * 0.07 + 0.02).tolist()
    exact = stats.sign_flip_p(d)
    drawn = stats._sign_flip_p_drawn(np.asarray(d), abs(sum(d)) - 1e-12, seed=0)
    se = math.sqrt(exact * (1 - exact) / stats.SIGN_FLIP_DRAWS)
    assert 0.01 < exact < 0.99 and abs(drawn - exact) < 4 * se + 1e-6
    more = d + [0.03, -0.01, 0.05]
    p = stats.sign_flip_p(more)
    assert p == stats.sign_flip_p(more) and 0 < p < 1  # seeded: the same p for the same differences
    assert stats.sign_flip_p([0.01] * 48) == 1 / (1 + stats.SIGN_FLIP_DRAWS)  # nothing drawn reaches it


def _study(**kw) -> GPURemediesStudy:
    base = dict(
        levels=("add1", "mul1"),
        train_prompts=8,
        heldout_per_level=6,
        validation_per_level=2,
        settings=SMALL,
        arms={
            "GRPO": ARMS["GRPO"],
            "AVSPO": ARMS["AVSPO"],
            "DAPO-DS": ARMS["DAPO-DS"],
            "random-reward": ARMS["random-reward"],
        },
        seeds={"GRPO": 3, "AVSPO": 3, "DAPO-DS": 2, "random-reward": 1},
        primary=("GRPO", "AVSPO", "DAPO-DS"),
        pilot={"GRPO": 2, "AVSPO": 2},
    )
    return GPURemediesStudy(**{**base, **kw})


def test_the_run_order_is_primary_arms_seed_by_seed_then_the_rest():
    st = _study()
    assert st.order(list(st.arms), None) == [
        ("GRPO", 0),
        ("AVSPO", 0),
        ("DAPO-DS", 0),
        ("GRPO", 1),
        ("AVSPO", 1),
        ("DAPO-DS", 1),
        ("GRPO", 2),
        ("AVSPO", 2),
        ("random-reward", 0),
    ]
    assert st.order(list(st.arms), None, pilot=True) == [("GRPO", 0), ("AVSPO", 0), ("GRPO", 1), ("AVSPO", 1)]
    with pytest.raises(ValueError, match="NGRPO"):
        _study(primary=("GRPO", "NGRPO"))


@pytest.mark.slow
def test_the_report_is_generated_from_the_runs(tmp_path):
    mid = [
        {"milestone": 500, "step": 5, "tokens": 510, "pass1": 0.3},
        {"milestone": 1000, "step": 10, "tokens": 1010, "pass1": 0.6},
    ]
    runs = [_fake_run("GRPO", s, {i: 0.5 for i in IDS}, mid) for s in range(3)]
    runs += [_fake_run("AVSPO", s, {i: 0.75 for i in IDS}, mid[:1]) for s in range(3)]
    st = _study()
    for r in runs:
        st.publish_run(r, tmp_path / "pub")
    collected = st.collect(tmp_path / "none", tmp_path / "pub")
    assert sorted((r["method"], r["seed"]) for r in collected) == sorted((r["method"], r["seed"]) for r in runs)
    assert {r["seed"]: r["per_problem"] for r in collected if r["method"] == "AVSPO"}[0] == {i: 0.75 for i in IDS}
    text = st.report(collected, tmp_path / "pub")
    # Holm over AVSPO and DAPO-DS (no runs: p = 1): AVSPO's p 2/8 ranks first, x 2; its interval at 1 - 0.05 / 2
    assert "| AVSPO | 3 (3) | 75.0 ± 0.0 | 10.0 ± 0.0 | +25.0 [+25.0, +25.0] at 97.5 % (3) | 0.500 |" in text
    # tokens to target: the tokens generated when the evaluation that reached it ran (1,010, not its milestone
    # 1,000), a censored median over every seed (AVSPO never reached 50 %: beyond the budget)
    assert "| GRPO | 10.0 ± 0.0 | 1,000 ± 0 | - | 1,010 (3/3) |" in text and "> 1,000 (0/3)" in text
    assert "NVIDIA H100 80GB HBM3 (6 runs)" in text and "StudySettings hash h1" in text
    summary = json.loads((tmp_path / "pub" / "results.json").read_text())["summary"]
    assert summary["AVSPO"]["vs_GRPO"]["seeds"] == 3 and (tmp_path / "pub" / "accuracy_vs_tokens.png").exists()


def _study_cmd(*args: str, cwd: Path) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, str(REPO / "experiments" / "remedies_gpu" / "run.py"), *args],
        cwd=cwd,
        capture_output=True,
        text=True,
        timeout=120,
        env={**os.environ, **ENV},
    )


@pytest.mark.slow
def test_the_study_command_checks_its_runs_and_fails_fast_on_a_mistake(tmp_path):
    r = _study_cmd("--dry-run", "--out", str(tmp_path / "o"), "--shard", "1/4", cwd=tmp_path)
    assert r.returncode == 0, r.stderr
    # 4 x 37 primary runs + 48 others, every 4th from the second: 49; seed by seed over the four primary arms,
    # so this shard's primary runs are AVSPO's
    assert "49 runs to start (shard 1/4, 0 finished): AVSPO seed 0, AVSPO seed 1, AVSPO seed 2, " in r.stdout
    r = _study_cmd("--dry-run", "--pilot", "--ckpt-every", "0", "--out", str(tmp_path / "o"), cwd=tmp_path)
    assert "12 runs to start" in r.stdout, r.stderr  # no checkpoints: a call whose runs all finish in it
    for args, msg in [
        (("--shard", "4/4"), "--shard"),
        (("--k", "0"), "--k must be"),
        (("--model", str(tmp_path)), "--model"),
        (("--train", "nope.jsonl"), "--train: no such file"),
        (("--budget", "0"), "token_budget"),
        (("--ckpt-every", "-1"), "ckpt_every"),
    ]:
        r = _study_cmd("--dry-run", "--out", str(tmp_path / "o"), *args, cwd=tmp_path)
        assert r.returncode == 2 and msg in r.stderr, (args, r.stderr)


@pytest.mark.slow
def test_the_slurm_array_script_runs_its_share(tmp_path):
    env = {
        **os.environ,
        "SLURM_ARRAY_TASK_ID": "2",
        "SLURM_ARRAY_TASK_COUNT": "8",
        "AVSPO_OUT": str(tmp_path / "o"),
        "AVSPO_PUBLISH": str(tmp_path / "pub"),
        "AVSPO_PYTHON": sys.executable,
    }
    env.pop("SLURM_JOB_ID", None)
    script = str(REPO / "launch_scripts" / "slurm" / "remedies_study.sbatch")
    r = subprocess.run(["bash", script, "--dry-run"], env=env, capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr
    # 196 runs, every 8th from the third: seed by seed over four primary arms, this share's primary runs are sign's
    assert "25 runs to start (shard 2/8, 0 finished): sign seed 0, sign seed 2, " in r.stdout


@pytest.mark.slow
def test_the_study_needs_no_ray_vllm_deepspeed_or_openrlhf():
    """A bare GPU machine with torch and transformers runs the study as a user's GPU does."""
    code = (
        "import sys; import avspo_openrlhf.study.remedies_gpu, avspo_openrlhf.study.scheduler, "
        "avspo_openrlhf.cpu.models; "
        "print(sorted(m for m in ('openrlhf', 'ray', 'vllm', 'deepspeed', 'trl', 'verl') if m in sys.modules))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0 and out.stdout.strip() == "[]", out.stderr


def test_an_empty_study_reports_the_runs_missing(tmp_path):
    text = _study().report([], tmp_path)
    assert "No run has finished yet" in text and "Incomplete: no verdict yet" in text
    assert "GRPO 3 of 3, AVSPO 3 of 3, DAPO-DS 2 of 2" in text and "random-reward 1 of 1" in text


@pytest.mark.slow
def test_the_throughput_table_measures_k_runs_at_once(assets, tmp_path):
    r = _study_cmd(
        "--throughput",
        "1,2",
        "--throughput-budget",
        "60",
        "--model",
        assets["model"],
        "--out",
        str(tmp_path / "o"),
        "--publish",
        str(tmp_path / "pub"),
        cwd=tmp_path,
    )
    assert r.returncode == 0, r.stderr + r.stdout
    rows = json.loads((tmp_path / "pub" / "throughput.json").read_text())
    assert [x["k"] for x in rows] == [1, 2] and all(x["tokens"] >= 60 * x["k"] for x in rows)
    assert all(x["runs_per_hour"] == pytest.approx(3600 * x["tokens_per_s"] / 64_000) for x in rows)
    assert "| 2 |" in (tmp_path / "pub" / "throughput.md").read_text() and "cores" in rows[0]["device"]


def test_no_run_starts_after_the_time_given(assets, tmp_path):
    log = []
    jobs = [Job(spec(assets, token_budget=40), tmp_path / "a")]
    assert run_jobs(jobs, 1, threads=1, env=ENV, log=log.append, start_until=time.monotonic() - 1) == []
    assert not jobs[0].done() and "no new run after the time given: 1 left" in log[0]


def test_a_launch_starts_only_when_it_is_expected_to_end_by_the_time_given():
    """--finish-by: a launch is expected to take as long as the longest one so far (or --batch-minutes
    before any ended); it starts only if it would end in time, so a slot's runs finish, not get cut."""
    from avspo_openrlhf.study.scheduler import Deadline

    now = time.monotonic()
    assert Deadline(finish_by=now + 600).why_not() is None  # nothing known: the first starts
    assert "more than is left" in Deadline(finish_by=now + 600, first_s=900).why_not()
    d = Deadline(finish_by=now + 600, first_s=60)
    assert d.why_not() is None
    d.ended(700)  # the first launch took longer than estimated: the estimate follows it
    assert "~11.7 min" in d.why_not()
    assert "no new run" in Deadline(start_until=now - 1).why_not()


def test_the_bf16_autocast_path_the_gpu_takes_runs_here(assets, tmp_path):
    """The GPU's precision (fp32 weights, bf16 autocast), exercised on the CPU: generation, the
    training forward and RL-ZVP's entropies under autocast give finite losses."""
    res = loop.run(
        spec(assets, "RL-ZVP", dtype="bf16", token_budget=60, mid_eval_tokens=0), tmp_path / "r", log=lambda _: None
    )
    assert res["precision"] == {"weights": "fp32", "compute": "bf16 autocast"}
    assert all(math.isfinite(c["loss"]) and math.isfinite(c["token_adv_abs_mean"]) for c in res["curve"])


def test_the_task_rewards():
    arith = loop.reward_function("arith")
    assert arith(["so 3 + 4 = \\boxed{7}", "it is 8", "no idea"], ["7", "7", "7"]) == [1.0, 0.0, 0.0]
    math_ = loop.reward_function("math")  # math-verify, in the pool of verifier processes
    assert math_(["so \\boxed{\\frac{1}{2}}", "\\boxed{3}"], ["0.5", "4"]) == [1.0, 0.0]
    assert loop.reward_function("study_reward:parity")(["ab", "abc"], ["1", "1"]) == [1.0, 0.0]
