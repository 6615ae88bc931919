"""Run reports: per-step metrics as jsonl, an offline-capable wandb logger, and PNG plots."""

from __future__ import annotations

import json
import math
import os
import sys
from pathlib import Path

from avspo_openrlhf.atomic import atomic_file


def _floats(logs: dict) -> dict:
    out = {}
    for k, v in logs.items():
        if hasattr(v, "item") and getattr(v, "numel", lambda: 0)() == 1:
            v = v.item()
        if isinstance(v, bool):
            v = float(v)
        if isinstance(v, (int, float)) and math.isfinite(float(v)):
            out[k] = float(v)
    return out


class JsonlLogger:
    """OpenRLHF logger interface (``log_train``/``log_eval``/``close``) writing ``metrics.jsonl``."""

    def __init__(self, directory: str):
        os.makedirs(directory, exist_ok=True)
        self.path = os.path.join(directory, "metrics.jsonl")

    def _write(self, row: dict) -> None:
        with open(self.path, "a", encoding="utf-8") as f:
            f.write(json.dumps(row) + "\n")

    def log_train(self, global_step: int, logs: dict) -> None:
        self._write({"step": int(global_step), "kind": "train", **_floats(logs)})

    def log_eval(self, global_step: int, logs: dict) -> None:
        self._write({"step": int(global_step), "kind": "eval", **_floats(logs)})

    def close(self) -> None:
        pass

    def truncate_after(self, step: int) -> int:
        """A resumed run continues from the checkpoint of ``step``: rows logged after it (steps the
        killed run trained but never checkpointed, which are trained again) are dropped, so the log
        holds each step once, as the checkpoint knows it. Atomic; returns the rows dropped."""
        if not os.path.exists(self.path):
            return 0
        with open(self.path, encoding="utf-8") as f:
            lines = f.readlines()
        keep = []
        for line in lines:
            try:
                row = json.loads(line)
            except json.JSONDecodeError:
                continue  # a torn last line of the killed run
            if int(row.get("step", 0)) <= step:
                keep.append(line if line.endswith("\n") else line + "\n")
        if len(keep) == len(lines):
            return 0
        with atomic_file(self.path) as f:
            f.writelines(keep)
        return len(lines) - len(keep)


def _wandb_config(args) -> dict:
    """The run's args as a plain nested dict, secrets redacted (the wandb config is visible to
    everyone who can see the project)."""
    from avspo_openrlhf.redaction import redact

    def plain(v):
        return {k: plain(x) for k, x in vars(v).items()} if hasattr(v, "__dict__") else v

    return plain(redact(args))


LAUNCH_INPUTS_MODULE = "wandb.sdk.launch.inputs.internal"


def _skip_unstaged_launch_inputs() -> None:
    """wandb's ``Run`` applies W&B Launch's staged inputs as it starts
    (``Run._detect_and_apply_job_inputs``), importing all of ``wandb.sdk.launch`` to look: in a process
    that holds torch, transformers and vLLM, pydantic's model building there walks ``sys.modules`` per
    field, more than half of the 4.1 s the CPU driver spent starting wandb's run (py-spy; 2-core Intel
    Xeon with native bf16). Inputs are staged only through that module (``wandb.sdk.launch``'s
    ``manage_config_file`` / ``manage_wandb_config`` import it), so where it is not imported there is
    nothing to apply and the look is skipped; where it is, wandb's own runs. The private names are
    guarded by tests/test_startup.py."""
    from wandb.sdk.wandb_run import Run

    apply = Run._detect_and_apply_job_inputs
    if getattr(apply, "skips_unstaged", False):
        return

    def detect_and_apply_job_inputs(self) -> None:
        if LAUNCH_INPUTS_MODULE in sys.modules:
            apply(self)

    detect_and_apply_job_inputs.skips_unstaged = True
    detect_and_apply_job_inputs.wrapped = apply
    Run._detect_and_apply_job_inputs = detect_and_apply_job_inputs


def _wandb_init(args, run_dir: str | None):
    import wandb

    _skip_unstaged_launch_inputs()
    return wandb.init(
        project=args.logger.wandb.project or "avspo",
        name=args.logger.wandb.run_name,
        mode=os.environ.get("WANDB_MODE") or ("online" if wandb.api.api_key else "offline"),
        dir=run_dir,
        config=_wandb_config(args),
        reinit=True,
    )


class WandbAutoLogger:
    """wandb without an API key flag: online when logged in, otherwise offline (``wandb sync`` later)."""

    _early: dict = {}  # run folder -> the wandb run start_early began there, for the trainer to take

    def __init__(self, args, run_dir: str | None):
        import wandb

        self.handle = wandb
        self.run = self._early.pop(run_dir, None)
        if self.run is None:
            self.run = _wandb_init(args, run_dir)
        else:  # the trainer's copy of the args, as a run started here records them
            self.run.config.update(_wandb_config(args), allow_val_change=True)
        wandb.define_metric("train/global_step")
        wandb.define_metric("train/*", step_metric="train/global_step", step_sync=True)

    @classmethod
    def start_early(cls, args, run_dir: str | None) -> None:
        """``wandb.init`` now, for the trainer built later in this process to take (about 2.4 s of CPU
        with its service process, 2-core Xeon with native bf16): the CPU driver runs it while Ray starts rather than
        beside the engine's and the policy's start (``cpu/backend.py``)."""
        cls._early[run_dir] = _wandb_init(args, run_dir)

    def log_train(self, global_step, logs):
        self.handle.log({f"train/{k}": v for k, v in {**_floats(logs), "global_step": global_step}.items()})

    def log_eval(self, global_step, logs):
        self.handle.log({f"eval/{k}": v for k, v in {**_floats(logs), "global_step": global_step}.items()})

    def close(self):
        self.handle.finish()


class FanOutLogger:
    """Several OpenRLHF-style loggers behind one."""

    def __init__(self, *loggers):
        self.loggers = [lg for lg in loggers if lg is not None]

    def log_train(self, step, logs):
        for lg in self.loggers:
            lg.log_train(step, logs)

    def log_eval(self, step, logs):
        for lg in self.loggers:
            lg.log_eval(step, logs)

    def close(self):
        for lg in self.loggers:
            lg.close()


def read_metrics(path: str) -> tuple[list[dict], list[dict]]:
    """Train and eval rows of a metrics.jsonl; a step logged twice (a resumed run) keeps the last."""
    train, evals = {}, {}
    if os.path.exists(path):
        for line in Path(path).read_text(encoding="utf-8").splitlines():
            try:
                row = json.loads(line)
            except json.JSONDecodeError:
                continue  # a torn last line from a killed run
            (evals if row.get("kind") == "eval" else train)[row["step"]] = row
    return [train[k] for k in sorted(train)], [evals[k] for k in sorted(evals)]


PANELS = [
    (
        "ACR by view",
        [
            ("acr", "raw (correctness)"),
            ("acr_shaped", "shaped"),
            ("acr_effective", "effective (after the remedy)"),
            ("acr_gate", "ACR_gate (smoothed)"),
        ],
    ),
    ("ACR split", [("acr_all_wrong", "all-wrong"), ("acr_all_right", "all-right")]),
    ("reward", [("rollout/reward_mean", "mean reward")]),
    ("entropy (nats)", [("monitor/entropy", "token entropy")]),
    ("tau_adapt", [("tau_adapt", "tau_adapt")]),
    ("async staleness", [("async/staleness", "trainer step - generation version")]),
]


SMOOTHED = {"rollout/reward_mean"}


def plot_run(metrics_path: str, out_dir: str) -> list[str]:
    """PNG plots of a run's metrics.jsonl (panels with no data are skipped); returns the files."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    train, evals = read_metrics(metrics_path)
    os.makedirs(out_dir, exist_ok=True)
    panels = list(PANELS)
    levels = sorted({k.split("/", 1)[1] for r in train for k in r if k.startswith("acr_by_level/")})
    if levels:
        panels.insert(
            1,
            (
                "ACR by level (raw solid, effective dashed)",
                [(f"acr_by_level/{lv}", f"{lv} raw") for lv in levels]
                + [(f"acr_effective_by_level/{lv}", f"{lv} effective") for lv in levels],
            ),
        )
    eval_keys = sorted({k for r in evals for k in r if k.endswith("pass1")})
    if eval_keys:
        panels.append(("held-out accuracy", [(k, k) for k in eval_keys]))
    shown = [
        (t, [(k, lab) for k, lab in series if any(k in r for r in (evals if t == "held-out accuracy" else train))])
        for t, series in panels
    ]
    shown = [(t, s) for t, s in shown if s]
    if not shown:
        return []
    cols = 2
    rows = (len(shown) + 1) // cols
    fig, axes = plt.subplots(rows, cols, figsize=(11, 3.2 * rows), squeeze=False)
    for ax, (title, series) in zip(axes.flat, shown):
        src = evals if title == "held-out accuracy" else train
        for key, label in series:
            pts = [(r["step"], r[key]) for r in src if key in r]
            style = "--" if key.startswith("acr_effective_by_level/") else "-"
            line = ax.plot(
                *zip(*pts),
                style,
                marker="." if len(pts) < 60 else None,
                label=label,
                alpha=0.45 if key in SMOOTHED else 1.0,
            )
            if key in SMOOTHED and len(pts) >= 3:  # noisy per-step values: a trailing mean beside the raw curve
                w = max(3, len(pts) // 5)
                ys = [p[1] for p in pts]
                sm = [sum(ys[max(0, i - w + 1) : i + 1]) / len(ys[max(0, i - w + 1) : i + 1]) for i in range(len(ys))]
                ax.plot([p[0] for p in pts], sm, color=line[0].get_color(), lw=2.2, label=f"{label}, mean of last {w}")
        ax.set_title(title)
        ax.set_xlabel("step")
        ax.grid(alpha=0.3)
        ax.legend(fontsize=7)
    for ax in list(axes.flat)[len(shown) :]:
        ax.axis("off")
    fig.tight_layout()
    path = os.path.join(out_dir, "training_curves.png")
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return [path]
