"""One object that runs docs/algorithm.md#one-step step by step for a trainer: ACR stats on both reward
views, the gate, AVSPO advantages, the adaptive threshold, the monitors, and their state.

Pure (torch only). A trainer calls :meth:`AVSPOController.step` once per rollout batch with the
``[N, G]`` raw (correctness) and shaped rewards, and :meth:`after_train` with the optimizer's
metrics; ``state_dict`` goes into the checkpoint.
"""

from __future__ import annotations

from typing import Any

import torch

from .advantages import group_advantages
from .collapse import collapse_stats
from .monitors import ACRTracker, EntropyCollapseMonitor, KLDriftMonitor
from .options import ACRConfig, AVSPOConfig, MonitorConfig, NGRPOConfig
from .threshold import AdaptiveThreshold

_ACR, _AV, _MON = ACRConfig, AVSPOConfig, MonitorConfig  # every keyword default is one of theirs
# what the controller computes: None = measure only (the trainer's own estimator, e.g. GRPO);
# rl_zvp also measures only here: its token-level advantages need the policy's entropies, which the
# trainer adds to OpenRLHF's GRPO advantages (algo/rl_zvp.py)
ESTIMATORS = ("avspo", "ngrpo", "rl_zvp")


class AVSPOController:
    """ACR monitoring (always) and AVSPO or NGRPO advantages for a stream of batches.

    Args:
        enable: compute AVSPO advantages (same as ``estimator="avspo"``); otherwise :meth:`step`
            only measures and returns ``None`` (the trainer's own estimator, e.g. GRPO, is used).
        estimator: ``avspo`` | ``ngrpo`` (advantages computed here) | ``rl_zvp`` (measured here;
            every collapsed group counts as effective) | ``None`` (``avspo`` if ``enable``).
        ngrpo: NGRPO options ``num_max``, ``gated``, ``std``, ``eps`` (see ``group_advantages``).
        gate_view: ``raw`` (correctness, the paper's) or ``shaped``: the view whose ACR feeds
            ACR_gate, the K rule and the threshold. Advantages always use the shaped rewards,
            which are what the policy is trained on.
        tol, reward_range: collapse tolerance and reward range (see ``collapse_stats``).
        tracker: kwargs of :class:`ACRTracker` (smoothing, window, ...).
        strategy, alpha, r_anchor, gamma, std, eps, fixed_k, fix_groups: AVSPO options (see
            ``group_advantages``).
        tau_init, eta, tau_bounds, reward_ema_decay: :class:`AdaptiveThreshold`.
        seed: seeds the ``random_uniform`` strategy (its generator state is checkpointed).
        entropy_threshold, entropy_patience: entropy-collapse alarm (``None`` threshold: off).
        kl_bound, kl_patience: KL-drift alarm (``None`` bound: off).
    """

    def __init__(
        self,
        *,
        enable: bool = _AV.enable,
        estimator: str | None = None,
        ngrpo: dict[str, Any] | None = None,
        gate_view: str = _ACR.gate_view,
        tol: float = _ACR.tol,
        reward_range: tuple[float, float] = _ACR.reward_range,
        tracker: dict[str, Any] | None = None,
        strategy: str = _AV.strategy,
        alpha: float = _AV.alpha,
        r_anchor: float = _AV.r_anchor,
        gamma: float = _AV.gamma,
        std: str = _AV.std,
        eps: float = _AV.eps,
        fixed_k: int | None = _AV.num_virtual,
        fix_groups: str = _AV.fix_groups,
        tau_init: float = _AV.tau_init,
        eta: float = _AV.eta,
        tau_bounds: tuple[float, float] = _AV.tau_bounds,
        reward_ema_decay: float = _AV.reward_ema_decay,
        seed: int = 0,
        entropy_threshold: float | None = _MON.entropy_threshold,
        entropy_patience: int = _MON.entropy_patience,
        kl_bound: float | None = _MON.kl_bound,
        kl_patience: int = _MON.kl_patience,
    ):
        if gate_view not in ("raw", "shaped"):
            raise ValueError(f"gate_view must be 'raw' or 'shaped', got {gate_view!r}")
        estimator = estimator or ("avspo" if enable else None)
        if estimator is not None and estimator not in ESTIMATORS:
            raise ValueError(f"estimator must be one of {ESTIMATORS} or None, got {estimator!r}")
        self.estimator, self.gate_view = estimator, gate_view
        self.enable = estimator in ("avspo", "ngrpo")  # advantages come from here
        n = NGRPOConfig
        self.ngrpo_kwargs = {"num_max": n.num_max, "gated": n.gated, "std": n.std, "eps": n.eps, **(ngrpo or {})}
        self.tol, self.reward_range = float(tol), (float(reward_range[0]), float(reward_range[1]))
        self.adv_kwargs = dict(
            strategy=strategy, alpha=alpha, r_anchor=r_anchor, gamma=gamma, std=std, eps=eps, tol=self.tol,
            fixed_k=fixed_k, fix_groups=fix_groups,
        )  # fmt: skip
        self.tracker = ACRTracker(**(tracker or {}))
        self.threshold = AdaptiveThreshold(tau_init, eta, tuple(tau_bounds), reward_ema_decay)
        self.generator = torch.Generator().manual_seed(int(seed))
        self.entropy = (
            EntropyCollapseMonitor(entropy_threshold, entropy_patience) if entropy_threshold is not None else None
        )
        self.kl = KLDriftMonitor(kl_bound, kl_patience) if kl_bound is not None else None
        self.steps = 0

    @classmethod
    def from_config(
        cls,
        acr: ACRConfig,
        avspo: AVSPOConfig,
        monitor: MonitorConfig,
        ngrpo: NGRPOConfig | None = None,
        *,
        estimator: str | None = None,
        seed: int = 0,
    ) -> AVSPOController:
        """The controller the typed options describe, field by field (``--acr.*``, ``--avspo.*``,
        ``--monitor.*``, ``--ngrpo.*``); ``estimator``: see the class (default: ``avspo`` when
        ``avspo.enable``); ``seed``: the ``random_uniform`` generator's."""
        ngrpo = ngrpo or NGRPOConfig()
        return cls(
            enable=avspo.enable,
            estimator=estimator,
            ngrpo=dict(num_max=ngrpo.num_max, gated=ngrpo.gated, std=ngrpo.std, eps=ngrpo.eps),
            gate_view=acr.gate_view,
            tol=acr.tol,
            reward_range=acr.reward_range,
            tracker=dict(
                smoothing=acr.smoothing,
                window=acr.window,
                ema_decay=acr.ema_decay,
                early_steps=acr.early_steps,
                stall_threshold=acr.stall_threshold,
                stall_patience=acr.stall_patience,
                volatility_window=acr.volatility_window,
                volatility_threshold=acr.volatility_threshold,
            ),
            strategy=avspo.strategy,
            alpha=avspo.alpha,
            r_anchor=avspo.r_anchor,
            gamma=avspo.gamma,
            std=avspo.std,
            eps=avspo.eps,
            fixed_k=avspo.num_virtual,
            fix_groups=avspo.fix_groups,
            tau_init=avspo.tau_init,
            eta=avspo.eta,
            tau_bounds=avspo.tau_bounds,
            reward_ema_decay=avspo.reward_ema_decay,
            seed=seed,
            entropy_threshold=None if monitor.disable_entropy else monitor.entropy_threshold,
            entropy_patience=monitor.entropy_patience,
            kl_bound=monitor.kl_bound,
            kl_patience=monitor.kl_patience,
        )

    def step(
        self, raw: torch.Tensor, shaped: torch.Tensor | None = None
    ) -> tuple[torch.Tensor | None, dict[str, float]]:
        """One batch: ``raw``/``shaped`` are ``[N, G]`` (``shaped=None``: same as raw).

        Returns ``(advantages [N, G] or None, metrics)``; advantages are for the real samples of
        the shaped rewards (``None`` when AVSPO is off).
        """
        shaped = raw if shaped is None else shaped
        if raw.shape != shaped.shape:
            raise ValueError(f"raw {tuple(raw.shape)} and shaped {tuple(shaped.shape)} rewards differ in shape")
        raw_stats = collapse_stats(raw, self.tol, self.reward_range)
        shaped_stats = raw_stats if shaped is raw else collapse_stats(shaped, self.tol, self.reward_range)
        gate_stats, gate_rewards = (raw_stats, raw) if self.gate_view == "raw" else (shaped_stats, shaped)
        self.tracker.observe(gate_stats)

        metrics = raw_stats.metrics()
        metrics.update({k.replace("acr", "acr_shaped", 1): v for k, v in shaped_stats.metrics().items()})
        metrics["frac_reward_zero_std"] = shaped_stats.acr  # TRL's name for the same quantity
        metrics["reward_raw_mean"] = float(raw.mean()) if raw.numel() else 0.0

        adv = None
        num_effective = shaped_stats.num_collapsed  # GRPO-family estimators zero collapsed groups
        if self.estimator == "rl_zvp":
            num_effective = 0  # every collapsed group gets entropy-shaped token advantages
        if self.enable:
            common = dict(reward_range=self.reward_range, acr_gate=self.tracker.acr_gate, tau_adapt=self.threshold.tau)
            if self.estimator == "avspo":
                adv, info = group_advantages(shaped, "avspo", generator=self.generator, **common, **self.adv_kwargs)
            else:
                adv, info = group_advantages(shaped, "ngrpo", tol=self.tol, **common, **self.ngrpo_kwargs)
                info.update(num_virtual_k=self.ngrpo_kwargs["num_max"], num_virtual=torch.full(
                    (shaped_stats.num_groups,), self.ngrpo_kwargs["num_max"] if info["gate_open"] else 0))  # fmt: skip
            num_effective = round(info["acr_effective"] * shaped_stats.num_groups)
            nv = info["num_virtual"]
            metrics.update(
                gate_open=float(info["gate_open"]),
                num_virtual_k=float(info["num_virtual_k"]),
                num_virtual_per_collapsed=float(nv.sum()) / shaped_stats.num_collapsed
                if shaped_stats.num_collapsed
                else 0.0,
                tau_adapt_used=self.threshold.tau,
            )
            metrics.update(
                self.threshold.update(gate_stats.acr, float(gate_rewards.mean()) if gate_rewards.numel() else 0.0)
            )
        self.tracker.record_effective(num_effective)
        metrics["acr_effective"] = num_effective / shaped_stats.num_groups if shaped_stats.num_groups else 0.0
        metrics.update(self.tracker.metrics())
        self.steps += 1
        return adv, metrics

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
        self.generator.set_state(torch.tensor(state["generator"], dtype=torch.uint8))
        if self.entropy is not None and state.get("entropy") is not None:
            self.entropy.load_state_dict(state["entropy"])
        if self.kl is not None and state.get("kl") is not None:
            self.kl.load_state_dict(state["kl"])
