"""The pure math of ACR and its remedies: torch only, no OpenRLHF/Ray/vLLM/DeepSpeed.

Any trainer can call these (the OpenRLHF trainers of this package, ``integrations/trl.py``,
``integrations/verl.py``, a hand-written loop: ``examples/avspo_loop.py``). One step on a ``[N, G]``
correctness matrix ``R``::

    ctrl = CollapseController("avspo", AVSPOConfig(alpha=0.5), acr=ACRConfig(tau_init=0.5))
    adv, metrics = ctrl.step(R)                # advantages [N, G]; acr, acr_effective, gate, alarms

or, piece by piece::

    stats = collapse_stats(R)                  # raw ACR, split all-wrong / all-right
    tracker.observe(stats)                     # smoothed gate input, cumulative, ACR_100, alarms
    adv, info = group_advantages(R, "avspo", AVSPOConfig(), acr_gate=tracker.acr_gate, tau_adapt=threshold.tau)
    threshold.update(stats.acr, R.mean().item())

A remedy is one registered estimator (:data:`ESTIMATORS`) plus its config class; every front-end
assembles a run's remedy through :func:`build_configs` / :func:`build_controller` (``build.py``).
"""

# importing the remedy modules registers their estimators
from . import avspo as _avspo  # noqa: F401
from . import ngrpo as _ngrpo  # noqa: F401
from . import rl_zvp as _rl_zvp  # noqa: F401
from . import sign as _sign  # noqa: F401
from .advantages import (
    ESTIMATORS,
    Estimator,
    GroupContext,
    augmented_group_stats,
    default_config,
    group_advantages,
    register_estimator,
)
from .build import GENERIC, Names, RemedyConfigs, build_configs, build_controller, remedy_name, typed
from .collapse import DEFAULT_TOL, CollapseStats, check_rewards, collapse_stats, dynamic_sampling_keep_mask
from .controller import CollapseController
from .greso import GRESOSelector, prompt_key
from .monitors import (
    ACR100_FIT_INTERCEPT,
    ACR100_FIT_SLOPE,
    ACRTracker,
    ConsecutiveAlarm,
    EntropyCollapseMonitor,
    KLDriftMonitor,
)
from .options import (
    FIX_GROUPS,
    STD_CONVENTIONS,
    ACRConfig,
    AVSPOConfig,
    GRESOConfig,
    GroupNormConfig,
    MonitorConfig,
    NGRPOConfig,
    OptionError,
    RLZVPConfig,
    SignConfig,
)
from .rl_zvp import rl_zvp_token_advantages, zero_variance_sign
from .threshold import AdaptiveThreshold
from .virtual import VIRTUAL_STRATEGIES, num_virtual, register_virtual_strategy, virtual_rewards

__all__ = [
    "ACR100_FIT_INTERCEPT",
    "ACR100_FIT_SLOPE",
    "ACRConfig",
    "ACRTracker",
    "AVSPOConfig",
    "AdaptiveThreshold",
    "CollapseController",
    "CollapseStats",
    "ConsecutiveAlarm",
    "DEFAULT_TOL",
    "ESTIMATORS",
    "GENERIC",
    "EntropyCollapseMonitor",
    "Estimator",
    "FIX_GROUPS",
    "GRESOConfig",
    "GRESOSelector",
    "GroupNormConfig",
    "GroupContext",
    "KLDriftMonitor",
    "MonitorConfig",
    "Names",
    "NGRPOConfig",
    "OptionError",
    "RLZVPConfig",
    "RemedyConfigs",
    "STD_CONVENTIONS",
    "SignConfig",
    "VIRTUAL_STRATEGIES",
    "augmented_group_stats",
    "build_configs",
    "build_controller",
    "check_rewards",
    "collapse_stats",
    "default_config",
    "dynamic_sampling_keep_mask",
    "group_advantages",
    "num_virtual",
    "prompt_key",
    "register_estimator",
    "register_virtual_strategy",
    "remedy_name",
    "rl_zvp_token_advantages",
    "typed",
    "virtual_rewards",
    "zero_variance_sign",
]
