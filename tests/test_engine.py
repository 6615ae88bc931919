"""The stacked engine (``study/engine.py``) on the CPU with the tiny random model, fp32: for every arm,
K runs advanced together equal each run advanced alone (the same sampled tokens, rewards and
advantages; losses within rounding), a killed batch resumes to the results it would have had, and a
failing run leaves the others to finish."""

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

import pytest
from helpers import small_study

from avspo_openrlhf.data.io import write_jsonl
from avspo_openrlhf.study.engine import StackedEngine
from avspo_openrlhf.study.loop import Arm, RunSpec
from avspo_openrlhf.study.scheduler import Job, run_jobs

pytest.importorskip("transformers")
TESTS = Path(__file__).resolve().parent
ENV = {"PYTHONPATH": os.pathsep.join([str(TESTS), os.environ.get("PYTHONPATH", "")])}

ARMS = {  # every arm family of the study, its controls included
    "GRPO": Arm("grpo"),
    "AVSPO": Arm("avspo", {"strategy": "stratified"}),
    "sign": Arm("sign"),
    "RL-ZVP": Arm("rl_zvp", {"std_convention": "population", "eps": 1e-6}),
    "DAPO-DS": Arm("grpo", dynamic=True),
    "GRESO": Arm("grpo", dynamic=True, greso={}),
    "NGRPO": Arm("ngrpo"),
    "random-sign": Arm("grpo", control="random_sign"),
    "coin-reward": Arm("grpo", reward="random"),
    "GRPO@2e-3": Arm("grpo", lr=2e-3),
}
SMALL = small_study(token_budget=160, reward="study_reward:half_collapsed", engine="stacked")


@pytest.fixture(scope="module")
def assets(study_assets):
    return study_assets


pytestmark = pytest.mark.usefixtures("study_rewards")


def spec(assets, method: str, seed: int, **settings) -> RunSpec:
    return RunSpec(
        method=method,
        seed=seed,
        arm=ARMS[method],
        settings=dataclasses.replace(SMALL, **settings),
        model=assets["model"],
        train=assets["train"],
        heldout=assets["heldout"],
    )


EXACT = {
    "step",
    "tokens",
    "step_tokens",
    "rounds",
    "groups_generated",
    "groups_trained",
    "groups_signal",
    "reward",
    "task_reward",
    "acr",
    "acr_all_wrong",
    "acr_all_right",
    "acr_effective",
    "gate_open",
    "acr_generated",
    "truncation_rate",
    "completion_tokens_mean",
    "update_skipped",
}


def same_run(a: dict, b: dict) -> None:
    """Two records of one run: what was sampled and scored exactly equal, the update's numbers within
    float rounding (the batch's shapes differ with its companions)."""
    assert (a["steps"], a["generated_tokens"], a["per_problem"], a["mid_evals"]) == (
        b["steps"],
        b["generated_tokens"],
        b["per_problem"],
        b["mid_evals"],
    )
    for ra, rb in zip(a["curve"], b["curve"], strict=True):
        for key, va in ra.items():
            if key == "wall_s":
                continue
            if key in EXACT or not isinstance(va, float) or math.isnan(va):
                assert va == rb[key] or (va != va and rb[key] != rb[key]), (key, va, rb[key])
            else:
                assert va == pytest.approx(rb[key], rel=1e-4, abs=1e-6), (key, va, rb[key])


def test_k_runs_together_equal_each_run_alone_for_every_arm(assets, tmp_path):
    specs = [spec(assets, m, seed) for seed, m in enumerate(ARMS)]
    together = StackedEngine(specs, [tmp_path / "together" / s.method for s in specs], log=lambda _: None).run()
    assert sorted(together) == list(range(len(specs)))
    for k, s in enumerate(specs):
        alone = StackedEngine([s], [tmp_path / "alone" / s.method], log=lambda _: None).run()[0]
        same_run(together[k], alone)
    by = {s.method: together[k] for k, s in enumerate(specs)}
    assert all(r["generated_tokens"] >= 160 for r in by.values())  # every run to its budget
    assert any(c["rounds"] > 1 for c in by["DAPO-DS"]["curve"])  # DS refilled while the others waited
    # token advantages from the batched forward (odd answers collapse all-wrong: some step holds one)
    assert any(c.get("token_adv_abs_mean", 0) > 0 for c in by["RL-ZVP"]["curve"])
    assert by["GRPO@2e-3"]["lr"] == 2e-3 and by["GRPO"]["lr"] == 1e-3
    assert by["GRPO"]["engine"] == "stacked"


def _engine(pairs: list[tuple[RunSpec, Path]], env: dict) -> subprocess.Popen:
    cmd = [sys.executable, "-m", "avspo_openrlhf.study.engine", "--threads", "1"]
    for s, d in pairs:
        d.mkdir(parents=True, exist_ok=True)
        (d / "request.json").write_text(s.to_json())
        cmd += [str(d / "request.json"), str(d)]
    return subprocess.Popen(
        cmd, env={**os.environ, **ENV, **env}, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True
    )


def test_a_killed_batch_resumes_to_the_results_it_would_have_had(assets, tmp_path):
    specs = [
        spec(assets, m, seed, reward="study_reward:parity_then_hang", ckpt_every=1, token_budget=300, mid_eval_tokens=0)
        for seed, m in enumerate(("AVSPO", "DAPO-DS"))
    ]
    whole = _engine([(s, tmp_path / "whole" / s.method) for s in specs], {})
    assert whole.wait(timeout=300) == 0, whole.stdout.read()
    hung = tmp_path / "hung"
    pairs = [(s, tmp_path / "killed" / s.method) for s in specs]
    # the first lockstep step scores at most 8 + 4 x 8 completions (AVSPO, DAPO-DS's four rounds): the
    # 41st call is in the second step, after both runs' first checkpoint, long before either ends
    proc = _engine(pairs, {"STUDY_TEST_HANG_AT": "41", "STUDY_TEST_HUNG_FILE": str(hung)})
    deadline = time.monotonic() + 300
    while not hung.exists():
        assert proc.poll() is None and time.monotonic() < deadline, proc.stdout.read() if proc.poll() else "no hang"
        time.sleep(0.05)
    # the first checkpoints are written in the background while the second step runs: on disk before the kill
    while not all((d / "ckpt.pt").exists() for _, d in pairs):
        assert time.monotonic() < deadline, "the first checkpoints were never written"
        time.sleep(0.05)
    proc.send_signal(signal.SIGKILL)
    proc.wait(timeout=30)
    assert not any((d / "result.json").exists() for _, d in pairs)
    again = _engine(pairs, {})
    out, _ = again.communicate(timeout=300)
    assert again.returncode == 0 and "resumed at step" in out, out
    for s in specs:
        a = json.loads((tmp_path / "whole" / s.method / "result.json").read_text())
        b = json.loads((tmp_path / "killed" / s.method / "result.json").read_text())
        assert b["resumed"] == 1 and a["resumed"] == 0
        same_run(a, b)


def test_a_failing_run_leaves_the_others_to_finish(assets, tmp_path):
    """One run's verifier crashes mid-run (its data holds a problem it cannot score): its traceback goes
    to its log.txt, it leaves the batch, and the others finish."""
    bad_train = tmp_path / "bad_train.jsonl"
    write_jsonl([{"problem": "What is 990 + 9?", "answer": "999", "unique_id": "bad/0"}] * 8, str(bad_train))
    good = {"reward": "study_reward:explode_on_999"}
    bad = dataclasses.replace(spec(assets, "AVSPO", 1, **good), train=str(bad_train))
    jobs = [
        Job(spec(assets, "GRPO", 0, **good), tmp_path / "GRPO_seed0"),
        Job(bad, tmp_path / "AVSPO_seed1"),
        Job(spec(assets, "sign", 2, **good), tmp_path / "sign_seed2"),
    ]
    log = []
    failed = run_jobs(jobs, 3, threads=1, env=ENV, log=log.append, engine="stacked")
    assert failed == ["AVSPO_seed1"] and jobs[0].done() and jobs[2].done()
    assert "the verifier crashed on answer 999" in (tmp_path / "AVSPO_seed1" / "log.txt").read_text()
    assert any("started a batch of 3 (stacked)" in line for line in log)


def test_a_crashed_batch_names_the_file_that_holds_its_traceback(assets, tmp_path):
    """A crash of the engine's process outside any run (here a bad thread count; on an H200 a device
    mix in the optimizer) leaves no run log.txt: the message names batch.log, which holds it."""
    job = Job(spec(assets, "GRPO", 0), tmp_path / "GRPO_seed0")
    log = []
    assert run_jobs([job], 1, threads=-1, env=ENV, log=log.append, engine="stacked") == ["GRPO_seed0"]
    (line,) = [x for x in log if "failed" in x]
    named = line.split("see ", 1)[1].split(" and ")
    assert all(Path(p).is_file() for p in named) and any(p.endswith("batch.log") for p in named)
    assert "Traceback" in "".join(Path(p).read_text() for p in named)


def test_the_runs_of_one_batch_share_model_and_settings(assets, tmp_path):
    with pytest.raises(ValueError, match="share the model and the settings"):
        StackedEngine(
            [spec(assets, "GRPO", 0), spec(assets, "GRPO", 1, token_budget=80)], [tmp_path / "a", tmp_path / "b"]
        )
    with pytest.raises(ValueError, match="process engine"):
        StackedEngine([spec(assets, "GRPO", 0, engine="process")], [tmp_path / "c"])


def test_whole_runs_of_the_two_engines_agree_within_their_seed_spread(assets, tmp_path):
    """The engines draw different random numbers (multinomial against inverse-CDF draws), so runs of
    one seed differ; over seeds, each arm's mean training reward and held-out pass@1 agree within the
    seed-to-seed spread (a difference of means below three standard errors)."""
    import statistics

    for method in ("GRPO", "DAPO-DS"):
        got = {}
        for engine in ("process", "stacked"):
            specs = [
                spec(assets, method, seed, engine=engine, mid_eval_tokens=0, token_budget=240) for seed in range(6)
            ]
            dirs = [tmp_path / engine / f"{method}_seed{s.seed}" for s in specs]
            if engine == "stacked":
                res = list(StackedEngine(specs, dirs, log=lambda _: None).run().values())
            else:
                from avspo_openrlhf.study import loop

                res = [loop.run(s, d, log=lambda _: None) for s, d in zip(specs, dirs)]
            got[engine] = [
                (statistics.mean(c["task_reward"] for c in r["curve"] if c["groups_trained"]), r["heldout_pass1"])
                for r in res
            ]
        for i in range(2):
            a, b = [x[i] for x in got["process"]], [x[i] for x in got["stacked"]]
            se = math.sqrt(statistics.variance(a) / len(a) + statistics.variance(b) / len(b))
            assert abs(statistics.mean(a) - statistics.mean(b)) <= 3 * se + 1e-9, (method, i, a, b)
