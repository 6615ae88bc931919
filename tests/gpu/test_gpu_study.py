"""The GPU study's two engines on CUDA (bf16 autocast), on the tiny model: the process engine's loop
and the stacked engine each train and evaluate a few steps. The stacked engine's first CUDA run (an
H200, 2026-11-28) stopped in its optimizer on a CPU/CUDA mix that no CPU test can show; the loop's
first pilot lost a seed to NaN gradients from left-padded rows (``hf_engine.training_attention_mask``)."""

from __future__ import annotations

import dataclasses

import pytest
import torch
from helpers import small_study

from avspo_openrlhf.study import loop
from avspo_openrlhf.study.scheduler import Job, run_jobs
from avspo_openrlhf.study.spec import Arm, RunSpec

pytestmark = [pytest.mark.gpu, pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")]


def _spec(assets, method: str, seed: int, arm: Arm, **settings) -> RunSpec:
    s = dataclasses.replace(small_study(token_budget=160), **settings)
    paths = {k: assets[k] for k in ("model", "train", "heldout")}
    return RunSpec(method=method, seed=seed, arm=arm, settings=s, **paths)


@pytest.mark.parametrize("engine", ["process", "stacked"])
def test_both_engines_train_on_cuda(study_assets, tmp_path, engine):
    jobs = [
        Job(_spec(study_assets, "GRPO", 0, Arm("grpo"), engine=engine), tmp_path / "GRPO_seed0"),
        Job(_spec(study_assets, "AVSPO", 0, Arm("avspo"), engine=engine), tmp_path / "AVSPO_seed0"),
    ]
    log: list[str] = []
    assert run_jobs(jobs, 2, threads=1, log=log.append, engine=engine) == [], "\n".join(log)
    for job in jobs:
        res = job.result()
        assert res["steps"] >= 2 and res["heldout_pass1"] is not None
        assert all(c["update_skipped"] == 0 for c in res["curve"]), res.get("nonfinite_steps")
        assert "bf16" in res["precision"]["compute"]


def test_left_padded_rows_give_finite_gradients_in_bf16(study_assets, tmp_path):
    run = loop.Run(_spec(study_assets, "GRPO", 0, Arm("grpo"), final_eval=False), tmp_path / "r")
    ro = run.policy.generate(["What is 2 + 3?", "What is 17 * 23 + 4 - 9?"], 4, 8, 0.7, 16)
    assert (ro.attn[:, 0] == 0).any()
    run.policy.model.zero_grad(set_to_none=True)
    lp, _ = run.policy.logprobs_entropy(ro.ids, ro.attn, ro.mask.shape[1], False, 0.7)
    (lp * ro.mask).sum().backward()
    assert all(torch.isfinite(p.grad).all() for p in run.policy.model.parameters() if p.grad is not None)


@pytest.mark.parametrize("model", ["tiny", "smollm2-shape"])
def test_the_engines_update_alike_within_bf16_rounding(study_assets, study_rewards, tmp_path, model):
    """study/engine_check.py in bf16 autocast: every arm's stacked update against its process update,
    within 2 x the process engine's own bf16-vs-fp32 difference. The JSON goes to $OUT where set (the
    device run's folder that comes back), else beside the test's other outputs."""
    import json
    import os
    from pathlib import Path

    from avspo_openrlhf.study import engine_check

    folder = study_assets["model"] if model == "tiny" else engine_check.smollm2_shape()
    arms = engine_check.every_update()
    res = engine_check.check_engines(folder, small_study(prompts_per_step=6, dtype="bf16"), arms)
    out = Path(os.environ.get("OUT") or tmp_path) / f"engine_check_{model}.json"
    out.write_text(json.dumps(res, indent=1), encoding="utf-8")
    print(engine_check.table(res))
    assert res["dtype"] == "bf16" and res["ok"], engine_check.table(res)
    assert all(r["rounding"]["dw_rel"] > 0 for r in res["arms"].values())  # bf16 did round
