"""The statistics of the studies and the quickstart (``avspo_openrlhf.stats``), the tables' ±
convention, the ACR-vs-accuracy relation (``study.acr``) and the collapse study's report, on
closed-form inputs."""

from __future__ import annotations

import json
import math
import statistics

import numpy as np
import pytest

from avspo_openrlhf import stats
from avspo_openrlhf.study import acr, tables
from avspo_openrlhf.study.collapse import CollapseStudy


@pytest.mark.parametrize("df", [1, 2, 3, 7, 30])
def test_t_quantile_against_closed_forms_and_the_textbook_table(df):
    # df 1 is Cauchy: tan(pi (p - 1/2)); df 2: (2p - 1) sqrt(2 / (4 p (1 - p)))
    for p in (0.6, 0.9, 0.975, 0.995):
        q = stats.t_quantile(p, df)
        assert stats.t_cdf(q, df) == pytest.approx(p, abs=1e-12)
        assert stats.t_quantile(1 - p, df) == pytest.approx(-q, abs=1e-10)
        if df == 1:
            assert q == pytest.approx(math.tan(math.pi * (p - 0.5)), rel=1e-10)
        if df == 2:
            assert q == pytest.approx((2 * p - 1) * math.sqrt(2 / (4 * p * (1 - p))), rel=1e-10)
    table = {1: 12.706, 2: 4.303, 3: 3.182, 7: 2.365, 30: 2.042}  # 0.975 quantiles, 3 decimals
    assert round(stats.t_quantile(0.975, df), 3) == table[df]


def test_t_quantile_tends_to_the_normal_and_refuses_a_probability_outside_0_1():
    assert stats.t_quantile(0.975, 1e7) == pytest.approx(statistics.NormalDist().inv_cdf(0.975), abs=1e-6)
    with pytest.raises(ValueError, match="p must be in"):
        stats.t_quantile(1.0, 3)


def test_t_interval_closed_form():
    mean, sd, lo, hi = stats.t_interval([1.0, 2.0, 3.0])  # sd 1, df 2
    q = 2 * 0.975 - 1
    half = q * math.sqrt(2 / (4 * 0.975 * 0.025)) / math.sqrt(3)
    assert (mean, sd) == (2.0, 1.0) and lo == pytest.approx(2 - half) and hi == pytest.approx(2 + half)
    with pytest.raises(ValueError, match="needs 2 values"):
        stats.t_interval([1.0])


def test_t_halfwidth_closed_form():
    # one run's evaluation interval: per-problem accuracies 0, 1/2, 1 (sd 1/2, df 2) and 1, 0 (sd sqrt(1/2), df 1)
    p = 0.975
    assert stats.t_halfwidth([0.0, 0.5, 1.0]) == pytest.approx(
        (2 * p - 1) * math.sqrt(2 / (4 * p * (1 - p))) * 0.5 / math.sqrt(3), rel=1e-10
    )
    assert stats.t_halfwidth([1.0, 0.0]) == pytest.approx(
        math.tan(math.pi * (p - 0.5)) * math.sqrt(0.5) / math.sqrt(2), rel=1e-10
    )
    # the interval t_interval reports is mean +- this half-width
    mean, _, lo, hi = stats.t_interval([0.25, 0.5, 1.0, 1.0], level=0.9)
    half = stats.t_halfwidth([0.25, 0.5, 1.0, 1.0], level=0.9)
    assert (lo, hi) == pytest.approx((mean - half, mean + half))
    # hundreds of problems: about the normal interval's 1.96 sd / sqrt(P)
    xs = [1.0, 0.0] * 600
    normal = 1.96 * statistics.stdev(xs) / math.sqrt(1200)
    assert normal < stats.t_halfwidth(xs) < 1.002 * normal
    with pytest.raises(ValueError, match="needs 2 values"):
        stats.t_halfwidth([1.0])


def test_sign_flip_p_is_exact():
    assert stats.sign_flip_p([0.1, 0.2, 0.3]) == 2 / 8  # all positive: only all-+ and all-- reach |0.6|
    assert stats.sign_flip_p([1, 1, 1, 1, 1]) == 2 / 32  # the smallest p five seeds allow
    assert stats.sign_flip_p([0.3, -0.1, 0.1]) == 6 / 8  # |sum| >= 0.3 for all but (+, -, -), (-, +, +)
    assert stats.sign_flip_p([0.0, 0.0]) == 1.0 and math.isnan(stats.sign_flip_p([]))
    assert stats.sign_flip_p([1.0] * 21) == 2 / 2**21  # past 20 pairs still exact (tests/test_study_loop.py)
    # beyond 40 pairs: drawn sign patterns (tests/test_study_loop.py), a valid p of at least 1 / (1 + draws)
    assert stats.sign_flip_p([1.0] * 41) == 1 / (1 + stats.SIGN_FLIP_DRAWS)


def test_bootstrap_of_a_constant_difference_has_zero_width():
    rng = np.random.default_rng(0)
    for d in ([[0.25] * 7], [[0.25] * 7] * 3):  # problems only; seeds and problems
        mean, lo, hi, p = stats.bootstrap_mean(d, rng, n_boot=500)
        assert mean == lo == hi == pytest.approx(0.25) and p == 0.0
    assert all(math.isnan(v) for v in stats.bootstrap_mean(np.zeros((0, 0)), rng))


def test_bootstrap_interval_covers_the_mean_and_resamples_seeds():
    """Seeds that disagree (+0.5 and -0.5 on every problem) give an interval as wide as the seeds
    apart, a constant problem spread within each seed nothing more; p is two-sided."""
    d = [[0.5] * 10, [-0.5] * 10]
    mean, lo, hi, p = stats.bootstrap_mean(d, np.random.default_rng(0), n_boot=2000)
    assert mean == 0 and lo == -0.5 and hi == 0.5 and p == 1.0


def test_bootstrap_gain_per_level_from_records():
    def recs(rows):
        return [
            {"unique_id": f"{lv}/{i}", "level": lv, "correct": c}  # noqa: E731
            for lv, cs in rows.items()
            for i, c in enumerate(cs)
        ]

    before = recs({"add1": [[0, 0]] * 4, "mul1": [[1, 0]] * 4})
    after = recs({"add1": [[1, 1]] * 4, "mul1": [[1, 0]] * 4})
    g = stats.bootstrap_gain(before, after)
    assert list(g) == ["all", "add1", "mul1"]  # the levels in the order the records name them
    assert g["add1"] == (1.0, 1.0, 1.0) and g["mul1"] == (0.0, 0.0, 0.0) and g["all"][0] == 0.5


def test_pearson_closed_form():
    # x = 1..4, y = 1, 3, 2, 4: Sxy = 4, Sxx = Syy = 5, r = 0.8; df 2: p = 1 - |t| / sqrt(2 + t^2) = 0.2
    c = stats.pearson([1, 2, 3, 4], [1, 3, 2, 4])
    half = statistics.NormalDist().inv_cdf(0.975)  # n - 3 = 1
    assert c["n"] == 4 and c["r"] == pytest.approx(0.8) and c["r2"] == pytest.approx(0.64)
    assert c["p"] == pytest.approx(0.2)
    assert c["ci95"] == pytest.approx([math.tanh(math.atanh(0.8) - half), math.tanh(math.atanh(0.8) + half)])
    line = stats.pearson([1, 2, 3, 4, 5], [10, 8, 6, 4, 2])
    assert line["r"] == pytest.approx(-1) and line["ci95"] == [line["r"], line["r"]] and line["p"] == 0
    assert stats.pearson([1, 2, 3], [1, 1, 1])["r"] is None  # a constant has no correlation
    assert stats.pearson([1, 2, 3], [1, 3, 2])["ci95"] is None  # three pairs: r, no interval
    assert stats.pearson([1, 2, 3, 4], [1, 3, 2, 4], centred_groups=2)["ci95"] is None  # one df fewer


def test_pearson_is_the_same_bit_for_bit_in_any_order_of_the_pairs():
    """Exactly rounded sums: r depends neither on the order of the pairs nor on the machine (a BLAS
    dot product's summation order follows the CPU's vector width; a published r differed in its last
    digit between an AVX2 and an AVX-512 machine)."""
    rng = np.random.default_rng(0)
    x, y = rng.random(37), rng.random(37)
    ref = stats.pearson(x.tolist(), y.tolist())
    for _ in range(20):
        order = rng.permutation(37)
        assert stats.pearson(x[order].tolist(), y[order].tolist()) == ref


def _run(method, seed, curve, accuracy):
    return {
        "method": method,
        "seed": seed,
        "steps": len(curve),
        "acr_raw": statistics.mean(curve),
        "curve": [{"acr": a} for a in curve],
        "heldout_pass1": accuracy,
    }


def test_early_acr_windows():
    r = _run("GRPO", 0, [1.0] * 10 + [0.0] * 20, 0.5)  # 30 steps: first third = first 10
    assert [acr.window_acr(r, w) for w in acr.WINDOWS] == [1.0, 1.0, pytest.approx(1 / 3)]
    r = _run("GRPO", 0, [0.0, 0.0, 1.0, 1.0, 1.0, 1.0, 1.0], 0.5)  # 7 steps: first third = first 3 (rounded up)
    assert acr.window_acr(r, "first_third") == pytest.approx(1 / 3) and acr.window_acr(r, "first_10_steps") == 5 / 7
    flat = {"method": "GRPO", "seed": 0, "steps": 10, "acr_raw": 0.25, "heldout_pass1": 0.5}  # no curve kept
    assert [acr.window_acr(flat, w) for w in acr.WINDOWS] == [0.25, None, 0.25]


def test_acr_relation_within_method_pooled_and_centred():
    """Two methods whose runs lie on lines of slope -1 (ACR up 0.1, accuracy down 0.1) at different
    levels: r = -1 within each and centred; pooled, the methods' offset decides. A method whose
    trained ACR is 0 in every run (dynamic sampling) is left out, and says so."""
    acc = [0.9, 0.8, 0.7, 0.6]
    runs = [_run("A", s, [0.1 * s] * 12, acc[s]) for s in range(4)]
    runs += [_run("B", s, [0.1 * s + 0.5] * 12, acc[s] + 0.05) for s in range(4)]
    runs += [_run("DS", s, [0.0] * 12, 0.7) for s in range(4)]
    rel = acr.relation([acr.Sample("toy", runs, "heldout_pass1")])
    (sample,) = rel["samples"]
    assert sample["excluded_methods"] == ["DS"]
    g = {row["group"]: row for row in sample["groups"]}
    assert set(g) == {"A", "B", "pooled", "pooled, centred within method"}
    for name in ("A", "B", "pooled, centred within method"):
        for w in acr.WINDOWS:
            assert g[name][w]["r"] == pytest.approx(-1.0)
    x = [0.1 * s for s in range(4)] + [0.1 * s + 0.5 for s in range(4)]
    y = acc + [a + 0.05 for a in acc]
    assert g["pooled"]["first_10_steps"]["r"] == pytest.approx(np.corrcoef(x, y)[0, 1])
    assert g["pooled"]["whole_run"]["n"] == 8 and g["A"]["runs"] == 4
    text = acr.markdown(rel)
    assert "left out, their trained-batch ACR being 0 by construction (dynamic sampling): DS" in text
    assert "| A | 12.0 | -1.00 [-1.00, -1.00], R² 1.00, p=0.00 (4) |" in text
    assert json.loads(json.dumps(rel)) == rel


def test_one_plus_minus_convention():
    assert tables.SD_NOTE == "± is the standard deviation over seeds"
    assert tables.mean_sd([0.4, 0.5, 0.9], 100) == f"60.0 ± {100 * statistics.stdev([0.4, 0.5, 0.9]):.1f}"
    assert tables.mean_sd([0.5], 100) == "50.0" and tables.mean_sd([]) == "-"


def test_collapse_report_states_its_convention_and_publishes_the_accuracy_before(tmp_path, monkeypatch):
    study = CollapseStudy(settings=["--prompts-per-step", "4", "--eval-n", "4"],
                          methods={"GRPO": ["--grpo"], "DAPO-DS": ["--grpo", "--", "--dynamic.std_filter"]},
                          heldout=60, pool_factor=3)  # fmt: skip
    monkeypatch.setattr(CollapseStudy, "plot", lambda *a: None)
    run = {"steps": 10, "acr_effective": 0.2, "reward_last5": 0.5, "wall_min": 10.0}
    runs = [
        {**run, "method": "GRPO", "seed": s, "acr_raw": a, "heldout_pass1": p, "generated_per_trained": 1.0}
        for s, a, p in [(0, 0.2, 0.40), (1, 0.2, 0.40), (2, 0.5, 0.55)]
    ]
    runs.append(
        {**run, "method": "DAPO-DS", "seed": 0, "acr_raw": 0.0, "heldout_pass1": 0.5, "generated_per_trained": 1.25}
    )
    table = study.report(runs, 0.3, tmp_path, 48)
    assert (
        "; ± is the standard deviation over seeds. Held-out pass@1 (60 problems, n=4, T=0.7) before training: 30.0 %."
        in table
    )
    # GRPO: ACR 0.2, 0.2, 0.5: sd sqrt(0.03) = 0.173 (half the range would be 0.150); accuracy sd 8.7 (not 7.5)
    assert "| GRPO | 0.300 ± 0.173 | 0.300 ± 0.173 | 0.200 ± 0.000 | 45.0 ± 8.7 |" in table
    assert "| DAPO-DS | 0.000 | 0.200 | 0.200 | 50.0 |" in table
    pub = json.loads((tmp_path / "results.json").read_text())
    assert pub["before_pass1"] == 0.3 and pub["max_new_tokens"] == 48 and pub["runs"] == runs
