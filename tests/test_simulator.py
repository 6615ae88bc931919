"""The pipeline simulator (pure Python): closed forms, staleness bounds, calibration round trip, CLI."""

import json
import random
from pathlib import Path

import pytest

from avspo_openrlhf.cli.simulate import main as simulate_main
from avspo_openrlhf.cli.simulate import predict
from avspo_openrlhf.sim import (
    Dist,
    PipelineConfig,
    Workload,
    calibrate,
    ideal_speedup,
    load_rows,
    lock_bound_speedup,
    measured_timeline,
    simulate,
    summarize,
)


def _w(g, t, s=0.0, **kw):
    return Workload(Dist.const(g), Dist.const(t), Dist.const(s), **kw)


def _intervals(res):
    ends = [s["end"] for s in res.steps]
    return [b - a for a, b in zip(ends, ends[1:])]


@pytest.mark.parametrize("g, t, s", [(2.0, 5.0, 1.0), (5.0, 2.0, 1.0), (3.0, 3.0, 0.5), (1.0, 7.0, 0.0)])
def test_sync_step_is_the_sum_of_the_phases(g, t, s):
    res = simulate(_w(g, t, s), PipelineConfig("sync"), steps=10)
    assert [st["end"] for st in res.steps] == pytest.approx([(i + 1) * (g + t + s) for i in range(10)])
    summ = res.summary()
    assert summ["step_s"] == pytest.approx(g + t + s)
    assert summ["trainer/idle_ratio"] == pytest.approx(g / (g + t + s))
    assert summ["rollouter/idle_ratio"] == pytest.approx((t + s) / (g + t + s))
    assert summ["staleness_max"] == 0


@pytest.mark.parametrize("q", [1, 2, 4])
@pytest.mark.parametrize("g, t, s", [(2.0, 5.0, 1.0), (5.0, 2.0, 1.0), (3.0, 3.0, 0.5), (1.0, 7.0, 0.0)])
def test_async_converges_to_the_slower_phase_plus_the_sync(q, g, t, s):
    res = simulate(_w(g, t, s), PipelineConfig("async", q), steps=30)
    # after the pipeline fills, every step takes max(T_gen, T_train) + T_sync (the sync holds the engine lock)
    assert _intervals(res)[q + 1 :] == pytest.approx([max(g, t) + s] * (29 - q - 1))
    assert res.summary(warmup=q + 1)["step_s"] == pytest.approx(max(g, t) + s)
    assert res.steps[0]["end"] >= g + t + s - 1e-9  # the first batch overlaps nothing (and its sync may wait)


def test_async_q1_staleness_is_one_after_the_first_step():
    res = simulate(_w(2.0, 5.0, 1.0), PipelineConfig("async", 1), steps=8)
    assert [st["staleness"] for st in res.steps] == [0] + [1] * 7
    # a fast generator runs ahead by the queue size, never more
    res = simulate(_w(1.0, 5.0, 0.0), PipelineConfig("async", 4), steps=20)
    assert max(st["staleness"] for st in res.steps) == 4


@pytest.mark.parametrize("seed", range(5))
def test_staleness_never_exceeds_queue_size_or_bound(seed):
    rng = random.Random(seed)
    w = Workload(
        Dist(tuple(rng.uniform(0.5, 4) for _ in range(20)), tail_sigma=0.8),
        Dist(tuple(rng.uniform(0.5, 4) for _ in range(20))),
        Dist.const(0.2),
    )
    for q in (1, 2, 4):
        res = simulate(w, PipelineConfig("async", q), steps=60, seed=seed)
        assert len(res.steps) == 60 and max(st["staleness"] for st in res.steps) <= q
        bounded = simulate(w, PipelineConfig("async", q, max_staleness=1), steps=60, seed=seed)
        assert len(bounded.steps) == 60 and max(st["staleness"] for st in bounded.steps) <= 1


def test_staleness_bound_rejects_batches_and_costs_throughput():
    w = _w(1.0, 4.0, 0.0)  # the generator fills a queue of 4 with batches that will be 2-4 versions old
    free = simulate(w, PipelineConfig("async", 4), steps=40)
    bound = simulate(w, PipelineConfig("async", 4, max_staleness=1), steps=40)
    assert free.rejected == 0 and bound.rejected > 0
    assert max(st["staleness"] for st in bound.steps) <= 1
    assert bound.summary()["step_s"] >= free.summary()["step_s"]


def _lock_waits(res):
    train_ends = {round(e, 9) for lane, ph, _, e in res.spans if lane == "trainer" and ph == "train"}
    return [sp for sp in res.spans if sp[:2] == ("trainer", "wait") and round(sp[2], 9) in train_ends]


def test_partial_rollout_pauses_generation_instead_of_waiting():
    g, t, s = 5.0, 2.0, 1.0
    locked = simulate(_w(g, t, s), PipelineConfig("async", 1), steps=20)
    partial = simulate(_w(g, t, s), PipelineConfig("async", 1, partial_rollout=True), steps=20)
    # without partial rollout the sync waits for the generation in progress; with it, never
    assert len(_lock_waits(locked)) >= 18 and not _lock_waits(partial)
    # and each generation is stretched by the sync that paused it: g + s per batch in steady state
    assert partial.summary(warmup=3)["step_s"] == pytest.approx(g + s)


def test_more_engines_split_the_batch_and_pay_for_stragglers():
    w = _w(8.0, 1.0, 0.0)
    assert simulate(w, PipelineConfig("sync", engines=4), steps=3).summary()["step_s"] == pytest.approx(2.0 + 1.0)
    tail = Workload(Dist((8.0,), tail_sigma=1.0), Dist.const(1.0))
    one = simulate(tail, PipelineConfig("sync"), steps=400, seed=1).summary()["step_s"]
    four = simulate(tail, PipelineConfig("sync", engines=4), steps=400, seed=1).summary()["step_s"]
    assert 3.0 < four < one / 4 * 2 + 1.0  # faster than one engine, slower than a perfect 4x (the slowest engine)


def test_ideal_speedup_closed_forms_and_predict():
    assert ideal_speedup(3, 3) == 2 and ideal_speedup(1, 3) == pytest.approx(4 / 3)
    assert lock_bound_speedup(3, 3, 1) == pytest.approx(7 / 4)
    rows = {
        r["mode"]: r for r in predict(_w(3.0, 3.0, 0.0), [PipelineConfig("sync"), PipelineConfig("async", 1)], 50, 1)
    }
    assert rows["sync"]["speedup"] == 1.0
    assert rows["async q=1"]["speedup"] == pytest.approx(2.0, rel=0.05)  # T_gen = T_train: async doubles throughput
    assert rows["async q=1"]["efficiency"] == pytest.approx(1.0, rel=0.05)


def _synthetic_metrics(path, gen, train, sync, lock=None, start=1_700_000_000.0):
    """A metrics.jsonl as the trainer writes it: timing/*, timeline/* (absolute seconds)."""
    t, rows = start, []
    for i, (g, tr, s) in enumerate(zip(gen, train, sync)):
        lw = 0.0 if lock is None else lock[i]
        me, pt = 0.4 * tr, 0.6 * tr
        row = {
            "kind": "train",
            "step": i + 1,
            "timing/generation": g,
            "timing/make_experience": me,
            "timing/ppo_train": pt,
            "timing/broadcast": s + lw,
            "async/sync_lock_wait_s": lw,
            "rollout/num_samples": 16.0,
            "rollout/response_length_mean": 20.0,
            "async/staleness": 0.0,
            "timeline/gen_start": t,
            "timeline/gen_end": t + g,
            "timeline/step_start": t + g,
            "timeline/step_end": t + g + tr + s + lw,
        }
        t = row["timeline/step_end"]
        rows.append(row)
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return rows


def test_calibration_round_trip(tmp_path):
    rng = random.Random(0)
    gen = [rng.uniform(2, 4) for _ in range(40)]
    train = [rng.uniform(3, 5) for _ in range(40)]
    sync = [0.5] * 40
    path = tmp_path / "metrics.jsonl"
    _synthetic_metrics(path, gen, train, sync, lock=[0.7] * 40)
    rows = load_rows(str(path))
    w = calibrate(rows, skip=1)
    assert w.gen.mean == pytest.approx(sum(gen[1:]) / 39)
    assert w.train.mean == pytest.approx(sum(train[1:]) / 39)
    assert w.sync.mean == pytest.approx(0.5)  # the lock wait is not part of the sync's cost
    assert w.samples_per_step == 16 and w.tokens_per_step == 320
    # the measured timeline of a sync run (no lock waits) and the simulated sync run agree on the step time
    _synthetic_metrics(path, gen, train, sync)
    rows = load_rows(str(path))
    steps, spans = measured_timeline(rows)
    measured = summarize(steps, spans, 16, 320)
    sim = simulate(w, PipelineConfig("sync"), steps=2000, seed=0).summary()
    assert sim["step_s"] == pytest.approx(measured["step_s"], rel=0.05)
    assert measured["staleness_mean"] == 0 and 0 < measured["trainer/idle_ratio"] < 1


def test_calibration_needs_the_timing_fields(tmp_path):
    path = tmp_path / "metrics.jsonl"
    path.write_text(json.dumps({"kind": "train", "step": 1, "reward": 0.5}) + "\n")
    with pytest.raises(ValueError, match="timing/generation"):
        calibrate(load_rows(str(path)))
    with pytest.raises(ValueError, match="timeline"):
        measured_timeline(load_rows(str(path)))
    with pytest.raises(ValueError, match="missing.jsonl: no such file"):
        load_rows(str(tmp_path / "missing.jsonl"))
    (tmp_path / "empty.jsonl").write_text("")
    with pytest.raises(ValueError, match="no training steps"):
        load_rows(str(tmp_path / "empty.jsonl"))
    with pytest.raises(ValueError, match="finite"):
        Dist((float("nan"),))


def test_cli_from_metrics_phase_times_and_cluster(tmp_path, capsys):
    path = tmp_path / "metrics.jsonl"
    _synthetic_metrics(path, [3.0] * 10, [3.0] * 10, [0.0] * 10)
    out_json = tmp_path / "pred.json"
    assert simulate_main(["--from-metrics", str(path), "--queue-size", "1", "2", "--steps", "50",
                          "--json", str(out_json), "--gantt", str(tmp_path / "g.png")]) == 0  # fmt: skip
    out = capsys.readouterr().out
    assert "| async q=1 |" in out and "| sync |" in out
    pred = {r["mode"]: r for r in json.loads(out_json.read_text())}
    assert pred["async q=1"]["speedup"] == pytest.approx(2.0, rel=0.05)
    assert (tmp_path / "g.png").stat().st_size > 10_000
    assert simulate_main(["--phase-times", "4", "2", "0.5", "--queue-size", "1", "--max-staleness", "1"]) == 0
    assert "max_staleness=1" in capsys.readouterr().out
    csv = tmp_path / "cluster.csv"
    csv.write_text(
        "# comment\nname,gen_gpus,train_gpus,gen_s,train_s,sync_s,source\n"
        "colocated 8,8,0,10,5,0,x\nsplit 4/4,4,4,20,10,1,x\nsplit 6/2,6,2,13.3,20,1,x\n"
    )
    assert simulate_main(["--cluster", str(csv), "--queue-size", "1"]) == 0
    out = capsys.readouterr().out
    assert "| colocated 8 | sync | 15 |" in out and "| split 4/4 | async q=1 | 21 |" in out
    # a user's mistake: one line, exit 2
    assert simulate_main(["--from-metrics", str(tmp_path / "none.jsonl")]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("avspo-simulate: error:")


def test_one_warm_up_rule_for_rates_and_calibration():
    """Step 2 still pays warm-up here (4 s against 1 s): rates and calibration both keep it (they
    leave out step 1 only), so the simulator fed this run predicts this run's rate."""
    from avspo_openrlhf.sim.pipeline import WARMUP_STEPS, steady

    gen = [5.0, 3.0, 0.5, 0.5, 0.5, 0.5]  # step 1 warm, step 2 slow, then steady
    rows, t = [], 0.0
    for i, g in enumerate(gen, 1):  # a sync run: generate, train 0.5 s, no sync
        rows.append(
            {
                "step": i,
                "timing/generation": g,
                "timing/make_experience": 0.2,
                "timing/ppo_train": 0.3,
                "timing/broadcast": 0.0,
                "timeline/gen_start": t,
                "timeline/gen_end": t + g,
                "timeline/step_start": t + g,
                "timeline/step_end": t + g + 0.5,
            }
        )
        t += g + 0.5
    steps, spans = measured_timeline(rows)
    measured = summarize(steps, spans, 1.0, 0.0)["step_s"]
    assert WARMUP_STEPS == 1 and steady(rows) == rows[1:]
    assert measured == pytest.approx((3.5 + 4 * 1.0) / 5)  # steps 2..6: the slow step 2 included
    w = calibrate(rows)
    assert w.gen.mean == pytest.approx(sum(gen[1:]) / 5)  # the same steps
    assert simulate(w, PipelineConfig("sync"), 2000, 0).summary()["step_s"] == pytest.approx(measured, rel=0.05)


@pytest.mark.parametrize(
    "argv, message",
    [
        (
            ["--phase-times", "0", "0", "0"],
            "--phase-times: phase times must be >= 0 with some generation or training time",
        ),
        (["--phase-times", "1", "1", "0", "--seeds", "0"], "--seeds must be >= 1"),
        (["--phase-times", "1", "1", "0", "--engines", "0"], "--engines and --engines-ref must be >= 1"),
        (["--from-metrics", "/no/such/metrics.jsonl"], "--from-metrics /no/such/metrics.jsonl: no such file"),
        (["--cluster", "EMPTY"], "EMPTY: no rows"),
        (
            ["--cluster", "experiments/async_throughput/cluster_qwen2.5-math-1.5b.csv", "--gantt", "x.png"],
            "--gantt draws one workload's timeline",
        ),
    ],
)
def test_simulate_cli_mistakes_are_one_line(argv, message, tmp_path, capsys, monkeypatch):
    monkeypatch.chdir(Path(__file__).resolve().parents[1])
    empty = tmp_path / "empty.csv"
    empty.write_text("")
    argv = [str(empty) if a == "EMPTY" else a for a in argv]
    assert simulate_main(argv) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert (
        len(err) == 1
        and err[0].startswith("avspo-simulate: error: ")
        and message.replace("EMPTY", str(empty)) in err[0]
    )


def test_simulate_json_into_a_new_folder_and_the_ideal_follows_the_engines(tmp_path):
    out = tmp_path / "new" / "folder" / "pred.json"
    assert simulate_main(["--phase-times", "1", "1", "0", "--engines", "4", "--queue-size", "1", "--steps", "200",
                          "--seeds", "2", "--json", str(out)]) == 0  # fmt: skip
    rows = {r["mode"]: r for r in json.loads(out.read_text())}
    # 4 engines make generation 0.25 s: the ideal is (0.25 + 1) / 1, and async q=1 reaches it
    assert rows["async q=1"]["ideal"] == pytest.approx(1.25)
    assert rows["async q=1"]["efficiency"] == pytest.approx(1.0, abs=0.03)


def test_overhead_and_overlap_slowdown_closed_forms():
    g, t, s, o, slow = 2.0, 1.0, 0.2, 0.1, 0.5
    w = Workload(Dist.const(g), Dist.const(t), Dist.const(s), overhead=o, overlap_slowdown=slow)
    # sync: nothing overlaps, the overhead adds to every step
    assert simulate(w, PipelineConfig("sync"), 50).summary()["step_s"] == pytest.approx(g + t + s + o)
    # async q=1: the next generation starts when the trainer takes a batch and runs at 1/(1+slow)
    # while it trains (t), then at full speed: t + (g - t/(1+slow)), then the sync and the overhead
    expect = t + (g - t / (1 + slow)) + s + o
    assert simulate(w, PipelineConfig("async", 1), 200).summary()["step_s"] == pytest.approx(expect)
    # without the two terms the model is the old one: max(g, t) + s
    plain = Workload(Dist.const(g), Dist.const(t), Dist.const(s))
    assert simulate(plain, PipelineConfig("async", 1), 200).summary()["step_s"] == pytest.approx(g + s)
    # training longer than the slowed generation hides the slowdown entirely
    long_train = Workload(Dist.const(1.0), Dist.const(3.0), Dist.const(0.2), overhead=0.1, overlap_slowdown=0.5)
    assert simulate(long_train, PipelineConfig("async", 1), 200).summary()["step_s"] == pytest.approx(3.3)
    with pytest.raises(ValueError, match="overlap_slowdown"):
        Workload(Dist.const(1), Dist.const(1), overlap_slowdown=-0.1)
    with pytest.raises(ValueError, match="train_slowdown"):
        Workload(Dist.const(1), Dist.const(1), train_slowdown=float("nan"))


def test_train_slowdown_and_async_overhead_closed_forms():
    # training-bound async q=1: the next generation (0.5 s) runs during the first part of each train
    # phase; training progresses at 1/1.2 then: 0.5 s wall covers 0.5/1.2 of its 1 s, the rest at full speed
    w = Workload(Dist.const(0.5), Dist.const(1.0), Dist.const(0.1), train_slowdown=0.2)
    step = simulate(w, PipelineConfig("async", 1), 200).summary()["step_s"]
    assert step == pytest.approx(0.5 + (1.0 - 0.5 / 1.2) + 0.1)
    # both slow each other: the generation takes 0.5 * 1.5 s of wall, training progresses 0.75/1.2 then
    both = Workload(Dist.const(0.5), Dist.const(1.0), Dist.const(0.1), train_slowdown=0.2, overlap_slowdown=0.5)
    assert simulate(both, PipelineConfig("async", 1), 200).summary()["step_s"] == pytest.approx(
        0.75 + (1 - 0.75 / 1.2) + 0.1
    )
    # sync: nothing overlaps, neither slowdown applies; the async overhead applies to async steps only
    split = Workload(
        Dist.const(0.5),
        Dist.const(1.0),
        Dist.const(0.1),
        overhead=0.01,
        async_overhead=0.05,
        train_slowdown=0.2,
        overlap_slowdown=0.5,
    )
    assert simulate(split, PipelineConfig("sync"), 50).summary()["step_s"] == pytest.approx(1.61)
    assert simulate(split, PipelineConfig("async", 1), 200).summary()["step_s"] == pytest.approx(
        0.75 + (1 - 0.75 / 1.2) + 0.1 + 0.05
    )


def test_train_warmup_gives_the_generator_the_head_start_that_fills_a_deep_queue():
    # generation (0.9 s) barely faster than training (1 s): from an empty queue of 4 the generator runs
    # back to back, so most syncs wait for the generation in progress; a long first train phase (the
    # measured runs' DeepSpeed warm-up) lets it fill the queue first, and a full queue stays full:
    # each generation starts when the trainer takes a batch and ends before its sync (T_train + T_sync)
    n = 24  # the measured runs' length: the fill-up is most of it
    cold = simulate(_w(0.9, 1.0, 0.1), PipelineConfig("async", 4), n)
    warm = simulate(_w(0.9, 1.0, 0.1, train_warmup=5.0), PipelineConfig("async", 4), n)
    assert _intervals(warm) == pytest.approx([1.1] * (n - 1))
    assert warm.summary()["step_s"] == pytest.approx(1.1)
    assert cold.summary()["step_s"] > 1.15  # syncs waiting for generations while the queue fills
    assert warm.steps[0]["end"] == pytest.approx(0.9 + 1.0 + 5.0 + 0.1)
    # queue 1 starts each generation at the trainer's get already: the warm-up changes nothing after step 1
    q1 = [simulate(_w(0.9, 1.0, 0.1, train_warmup=x), PipelineConfig("async", 1), n) for x in (0.0, 5.0)]
    assert _intervals(q1[0])[1:] == pytest.approx(_intervals(q1[1])[1:])
    # sync: the first step alone is longer, and it is left out of the rate
    sync = simulate(_w(0.9, 1.0, 0.1, train_warmup=5.0), PipelineConfig("sync"), n)
    assert sync.steps[0]["end"] == pytest.approx(7.0) and sync.summary()["step_s"] == pytest.approx(2.0)


def test_train_warmup_is_calibrated_from_the_first_step(tmp_path):
    from avspo_openrlhf.sim.calibrate import train_warmup

    rows = _synthetic_metrics(tmp_path / "m.jsonl", [2.0] * 6, [4.0, 1.0, 1.2, 0.8, 1.0, 1.0], [0.2] * 6)
    assert train_warmup(rows) == pytest.approx(3.0) and calibrate(rows).train_warmup == pytest.approx(3.0)
    assert train_warmup(rows, skip=0) == 0.0  # nothing left out: no warm-up step to compare
    fast_first = _synthetic_metrics(tmp_path / "f.jsonl", [2.0] * 3, [0.5, 1.0, 1.0], [0.2] * 3)
    assert train_warmup(fast_first) == 0.0


def test_cli_sets_the_overlap_terms_by_hand(capsys):
    args = ["--phase-times", "0.5", "1", "0.1", "--queue-size", "1", "--steps", "100", "--seeds", "1"]
    assert simulate_main([*args, "--train-slowdown", "0.2", "--overhead", "0.05"]) == 0
    out = capsys.readouterr().out
    assert "training 20 % slower beside generation" in out and "overhead 0.050 s/step (async 0.050)" in out
    assert simulate_main([*args, "--train-slowdown", "-1"]) == 2
    assert "train_slowdown must be finite and >= 0" in capsys.readouterr().err
    assert simulate_main([*args, "--train-warmup", "2"]) == 0
    assert "first train phase +2.00 s" in capsys.readouterr().out
    assert simulate_main([*args, "--train-warmup", "nan"]) == 2
    assert "train_warmup must be finite and >= 0" in capsys.readouterr().err


def test_overhead_and_slowdown_are_calibrated_from_a_sync_and_an_async_run(tmp_path):
    from avspo_openrlhf.sim.calibrate import overlap_calibration, step_overhead

    sync_rows = _synthetic_metrics(tmp_path / "s.jsonl", [2.0] * 8, [1.0] * 8, [0.2] * 8)
    for r in sync_rows:
        r.pop("async/staleness")
    # an async run: generation 15 % slower, 0.05 s between the trainer's steps that no timer covers
    rows, end = [], 100.0
    for i in range(8):
        rows.append(
            {
                "step": i + 1,
                "timing/generation": 2.3,
                "timing/make_experience": 0.4,
                "timing/ppo_train": 0.6,
                "timing/broadcast": 0.2,
                "async/sync_lock_wait_s": 0.0,
                "async/staleness": 1.0,
                "async/trainer_idle_s": 1.0,
                "timeline/gen_start": end - 1.3,
                "timeline/gen_end": end + 1.0,
                "timeline/step_start": end + 1.05,
                "timeline/step_end": end + 2.25,
            }
        )
        end += 2.25
    assert step_overhead(sync_rows) == pytest.approx(0.0, abs=1e-9)
    o = overlap_calibration(sync_rows, rows)
    assert o["overlap_slowdown"] == pytest.approx(0.15) and o["overhead"] == pytest.approx(0.05)
    assert o["train_slowdown"] == pytest.approx(0.0)  # 1.0 s of training in both runs
    # a batch done before the previous step ended: the trainer's "idle" time is hand-over, not waiting
    ready = [
        dict(
            r,
            **{
                "timeline/gen_start": r["timeline/gen_start"] - 1.2,
                "timeline/gen_end": r["timeline/gen_end"] - 1.2,
                "timing/ppo_train": 0.66,
            },
        )
        for r in rows
    ]
    # interval 2.25 = train 1.06 + sync 0.2 + 0.99 that no phase covers (the 1.0 s the idle timer counts is hand-over)
    assert step_overhead(ready) == pytest.approx(0.99)
    assert overlap_calibration(sync_rows, ready)["train_slowdown"] == pytest.approx(0.06)
    path_s, path_a = tmp_path / "sync.jsonl", tmp_path / "async.jsonl"
    path_s.write_text("".join(json.dumps(r) + "\n" for r in sync_rows))
    path_a.write_text("".join(json.dumps(r) + "\n" for r in rows))
    assert simulate_main(["--from-metrics", str(path_s), "--overlap-from", str(path_a), "--queue-size", "1",
                          "--steps", "50", "--seeds", "1"]) == 0  # fmt: skip
    assert simulate_main(["--phase-times", "1", "1", "0", "--overlap-from", str(path_a)]) == 2
