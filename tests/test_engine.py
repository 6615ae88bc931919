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
import torch
from helpers import small_study

from avspo_openrlhf.data.io import read_jsonl, write_jsonl
from avspo_openrlhf.study.engine import StackedEngine
from avspo_openrlhf.study.hf_engine import HFEngine
from avspo_openrlhf.study.loop import Run
from avspo_openrlhf.study.protocol import Generate, Update
from avspo_openrlhf.study.scheduler import Job, run_jobs
from avspo_openrlhf.study.spec import Arm, RunSpec

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


@pytest.mark.slow
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


@pytest.mark.slow
def test_a_killed_batch_resumes_to_the_results_it_would_have_had(assets, tmp_path):
    specs = [
        spec(assets, m, seed, reward="study_reward:parity_then_hang", ckpt_every=1, token_budget=300, mid_eval_tokens=0)
        for seed, m in enumerate(("AVSPO", "DAPO-DS"))
    ]
    whole = _engine([(s, tmp_path / "whole" / s.method) for s in specs], {})
    out, _ = whole.communicate(timeout=300)  # read as it runs: a full pipe would stall the run
    assert whole.returncode == 0, out
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


@pytest.mark.slow
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


@pytest.mark.slow
def test_a_run_whose_generation_request_crashes_in_the_batched_call_fails_alone(assets, tmp_path):
    """A problem the engine cannot encode (template ``none``: a bare problem, and an int is no chat):
    the batched generation's per-run part raises for that run only; it leaves the batch, the others
    finish."""
    bad_train = tmp_path / "bad_train.jsonl"
    write_jsonl([{"problem": 7, "answer": "7", "unique_id": f"bad/{i}"} for i in range(8)], str(bad_train))
    bad = dataclasses.replace(spec(assets, "AVSPO", 1, template="none"), train=str(bad_train))
    jobs = [
        Job(spec(assets, "GRPO", 0, template="none"), tmp_path / "GRPO_seed0"),
        Job(bad, tmp_path / "AVSPO_seed1"),
        Job(spec(assets, "RL-ZVP", 2, template="none"), tmp_path / "RL-ZVP_seed2"),
    ]
    failed = run_jobs(jobs, 3, threads=1, env=ENV, log=lambda _: None, engine="stacked")
    assert failed == ["AVSPO_seed1"] and jobs[0].done() and jobs[2].done()
    text = (tmp_path / "AVSPO_seed1" / "log.txt").read_text()
    assert "Traceback" in text and "in _generate" in text and "'int' object is not iterable" in text
    # the report lists it: its own error, one launch so far (it resumes; a second makes it fail for good)
    from avspo_openrlhf.study.remedies_gpu import GPURemediesStudy

    (said,) = GPURemediesStudy.failures(tmp_path)["AVSPO"]
    assert said.startswith("seed 1: its own error in 1 launch(es)") and "not iterable" in said


def _requests(assets, n: int = 4, temperature: float = 0.7, batch: int = 8) -> Generate:
    problems = [r["problem"] for r in read_jsonl(assets["heldout"])]
    return Generate(problems, n, 8, temperature, seed=1234, batch=batch)


def _completions(ro) -> list[list[int]]:
    """Each row's completion tokens (up to its EOS): what was drawn, whatever the padding."""
    width_c = ro.mask.shape[1]
    return [c[m.bool()].tolist() for c, m in zip(ro.ids[:, -width_c:], ro.mask)]


def test_the_process_engine_draws_what_the_stacked_engine_draws_whatever_its_batch(assets, tmp_path):
    """Both engines draw token t of row b with uniform [b, t] of the request's seed (inverse CDF): the
    same completions for one request (fp32), and in the process engine a row's tokens do not depend
    on how many rows a generate call takes (an evaluation is several calls)."""
    stacked_engine = StackedEngine([spec(assets, "GRPO", 0)], [tmp_path / "s"], log=lambda _: None)
    process = HFEngine(spec(assets, "GRPO", 0, engine="process"), None)
    q = _requests(assets)
    ours = stacked_engine._generate({0: q})[0]
    theirs = process.serve(q)
    assert len(set(ours.texts)) > len(ours.texts) // 2  # sampled: the rows differ
    assert _completions(ours) == _completions(theirs) and ours.texts == theirs.texts
    assert torch.equal(ours.ids, theirs.ids) and torch.equal(ours.mask, theirs.mask)
    for batch in (4, 64):
        again = process.serve(dataclasses.replace(q, batch=batch))
        assert again.texts == theirs.texts and _completions(again) == _completions(theirs), batch
    # another seed, other draws
    assert process.serve(dataclasses.replace(q, seed=99)).texts != theirs.texts


def test_greedy_completions_of_both_engines_are_the_argmax_decoding(assets, tmp_path):
    """Temperature 0 is greedy in both engines: the argmax decoding of transformers' model, each
    problem's n rows the same."""
    stacked_engine = StackedEngine([spec(assets, "GRPO", 0)], [tmp_path / "s"], log=lambda _: None)
    process = HFEngine(spec(assets, "GRPO", 0, engine="process"), None)
    q = _requests(assets, n=2, temperature=0.0, batch=4)
    ours, theirs = stacked_engine._generate({0: q})[0], process.serve(q)
    policy = process.policy
    ids, attn = policy.encode(q.problems)
    ref = policy.model.generate(
        input_ids=ids,
        attention_mask=attn,
        do_sample=False,
        max_new_tokens=q.max_new_tokens,
        eos_token_id=policy.eos_ids.tolist(),
        pad_token_id=policy.tok.pad_token_id,
    )
    ref_ro = policy.rollout([(ids, attn, ref[:, ids.shape[1] :])])
    argmax = [c for c in _completions(ref_ro) for _ in range(q.n)]
    assert _completions(ours) == argmax and _completions(theirs) == argmax


def _nan_batch(assets, tmp_path, poison: bool) -> tuple[StackedEngine, dict, dict]:
    """RL-ZVP, GRPO and RL-ZVP runs' update on one batch each, run 0's final norm weight NaN (when
    ``poison``): the engine, the weights before the update, its answers."""
    specs = [spec(assets, "RL-ZVP", 0), spec(assets, "GRPO", 1), spec(assets, "RL-ZVP", 2)]
    engine = StackedEngine(specs, [tmp_path / f"{poison}{k}" for k in range(3)], log=lambda _: None)
    q = _requests(assets, batch=64)
    ros = engine._generate({k: dataclasses.replace(q, seed=k) for k in range(3)})
    g = torch.Generator().manual_seed(0)
    rows = len(ros[0].texts)
    sign = torch.tensor([1, -1, 0], dtype=torch.int8).repeat_interleave(q.n).repeat(rows // (3 * q.n) + 1)[:rows]
    if poison:
        with torch.no_grad():
            engine.params["model.norm.weight"][0] = float("nan")
    before = {n: p.detach().clone() for n, p in engine.params.items()}
    updates = {
        k: Update(ros[k], torch.randn(rows, generator=g), sign if engine.runs[k].controller.needs_entropy else None)
        for k in range(3)
    }
    return engine, before, engine._update(updates)


def test_a_non_finite_entropy_skips_that_runs_step_alone(assets, tmp_path):
    """RL-ZVP's token advantages raise on a non-finite entropy: the engines skip that run's step
    (as a non-finite gradient's, diagnosed) instead; its companions in the stacked batch update as
    they would without it."""
    engine, before, out = _nan_batch(assets, tmp_path, poison=True)
    clean, _, clean_out = _nan_batch(assets, tmp_path, poison=False)
    assert out[0]["update_skipped"] == 1 and out[0]["diagnosis"]["entropy_finite"] is False
    for name, p in engine.params.items():
        torch.testing.assert_close(p[0], before[name][0], rtol=0, atol=0, equal_nan=True)
    assert engine.opt.step_count.tolist() == [0.0, 1.0, 1.0]
    # within rounding: the CPU's backward accumulates in an order that varies from call to call (two
    # batches without NaN differ by an ulp too); a NaN let through, or a step missed, would not be close
    assert out[2]["token_adv_abs_mean"] > 0
    for k in (1, 2):
        assert out[k] == pytest.approx(clean_out[k], rel=1e-5) and out[k]["update_skipped"] == 0
        for name, p in engine.params.items():
            assert torch.allclose(p[k], clean.params[name][k], rtol=1e-5, atol=1e-7), (k, name)
            assert not torch.equal(p[k], before[name][k]), (k, name)
    # the process engine: the same run's step skipped, without raising
    run = Run(spec(assets, "RL-ZVP", 0, engine="process"), tmp_path / "process")
    ro = run.engine.serve(_requests(assets, batch=64))
    model = run.policy.model
    with torch.no_grad():
        model.model.norm.weight.fill_(float("nan"))
    weights = {n: p.detach().clone() for n, p in model.named_parameters()}
    rows = len(ro.texts)
    res = run.engine.serve(Update(ro, torch.randn(rows), torch.ones(rows, dtype=torch.int8)))
    assert res["update_skipped"] == 1 and res["diagnosis"]["entropy_finite"] is False
    assert not run.optimizer.state_dict()["state"]  # no AdamW step
    for name, p in model.named_parameters():
        torch.testing.assert_close(p, weights[name], rtol=0, atol=0, equal_nan=True)


@pytest.mark.slow
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


@pytest.mark.slow
def test_whole_runs_of_the_two_engines_agree_within_their_seed_spread(assets, tmp_path):
    """The engines draw the same random numbers the same way (inverse-CDF draws of one request's
    uniforms), but compute with different kernels (transformers and torch's AdamW against the stacked
    forward and AdamW): a rounding difference may flip a later draw, so runs of one seed can differ;
    over seeds, each arm's mean training reward and held-out pass@1 agree within the seed-to-seed
    spread (a difference of means below three standard errors)."""
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
