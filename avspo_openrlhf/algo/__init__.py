"""The pure math of ACR and AVSPO: torch only, no OpenRLHF/Ray/vLLM/DeepSpeed.

Any trainer can call these (TRL, verl, a hand-written loop). One AVSPO step on a ``[N, G]``
correctness matrix ``R``::

    stats = collapse_stats(R)                 # raw ACR, split all-wrong / all-right
    tracker.observe(stats)                     # smoothed gate input, cumulative, ACR_100, alarms
    adv, info = group_advantages(R, "avspo", acr_gate=tracker.acr_gate, tau_adapt=threshold.tau)
    threshold.update(stats.acr, R.mean().item())
"""

from .advantages import (
    ADVANTAGE_ESTIMATORS,
    FIX_GROUPS,
    STD_CONVENTIONS,
    augmented_group_stats,
    group_advantages,
    register_estimator,
)
from .collapse import DEFAULT_TOL, CollapseStats, check_rewards, collapse_stats, dynamic_sampling_keep_mask
from .greso import GRESOSelector, prompt_key
from .monitors import (
    ACR100_FIT_INTERCEPT,
    ACR100_FIT_SLOPE,
    ACRTracker,
    ConsecutiveAlarm,
    EntropyCollapseMonitor,
    KLDriftMonitor,
)
from .rl_zvp import rl_zvp_token_advantages, zero_variance_sign
from .threshold import AdaptiveThreshold
from .virtual import VIRTUAL_STRATEGIES, num_virtual, register_virtual_strategy, virtual_rewards

__all__ = [
    "ACR100_FIT_INTERCEPT",
    "ACR100_FIT_SLOPE",
    "ADVANTAGE_ESTIMATORS",
    "FIX_GROUPS",
    "GRESOSelector",
    "ACRTracker",
    "AdaptiveThreshold",
    "CollapseStats",
    "ConsecutiveAlarm",
    "DEFAULT_TOL",
    "EntropyCollapseMonitor",
    "KLDriftMonitor",
    "STD_CONVENTIONS",
    "VIRTUAL_STRATEGIES",
    "augmented_group_stats",
    "check_rewards",
    "collapse_stats",
    "dynamic_sampling_keep_mask",
    "group_advantages",
    "num_virtual",
    "prompt_key",
    "register_estimator",
    "register_virtual_strategy",
    "rl_zvp_token_advantages",
    "virtual_rewards",
    "zero_variance_sign",
]
