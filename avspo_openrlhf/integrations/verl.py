"""ACR and the group remedies as verl advantage estimators (verl 0.9.1; docs/verl.md).

``import verl`` loads this module through the ``verl.plugins`` entry point (pyproject.toml; or
``VERL_USE_EXTERNAL_MODULES=avspo_openrlhf.integrations.verl``), which registers every group
estimator of :data:`avspo_openrlhf.algo.ESTIMATORS` with verl's own registry
(``core_algos.register_adv_est``) as ``acr_<name>`` (:data:`REMEDIES`: ``acr_grpo``, ``acr_avspo``, ...),
and each one registered later too (a remedy of yours: its module in ``VERL_USE_EXTERNAL_MODULES``),
chosen with ``algorithm.adv_estimator=acr_avspo``. verl's ``compute_advantage`` calls them with the
``[B, T]`` token-level rewards and response mask, the prompt ``uid`` of each row (``index``) and the
algorithm config, whose sections give the options (all optional)::

    algorithm.acr.*      ACRConfig fields (tol, reward_range, window, tau_init, eta, ...) and seed
    algorithm.<name>.*   the chosen remedy's config fields (algorithm.avspo.alpha, ...)
    algorithm.monitor.*  MonitorConfig

Every option is checked when the run's controller is built, at the first advantage step (or earlier
with :func:`check_config`), in one line naming it as set: ``algorithm.avspo.alpha must be > 0, got -1``.
A NaN score is a completion without one (docs/algorithm.md#unscored).

One :class:`CollapseController` per algorithm config object (one run) keeps the gate, the adaptive
threshold and the window across steps; :func:`acr_metrics` returns its latest ACR metrics. As with
TRL, verl's own GRPO numbers (``compute_grpo_outcome_advantage``: ``torch.std``, epsilon 1e-6) are
kept on every group where the remedy equals GRPO, so a closed gate is verl's ``grpo`` bit for bit.

RL-ZVP is not registered: its token advantages need the policy's token entropies, and neither an
estimator (rewards, mask, uid, config) nor a registered policy loss (log-probs, advantages, mask)
receives them in verl 0.9.1.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from typing import Any

import numpy as np
import torch
from omegaconf import DictConfig, OmegaConf
from verl.trainer.ppo import core_algos

from avspo_openrlhf.algo import ESTIMATORS, CollapseController
from avspo_openrlhf.algo.advantages import ON_REGISTER, Estimator
from avspo_openrlhf.algo.build import Names, build_controller

from . import base_advantages, framework_metrics, remedy_groups

TESTED_VERL = "0.9.1"
# verl's GRPO: (s - mean) / (torch.std + epsilon), epsilon 1e-6 as compute_advantage leaves it
VERL_STD_CONVENTION, VERL_EPS = "unbiased", 1e-6
PREFIX = "acr_"
# the remedies registered with verl as acr_<name>: every group estimator, in registration order
REMEDIES: list[str] = []


@dataclasses.dataclass
class _Run:
    config: Any  # held so that its id is not reused while the run lives
    remedy: str
    controller: CollapseController
    metrics: dict[str, float] = dataclasses.field(default_factory=dict)


_RUNS: dict[int, _Run] = {}
_LAST: list[_Run] = []


def _get(config: Any, key: str, default: Any = None) -> Any:
    if config is None:
        return default
    value = config.get(key, default) if hasattr(config, "get") else getattr(config, key, default)
    return default if value is None else value


def _section(config: Any, key: str) -> dict[str, Any]:
    """``algorithm.<key>`` as a plain dict (DictConfig, mapping or dataclass; absent: empty)."""
    value = _get(config, key)
    if value is None:
        return {}
    if isinstance(value, DictConfig):
        return OmegaConf.to_container(value, resolve=True)
    if isinstance(value, Mapping):
        return dict(value)
    if dataclasses.is_dataclass(value):
        return dataclasses.asdict(value)
    raise ValueError(f"algorithm.{key} must be a mapping of options, got {type(value).__name__}")


def _seed(acr: dict[str, Any]) -> int:
    """``algorithm.acr.seed`` (taken out of the ACR options; 0 when unset)."""
    seed = acr.pop("seed", 0)
    if isinstance(seed, bool) or not isinstance(seed, int) or seed < 0:
        raise ValueError(f"algorithm.acr.seed must be an integer >= 0, got {seed!r}")
    return seed


def _names(remedy: str) -> Names:
    """Errors name the option as the user set it: ``algorithm.acr.window``, ``algorithm.avspo.alpha``."""
    return Names(
        {"remedy": f"algorithm.{remedy}", "acr": "algorithm.acr", "monitor": "algorithm.monitor"}, style="attr"
    )


def _controller(config: Any, remedy: str) -> CollapseController:
    """The controller the ``algorithm`` config describes for ``remedy``: every option of its
    ``acr``, ``monitor`` and remedy sections checked, one line naming ``algorithm.<section>.<field>``."""
    for other in ESTIMATORS:  # another remedy's options are refused, not ignored
        if other != remedy and ESTIMATORS[other].config is not None and _section(config, other):
            raise ValueError(
                f"algorithm.{other} holds the options of {PREFIX}{other}, but algorithm.adv_estimator "
                f"is {PREFIX}{remedy}: drop it, or choose {PREFIX}{other}"
            )
    acr = _section(config, "acr")
    seed = _seed(acr)
    options = _section(config, remedy) if ESTIMATORS[remedy].config is not None else {}
    monitor = _section(config, "monitor")
    controller = build_controller(
        remedy,
        std_convention=VERL_STD_CONVENTION,
        eps=VERL_EPS,
        options=options,
        acr=acr,
        monitor=monitor,
        seed=seed,
        names=_names(remedy),
    )
    if monitor:  # checked above, then refused: an option that validates and does nothing is worse than an error
        raise ValueError(
            f"algorithm.monitor ({', '.join(sorted(monitor))}): a verl advantage estimator sees no "
            "entropy, KL or training loop, so the entropy and KL monitors and stop_on_alarm cannot act "
            "in verl; the ACR alarms (algorithm.acr) are logged. Leave algorithm.monitor out"
        )
    return controller


def _run(config: Any, remedy: str) -> _Run:
    """The run of this algorithm config; its controller is built at the first use, before any
    advantage is computed."""
    run = _RUNS.get(id(config))
    if run is None or run.config is not config or run.remedy != remedy:
        run = _RUNS[id(config)] = _Run(config, remedy, _controller(config, remedy))
    _LAST[:] = [run]
    return run


def check_config(config: Any, remedy: str | None = None) -> None:
    """Check the ``algorithm`` config of a verl run now (e.g. in a launcher, before Ray starts): the
    ``algorithm.acr``, ``algorithm.monitor`` and the remedy's section (``remedy``: ``avspo``, ...;
    ``None``: the one ``algorithm.adv_estimator`` names, when it is one of ours)."""
    if remedy is None:
        est = str(_get(config, "adv_estimator", ""))
        if not est.startswith(PREFIX):
            return
        remedy = est[len(PREFIX) :]
    if remedy not in REMEDIES:
        raise ValueError(
            f"algorithm.adv_estimator {PREFIX}{remedy}: no such estimator; have "
            f"{', '.join(PREFIX + r for r in REMEDIES)}"
        )
    _controller(config, remedy)


def _groups(index: Any, batch: int) -> tuple[torch.Tensor, int]:
    """(rows in group order ``[B]``, G) from the ``[B]`` prompt uids; every group must have G >= 2 rows."""
    if index is None or len(index) != batch:
        got = "no uids" if index is None else f"{len(index)} uids"
        raise ValueError(
            f"{PREFIX}* estimators group rows by prompt uid (data.non_tensor_batch['uid']): {got} for {batch} rows"
        )
    _, inverse, counts = np.unique(np.asarray(index), return_inverse=True, return_counts=True)
    if counts.min() != counts.max() or counts[0] < 2:
        raise ValueError(
            f"{PREFIX}* estimators need every uid group of one size G >= 2, got sizes {sorted(set(counts.tolist()))}"
        )
    return torch.from_numpy(np.argsort(inverse, kind="stable")), int(counts[0])


def compute_acr_advantage(
    token_level_rewards: torch.Tensor, response_mask: torch.Tensor, index: Any, config: Any, remedy: str
) -> tuple[torch.Tensor, torch.Tensor]:
    """``(advantages, returns)``, both ``[B, T]``: the remedy's per-response advantage on the groups
    where it differs from verl's GRPO, verl's own ``compute_grpo_outcome_advantage`` elsewhere,
    times the response mask. ``token_level_rewards``/``response_mask`` ``[B, T]``; ``index`` ``[B]``
    uids; ``config`` the algorithm config."""
    norm = bool(_get(config, "norm_adv_by_std_in_grpo", True))
    if not norm and remedy != "dr_grpo":
        raise ValueError(
            f"{PREFIX}{remedy} divides by the group std: set algorithm.norm_adv_by_std_in_grpo=True "
            f"(or use {PREFIX}dr_grpo)"
        )
    run = _run(config, remedy)
    scores = token_level_rewards.sum(dim=-1)
    order, g = _groups(index, scores.shape[0])
    rewards = scores.detach().cpu().float()[order].view(-1, g)
    # docs/algorithm.md#unscored: a NaN score is a completion without one; ACR is measured on each
    # group's scored completions and such groups keep verl's own advantages
    scored = ~torch.isnan(rewards)
    ours, metrics = run.controller.step(rewards, scored=scored)
    full = scored.all(dim=1)
    changed = torch.zeros(rewards.shape[0], dtype=torch.bool)
    if full.any():
        base = base_advantages(rewards[full], run.controller, VERL_STD_CONVENTION if norm else None, VERL_EPS)
        changed[full] = remedy_groups(ours[full], base)
    metrics["remedy_groups"] = float(changed.float().mean()) if changed.numel() else 0.0
    run.metrics = framework_metrics(metrics)

    verl_adv, _ = core_algos.compute_grpo_outcome_advantage(
        token_level_rewards, response_mask, index, epsilon=VERL_EPS, norm_adv_by_std_in_grpo=norm
    )
    per_row = torch.empty_like(scores)
    per_row[order.to(scores.device)] = torch.where(changed[:, None], ours, 0.0).reshape(-1).to(scores)
    use = torch.empty(scores.shape[0], dtype=torch.bool)
    use[order] = changed.repeat_interleave(g)
    adv = torch.where(use.to(scores.device).unsqueeze(-1), per_row.unsqueeze(-1) * response_mask, verl_adv)
    return adv, adv


def _estimator(remedy: str):
    def estimator(token_level_rewards, response_mask, index=None, config=None, **_):
        return compute_acr_advantage(token_level_rewards, response_mask, index, config, remedy)

    estimator.__name__ = estimator.__qualname__ = f"compute_{PREFIX}{remedy}_advantage"
    estimator.__doc__ = f"verl advantage estimator ``{PREFIX}{remedy}``: see :func:`compute_acr_advantage`."
    return estimator


def _register(entry: Estimator) -> None:
    """``acr_<name>`` in verl's registry; a token-level estimator (RL-ZVP) is left out (module docstring)."""
    if entry.token_fn is None and entry.name not in REMEDIES:
        core_algos.register_adv_est(PREFIX + entry.name)(_estimator(entry.name))
        REMEDIES.append(entry.name)


for _entry in list(ESTIMATORS.values()):
    _register(_entry)
ON_REGISTER.append(_register)  # an estimator registered after this import (a user's module) too


def controller_of(config: Any = None) -> CollapseController | None:
    """The controller of the run whose algorithm config is ``config`` (``None``: the last run that
    computed advantages), e.g. for its ``state_dict()``; ``None`` before its first step."""
    run = _LAST[0] if config is None and _LAST else _RUNS.get(id(config))
    return run.controller if run is not None and (config is None or run.config is config) else None


def acr_metrics(config: Any = None) -> dict[str, float]:
    """The latest step's ACR metrics of that run (``acr``, ``acr/all_wrong``, ``acr/effective``,
    ``acr/gate``, ``acr/gate_open``, ``acr/tau_adapt``, ``alarm/acr_stall``, ...), for verl's logger."""
    run = _LAST[0] if config is None and _LAST else _RUNS.get(id(config))
    return dict(run.metrics) if run is not None else {}


__all__ = ["PREFIX", "REMEDIES", "TESTED_VERL", "acr_metrics", "check_config", "compute_acr_advantage", "controller_of"]
