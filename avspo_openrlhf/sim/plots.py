"""Plots of pipeline timelines and async results (matplotlib, Agg)."""

from __future__ import annotations

COLORS = {"generate": "tab:blue", "train": "tab:orange", "sync": "tab:red", "wait": "0.85"}


def _plt():
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def plot_gantt(
    runs: dict[str, tuple[list, list]], path: str, title: str = "", max_s: float | None = None, warmup_steps: int = 0
) -> None:
    """One pair of lanes (generator, trainer) per run: what each side does over time; with
    ``warmup_steps``, the time up to the end of that step is shaded (left out of every rate)."""
    plt = _plt()
    fig, axes = plt.subplots(len(runs), 1, figsize=(11, 1.5 + 1.3 * len(runs)), squeeze=False, sharex=True)
    horizon = max_s or max((max((e for *_, e in spans), default=0) for _, spans in runs.values()), default=1)
    for ax, (label, (steps, spans)) in zip(axes[:, 0], runs.items()):
        for y, lane in enumerate(["trainer", "generator"]):
            for ln, phase, s, e in spans:
                if ln == lane and s < horizon:
                    ax.broken_barh([(s, min(e, horizon) - s)], (y - 0.35, 0.7), color=COLORS[phase])
        for st in steps:
            if st["end"] <= horizon:
                ax.axvline(st["end"], color="k", lw=0.4, alpha=0.4)
        if warmup_steps and len(steps) >= warmup_steps:
            ax.axvspan(0, steps[warmup_steps - 1]["end"], color="0.6", alpha=0.15, lw=0)
        ax.set_yticks([0, 1], ["trainer", "generator"])
        ax.set_title(label, fontsize=9, loc="left")
    axes[-1, 0].set_xlabel(
        "seconds (thin lines: a training step ends"
        + (f"; shaded: warm-up, the first {warmup_steps} step(s), left out of the rates)" if warmup_steps else ")")
    )
    handles = [plt.Rectangle((0, 0), 1, 1, color=c) for c in COLORS.values()]
    fig.legend(handles, list(COLORS), loc="upper right", ncol=4, fontsize=8)
    fig.suptitle(title, fontsize=10, x=0.01, ha="left")
    fig.tight_layout(rect=(0, 0, 1, 0.95))
    fig.savefig(path, dpi=110)
    plt.close(fig)


def plot_throughput(rows: list[dict], path: str) -> None:
    """Measured speedup over sync per mode (bar: mean; dots: each seed), against the ideal (an
    estimate from the phase timers) and the simulator calibrated on the sync run."""
    plt = _plt()
    fig, ax = plt.subplots(figsize=(max(6, 1.1 * len(rows)), 4))
    xs = range(len(rows))
    ax.bar([x - 0.27 for x in xs], [r["speedup"] for r in rows], 0.27, label="measured (mean; dots: seeds)")
    for x, r in zip(xs, rows):
        seeds = r.get("speedup_seeds") or []
        ax.scatter([x - 0.27] * len(seeds), seeds, color="k", s=10, zorder=3)
    for dx, key, label in (
        (0.0, "predicted_speedup", "simulator calibrated on the sync run alone"),
        (0.27, "probe_predicted_speedup", "simulator: sync run + 3-step overlapped probe"),
    ):
        if any(key in r for r in rows):
            ax.bar([x + dx for x in xs], [r.get(key, 0) for r in rows], 0.27, label=label, alpha=0.7)
    ideal = rows[0].get("ideal")
    if ideal:
        ax.axhline(ideal, color="k", ls="--", lw=1, label=f"ideal {ideal:.2f}x (estimate from the phase timers)")
    ax.axhline(1.0, color="0.5", lw=0.8)
    ax.set_xticks(list(xs), [r["mode"] for r in rows], rotation=25, ha="right", fontsize=8)
    ax.set_ylabel("speedup over sync (same core split)")
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def plot_staleness(hists: dict[str, dict], path: str, rejected: dict[str, float] | None = None) -> None:
    """Staleness of the trained batches per mode; ``rejected``: over-stale batches generated and
    thrown away per mode (shown in the legend, as a share of all batches generated)."""
    plt = _plt()
    fig, ax = plt.subplots(figsize=(6, 3.5))
    modes = list(hists)
    keys = sorted({k for h in hists.values() for k in h})
    width = 0.8 / max(len(modes), 1)
    for i, m in enumerate(modes):
        tot = sum(hists[m].values()) or 1
        rej = (rejected or {}).get(m, 0)
        label = f"{m}: {rej:.0f} rejected ({100 * rej / (tot + rej):.0f} % of generated)" if rej else m
        ax.bar([k + i * width for k in keys], [hists[m].get(k, 0) / tot for k in keys], width, label=label)
    ax.set_xticks([k + 0.4 - width / 2 for k in keys], [str(k) for k in keys])
    ax.set_xlabel("staleness (trainer step - generating policy version)")
    ax.set_ylabel("fraction of trained batches")
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def plot_curves(curves: dict[str, dict[str, list]], key: str, path: str, ylabel: str, title: str = "") -> None:
    """``curves[mode][key]``: a list per seed of (step, value) pairs; mean over seeds per step."""
    plt = _plt()
    fig, ax = plt.subplots(figsize=(6, 3.5))
    for mode, per_key in curves.items():
        seeds = per_key.get(key, [])
        if not seeds:
            continue
        by_step: dict[int, list] = {}
        for pts in seeds:
            for s, v in pts:
                by_step.setdefault(int(s), []).append(v)
        xs = sorted(by_step)
        ax.plot(
            xs, [sum(by_step[x]) / len(by_step[x]) for x in xs], marker="o", ms=3, label=f"{mode} ({len(seeds)} seeds)"
        )
    ax.set_xlabel("training step")
    ax.set_ylabel(ylabel)
    if title:
        ax.set_title(title, fontsize=9)
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
