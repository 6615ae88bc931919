"""One object that runs docs/algorithm.md#one-step step by step for a trainer, whatever the remedy:
ACR stats on both reward views, the gate, the chosen estimator's advantages, the adaptive threshold,
the monitors, and their state.

Pure (torch only). A trainer calls :meth:`CollapseController.step` once per rollout batch with the
``[N, G]`` raw (correctness) and shaped rewards, :meth:`token_advantages` when the estimator is
token-level (RL-ZVP), and :meth:`after_train` with the optimizer's metrics; ``state_dict`` goes
into the checkpoint.
"""

from __future__ import annotations

from typing import Any

import torch

from .advantages import default_config, get_estimator, group_advantages
from .collapse import collapse_stats
from .monitors import ACRTracker, EntropyCollapseMonitor, KLDriftMonitor
from .options import ACRConfig, MonitorConfig, config_of
from .threshold import AdaptiveThreshold


def _scored_mean(rewards: torch.Tensor, scored: torch.Tensor | None) -> float:
    """Mean reward over the scored completions (0.0 when there is none)."""
    if scored is None:
        return float(rewards.mean()) if rewards.numel() else 0.0
    n = int(scored.sum())
    return float(torch.where(scored, rewards, torch.zeros_like(rewards)).sum()) / n if n else 0.0


class CollapseController:
    """ACR monitoring (always) and one registered estimator's advantages for a stream of batches.

    Args:
        estimator: a name in :data:`~avspo_openrlhf.algo.advantages.ESTIMATORS` (every
            registered estimator, this package's and a user's): :meth:`step` returns its
            advantages; ``None``: measure only, :meth:`step` returns ``None`` advantages (the
            trainer's own estimator, e.g. OpenRLHF's GRPO, is used).
        config: that estimator's config (``AVSPOConfig(...)``, ...); ``None``: its defaults.
        acr: :class:`ACRConfig`: collapse tolerance, reward range, the gate's smoothing and
            adaptive threshold, the ACR alarms.
        monitor: :class:`MonitorConfig`: the entropy-collapse and KL-drift alarms.
        seed: seeds the generator of random virtual rewards (its state is checkpointed), unless the
            estimator's config has a ``seed`` of its own that is not None.
    """

    def __init__(
        self,
        estimator: str | None = None,
        config: Any = None,
        *,
        acr: ACRConfig | None = None,
        monitor: MonitorConfig | None = None,
        seed: int = 0,
    ):
        acr, monitor = config_of(ACRConfig, acr, "acr"), config_of(MonitorConfig, monitor, "monitor")
        self.estimator = estimator
        self._entry = get_estimator(estimator) if estimator is not None else None
        if config is not None and estimator is None:
            raise ValueError("a config needs an estimator")
        if config is not None and not isinstance(config, self._entry.config or ()):
            want = self._entry.config.__name__ if self._entry.config else "no"
            raise TypeError(f"estimator {estimator!r} takes {want} config, got {type(config).__name__}")
        self.config = config if config is not None else (default_config(estimator) if estimator else None)
        self.acr = acr
        self.tol, self.reward_range = float(acr.tol), (float(acr.reward_range[0]), float(acr.reward_range[1]))
        self.tracker = ACRTracker(acr)
        self.threshold = AdaptiveThreshold(acr)
        # a remedy config's own seed (AVSPO's --avspo.seed) wins over the run's, in every front-end
        own = getattr(self.config, "seed", None)
        self.generator = torch.Generator(device="cpu").manual_seed(int(own if own is not None else seed))
        self.entropy = (
            EntropyCollapseMonitor(monitor.entropy_threshold, monitor.entropy_patience)
            if monitor.entropy_threshold is not None and not monitor.disable_entropy
            else None
        )
        self.kl = KLDriftMonitor(monitor.kl_bound, monitor.kl_patience) if monitor.kl_bound is not None else None
        self.steps = 0

    @property
    def enable(self) -> bool:
        """Advantages come from here (an estimator is set)."""
        return self.estimator is not None

    @property
    def needs_entropy(self) -> bool:
        """The estimator adds token-level advantages from the policy's token entropies (RL-ZVP)."""
        return self._entry is not None and self._entry.token_fn is not None

    def token_advantages(self, entropy: torch.Tensor, mask: torch.Tensor, sign: torch.Tensor) -> torch.Tensor:
        """``[B, T]`` token-level additions of a token-level estimator (see ``needs_entropy``):
        ``entropy``/``mask`` ``[B, T]``, ``sign`` ``[B]`` from ``zero_variance_sign`` of each row's group."""
        if not self.needs_entropy:
            raise ValueError(f"estimator {self.estimator!r} has no token-level advantages")
        return self._entry.token_fn(entropy, mask, sign, self.config)

    def step(
        self, raw: torch.Tensor, shaped: torch.Tensor | None = None, scored: torch.Tensor | None = None
    ) -> tuple[torch.Tensor | None, dict[str, float]]:
        """One batch: ``raw``/``shaped`` are ``[N, G]`` (``shaped=None``: same as raw).

        ``scored`` (``[N, G]`` bool, docs/algorithm.md#unscored): False for a completion the raw view
        (correctness) has no score for; its raw value is not read. ACR is measured on each group's
        scored completions (``acr_unscored``: the share of completions without a score). The shaped
        view holds what the trainer trains on: there a completion counts wherever it is scored or
        its shaped reward is a number (OpenRLHF trains on 0 for a verifier timeout), and the
        estimator runs on the groups whose shaped rewards are all numbers; the rows of the others
        (a NaN: TRL's unscored, verl's) are NaN, and the trainer keeps its own advantages there.
        ``scored=None``: every reward is a score (NaN/Inf raise).

        Returns ``(advantages [N, G] or None, metrics)``; advantages are for the real samples of
        the shaped rewards (``None`` when no estimator is set).
        """
        shaped = raw if shaped is None else shaped
        if raw.shape != shaped.shape:
            raise ValueError(f"raw {tuple(raw.shape)} and shaped {tuple(shaped.shape)} rewards differ in shape")
        shaped_scored = None
        if scored is not None:
            scored = scored.to(raw.device)
            shaped_scored = scored if shaped is raw else scored | torch.isfinite(shaped)
            # every completion scored: the plain (faster) path, whose finiteness check still applies
            scored = None if bool(scored.all()) else scored
            shaped_scored = None if bool(shaped_scored.all()) else shaped_scored
        # the raw view is the reward the range describes; the shaped one may leave it by design (an
        # overlong or stop penalty below lo: its constant groups count as "other", docs/metrics.md)
        self._check_range(raw, scored, "raw")
        raw_stats = collapse_stats(raw, self.tol, self.reward_range, scored)
        shaped_stats = (
            raw_stats if shaped is raw else collapse_stats(shaped, self.tol, self.reward_range, shaped_scored)
        )
        gate_stats, gate_rewards, gate_scored = (
            (raw_stats, raw, scored) if self.acr.gate_view == "raw" else (shaped_stats, shaped, shaped_scored)
        )
        self.tracker.observe(gate_stats)

        metrics = raw_stats.metrics()
        metrics.update(
            {k.replace("acr", "acr_shaped", 1): v for k, v in shaped_stats.metrics().items() if k != "acr_unscored"}
        )
        metrics["frac_reward_zero_std"] = shaped_stats.acr  # TRL's name for the same quantity
        metrics["reward_raw_mean"] = _scored_mean(raw, scored)

        adv = None
        num_effective = shaped_stats.num_collapsed  # the trainer's GRPO zeroes every collapsed group
        if self.enable:
            full = None if shaped_scored is None else shaped_scored.all(dim=1)
            rows = shaped if full is None else shaped[full]
            ours, info = group_advantages(
                rows,
                self.estimator,
                self.config,
                tol=self.tol,
                reward_range=self.reward_range,
                acr_gate=self.tracker.acr_gate,
                tau_adapt=self.threshold.tau,
                generator=self.generator,
            )
            num_effective = round(info["acr_effective"] * rows.shape[0])
            if full is None:
                adv = ours
            else:  # the groups with an unscored completion keep the trainer's advantages (NaN here)
                adv = torch.full_like(shaped, float("nan"))
                adv[full] = ours.to(adv.dtype)
                num_effective += int(shaped_stats.collapsed[~full].sum())
            if "gate_open" in info:
                metrics["gate_open"] = float(info["gate_open"])
            if "num_virtual" in info:
                nc = int(info["stats"].num_collapsed) if "stats" in info else shaped_stats.num_collapsed
                metrics.update(
                    num_virtual_k=float(info["num_virtual_k"]),
                    num_virtual_per_collapsed=float(info["num_virtual"].sum()) / nc if nc else 0.0,
                )
            metrics["tau_adapt_used"] = self.threshold.tau
            metrics.update(self.threshold.update(gate_stats.acr, _scored_mean(gate_rewards, gate_scored)))
        self.tracker.record_effective(num_effective)
        measured = shaped_stats.num_measured
        metrics["acr_effective"] = num_effective / measured if measured else 0.0
        metrics.update(self.tracker.metrics())
        self.steps += 1
        return adv, metrics

    def _check_range(self, rewards: torch.Tensor, scored: torch.Tensor | None, view: str) -> None:
        """A reward outside ``acr.reward_range`` fails the step in one line: all-wrong and all-right
        are read against that range, so a group at 10 of a 0..10 reward with the range left at (0, 1)
        would be pushed down as if it were all wrong. Unscored (masked or non-finite) values are not read."""
        values = rewards if scored is None else rewards[scored.to(rewards.device)]
        values = values[torch.isfinite(values)]
        if not values.numel():
            return
        lo, hi = self.reward_range
        low, high = float(values.min()), float(values.max())
        if low < lo - self.tol or high > hi + self.tol:
            seen = low if low < lo - self.tol else high
            raise ValueError(
                f"acr.reward_range is ({lo:g}, {hi:g}) but a {view} reward is {seen:g} (this batch spans "
                f"{low:g}..{high:g}): all-wrong and all-right groups are read against that range. Set it to the "
                "rewards' range: --acr.reward_range LO HI (avspo-train), acr_reward_range=[LO, HI] (TRL), "
                "algorithm.acr.reward_range (verl), StudySettings.acr reward_range (the study loop)"
            )

    def after_train(self, status: dict[str, float], kl_key: str = "kl") -> dict[str, float]:
        """Feed the optimizer's metrics (OpenRLHF's ``entropy_loss`` and ``kl``/``ppo_kl``) to the
        entropy and KL monitors; returns their metrics."""
        out: dict[str, float] = {}
        if self.entropy is not None and "entropy_loss" in status:
            out.update(self.entropy.update(float(status["entropy_loss"])))
        if self.kl is not None and kl_key in status:
            out.update(self.kl.update(float(status[kl_key])))
        return out

    def alarms(self) -> dict[str, bool]:
        """Which alarms are on now."""
        m = self.tracker.metrics()
        return {
            "acr_stall": bool(m["alarm/acr_stall"]),
            "acr_volatility": bool(m["alarm/acr_volatility"]),
            "entropy_collapse": bool(self.entropy is not None and self.entropy.on),
            "kl_drift": bool(self.kl is not None and self.kl.on),
        }

    def state_dict(self) -> dict[str, Any]:
        return {
            "steps": self.steps,
            "tracker": self.tracker.state_dict(),
            "threshold": self.threshold.state_dict(),
            "generator": self.generator.get_state().tolist(),
            "entropy": self.entropy.state_dict() if self.entropy is not None else None,
            "kl": self.kl.state_dict() if self.kl is not None else None,
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.steps = int(state["steps"])
        self.tracker.load_state_dict(state["tracker"])
        self.threshold.load_state_dict(state["threshold"])
        # on the CPU, whatever torch's default device is (a generator's state is a CPU ByteTensor)
        self.generator.set_state(torch.tensor(state["generator"], dtype=torch.uint8, device="cpu"))
        if self.entropy is not None and state.get("entropy") is not None:
            self.entropy.load_state_dict(state["entropy"])
        if self.kl is not None and state.get("kl") is not None:
            self.kl.load_state_dict(state["kl"])
