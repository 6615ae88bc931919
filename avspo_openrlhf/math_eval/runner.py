"""Evaluate a model (or every checkpoint of a run) on the paper's benchmarks, resumably.

Output layout (``--output DIR``)::

    DIR/<benchmark>/records.jsonl   one line per problem: prompt, completions, answers, statuses, correct
    DIR/<benchmark>/summary.json    metrics for that benchmark
    DIR/summary.json                all benchmarks + decoding settings
    DIR/table.md                    the paper-layout table
    DIR/decoding.json               model label + decoding: a resume with other settings is refused

Records are appended chunk by chunk (fsynced), so an interrupted run continues from the last
complete line; a summary is rebuilt from the records, so a resumed run gives the same summary.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import time
from dataclasses import dataclass
from pathlib import Path

from avspo_openrlhf import atomic
from avspo_openrlhf.data.io import load_local, read_jsonl, write_jsonl

from .generators import Completion, Decoding, FileGenerator, OracleGenerator, render_prompt
from .metrics import extract_choice, summarize


@dataclass(frozen=True)
class Benchmark:
    name: str  # our source name (avspo-prepare-data)
    column: str  # the paper's column title
    kind: str = "math"  # "math" (math-verify) or "choice" (option letter)


# the paper's column order
BENCHMARKS = [
    Benchmark("math500", "MATH-500"),
    Benchmark("gsm8k", "GSM8K"),
    Benchmark("minerva", "Minerva"),
    Benchmark("olympiadbench", "OlympiadBench"),
    Benchmark("amc", "AMC"),
    Benchmark("aime24", "AIME24"),
    Benchmark("mmlu_pro", "MMLU-Pro", kind="choice"),
]
# not in the paper: the CPU quickstart's held-out synthetic arithmetic (integer answers)
EXTRA = [Benchmark("arith", "Arithmetic", kind="arith")]
ALL = BENCHMARKS + EXTRA
BY_NAME = {b.name: b for b in ALL}
IN_DOMAIN = [b.name for b in BENCHMARKS if b.kind == "math"]


def load_benchmark(name: str, path: str, template: str = "paper") -> list[dict]:
    """Rows in the project schema from a prepared file, or from a raw file in the hub's format."""
    from avspo_openrlhf.data.tasks import make_prompt

    first = next((r for r in read_jsonl(path)[:1]), None) if path.endswith(".jsonl") else None
    # Prepared files carry "source"; hub MATH-500 has problem/answer/unique_id too but an int level.
    if first is not None and {"problem", "answer", "unique_id", "source"} <= set(first):
        rows = read_jsonl(path)
    else:
        rows = load_local(path, name).rows
    for i, r in enumerate(rows):
        r["unique_id"] = str(r.get("unique_id") or f"{name}-{i}")
        r.setdefault("prompt", make_prompt(r["problem"], template))
    ids = [r["unique_id"] for r in rows]
    if len(set(ids)) != len(ids):  # make ids unique so resume can key on them
        for i, r in enumerate(rows):
            r["unique_id"] = f"{r['unique_id']}#{i}"
    return rows


def find_data(name: str, data_dirs: list[str], overrides: dict[str, str]) -> str | None:
    if name in overrides:
        return overrides[name]
    for d in data_dirs:
        for fname in (f"{name}.jsonl", f"{name}.json"):
            p = os.path.join(d, fname)
            if os.path.exists(p):
                return p
    return None


def _read_records(path: Path) -> list[dict]:
    """Complete lines of a records file; a torn last line (killed mid-write) is dropped."""
    if not path.exists():
        return []
    good, raw = [], path.read_text(encoding="utf-8").splitlines()
    for i, line in enumerate(raw):
        try:
            good.append(json.loads(line))
        except json.JSONDecodeError:
            if i != len(raw) - 1:
                raise ValueError(f"{path}:{i + 1}: corrupt record in the middle of the file") from None
    if len(good) != len(raw):
        with open(path, "w", encoding="utf-8") as f:
            f.writelines(json.dumps(r) + "\n" for r in good)
    return good


class Scorer:
    def __init__(self, workers: int, timeout_s: float):
        self.workers, self.timeout_s, self._pool = workers, timeout_s, None

    def score(
        self, bench: Benchmark, rows: list[dict], comps: list[list[Completion]]
    ) -> list[tuple[list, list, list, list]]:
        """Per problem: extracted answers, statuses, correct flags, and per completion the
        verification attempts retried after overrunning the timeout (math benchmarks only; the
        others are scored in this process, without a timeout)."""
        if bench.kind == "arith":
            from avspo_openrlhf.rewards.arith_reward import arith_answer, score_arith

            out = []
            for r, cs in zip(rows, comps):
                status = [score_arith(c.text, r["answer"]) for c in cs]
                answers = [arith_answer(c.text)[0] for c in cs]  # maj@n votes on these
                out.append((answers, status, [x == "correct" for x in status], [0] * len(cs)))
            return out
        if bench.kind == "choice":
            out = []
            for r, cs in zip(rows, comps):
                picks = [extract_choice(c.text, len(r.get("choices") or [])) for c in cs]
                status = ["no_answer" if p is None else ("correct" if p == r["answer"] else "wrong") for p in picks]
                out.append((picks, status, [s == "correct" for s in status], [0] * len(cs)))
            return out
        if self._pool is None:
            from avspo_openrlhf.rewards.pool import VerifierPool

            self._pool = VerifierPool(num_workers=self.workers, timeout_s=self.timeout_s)
        flat_c = [c.text for cs in comps for c in cs]
        flat_g = [r["answer"] for r, cs in zip(rows, comps) for _ in cs]
        res = iter(self._pool.score(flat_c, flat_g))
        out = []
        for cs in comps:
            rs = [next(res) for _ in cs]
            statuses = [x.status for x in rs]
            out.append(([x.pred for x in rs], statuses, [s == "correct" for s in statuses], [x.retries for x in rs]))
        return out

    def close(self):
        if self._pool is not None:
            self._pool.close()


def evaluate_benchmark(
    bench,
    rows,
    generator,
    dec: Decoding,
    out_dir: Path,
    scorer: Scorer,
    *,
    chunk: int = 64,
    system_prompt=None,
    chat_template=True,
    ks=None,
    limit=None,
    progress=print,
) -> dict:
    out_dir.mkdir(parents=True, exist_ok=True)
    rec_path = out_dir / "records.jsonl"
    rows = rows[:limit] if limit else rows
    done = {r["unique_id"]: r for r in _read_records(rec_path)}
    todo = [r for r in rows if r["unique_id"] not in done]
    if done:
        progress(f"[{bench.name}] resuming: {len(done)}/{len(rows)} problems already done")
    t0 = time.time()
    for start in range(0, len(todo), chunk):
        part = todo[start : start + chunk]
        if hasattr(generator, "lookup"):
            texts = [None] * len(part)
            comps = [generator.lookup(r) for r in part]
        else:
            texts = [render_prompt(r["prompt"], generator.tokenizer, system_prompt, chat_template) for r in part]
            comps = generator.generate(texts, dec)
        scored = scorer.score(bench, part, comps)
        with open(rec_path, "a", encoding="utf-8") as f:
            for r, text, cs, (answers, statuses, correct, retries) in zip(part, texts, comps, scored):
                rec = {
                    "unique_id": r["unique_id"],
                    "problem": r["problem"],
                    "answer": r["answer"],
                    "level": r.get("level"),
                    "subject": r.get("subject"),
                    "prompt": text,
                    "completions": [c.text for c in cs],
                    "answers": answers,
                    "statuses": statuses,
                    "correct": correct,
                    "retries": retries,  # per completion: attempts retried after a verifier timeout
                    "lengths": [c.num_tokens for c in cs if c.num_tokens is not None],
                    "truncated": [c.truncated for c in cs if c.truncated is not None],
                }
                f.write(json.dumps(rec) + "\n")
                done[r["unique_id"]] = rec
            f.flush()
            os.fsync(f.fileno())
        progress(f"[{bench.name}] {len(done)}/{len(rows)} problems ({time.time() - t0:.0f}s)")
    records = [done[r["unique_id"]] for r in rows if r["unique_id"] in done]
    summary = summarize(records, ks)
    summary["benchmark"] = bench.column
    write_json(out_dir / "summary.json", summary)
    return summary


def write_json(path: Path, obj) -> None:
    atomic.write_json(path, obj, indent=1, sort_keys=True)


def markdown_table(results: dict[str, dict], decoding: str, label: str = "model", precision: str | None = None) -> str:
    """Paper column order; Avg over the in-domain math benchmarks present (named under the table)."""
    cols = [b for b in ALL if b.name in results]
    avg_over = [b for b in cols if b.kind == "math"]
    head = "| " + " | ".join([label] + [b.column for b in cols] + (["Avg"] if avg_over else [])) + " |"
    vals = [f"{100 * results[b.name]['pass@1']:.1f}" for b in cols]
    if avg_over:
        vals.append(f"{100 * sum(results[b.name]['pass@1'] for b in avg_over) / len(avg_over):.1f}")
    lines = [head, "|" + " --- |" * (len(cols) + 1 + bool(avg_over)), "| " + " | ".join([label, *vals]) + " |"]
    note = f"\npass@1 (%), {decoding}" + (f"; weights in {precision}." if precision else ".")
    if avg_over:
        note += f" Avg = mean over {', '.join(b.column for b in avg_over)}"
        note += " (MMLU-Pro, out of domain, is not averaged)." if "mmlu_pro" in results else "."
    return "\n".join(lines) + note + "\n"


def evaluate_model(
    generator,
    benchmarks: dict[str, list[dict]],
    dec: Decoding,
    out: Path,
    *,
    label="model",
    workers=2,
    timeout_s=5.0,
    identity: str | None = None,
    **kw,
) -> dict:
    """``identity`` (:func:`model_identity`) keys the resume: a folder holding another model's
    records is refused, whatever the two models' folder names."""
    out.mkdir(parents=True, exist_ok=True)
    precision = getattr(generator, "precision", None)  # the dtype the weights ran in (vLLM generators)
    settings = {"label": label, **dec.__dict__}
    settings.update({k: v for k, v in (("precision", precision), ("model", identity)) if v})
    _check_resume(out / "decoding.json", settings)
    scorer = Scorer(workers, timeout_s)
    results = {}
    try:
        for b in ALL:
            if b.name in benchmarks:
                results[b.name] = evaluate_benchmark(b, benchmarks[b.name], generator, dec, out / b.name, scorer, **kw)
    finally:
        scorer.close()
    table = markdown_table(results, dec.describe(), label, precision)
    verification = verification_counts(results)
    write_json(
        out / "summary.json",
        {
            "decoding": dec.__dict__,
            "label": label,
            "precision": precision,
            "benchmarks": results,
            "verification": verification,
        },
    )
    (out / "table.md").write_text(table, encoding="utf-8")
    return {"benchmarks": results, "table": table, "verification": verification}


def verification_counts(results: dict[str, dict]) -> dict[str, int]:
    """Verifier timeouts and retries over all benchmarks (from the records, so a resumed run counts
    the same); both are 0 on a healthy run, whatever else the machine is doing."""
    return {
        "timeouts": sum(s.get("verify_timeouts", 0) for s in results.values()),
        "retries": sum(s.get("verify_retries", 0) for s in results.values()),
    }


def verification_line(verification: dict[str, int]) -> str:
    return (
        f"[avspo-eval] verifier: {verification['timeouts']} timeouts, {verification['retries']} samples "
        "retried after overrunning the timeout"
    )


WEIGHT_SUFFIXES = (".safetensors", ".bin", ".pt", ".gguf")


def model_identity(model: str) -> str:
    """What an evaluation folder's records belong to: for a local folder, a digest of its config and
    every weight file's bytes (two trainings that both end in ``final/`` differ); for a hub id, the
    id. Resuming is keyed by this, never by the folder's name."""
    if not os.path.isdir(model):
        return f"hub:{model}"
    h = hashlib.blake2b(digest_size=16)
    for name in sorted(os.listdir(model)):
        path = os.path.join(model, name)
        if name == "config.json" or (name.endswith(WEIGHT_SUFFIXES) and os.path.isfile(path)):
            h.update(name.encode() + b"\0")
            with open(path, "rb") as f:
                for block in iter(lambda f=f: f.read(1 << 22), b""):
                    h.update(block)
    return f"blake2b:{h.hexdigest()}"


def _check_resume(path: Path, settings: dict) -> None:
    """Records are resumed by problem id, so a folder must hold one model and one decoding: refuse to
    mix in samples made with other settings."""
    if path.exists():
        old = json.loads(path.read_text(encoding="utf-8"))
        if old != settings:
            diff = {k: (old.get(k), v) for k, v in settings.items() if old.get(k) != v}
            raise ValueError(
                f"{path.parent} holds results of other settings {diff} (was, now): use another --output or delete it"
            )
    else:
        write_json(path, settings)


_STEP = re.compile(r"global_step(\d+)")


def find_checkpoints(run_dir: str) -> list[tuple[int, str]]:
    """HF checkpoints in an OpenRLHF run directory: ``*global_stepN_hf`` folders (``--ckpt.save_hf``)
    and any other folder with a ``config.json`` and weights, ordered by step (``final`` last)."""
    found = {}
    for cfg in Path(run_dir).rglob("config.json"):
        d = cfg.parent
        if not any(d.glob("*.safetensors")) and not any(d.glob("*.bin")):
            continue
        m = _STEP.search(d.name)
        step = int(m.group(1)) if m else 10**9  # the final model after training
        found.setdefault(step, str(d))
    return sorted(found.items())


def plot_steps(rows: list[tuple[int, dict]], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(6, 4))
    for b in BENCHMARKS:
        pts = [(s, r[b.name]["pass@1"] * 100) for s, r in rows if b.name in r and s < 10**9]
        if pts:
            ax.plot(*zip(*pts), marker="o", label=b.column)
    ax.set_xlabel("training step")
    ax.set_ylabel("pass@1 (%)")
    ax.grid(alpha=0.3)
    ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def write_eval_mix(benchmarks: dict[str, list[dict]], path: str, per_benchmark: int | None = None) -> int:
    """One jsonl for OpenRLHF's ``--eval.dataset`` (``datasource`` = benchmark name), so training
    logs ``eval/<benchmark>/pass1`` every ``--eval.steps`` (see ``--data.input_key prompt
    --data.label_key answer``)."""
    rows = []
    for name, rs in benchmarks.items():
        for r in rs[:per_benchmark] if per_benchmark else rs:
            rows.append({"prompt": r["prompt"], "answer": r["answer"], "datasource": name})
    return write_jsonl(rows, path)


__all__ = [
    "BENCHMARKS",
    "Decoding",
    "FileGenerator",
    "OracleGenerator",
    "evaluate_model",
    "find_checkpoints",
    "load_benchmark",
    "markdown_table",
    "plot_steps",
    "write_eval_mix",
]
