"""Which remedy for advantage collapse? GRPO, AVSPO, DAPO dynamic sampling, NGRPO, GRESO,
GRESO+AVSPO and RL-ZVP on SmolLM2-135M arithmetic (CPU), at equal generated tokens.

Every run is ``avspo-train --backend cpu`` with the same model, data, decoding, optimizer and seed
list, stopped by ``--run.max_generated_tokens`` (dynamic sampling spends extra generation per step,
GRESO saves some: equal steps would be unfair both ways), then a held-out evaluation of its final
model on 1,200 problems (the first 300, the first pass's whole set, then the other 900). Resumable
per (method, seed): a finished run leaves ``<method>_seed<k>/result.json``; a run killed midway
resumes from its checkpoint when the command is repeated. With ``--publish`` every finished run is
written to the repository's results folder with its per-problem records, and a run found there is
not run again, so the study also resumes on a machine whose run folder is gone. ``--report-only``
rebuilds the table, the p-values and the plots from what is there, saying how many seeds and
held-out problems each cell holds; with ``results_first_pass/`` beside it, the report also pools
both passes on the 300 problems both evaluated (each run a draw, paired within its seed and pass).
``--per-seed-json`` also writes both passes' numbers per method and seed with every comparison, the
per-problem records left out.

    python experiments/remedies/run.py --seeds 0 1 2 3 4 --out runs/remedies --publish experiments/remedies/results \
        --per-seed-json experiments/remedies/results.json
    python experiments/remedies/run.py --out runs/remedies --report-only --publish experiments/remedies/results \
        --per-seed-json experiments/remedies/results.json
"""

from __future__ import annotations

import argparse
import collections
import json
import math
import os
import shutil
import statistics
import sys
import time
from pathlib import Path

from avspo_openrlhf.cli import quickstart as qs
from avspo_openrlhf.report import read_metrics

# The task mix: at the start ~58 % of SmolLM2-135M's groups (G=8, T=0.7, 32 tokens) collapse, nearly
# all of them all-wrong (measured per level: add1 25 %, mul1 21 %, add2 88 %, multi 100 %); all-right
# groups appear as the model learns the answer format (add1, mul1).
LEVELS = ["add1", "mul1", "add2", "multi"]
TRAIN_PROMPTS = 32  # 8 per level: a pool revisited every 8 GRPO steps, so GRESO has history to use
# Held-out, x n=4 samples. The first 300 alone gave one run's accuracy a 95 % interval of +-4.2 to
# +-5.4 points (measured on 18 runs: 1.96 sd over problems / sqrt(300)); 1,200 bring it to about +-2.6.
# The extra 900 continue the same seeded stream, so the first 300 are the original set unchanged.
HELDOUT = 300
HELDOUT_EXTRA = 900
STUDY = dict(group_size=8, prompts_per_step=4, max_new_tokens=32, temperature=0.7, lr=1e-5, dtype="fp32",
             eval_n=4, mid_eval_problems=60, eval_steps=6, tau_init=0.5)  # fmt: skip
TOKEN_BUDGET = 16_000  # about 20 GRPO steps (2.5 passes over the pool) at the start's response length

# the remedies with their published defaults; AVSPO's std/eps set so that with its gate closed it is
# this study's GRPO (OpenRLHF group_norm: unbiased std + 1e-9) bit for bit
AVSPO = ["--avspo.enable", "--avspo.std", "unbiased", "--avspo.eps", "1e-9"]
METHODS = {
    "GRPO": [],
    "AVSPO": AVSPO,
    "DAPO-DS": ["--dynamic.std_filter"],
    "NGRPO": ["--ngrpo.enable", "--actor.eps_clip_low_high", "0.16", "0.24"],
    "GRESO": ["--greso.enable", "--greso.audit", "0.1", "--dynamic.std_filter"],
    "GRESO+AVSPO": ["--greso.enable", "--greso.audit", "0.1", *AVSPO],
    "RL-ZVP": ["--rlzvp.enable"],
}
MIN_SEEDS = {"GRPO": 5, "AVSPO": 5, "DAPO-DS": 5, "NGRPO": 5, "GRESO": 3, "GRESO+AVSPO": 3, "RL-ZVP": 3}
BASELINES = ("GRPO", "DAPO-DS")


def make_data(out: Path) -> tuple[str, str, str]:
    """The training pool, the held-out set and its extension, the same for every method and seed
    (written atomically: a study running beside a ``--report-only`` reads them)."""
    from avspo_openrlhf.data.io import write_jsonl
    from avspo_openrlhf.data.tasks import make_prompt, synthetic_arithmetic

    out.mkdir(parents=True, exist_ok=True)
    heldout = synthetic_arithmetic(HELDOUT + HELDOUT_EXTRA, LEVELS, seed=1000)
    sets = {"train": synthetic_arithmetic(TRAIN_PROMPTS, LEVELS, seed=0), "heldout": heldout[:HELDOUT],
            "heldout_extra": heldout[HELDOUT:]}  # fmt: skip
    for name, rows in sets.items():
        for r in rows:
            r["prompt"] = make_prompt(r["problem"], "user")
        write_jsonl(rows, str(out / f"{name}.jsonl"))
    return tuple(str(out / f"{name}.jsonl") for name in sets)


def _level(unique_id: str) -> str:
    return LEVELS[int(unique_id.rsplit("/", 1)[1]) % len(LEVELS)]  # synthetic_arithmetic cycles the levels


def merge_extra(res: dict, records: list[dict], precision: str | None = None) -> dict:
    """``res`` (a run's result) with the extra held-out problems' records added: pass@1 over all the
    problems it now holds, per level too; the first set's pass@1 kept as ``heldout_pass1_first``."""
    per = dict(res["per_problem"])
    per.update({r["unique_id"]: sum(r["correct"]) / len(r["correct"]) for r in records})
    by_level = {lv: [v for k, v in per.items() if _level(k) == lv] for lv in LEVELS}
    out = {**res, "per_problem": per, "heldout_problems": len(per),
           "heldout_pass1_first": res.get("heldout_pass1_first", res["heldout_pass1"]),
           "heldout_pass1": statistics.mean(per.values()),
           "heldout_by_level": {lv: statistics.mean(v) for lv, v in by_level.items() if v}}  # fmt: skip
    if precision is not None:
        out["precision"] = {**res.get("precision", {}), "evaluation after (extra problems)": precision}
    return out


def eval_halfwidth(per_problem: dict[str, float]) -> float:
    """Half-width of one run's 95 % interval on its held-out pass@1: 1.96 sd over problems / sqrt(P)."""
    return 1.96 * statistics.stdev(per_problem.values()) / math.sqrt(len(per_problem))


def _write_json(path: Path, obj: dict) -> None:
    tmp = path.with_suffix(".tmp")
    tmp.write_text(json.dumps(obj, indent=1))
    os.replace(tmp, path)


def extend_eval(run_dir: Path, extra: str) -> dict:
    """Evaluate a finished run's final model on the extra held-out problems and merge them into its
    result (once: a run that holds them is returned as it is)."""
    res = json.loads((run_dir / "result.json").read_text())
    if res.get("heldout_problems", HELDOUT) >= HELDOUT + HELDOUT_EXTRA:
        return res
    if not (run_dir / "final" / "config.json").exists():
        raise RuntimeError(f"{run_dir}: holds {res.get('heldout_problems', HELDOUT)} held-out problems and no final "
                           "model to evaluate the rest with; delete the folder to run it again")  # fmt: skip
    args = study_args(res["method"], res["seed"], TOKEN_BUDGET)
    qs._eval(str(run_dir / "final"), extra, run_dir / "eval_after_extra", args, run_dir / "log.txt")
    records = qs._records(run_dir / "eval_after_extra")
    if len(records) != HELDOUT_EXTRA:
        raise RuntimeError(f"{run_dir / 'eval_after_extra'}: {len(records)} records, expected {HELDOUT_EXTRA}")
    res = merge_extra(res, records, _summary_precision(run_dir / "eval_after_extra"))
    _write_json(run_dir / "result.json", res)
    return res


def pack_per_problem(per: dict[str, float], n: int = STUDY["eval_n"]) -> dict | dict[str, float]:
    """A run's per-problem accuracies as the repository keeps them: the ids' common prefix and one
    digit per problem, its correct samples of ``n`` (1,200 problems in 1.2 kB instead of ~40 kB).
    Ids that are not ``prefix + 0..P-1`` or values that are not k/n stay a plain dict."""
    ids = list(per)
    prefix = ids[0].rsplit("/", 1)[0] + "/" if ids else ""
    counts = [per.get(f"{prefix}{i}", -1.0) * n for i in range(len(ids))]
    if n > 9 or any(c < 0 or abs(c - round(c)) > 1e-9 for c in counts):
        return dict(per)
    return {"n": n, "prefix": prefix, "correct": "".join(str(round(c)) for c in counts)}


def unpack_per_problem(packed: dict) -> dict[str, float]:
    if "correct" not in packed:
        return dict(packed)
    return {f"{packed['prefix']}{i}": int(c) / packed["n"] for i, c in enumerate(packed["correct"])}


def restore_published(out: Path, published: Path) -> list[str]:
    """Put the runs (and the evaluation before training) that ``published``/results.json holds with
    their per-problem records back into ``out``, where ``out`` lacks them: the study resumes from
    the repository on a machine whose run folder is gone. Returns the runs restored."""
    path = published / "results.json"
    if not path.exists():
        return []
    pub = json.loads(path.read_text())
    for name, summary in pub.get("before_eval", {}).items():
        if not (out / name / "summary.json").exists():
            (out / name).mkdir(parents=True, exist_ok=True)
            _write_json(out / name / "summary.json", summary)
    restored = []
    for r in pub["runs"]:
        run_dir = out / f"{r['method']}_seed{r['seed']}"
        if "per_problem" not in r or (run_dir / "result.json").exists():
            continue  # runs published without their records (the first pass) cannot enter the statistics
        run_dir.mkdir(parents=True, exist_ok=True)
        _write_json(run_dir / "result.json", {**r, "per_problem": unpack_per_problem(r["per_problem"])})
        restored.append(run_dir.name)
    return restored


def _summary_precision(eval_dir: Path) -> str:
    return json.loads((eval_dir / "summary.json").read_text()).get("precision") or "not recorded"


def study_args(method: str, seed: int, budget: int) -> argparse.Namespace:
    extra = [*METHODS[method], "--run.max_generated_tokens", str(budget), "--train.num_episodes", "50"]
    return qs.build_parser().parse_args(
        [
            "--grpo",
            "--seed",
            str(seed),
            "--save-steps",
            "8",
            *[f"--{k.replace('_', '-')}={v}" for k, v in STUDY.items()],
            "--",
            *extra,
        ]  # fmt: skip
    )


def run_one(method: str, seed: int, out: Path, model: str, data: tuple[str, str, str], budget: int) -> dict:
    run_dir = out / f"{method}_seed{seed}"
    result_file = run_dir / "result.json"
    train, heldout, extra = data
    if result_file.exists():
        return extend_eval(run_dir, extra)
    run_dir.mkdir(parents=True, exist_ok=True)
    args = study_args(method, seed, budget)
    resumed = (run_dir / "ckpt").exists()
    t0 = time.time()
    if not (run_dir / "final" / "config.json").exists():
        qs._run([sys.executable, "-m", "avspo_openrlhf.cli.train", *qs.train_flags(args, model, train, run_dir, heldout)],
                run_dir / "log.txt")  # fmt: skip
    train_s = time.time() - t0
    after = qs._eval(str(run_dir / "final"), heldout, run_dir / "eval_after", args, run_dir / "log.txt")
    rows, evals = read_metrics(str(run_dir / "report" / "metrics.jsonl"))
    start = rows[0].get("timeline/gen_start", t0)
    last = rows[-1]
    res = {
        "method": method,
        "seed": seed,
        "steps": len(rows),
        "heldout_pass1": after["pass@1"],
        "heldout_problems": HELDOUT,
        "heldout_by_level": after.get("pass@1_by_level", {}),
        "per_problem": {
            r["unique_id"]: sum(r["correct"]) / len(r["correct"]) for r in qs._records(run_dir / "eval_after")
        },
        "generated_tokens": last.get("tokens/generated_cum", 0.0),
        "trained_samples": len(rows) * STUDY["group_size"] * STUDY["prompts_per_step"],
        "generated_per_trained": last.get("dynamic/generated_per_trained_cum", 1.0),
        "acr_raw": statistics.mean(r["acr"] for r in rows),
        "acr_effective": statistics.mean(r["acr_effective"] for r in rows),
        "acr_start": statistics.mean(r["acr"] for r in rows[:3]),
        "acr_all_wrong": statistics.mean(r["acr_all_wrong"] for r in rows),
        "acr_all_right": statistics.mean(r["acr_all_right"] for r in rows),
        "greso": {k: v for k, v in last.items() if k.startswith("greso/")},
        "train_wall_min": train_s / 60,
        "resumed": resumed,  # wall time of a resumed run is not comparable
        "cpu": qs.cpu_kind(),  # the machine that ran it, not the one that writes the report
        "curve": [
            {
                "step": r["step"],
                "tokens": r.get("tokens/generated_cum", 0.0),
                "wall_s": r.get("timeline/step_end", start) - start,
                "reward": r["rollout/reward_mean"],
                "acr": r["acr"],
                "acr_effective": r["acr_effective"],
            }
            for r in rows
        ],  # fmt: skip
        "mid_evals": [{"step": e["step"], "pass1": _mid_pass1(e)} for e in evals if _mid_pass1(e) is not None],
        "precision": qs.stage_precisions(run_dir),
        "load_avg": os.getloadavg(),
    }
    _write_json(result_file, res)
    shutil.rmtree(run_dir / "ckpt", ignore_errors=True)  # 1.6 GB per run; the final model stays
    return extend_eval(run_dir, extra)


def _mid_pass1(e: dict) -> float | None:
    per = [v for k, v in e.items() if k.endswith("/pass1")]
    return sum(per) / len(per) if per else None


# ── statistics ──


def sign_flip_p(diffs: list[float]) -> float:
    """Exact two-sided paired permutation test over seeds (all 2^n sign flips of the per-seed
    differences). With 5 seeds the smallest possible p is 2/32 = 0.0625."""
    n = len(diffs)
    if n == 0:
        return float("nan")
    obs = abs(sum(diffs))
    count = 0
    for mask in range(2**n):
        s = sum(-d if mask >> i & 1 else d for i, d in enumerate(diffs))
        count += abs(s) >= obs - 1e-12
    return count / 2**n


def _paired_diffs(a: list[dict], b: list[dict]):
    """Per-problem differences a - b, one row per seed both hold, over the held-out problems every
    one of those runs holds (runs evaluated on the first 300 only pair with the rest on those)."""
    import numpy as np

    by_seed_b = {r["seed"]: r for r in b}
    pairs = [(r, by_seed_b[r["seed"]]) for r in a if r["seed"] in by_seed_b]
    if not pairs:
        return np.zeros((0, 0))
    ids = sorted(set.intersection(*(set(ra["per_problem"]) & set(rb["per_problem"]) for ra, rb in pairs)))
    return np.array([[ra["per_problem"][i] - rb["per_problem"][i] for i in ids] for ra, rb in pairs])


def paired_bootstrap(a: list[dict], b: list[dict], n_boot: int = 10_000, seed: int = 0) -> tuple[float, ...]:
    """Mean accuracy difference a - b over the seeds both hold, with a 95 % interval and a two-sided
    p-value from a bootstrap that resamples seeds and, within each, held-out problems (paired: the same
    problems and seed for both methods)."""
    import numpy as np

    d = _paired_diffs(a, b)  # [S, P]
    if d.size == 0:
        return float("nan"), float("nan"), float("nan"), float("nan")
    rng = np.random.default_rng(seed)
    s_idx = rng.integers(0, d.shape[0], size=(n_boot, d.shape[0]))
    p_idx = rng.integers(0, d.shape[1], size=(n_boot, d.shape[1]))
    boots = np.array([d[s][:, p].mean() for s, p in zip(s_idx, p_idx)])
    mean = float(d.mean())
    p = float(min(1.0, 2 * min((boots <= 0).mean(), (boots >= 0).mean())))
    return mean, float(np.quantile(boots, 0.025)), float(np.quantile(boots, 0.975)), p


def compare(results: list[dict], method: str, base: str) -> dict | None:
    a = [r for r in results if r["method"] == method]
    b = [r for r in results if r["method"] == base]
    diffs = [float(x) for x in _paired_diffs(a, b).mean(axis=1)] if a and b else []
    if method == base or not diffs:
        return None
    mean, lo, hi, p_boot = paired_bootstrap(a, b)
    return {
        "seeds": len(diffs),
        "diff": mean,
        "ci95": [lo, hi],
        "p_bootstrap": p_boot,
        "p_sign_flip": sign_flip_p(diffs),
    }


# Student t 0.975 quantiles by degrees of freedom: a pooled comparison holds at most 10 draws.
T975 = {1: 12.706, 2: 4.303, 3: 3.182, 4: 2.776, 5: 2.571, 6: 2.447, 7: 2.365, 8: 2.306, 9: 2.262, 10: 2.228,
        11: 2.201, 12: 2.179, 13: 2.160, 14: 2.145}  # fmt: skip
FIRST_PASS = Path(__file__).resolve().parent / "results_first_pass" / "results.json"


def first_set_pass1(runs: list[dict], tag: str) -> dict[tuple[str, str, int], float]:
    """Each run's pass@1 on the first 300 held-out problems, the set both passes evaluated, keyed by
    (pass, method, seed): a run is a fresh draw (asynchronous rollouts and vLLM's sampling are not
    bit-reproducible), so a seed run in both passes gives two pairs."""
    out = {}
    for r in runs:
        if "heldout_pass1_first" in r or r.get("heldout_problems", HELDOUT) == HELDOUT:
            out[tag, r["method"], r["seed"]] = r.get("heldout_pass1_first", r["heldout_pass1"])
    return out


def pooled_compare(acc: dict[tuple[str, str, int], float], method: str, base: str) -> dict | None:
    """``method`` - ``base`` over every (pass, seed) draw both hold, paired within a draw: mean, 95 %
    t interval over the draws and the exact sign-flip p-value."""
    d = [acc[k] - acc[k[0], base, k[2]] for k in sorted(acc) if k[1] == method and (k[0], base, k[2]) in acc]
    if method == base or len(d) < 2:
        return None
    mean, sd = statistics.mean(d), statistics.stdev(d)
    half = T975.get(len(d) - 1, 1.96) * sd / math.sqrt(len(d))
    return {"pairs": len(d), "diff": mean, "sd": sd, "ci95": [mean - half, mean + half], "p_sign_flip": sign_flip_p(d)}


def pooled_table(results: list[dict], first_pass: list[dict], methods: list[str]) -> list[str]:
    """Both passes together on the first 300 problems: about twice the draws of either pass alone,
    since the spread between runs, not the evaluation set, is what limits each pass."""
    acc = {**first_set_pass1(first_pass, "first"), **first_set_pass1(results, "second")}
    rows = []
    for m in methods:
        cmp = [pooled_compare(acc, m, b) for b in BASELINES]
        if any(cmp):
            cells = [f"{100 * c['diff']:+.1f} [{100 * c['ci95'][0]:+.1f}, {100 * c['ci95'][1]:+.1f}], "
                     f"sd {100 * c['sd']:.1f}, p={c['p_sign_flip']:.3f} ({c['pairs']})" if c else "-" for c in cmp]  # fmt: skip
            rows.append(f"| {m} | " + " | ".join(cells) + " |")
    if not rows:
        return []
    return ["", "Both passes together, on the first 300 held-out problems (the set both evaluated): each "
            "(pass, seed) run is a draw, paired within the draw; mean [95 % t interval over the draws], sd of "
            "the paired differences, p = exact sign-flip (draws):", "",
            "| method | vs GRPO (points) | vs DAPO-DS (points) |", "| --- | --- | --- |", *rows]  # fmt: skip


def _fmt_cmp(c: dict | None) -> str:
    if c is None:
        return "-"
    return (f"{100 * c['diff']:+.1f} [{100 * c['ci95'][0]:+.1f}, {100 * c['ci95'][1]:+.1f}], "
            f"p={c['p_bootstrap']:.3f} / {c['p_sign_flip']:.3f} ({c['seeds']})")  # fmt: skip


def _ms(xs, scale=1.0, fmt="{:.1f}") -> str:
    if not xs:
        return "-"
    if len(xs) == 1:  # one seed has no spread to show
        return fmt.format(xs[0] * scale)
    return f"{fmt.format(statistics.mean(xs) * scale)} ± {fmt.format(statistics.stdev(xs) * scale)}"


def _mean(xs, scale=1.0, fmt="{:.1f}") -> str:
    return fmt.format(statistics.mean(xs) * scale) if xs else "-"


def heldout_line(results: list[dict], before: float) -> str:
    """What the held-out numbers stand on: problems per run, one run's evaluation interval."""
    n_full = sum(r.get("heldout_problems", HELDOUT) >= HELDOUT + HELDOUT_EXTRA for r in results)
    if n_full == len(results):
        held = f"{HELDOUT + HELDOUT_EXTRA:,} problems x n=4 (T=0.7)"
    elif n_full == 0:
        held = f"{HELDOUT} problems x n=4 (T=0.7; the first pass's set, without the {HELDOUT_EXTRA} added later)"
    else:
        held = (f"{HELDOUT + HELDOUT_EXTRA:,} problems x n=4 (T=0.7) for {n_full} of {len(results)} runs, the first "
                f"{HELDOUT} for the others (a difference is over the problems both runs hold)")  # fmt: skip
    hw = [100 * eval_halfwidth(r["per_problem"]) for r in results if len(r.get("per_problem", {})) > 1]
    interval = f"; one run's 95 % evaluation interval ±{min(hw):.1f} to ±{max(hw):.1f} points" if hw else ""
    return f"Held-out: {held}; before training {100 * before:.1f} %{interval}."


def seed_and_level_tables(results: list[dict], methods: list[str]) -> list[str]:
    """Held-out pass@1 per seed (the paired tests' inputs, an empty cell for a run not yet done) and
    per level as a mean over seeds, with the collapsed share split all-wrong / all-right: where a
    method wins or loses, not only by how much."""
    acc = {(r["method"], r["seed"]): r["heldout_pass1"] for r in results}
    seeds = sorted({r["seed"] for r in results})
    lines = ["", "Held-out pass@1 per seed (%):", "", "| seed | " + " | ".join(methods) + " |",
             "| --- |" + " --- |" * len(methods)]  # fmt: skip
    for s in seeds:
        cells = [f"{100 * acc[m, s]:.1f}" if (m, s) in acc else "" for m in methods]
        lines.append(f"| {s} | " + " | ".join(cells) + " |")
    lines += ["", "Per level (held-out pass@1, %) and the trained groups' collapsed share (all-wrong, all-right), "
              "means over seeds:", "",
              "| method | seeds | " + " | ".join(LEVELS) + " | all-wrong | all-right |",
              "| --- | --- |" + " --- |" * (len(LEVELS) + 2)]  # fmt: skip
    for m in methods:
        rs = [r for r in results if r["method"] == m]
        lv = [_mean([r["heldout_by_level"][k] for r in rs if k in r.get("heldout_by_level", {})], 100) for k in LEVELS]
        split = [_mean([r[k] for r in rs if k in r], 1, "{:.2f}") for k in ("acr_all_wrong", "acr_all_right")]
        lines.append(f"| {m} | {len(rs)} | " + " | ".join(lv + split) + " |")
    return lines


def level_compare_table(results: list[dict], methods: list[str], base: str = "GRPO") -> list[str]:
    """Paired differences against ``base`` level by level (the same bootstrap as the main table, on
    one level's problems): which levels a method's overall difference comes from."""

    def at(lv: str) -> list[dict]:
        return [{**r, "per_problem": {k: v for k, v in r["per_problem"].items() if _level(k) == lv}}
                for r in results if r.get("per_problem")]  # fmt: skip

    by_level = {lv: at(lv) for lv in LEVELS}
    rows = []
    for m in methods:
        cmp = [compare(by_level[lv], m, base) for lv in LEVELS]
        if any(cmp):
            rows.append(f"| {m} | " + " | ".join(_fmt_cmp(c) for c in cmp) + " |")
    if not rows:
        return []
    return ["", f"Per level against {base} (points; mean [95 % bootstrap interval], p = bootstrap / exact sign-flip "
            "(seeds)):", "", "| method | " + " | ".join(LEVELS) + " |", "| --- |" + " --- |" * len(LEVELS), *rows]  # fmt: skip


def cpu_line(results: list[dict]) -> str:
    """The CPUs the runs ran on, with their run counts: a study resumed on another machine (native
    bf16 or not) says so rather than naming the machine that wrote the report."""
    kinds = collections.Counter(r.get("cpu", "not recorded") for r in results)
    return "; ".join(f"{k} ({n} run{'s' * (n != 1)})" for k, n in sorted(kinds.items()))


def precisions(results: list[dict]) -> list[dict]:
    """The distinct per-stage precisions the runs recorded, each once."""
    return [json.loads(p) for p in sorted({json.dumps(r.get("precision", {}), sort_keys=True) for r in results})]


# what a reader needs per run; the per-problem records and curves stay in the published results.json
PER_SEED_KEYS = ("heldout_pass1", "heldout_pass1_first", "heldout_problems", "heldout_by_level", "steps",
                 "generated_tokens", "trained_samples", "generated_per_trained", "acr_start", "acr_raw",
                 "acr_effective", "acr_all_wrong", "acr_all_right", "train_wall_min", "resumed", "cpu")  # fmt: skip


def per_seed_summary(results: list[dict], summary: dict, first_pass: dict | None, budget: int, before: float) -> dict:
    """Both passes' numbers per method and seed, with their paired comparisons (each pass's and the
    pooled ones), in a file small enough to read: the study's answer without its per-problem
    records. ``summary`` is the report's (second-pass comparisons); ``first_pass`` the first pass's
    published results.json, whose comparisons were computed while its records existed."""

    def block(runs: list[dict], comparisons: dict, m: str) -> dict:
        rs = sorted((r for r in runs if r["method"] == m), key=lambda r: r["seed"])
        rows = [{"seed": r["seed"], **{k: r[k] for k in PER_SEED_KEYS if k in r}} for r in rs]
        vs = {k: v for k, v in comparisons.get(m, {}).items() if k.startswith("vs_")}
        return {"seeds": len(rows), "target_seeds": MIN_SEEDS[m], "runs": rows, **vs}

    def machine(runs: list[dict]) -> dict:  # every number names its CPU and precision
        return {"cpu": cpu_line(runs), "precision": precisions(runs)}

    first_runs = first_pass["runs"] if first_pass else []
    acc = {**first_set_pass1(first_runs, "first"), **first_set_pass1(results, "second")}
    out = {
        "budget_tokens": budget,
        "second_pass": {
            "before_pass1": before,
            **machine(results),
            "methods": {m: block(results, summary, m) for m in METHODS if m in summary},
        },
        "pooled_first_300": {
            m: {f"vs_{b}": c for b in BASELINES if (c := pooled_compare(acc, m, b))}
            for m in METHODS
            if any(k[1] == m for k in acc)
        },
    }
    if first_pass:
        done = [m for m in METHODS if any(r["method"] == m for r in first_runs)]
        out["first_pass"] = {
            "before_pass1": first_pass.get("before_pass1"),
            **machine(first_runs),
            "methods": {m: block(first_runs, first_pass.get("summary", {}), m) for m in done},
        }
    return out


def report(results: list[dict], before: float, out: Path, budget: int) -> str:
    methods = [m for m in METHODS if any(r["method"] == m for r in results)]
    lines = [
        f"SmolLM2-135M-Instruct, synthetic arithmetic ({'/'.join(LEVELS)}), {TRAIN_PROMPTS} training prompts, G=8, "
        f"4 prompts/step, T=0.7, 32 new tokens, lr 1e-5, async, fp32; every run stops at the step where its generated "
        f"tokens reach {budget:,}. {heldout_line(results, before)} "
        "± is the standard deviation over seeds. Differences are paired (same seeds, same problems): mean "
        "[95 % bootstrap interval over seeds and problems], p = bootstrap / exact sign-flip over seeds (seeds).",
        "",
        "| method | seeds (target) | held-out pass@1 (%) | vs GRPO (points) | vs DAPO-DS (points) | steps | generated tokens "
        "| generated ÷ trained samples | raw ACR (first 3 steps) | raw ACR (trained) | effective ACR | train wall (min) |",
        "| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |",
    ]
    summary = {}
    for m in methods:
        rs = [r for r in results if r["method"] == m]
        cmp = {base: compare(results, m, base) for base in BASELINES}
        summary[m] = {"seeds": sorted(r["seed"] for r in rs), "heldout_pass1": [r["heldout_pass1"] for r in rs],
                      "heldout_problems": [r.get("heldout_problems", HELDOUT) for r in rs],
                      **{f"vs_{b}": c for b, c in cmp.items()}}  # fmt: skip
        lines.append(
            f"| {m} | {len(rs)} ({MIN_SEEDS[m]}) | {_ms([r['heldout_pass1'] for r in rs], 100)} | {_fmt_cmp(cmp['GRPO'])} | "
            f"{_fmt_cmp(cmp['DAPO-DS'])} | {_ms([r['steps'] for r in rs], 1, '{:.1f}')} | "
            f"{_ms([r['generated_tokens'] for r in rs], 1, '{:.0f}')} | {_ms([r['generated_per_trained'] for r in rs], 1, '{:.2f}')} | "
            f"{_ms([r['acr_start'] for r in rs], 1, '{:.2f}')} | {_ms([r['acr_raw'] for r in rs], 1, '{:.2f}')} | "
            f"{_ms([r['acr_effective'] for r in rs], 1, '{:.2f}')} | {_ms([r['train_wall_min'] for r in rs], 1, '{:.1f}')} |"
        )
    lines += seed_and_level_tables(results, methods)
    lines += level_compare_table(results, methods)
    first_pass = json.loads(FIRST_PASS.read_text()) if FIRST_PASS.exists() else None
    if first_pass:
        lines += pooled_table(results, first_pass["runs"], methods)
    greso = [r for r in results if r["greso"]]
    if greso:
        lines += ["", "| GRESO run | skipped / visited prompts | audited | false skips (mixed when audited) | p_easy, p_hard at the end |",
                  "| --- | --- | --- | --- | --- |"]  # fmt: skip
        for r in greso:
            g = r["greso"]
            visited = g.get("greso/skipped_cum", 0) + g.get("greso/kept_cum", 0)
            lines.append(f"| {r['method']} seed {r['seed']} | {g.get('greso/skipped_cum', 0):.0f} / {visited:.0f} | "
                         f"{g.get('greso/audited_cum', 0):.0f} | {g.get('greso/false_skips_cum', 0):.0f} | "
                         f"{g.get('greso/p_easy', float('nan')):.2f}, {g.get('greso/p_hard', float('nan')):.2f} |")  # fmt: skip
    for p in precisions(results):
        lines.append("\nPrecision: " + ("; ".join(f"{k} {v}" for k, v in p.items()) or "not recorded") + ".")
    lines.append(f"\nCPU: {cpu_line(results)}. Runs resumed after a kill (wall time not comparable): "
                 f"{sum(r.get('resumed', False) for r in results)}.")  # fmt: skip
    table = "\n".join(lines) + "\n"
    (out / "results.md").write_text(table, encoding="utf-8")
    # per-problem records travel with the repository: the paired statistics need them, and the run
    # folders do not outlive the machine (the first pass lost them that way)
    runs = [{**r, "per_problem": pack_per_problem(r["per_problem"])} if "per_problem" in r else r for r in results]
    before_eval = {d: json.loads((out / d / "summary.json").read_text())
                   for d in ("eval_before", "eval_before_extra") if (out / d / "summary.json").exists()}  # fmt: skip
    _write_json(out / "results.json", {"budget_tokens": budget, "before_pass1": before, "before_eval": before_eval,
                                       "summary": summary, "runs": runs})  # fmt: skip
    _write_json(out / "per_seed.json", per_seed_summary(results, summary, first_pass, budget, before))
    plot(results, before, out / "remedies.png")
    return table


def _heldout_points(r: dict, before: float) -> list[tuple[float, float, float]]:
    """(generated tokens, wall s, held-out pass@1) along a run: before training, the in-training
    evaluations, the final evaluation."""
    tok = {c["step"]: c["tokens"] for c in r["curve"]}
    wall = {c["step"]: c["wall_s"] for c in r["curve"]}
    pts = [(0.0, 0.0, before)] + [(tok.get(e["step"], 0), wall.get(e["step"], 0), e["pass1"]) for e in r["mid_evals"]]
    return pts + [(r["generated_tokens"], r["curve"][-1]["wall_s"], r["heldout_pass1"])]


def _mean_band(ax, xs_runs, ys_runs, grid, color, label, scale=1.0):
    """Mean over seeds (line) and ± one standard deviation (band) of runs interpolated on ``grid``;
    beyond a run's last point its last value holds."""
    import numpy as np

    ys = np.array([np.interp(grid, x, y) for x, y in zip(xs_runs, ys_runs)]) * scale
    mean = ys.mean(axis=0)
    ax.plot(grid, mean, color=color, lw=1.6, label=label)
    if len(ys) > 1:
        sd = ys.std(axis=0, ddof=1)
        ax.fill_between(grid, mean - sd, mean + sd, color=color, alpha=0.12, lw=0)


def plot(results: list[dict], before: float, path: Path) -> None:
    """Learning curves per method (mean over seeds, band ± sd) against generated tokens and wall
    time, the training reward and effective ACR against generated tokens, and the final held-out
    accuracy per seed."""
    import matplotlib
    import numpy as np

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    import matplotlib.ticker

    if not results:
        return
    methods = [m for m in METHODS if any(r["method"] == m for r in results)]
    fig, axes = plt.subplots(1, 5, figsize=(24, 4.2))
    tok_end = min(r["generated_tokens"] for r in results)
    tok_grid = np.linspace(0, tok_end, 60)
    for i, m in enumerate(methods):
        rs = [r for r in results if r["method"] == m]
        color, label = f"C{i}", f"{m} ({len(rs)})"
        pts = [np.array(_heldout_points(r, before)) for r in rs]
        _mean_band(axes[0], [q[:, 0] for q in pts], [q[:, 2] for q in pts], tok_grid, color, label, 100)
        wall_end = min(q[-1, 1] for q in pts) / 60  # the method's curve ends with its shortest run
        _mean_band(axes[1], [q[:, 1] / 60 for q in pts], [q[:, 2] for q in pts], np.linspace(0, wall_end, 60),
                   color, label, 100)  # fmt: skip
        axes[1].scatter([statistics.mean(q[-1, 1] / 60 for q in pts)], [statistics.mean(100 * q[-1, 2] for q in pts)],
                        color=color, s=25, zorder=3)  # fmt: skip
        curves = [([c["tokens"] for c in r["curve"]], [c["reward"] for c in r["curve"]]) for r in rs]
        _mean_band(axes[2], *zip(*curves), tok_grid, color, label)
        acr = [([c["tokens"] for c in r["curve"]], [c["acr_effective"] for c in r["curve"]]) for r in rs]
        _mean_band(axes[3], *zip(*acr), tok_grid, color, label)
        ys = [100 * r["heldout_pass1"] for r in rs]
        axes[4].bar(i, statistics.mean(ys), color=color, alpha=0.6)
        axes[4].scatter([i] * len(ys), ys, color="k", s=10, zorder=3)
    axes[0].set(xlabel="generated tokens", ylabel="held-out pass@1 (%)",
                title="held-out vs generated tokens (mean ± sd over seeds)\nmiddle points: 60-problem subset, n=2")  # fmt: skip
    axes[1].set(xlabel="wall time since the first generation (min)", ylabel="held-out pass@1 (%)",
                title="held-out vs wall time\n(dot: mean end of the method's runs)")  # fmt: skip
    axes[2].set(xlabel="generated tokens", ylabel="mean training reward", title="training reward (trained batches)")
    axes[3].set(xlabel="generated tokens", ylabel="effective ACR", title="effective ACR (trained batches)")
    axes[4].set_xticks(range(len(methods)), methods, rotation=30)
    axes[4].set(ylabel="held-out pass@1 (%)", title="final held-out (dots: seeds)")
    for ax in axes:
        ax.grid(alpha=0.3)
    for ax in (axes[0], axes[2], axes[3]):  # "16000" beside "14000" ran together at this width
        ax.xaxis.set_major_formatter(matplotlib.ticker.FuncFormatter(lambda x, _: f"{x / 1000:g}k" if x else "0"))
    axes[0].legend(fontsize=7, title="method (seeds)", title_fontsize=7)
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=100)
    plt.close(fig)


def before_pass1(out: Path, extended: bool) -> float:
    """Held-out pass@1 of the model before training, on the set the runs hold (``extended``: all
    1,200 problems)."""
    sets = [("eval_before", HELDOUT)] + ([("eval_before_extra", HELDOUT_EXTRA)] if extended else [])
    parts = [(json.loads((out / d / "summary.json").read_text())["benchmarks"]["arith"], n)
             for d, n in sets if (out / d / "summary.json").exists()]  # fmt: skip
    if not parts:
        return math.nan
    return sum(s["pass@1"] * n for s, n in parts) / sum(n for _, n in parts)


def order(methods: list[str], seeds: list[int]) -> list[tuple[str, int]]:
    """Seed-major, so partial results hold complete seeds of every method; the methods that need
    only 3 seeds stop after seed 2."""
    return [(m, s) for s in seeds for m in methods if s in seeds[: MIN_SEEDS[m]]]


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], allow_abbrev=False)
    p.add_argument("--out", default="runs/remedies", help="run folder (rerun to resume)")
    p.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2, 3, 4])
    p.add_argument("--methods", nargs="+", default=list(METHODS), choices=list(METHODS))
    p.add_argument("--budget", type=int, default=TOKEN_BUDGET, help="generated tokens per run")
    p.add_argument("--model", default="smollm2")
    p.add_argument("--report-only", action="store_true", help="tables and plots from the finished runs only")
    p.add_argument("--publish", help="the repository's results folder: results.md/json and the plot are written there "
                                     "after every finished run, and the runs it holds are not run again (a study "
                                     "resumes from it when the run folder is gone)")  # fmt: skip
    p.add_argument("--per-seed-json", help="also write both passes' numbers per method and seed, with the paired "
                                           "comparisons, to this file (no per-problem records: small enough to read)")  # fmt: skip
    args = p.parse_args(argv)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    if args.publish:
        restored = restore_published(out, Path(args.publish))
        if restored:
            print(f"[remedies] restored from {args.publish}: {', '.join(restored)}", flush=True)
    data = make_data(out / "data")

    def publish() -> None:
        results = [json.loads(f.read_text()) for f in sorted(out.glob("*_seed*/result.json"))]
        before = before_pass1(out, all(r.get("heldout_problems", HELDOUT) >= HELDOUT + HELDOUT_EXTRA for r in results))
        print(report(results, before, out, args.budget), flush=True)
        if args.publish:
            dest = Path(args.publish)
            dest.mkdir(parents=True, exist_ok=True)
            for name in ("results.md", "results.json", "remedies.png"):
                if (out / name).exists():
                    shutil.copy(out / name, dest / name)
        if args.per_seed_json and (out / "per_seed.json").exists():
            shutil.copy(out / "per_seed.json", args.per_seed_json)

    if not args.report_only:
        from avspo_openrlhf.cpu.models import prepare

        model = prepare(args.model) if args.model in ("smollm2", "tiny") else args.model
        base = study_args("GRPO", 0, args.budget)
        qs._eval(model, data[1], out / "eval_before", base, out / "log.txt")
        qs._eval(model, data[2], out / "eval_before_extra", base, out / "log.txt")
        todo = order(args.methods, args.seeds)
        for i, (m, s) in enumerate(todo):
            print(f"[remedies] {i + 1}/{len(todo)}: {m} seed {s}", flush=True)
            fresh = not (out / f"{m}_seed{s}" / "result.json").exists()
            run_one(m, s, out, model, data, args.budget)
            if fresh:
                publish()  # partial results as they come, each cell with its seed count
    publish()
    return 0


if __name__ == "__main__":
    sys.exit(main())
