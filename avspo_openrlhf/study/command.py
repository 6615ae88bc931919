"""``avspo-study``: which remedy for *your* model and task? The arms and seeds you ask for, trained at
equal generated tokens on your problems and reward, paired by seed, and judged by this project's
decision rule (``study/compare.py``: Holm over your comparisons with the baseline, the exact sign-flip
p, the interval at its Holm level), with the power statement of your plan and the seeds to plan next.

    avspo-study --model tiny --task my_problems.jsonl --reward my_reward.py:score \\
        --arms grpo avspo --seeds 2 --budget 1500 --out runs/mine --dry-run   # checks, trains nothing
    avspo-study ... (the same without --dry-run)                              # runs, then the report

It is :class:`~avspo_openrlhf.study.remedies_gpu.GPURemediesStudy` (the GPU study is one configuration
of it) with your plan as its decision plan: every arm you name is primary, the first (or
``--baseline``) the base. docs/study.md is the manual."""

from __future__ import annotations

import argparse
import json
import os
import re
import sys
from dataclasses import dataclass
from pathlib import Path

from avspo_openrlhf.study.remedies_gpu import GPURemediesStudy

# what an arm name means beyond the registered estimators: the filtering remedies and the controls
SPECIAL_ARMS = {
    "dapo-ds": {"estimator": "grpo", "dynamic": True},
    "greso": {"estimator": "grpo", "dynamic": True, "greso": {}},
    "random-sign": {"estimator": "grpo", "control": "random_sign"},
    "format-reward": {"estimator": "grpo", "reward": "format"},
    "coin-reward": {"estimator": "grpo", "reward": "random"},
}
ARCHITECTURES = ("llama", "qwen2")  # what both engines run (stacked.py builds these two)
ARITH_LEVELS = ("add1", "mul1", "add2", "multi")


@dataclass(frozen=True)
class UserStudy(GPURemediesStudy):
    """The GPU study's machinery on the user's task: its prepared files instead of the built-in arithmetic."""

    data_files: tuple[str, str] | None = None  # (training pool, held-out set); None: the built-in arithmetic

    def make_data(self, out: Path) -> tuple[str, str, str]:
        if self.data_files is None:
            return super().make_data(out)
        return (*self.data_files, self.data_files[1])  # no learning-rate check here: its validation set is unused

    def near_duplicates(self, heldout_hash):  # the swapped-operand rule is the built-in arithmetic's
        return super().near_duplicates(heldout_hash) if self.data_files is None else frozenset()


class PlanError(ValueError):
    """A plan no run can carry out: one line, before anything trains."""


def parse_arm(item: str):
    """``[LABEL=]NAME[:key=value,...]`` -> ``(label, Arm)``: NAME a registered remedy (plugins' too) or one
    of :data:`SPECIAL_ARMS`; values are JSON where they parse (numbers, true, lists), text otherwise."""
    from avspo_openrlhf.algo import ESTIMATORS
    from avspo_openrlhf.study.spec import Arm

    head = item.split(":")[0]
    label, rest = (head.partition("=")[0], item[len(head.partition("=")[0]) + 1 :]) if "=" in head else ("", item)
    name, _, opts = rest.partition(":")
    label = label or name
    if not re.fullmatch(r"[A-Za-z0-9._@+-]+", label):
        raise PlanError(f"--arms {item}: an arm's label may hold letters, digits and ._@+- only")
    options = {}
    for kv in filter(None, opts.split(",")):
        k, eq, v = kv.partition("=")
        if not eq:
            raise PlanError(f"--arms {item}: options are key=value, got {kv!r}")
        try:
            options[k] = json.loads(v)
        except json.JSONDecodeError:
            options[k] = v
    if name in SPECIAL_ARMS:
        fields = dict(SPECIAL_ARMS[name])
        if options:
            fields["greso" if name == "greso" else "options"] = options
    elif name in ESTIMATORS:
        fields = {"estimator": name, "options": options}
    else:
        known = sorted(set(ESTIMATORS) | set(SPECIAL_ARMS))
        raise PlanError(f"--arms {item}: unknown remedy {name!r}; known: {', '.join(known)} (a plugin's: --plugin)")
    try:
        return label, Arm(**fields)
    except (ValueError, TypeError) as e:
        raise PlanError(f"--arms {item}: {e}") from None


class Formatter(argparse.RawDescriptionHelpFormatter):
    """--help keeps the description's lines and names every default a flag has."""

    def _get_help_string(self, action):
        h = action.help or ""
        if action.default in (None, False, [], argparse.SUPPRESS) or "default" in h or not action.option_strings:
            return h
        return h + " (default: %(default)s)"


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="avspo-study",
        description="Which remedy for your model and task? "
        + __doc__.split("\n\n")[0].split("? ", 1)[1].replace("``", ""),
        formatter_class=Formatter,
        epilog="Every run's step lines are in <out>/<arm>_seed<k>/log.txt (metrics.jsonl, TensorBoard beside).",
        allow_abbrev=False,
    )
    g = p.add_argument_group("the plan (fixed before the runs: the report's decision plan)")
    g.add_argument(
        "--arms",
        nargs="+",
        required=True,
        metavar="[LABEL=]NAME[:k=v,...]",
        help="the arms: a registered remedy (grpo, avspo, sign, rl_zvp, ngrpo, ..., a --plugin's) or dapo-ds, "
        "greso, random-sign, format-reward, coin-reward; options after ':' (avspo:strategy=opposite); a LABEL "
        "names two arms of one remedy apart",
    )
    g.add_argument("--baseline", help="the arm every other is compared with (default: the first)")
    g.add_argument(
        "--seeds",
        type=int,
        help="seeds per arm, 0..N-1, paired across arms (default: the fewest at which the rule can give a "
        "verdict for this many comparisons; fewer give no verdict, said so)",
    )
    g.add_argument(
        "--plugin", action="append", default=[], help="a module or .py file that registers a remedy (repeatable)"
    )
    t = p.add_argument_group("the task")
    t.add_argument(
        "--task",
        default="arith",
        help="arith (the built-in arithmetic of four levels) or a jsonl of your problems (its fields below)",
    )
    t.add_argument("--heldout", help="a jsonl of held-out problems (default: --heldout-share of --task, disjoint)")
    t.add_argument("--heldout-share", type=float, default=0.2, help="the share held out without --heldout")
    t.add_argument("--heldout-size", type=int, default=200, help="held-out problems evaluated at most")
    t.add_argument("--prompt-field", default="problem", help="the field holding a problem's text")
    t.add_argument("--answer-field", default="answer", help="the field holding its answer")
    t.add_argument("--level-field", help="a field holding its level (each level weighs the same in pass@1)")
    t.add_argument(
        "--reward",
        default="arith",
        help="arith | math (math-verify) | avspo:arith | avspo:math | module:function | path/file.py:function, "
        "a function(completion, answer) -> float",
    )
    t.add_argument(
        "--reward-range",
        type=float,
        nargs=2,
        default=(0.0, 1.0),
        metavar=("LO", "HI"),
        help="the reward's declared range: a value outside it stops the run; all-LO/all-HI groups collapse",
    )
    t.add_argument("--template", default="user", help="the prompt template (data.tasks.TEMPLATES)")
    s = p.add_argument_group("the settings every arm shares")
    s.add_argument("--budget", type=int, default=64_000, help="generated tokens per run: the equal-compute stop")
    s.add_argument("--group-size", type=int, default=8, help="completions per prompt (G)")
    s.add_argument("--prompts-per-step", type=int, default=8, help="groups per optimizer step")
    s.add_argument("--max-new-tokens", type=int, default=32, help="the answer's length limit (truncation is reported)")
    s.add_argument("--lr", type=float, default=1e-5, help="AdamW's learning rate")
    s.add_argument("--temperature", type=float, default=0.7, help="sampling temperature (and the log-probs')")
    s.add_argument("--acr-tau", type=float, default=0.5, help="the gate's initial threshold (acr.tau_init)")
    s.add_argument("--acr-window", type=int, default=5, help="steps in the gate's ACR window (acr.window)")
    s.add_argument("--eval-n", type=int, default=4, help="held-out samples per problem")
    s.add_argument(
        "--mid-eval-tokens", type=int, default=0, help="generated tokens between mid-run evaluations (0: none)"
    )
    s.add_argument("--micro-batch", type=int, default=16, help="sequences per forward/backward (memory, not results)")
    r = p.add_argument_group("where and how it runs")
    r.add_argument("--model", default="smollm2", help="smollm2 | tiny | a local HF folder of a Llama or Qwen2 model")
    r.add_argument("--out", default="runs/study", help="the run folder (rerun the same command to resume)")
    r.add_argument("--publish", help="also publish each finished run and the report here")
    r.add_argument("--k", type=int, default=1, help="runs at once on this device")
    r.add_argument(
        "--engine",
        choices=["process", "stacked"],
        default="process",
        help="process: one process per run; stacked: K runs in one process (a GPU's choice)",
    )
    r.add_argument("--threads", type=int, help="CPU threads per run (default: the cores / K)")
    r.add_argument("--shard", default="0/1", metavar="I/N", help="a Slurm array task's share of the runs")
    r.add_argument("--dry-run", action="store_true", help="check everything a run would hit first; train nothing")
    r.add_argument("--report-only", action="store_true", help="rebuild the report from the finished runs")
    return p


def memory_per_run(model: str, s, engine: str) -> tuple[float, float]:
    """``(GiB one run needs, GiB this device has free)``, an upper estimate: weights, gradients and
    AdamW's two moments in fp32 (16 bytes a parameter), a micro-batch's logits four times over (the
    log-softmax and its gradient), the generation's KV cache for a group batch, 1 GiB for a process,
    all times 1.5."""
    import torch
    from transformers import AutoConfig

    c = AutoConfig.from_pretrained(model)
    hidden, layers, vocab = c.hidden_size, c.num_hidden_layers, c.vocab_size
    kv_dim = hidden // c.num_attention_heads * getattr(c, "num_key_value_heads", c.num_attention_heads)
    inter = getattr(c, "intermediate_size", 4 * hidden)
    params = vocab * hidden * (1 if getattr(c, "tie_word_embeddings", False) else 2) + layers * (
        2 * hidden * hidden + 2 * hidden * kv_dim + 3 * hidden * inter
    )
    seq = 256 + s.max_new_tokens  # a prompt of at most ~256 tokens
    seqs = s.prompts_per_step * s.group_size
    need = (
        16 * params
        + 4 * 4 * s.micro_batch * seq * vocab
        + 4 * 2 * layers * seqs * seq * kv_dim
        + (2**30 if engine == "process" else 0)
    ) * 1.5
    if torch.cuda.is_available():
        free = torch.cuda.mem_get_info()[0]
    else:
        meminfo = Path("/proc/meminfo").read_text().splitlines()
        free = next((int(line.split()[1]) * 1024 for line in meminfo if line.startswith("MemAvailable")), 0)
    return need / 2**30, free / 2**30


def build(args, out: Path) -> tuple:
    """The study (a :class:`GPURemediesStudy` of the user's plan, its task's files prepared in
    ``out/data``) and its settings, or PlanError/TaskError."""
    from avspo_openrlhf.study.compare import fewest_seeds
    from avspo_openrlhf.study.spec import StudySettings
    from avspo_openrlhf.study.task import Task, normalize_reward
    from avspo_openrlhf.trainer.plugins import load_plugins

    try:
        load_plugins([str(Path(x).resolve()) if x.endswith(".py") else x for x in args.plugin])
    except (ImportError, ValueError) as e:
        raise PlanError(str(e)) from None
    arms = dict(parse_arm(a) for a in args.arms)
    if len(arms) != len(args.arms):
        raise PlanError(f"--arms: two arms share a label ({' '.join(args.arms)}); give one a LABEL=")
    if len(arms) < 2:
        raise PlanError("--arms: at least two arms, a baseline and a remedy")
    base = args.baseline or next(iter(arms))
    if base not in arms:
        raise PlanError(f"--baseline {base}: not one of the arms ({', '.join(arms)})")
    n = args.seeds if args.seeds is not None else fewest_seeds(len(arms) - 1)
    if n < 2:
        raise PlanError(f"--seeds: at least 2 (a paired comparison needs two), got {n}")
    reward = normalize_reward(args.reward)
    try:
        settings = StudySettings(
            group_size=args.group_size,
            prompts_per_step=args.prompts_per_step,
            max_new_tokens=args.max_new_tokens,
            temperature=args.temperature,
            lr=args.lr,
            token_budget=args.budget,
            template=args.template,
            reward=reward,
            acr={"tau_init": args.acr_tau, "window": args.acr_window, "reward_range": list(args.reward_range)},
            eval_n=args.eval_n,
            eval_temperature=args.temperature,
            mid_eval_tokens=args.mid_eval_tokens,
            mid_eval_problems=min(args.heldout_size, 200),
            micro_batch=args.micro_batch,
            engine=args.engine,
            ckpt_every=10,
        )
    except ValueError as e:  # StudySettings names its field (token_budget: --budget)
        raise PlanError(str(e)) from None
    files, levels = None, ARITH_LEVELS
    if args.task != "arith":
        task = Task(
            train=args.task,
            heldout=args.heldout,
            heldout_share=args.heldout_share,
            prompt_field=args.prompt_field,
            answer_field=args.answer_field,
            level_field=args.level_field,
            reward=args.reward,
            reward_range=tuple(args.reward_range),
        )
        train, heldout, levels = task.prepare(out / "data", args.heldout_size)
        files = (train, heldout)
    study = UserStudy(
        levels=levels,
        train_prompts=64,
        heldout_per_level=max(1, args.heldout_size // len(ARITH_LEVELS)),
        settings=settings,
        arms=arms,
        seeds=dict.fromkeys(arms, n),
        primary=tuple(arms),
        base=base,
        second_base=base,
        plugins=tuple(args.plugin),
        data_files=files,
    )
    return study, settings


def check_task(args, data: tuple[str, str, str]) -> list[str]:
    """The rows and the reward, checked before the model is touched (seconds): PlanError/TaskError on the first
    that fails, what was found otherwise."""
    from avspo_openrlhf.study.task import Task, read_rows

    train, heldout = read_rows(data[0]), read_rows(data[1])
    levels = sorted({r.get("level", "") for r in heldout})
    task = Task(train=data[0], reward=args.reward, reward_range=tuple(args.reward_range))
    return [
        f"rows: {len(train)} training problems, {len(heldout)} held-out ({len(levels)} levels: {', '.join(levels)})",
        task.check_reward(train),
    ]


def check_model(settings, args, model: str) -> list[str]:
    """The model's architecture, and memory for ``--k`` runs on this device."""
    arch = json.loads(Path(model, "config.json").read_text(encoding="utf-8")).get("model_type")
    if arch not in ARCHITECTURES:
        raise PlanError(f"--model {args.model}: a {arch!r} model; the study's engines run {', '.join(ARCHITECTURES)}")
    need, free = memory_per_run(model, settings, args.engine)
    fits = int(free // need)
    if args.k > fits:
        raise PlanError(
            f"--k {args.k}: {args.k} runs need about {args.k * need:.1f} GiB, {free:.1f} GiB are free: use --k {max(1, fits)}"
        )
    return [
        f"model: {arch}; memory: about {need:.2f} GiB a run (an upper estimate), {free:.1f} GiB free: {fits} at "
        f"once fit (--k {args.k})"
    ]


def probe(study, settings, model: str, data: tuple[str, str, str], runs: int, k: int) -> str:
    """One training step of the base arm and one batch of held-out evaluation, timed, in a scratch
    folder (its weights loaded, a batch generated, scored and trained on; then held-out problems
    generated and scored): the time a run and the plan take, estimated from them, evaluation included
    (the mid-run milestones at n = 2, the final one at ``eval_n``, the greedy one). The estimate
    assumes every step generates as many tokens as this first one (completions usually shorten as a
    model learns the format: more steps) and every evaluated completion costs what the batch's did."""
    import shutil
    import tempfile
    import time
    from dataclasses import replace

    from avspo_openrlhf.study.loop import Run, evaluate

    quick = replace(settings, token_budget=1, final_eval=False, mid_eval_tokens=0, ckpt_every=0, engine="process")
    spec = study.spec(study.base, 0, model, data, quick)
    tmp = Path(tempfile.mkdtemp(prefix="avspo-study-probe-"))
    try:
        t0 = time.perf_counter()
        run = Run(spec, tmp)
        loaded = time.perf_counter()
        row = run.step()
        step_s = time.perf_counter() - loaded
        heldout = run.heldout_rows
        batch = heldout[:16]
        t1 = time.perf_counter()
        run.drive(evaluate(batch, 1, quick, run.score, 1))
        per_completion = (time.perf_counter() - t1) / len(batch)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    steps = -(-settings.token_budget // max(1, row["tokens"]))
    milestones = settings.token_budget // settings.mid_eval_tokens + 1 if settings.mid_eval_tokens else 0
    completions = milestones * 2 * min(settings.mid_eval_problems, len(heldout))
    if settings.final_eval:
        completions += len(heldout) * (settings.eval_n + (1 if settings.greedy_eval else 0))
    eval_s = completions * per_completion
    one = loaded - t0 + steps * step_s + eval_s

    def dur(sec: float) -> str:
        return f"{sec:.0f} s" if sec < 120 else f"{sec / 60:.0f} min"

    return (
        f"time: a probe step of {study.base} took {step_s:.1f} s for {row['tokens']:,} generated tokens (the model "
        f"loaded in {loaded - t0:.1f} s), a held-out completion {per_completion:.2f} s (a batch of {len(batch)}): "
        f"about {steps} steps ({dur(steps * step_s)}) and {completions:,} evaluated completions ({dur(eval_s)}), "
        f"{dur(one)} a run, {runs} runs {dur(runs * one)} one after another (--k {k} at once divides that by at "
        f"most {k}: on a CPU they share its cores), plus each run's start; the console gives the time left as "
        "runs end"
    )


def same_settings(study, settings, model: str, data: tuple[str, str, str], out: Path) -> str:
    """Refuse a run folder that holds runs of other settings (a changed flag, model, data, or reward
    source), naming what differs, finished or not: a run in flight would otherwise resume on the new
    ones. The first call writes the record (``<out>/study.json``)."""
    from avspo_openrlhf.atomic import atomic_write
    from avspo_openrlhf.study.fingerprint import settings_difference
    from avspo_openrlhf.study.store import StudyError

    arm = next(iter(study.arms))
    record = study.spec(arm, 0, model, data, settings).settings_record()
    record.pop("versions", None)  # a library upgrade is recorded per run, not refused here
    path = out / "study.json"
    if path.exists():
        old = json.loads(path.read_text(encoding="utf-8"))
        if old != json.loads(json.dumps(record)):
            diff = settings_difference(old, json.loads(json.dumps(record)))
            raise StudyError(
                f"{out} holds runs of other settings ({'; '.join(diff[:4]) or 'the record'}): use another --out, "
                "or the settings it was started with"
            )
        return f"run folder {out}: the same settings as its runs so far (they resume)"
    out.mkdir(parents=True, exist_ok=True)
    atomic_write(path, json.dumps(record, indent=1, sort_keys=True))
    return f"run folder {out}: new, its settings recorded in study.json"


def main(argv: list[str] | None = None) -> int:
    from avspo_openrlhf.study.store import StudyError
    from avspo_openrlhf.study.task import TaskError

    p = parser()
    args = p.parse_args(argv)
    try:
        try:
            i, n = (int(x) for x in args.shard.split("/"))
            if not 0 <= i < n:
                raise ValueError
        except ValueError:
            raise PlanError(f"--shard: I/N with 0 <= I < N, got {args.shard!r}") from None
        if args.k < 1:
            raise PlanError(f"--k: at least 1 run at once, got {args.k}")
        out, published = Path(args.out), Path(args.publish) if args.publish else None
        study, settings = build(args, out)
        model = args.model
        if model not in ("smollm2", "tiny") and not Path(model, "config.json").is_file():
            raise PlanError(f"--model: {model} is not smollm2, tiny or a local HF folder with a config.json")
        # the GPU study's own flags for its run loop, its defaults included (the user's plan is the study's)
        run_args = study.parser().parse_args(
            ["--out", args.out, "--k", str(args.k), "--engine", args.engine, "--shard", args.shard]
            + (["--publish", args.publish] if args.publish else [])
            + (["--threads", str(args.threads)] if args.threads else [])
            + (["--dry-run"] if args.dry_run else [])
        )
        if args.report_only:
            print(study._rebuild(run_args, out, published), flush=True)
            return 0
        data = study.make_data(out / "data")
        found = check_task(args, data)
        if model in ("smollm2", "tiny"):
            from avspo_openrlhf.cpu.models import prepare

            model = prepare(model)
        found += check_model(settings, args, model)
        found.append(same_settings(study, settings, model, data, out))
        for line in found:
            print(f"[study] {line}", flush=True)
        if args.dry_run:
            print(f"[study] timing one training step of {study.base} ...", flush=True)
            print(f"[study] {probe(study, settings, model, data, len(study.arms) * study.seeds[study.base], args.k)}")
        run_args.model = model
        return study._run(run_args, p, out, published, settings, (i, n))
    except (PlanError, TaskError, StudyError) as e:
        print(f"avspo-study: {e}", file=sys.stderr, flush=True)
        return 2


if __name__ == "__main__":
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    sys.exit(main())
