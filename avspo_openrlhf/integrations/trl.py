"""ACR and every remedy in TRL's ``GRPOTrainer`` (TRL 1.16.0; docs/trl.md).

Measuring only needs no subclass: :func:`measure_acr` wraps a reward function so that stock TRL logs
ACR through the ``log_metric`` callback TRL 1.16 hands every reward function::

    from trl import GRPOConfig, GRPOTrainer
    from avspo_openrlhf.integrations.trl import measure_acr
    GRPOTrainer(model=..., reward_funcs=[measure_acr(accuracy, num_generations=8)],
                args=GRPOConfig(num_generations=8, ...), train_dataset=...).train()   # logs train/acr

The paper's README snippet works as written, with this import path::

    from avspo_openrlhf.integrations.trl import GRPOConfig, GRPOTrainer
    args = GRPOConfig(use_avspo=True, acr_threshold_init=0.5, virtual_sample_alpha=0.5, ...)
    GRPOTrainer(model=..., reward_funcs=..., args=args, train_dataset=...).train()   # logs train/acr

TRL 1.16.0 has no advantage hook (huggingface/trl#4525: "subclass and override"), so the subclass
overrides as little as it can:

- ``_calculate_rewards``: keeps the ``[B_all, F]`` rewards TRL gathered from every process;
- ``_generate_and_score_completions``: after TRL's own pass, steps the :class:`CollapseController`
  on the ``[N, G]`` rewards (identical on every process: the rewards are gathered), and replaces
  TRL's advantages on this process's slice by the remedy's on the groups where the remedy differs
  from GRPO; logs the ACR views to ``self._metrics`` (``acr``, ``acr/all_wrong``, ...);
- RL-ZVP only: ``_compute_loss`` / ``_get_per_token_logps_and_entropies`` add the entropy-shaped
  token advantages from the entropies of the loss's own forward pass (no extra forward);
- ``training_step``: feeds TRL's ``entropy``/``kl`` of each optimizer step to the alarms;
- ``_save_checkpoint`` / ``_load_optimizer_and_scheduler``: the controller's state as
  ``controller_state.json`` in each checkpoint (TRL's own pattern for its entropy controller).

Every TRL private name used here is guarded by tests/test_trl_integration.py.
"""

from __future__ import annotations

import dataclasses
import functools
import inspect
import json
import os
from dataclasses import dataclass, field
from typing import Any

import torch
import trl
from transformers.trainer_utils import PREFIX_CHECKPOINT_DIR

from avspo_openrlhf.algo import (
    ESTIMATORS,
    ACRConfig,
    MonitorConfig,
    collapse_stats,
    zero_variance_sign,
)
from avspo_openrlhf.algo.build import Names, build_configs, build_controller, remedy_name, typed
from avspo_openrlhf.algo.options import annotation

from . import base_advantages, framework_metrics, remedy_groups

TESTED_TRL = "1.16.0"
# TRL's GRPO: (r - mean) / (nanstd + 1e-4), nanstd Bessel-corrected (trl/trainer/grpo_trainer.py)
TRL_STD_CONVENTION, TRL_EPS = "unbiased", 1e-4
STATE_FILE = "controller_state.json"
SIGN_KEY = "zero_variance_sign"  # [B] int8 per completion (token-level remedies), travels with TRL's buffered batch


# how errors name what a TRL user set: GRPOConfig's own fields and its option dicts (virtual_sample_alpha
# is AVSPO's alpha only; each typed field set is added by _configs)
TRL_NAMES = Names(
    {"remedy": "remedy_options", "acr": "acr_options", "monitor": "monitor_options"},
    renamed={("remedy", "alpha"): "virtual_sample_alpha", ("acr", "tau_init"): "acr_threshold_init"},
)


def _as_dict(value: Any, name: str) -> dict[str, Any]:
    if value is None:
        return {}
    if isinstance(value, str):  # from the command line (TrlParser)
        try:
            value = json.loads(value) if value.strip() else {}
        except json.JSONDecodeError as e:
            raise ValueError(f"{name} is not valid JSON: {e}") from None
    if not isinstance(value, dict):
        raise ValueError(f"{name} must be a dict or a JSON object string, got {type(value).__name__}")
    return dict(value)


def _scored(*views: torch.Tensor) -> torch.Tensor:
    """``[N, G]`` bool: the completions every reward view scored (TRL turns a ``None`` reward into NaN)."""
    out = ~torch.isnan(views[0])
    for v in views[1:]:
        out &= ~torch.isnan(v)
    return out


def _gather(values: torch.Tensor) -> torch.Tensor:
    """Every process's ``[B]`` rewards in process order (TRL's gather order): a reward function sees
    its process's completions only, and a prompt group may straddle two processes."""
    import torch.distributed as dist

    if not (dist.is_available() and dist.is_initialized()) or dist.get_world_size() == 1:
        return values
    on = torch.device("cuda", torch.cuda.current_device()) if dist.get_backend() == "nccl" else torch.device("cpu")
    local = values.to(on)
    parts = [torch.empty_like(local) for _ in range(dist.get_world_size())]
    dist.all_gather(parts, local)
    return torch.cat(parts).cpu()


def measure_acr(reward_func, num_generations: int, acr: ACRConfig | dict | None = None):
    """``reward_func`` for stock TRL (``trl.GRPOTrainer``, no subclass) that also logs this batch's ACR
    views on its rewards (``acr``, ``acr/all_wrong``, ``acr/all_right``, ``acr/other``,
    ``acr/unscored``) through TRL's ``log_metric`` callback; the rewards pass through unchanged,
    ``None`` included (an unscored completion: docs/algorithm.md#unscored). TRL names the reward
    function after ``reward_func``, so its logged rewards keep their name.

    Args:
        reward_func: a TRL reward function (sync or async) that scores correctness.
        num_generations: TRL's ``num_generations`` (G): consecutive completions of one prompt.
        acr: :class:`ACRConfig` or a dict of its fields (``tol``, ``reward_range``); the tracker's
            fields (gate, alarms) need the trainer subclass and do nothing here.
    """
    g = num_generations
    if isinstance(g, bool) or not isinstance(g, int) or g < 2:
        raise ValueError(f"num_generations must be an integer >= 2 (a group needs two completions), got {g!r}")
    cfg = acr if isinstance(acr, ACRConfig) else typed(ACRConfig, acr, "acr", Names({"acr": "acr"}))

    def log(rewards, log_metric) -> None:
        if log_metric is None:
            return  # not called by TRL's GRPOTrainer: nowhere to log
        values = _gather(torch.tensor([torch.nan if r is None else float(r) for r in rewards], dtype=torch.float64))
        if values.numel() % g:
            return  # not whole groups: nothing to measure
        grouped = values.view(-1, g)
        stats = collapse_stats(grouped, cfg.tol, cfg.reward_range, _scored(grouped))
        for key, value in framework_metrics(stats.metrics()).items():
            log_metric(key, value)

    if inspect.iscoroutinefunction(reward_func):

        @functools.wraps(reward_func)
        async def measured_async(*args, log_metric=None, **kwargs):
            rewards = await reward_func(*args, log_metric=log_metric, **kwargs)
            log(rewards, log_metric)
            return rewards

        return measured_async

    @functools.wraps(reward_func)
    def measured(*args, log_metric=None, **kwargs):
        rewards = reward_func(*args, log_metric=log_metric, **kwargs)
        log(rewards, log_metric)
        return rewards

    return measured


# the option fields of a remedy that follow TRL's GRPO (build_configs fixes them), and the options
# the paper's README names its own way: no flat field of their own
FIXED_BY_TRL = ("std_convention", "eps")
ALIASES = {("avspo", "alpha"): "virtual_sample_alpha", ("acr", "tau_init"): "acr_threshold_init"}
# a config field's annotation -> the flat field's type (None: unset; HfArgumentParser reads these)
FLAT_TYPES = {
    "bool": bool,
    "int": int,
    "float": float,
    "str": str,
    "tuple[float, float]": list[float],
    "tuple[str, ...]": list[str],
}


def flat_options() -> dict[str, tuple[str, str, type, dataclasses.Field]]:
    """``{flat field name: (section, owner, config class, config field)}`` for every option a TRL
    user sets as a typed field of :class:`GRPOConfig`: ``acr_<field>`` (ACRConfig), ``monitor_<field>``
    (MonitorConfig) and ``<remedy>_<field>`` for each estimator registered when this module is
    imported (``avspo_strategy``, ``ngrpo_num_max``, ...; one registered later takes ``remedy_options``).
    ``section`` is ``acr``, ``monitor`` or ``remedy``; ``owner`` the remedy's name (or the section)."""
    out = {}
    owners = [("acr", "acr", ACRConfig), ("monitor", "monitor", MonitorConfig)]
    owners += [("remedy", name, e.config) for name, e in ESTIMATORS.items() if e.config is not None]
    for section, owner, cls in owners:
        for f in dataclasses.fields(cls):
            if (section == "remedy" and f.name in FIXED_BY_TRL) or (owner, f.name) in ALIASES:
                continue
            out[f"{owner}_{f.name}"] = (section, owner, cls, f)
    return out


def _flat_field(section: str, owner: str, cls: type, f: dataclasses.Field):
    """``(type, field)`` of one flat option: unset (None) by default, its help the config field's."""
    default = list(f.default) if isinstance(f.default, tuple) else f.default
    only = f" Only with remedy='{owner}'." if section == "remedy" else ""
    help_text = f"{cls.__name__}.{f.name}: {f.metadata.get('help', '')}{only} Unset (None): {default}."
    return FLAT_TYPES[annotation(f).removesuffix(" | None")] | None, field(default=None, metadata={"help": help_text})


FLAT_OPTIONS = flat_options()
_clash = sorted(set(FLAT_OPTIONS) & {f.name for f in dataclasses.fields(trl.GRPOConfig)})
if _clash:  # a TRL field of the same name: the flat option would silently replace it
    raise ImportError(f"TRL's GRPOConfig has fields {_clash}: rename the flat options of integrations/trl.py")
# the flat options as a base class: generated, so a remedy added to the registry gets its fields here
_FlatOptions = dataclasses.make_dataclass(
    "_FlatOptions", [(name, *_flat_field(*spec)) for name, spec in FLAT_OPTIONS.items()], bases=(trl.GRPOConfig,)
)
_FlatOptions.__module__ = __name__


@dataclass
class GRPOConfig(_FlatOptions):
    """TRL's ``GRPOConfig`` plus ACR monitoring and the remedies: the fields below, and one typed field
    per option (:data:`FLAT_OPTIONS`: ``acr_window``, ``avspo_strategy``, ``ngrpo_num_max``, ...; unset
    by default). Only the chosen remedy's options may be set."""

    remedy: str | None = field(
        default=None,
        metadata={
            "help": "Advantage remedy for collapsed groups: a name in avspo_openrlhf.algo.ESTIMATORS ("
            + ", ".join(repr(name) for name in ESTIMATORS)
            + ", or one a module of yours registered) or None/'none': TRL's own advantages, ACR measured and logged only."
        },
    )
    use_avspo: bool = field(default=False, metadata={"help": "The paper README's switch: the same as remedy='avspo'."})
    acr_threshold_init: float = field(
        default=ACRConfig.tau_init,
        metadata={"help": "Initial adaptive threshold tau_adapt(0): the gate opens while the smoothed ACR exceeds it."},
    )
    virtual_sample_alpha: float | None = field(
        default=None,
        metadata={
            "help": "AVSPO's K rule exponent: K = max(1, min(G, ceil(G * ACR_gate**alpha))). Only with "
            f"remedy='avspo'. Unset (None): {ESTIMATORS['avspo'].config.alpha}."
        },
    )
    remedy_options: dict | str | None = field(
        default=None,
        metadata={
            "help": "Fields of the remedy's config as a dict or JSON, another spelling of its typed fields "
            "(<remedy>_<field>), and the one of a remedy registered after this module was imported. "
            "std_convention and eps follow TRL's GRPO (unbiased, 1e-4)."
        },
    )
    acr_options: dict | str | None = field(
        default=None,
        metadata={
            "help": "Fields of ACRConfig as a dict or JSON, another spelling of the acr_<field> fields; "
            "tau_init is acr_threshold_init."
        },
    )
    acr_reward_func: str | None = field(
        default=None,
        metadata={
            "help": "Name of the reward function that scores correctness (the raw view of ACR, which drives the gate "
            "with gate_view 'raw'); default: the weighted sum TRL trains on (the shaped view)."
        },
    )
    monitor_options: dict | str | None = field(
        default=None,
        metadata={
            "help": "Fields of MonitorConfig as a dict or JSON, another spelling of the monitor_<field> fields: "
            "the alarms fed by TRL's logged entropy and kl."
        },
    )

    def __post_init__(self):
        super().__post_init__()
        self.remedy_options = _as_dict(self.remedy_options, "remedy_options")
        self.acr_options = _as_dict(self.acr_options, "acr_options")
        self.monitor_options = _as_dict(self.monitor_options, "monitor_options")
        self.remedy = remedy_name(self.remedy)
        if not isinstance(self.use_avspo, bool):
            raise ValueError(f"use_avspo must be True or False, got {self.use_avspo!r}")
        if self.use_avspo:
            if self.remedy not in (None, "avspo"):
                raise ValueError(f"use_avspo=True and remedy={self.remedy!r} choose two remedies")
            self.remedy = "avspo"
        if self.remedy != "avspo" and self.virtual_sample_alpha is not None:
            raise ValueError(
                f"virtual_sample_alpha is AVSPO's K rule exponent; remedy={self.remedy!r} does not use "
                "it: set remedy='avspo' (or use_avspo=True), or leave it out"
            )
        for name, (section, owner, _, _) in FLAT_OPTIONS.items():  # another remedy's options: refused
            if section == "remedy" and owner != self.remedy and getattr(self, name) is not None:
                raise ValueError(
                    f"{name} is an option of remedy={owner!r}; remedy={self.remedy!r} does not use it: "
                    f"set remedy={owner!r}, or leave it out"
                )
        if self.acr_reward_func is not None and not isinstance(self.acr_reward_func, str):
            raise ValueError(f"acr_reward_func must be a reward function's name, got {self.acr_reward_func!r}")
        self._check_trl_settings()
        monitor = _configs(self).monitor  # every option checked now, in the names set here (not after the model loads)
        if monitor.kl_bound is not None:  # a bound on a KL TRL does not compute would never fire
            if self.beta == 0:
                raise ValueError(
                    "monitor_kl_bound watches TRL's logged kl, which TRL computes only with beta > 0 "
                    "(beta=0 is its default): set beta, or leave monitor_kl_bound out"
                )
            if monitor.kl_source != "ref":
                raise ValueError(
                    "monitor_kl_source='old' (the KL to the previous policy) is not logged by TRL; "
                    "use 'ref' (TRL's kl, with beta > 0)"
                )

    def _check_trl_settings(self) -> None:
        """TRL settings a remedy cannot work with (TRL itself refuses num_generations < 2)."""
        remedy = self.remedy
        if remedy is None:
            return
        if self.multi_objective_aggregation != "sum_then_normalize":
            raise ValueError(
                f"remedy {remedy!r} needs multi_objective_aggregation='sum_then_normalize', "
                f"got {self.multi_objective_aggregation!r}"
            )
        allowed = ("group", "none") if remedy == "dr_grpo" else ("group",)
        if self.scale_rewards not in allowed:
            raise ValueError(
                f"remedy {remedy!r} normalises per group as TRL's scale_rewards={allowed[0]!r} does; "
                f"got scale_rewards={self.scale_rewards!r}"
            )
        from avspo_openrlhf.algo import ESTIMATORS

        if ESTIMATORS[remedy].token_fn is not None and self.use_liger_kernel:
            raise ValueError(
                f"remedy {remedy!r} needs TRL's own loss (its token entropies); use_liger_kernel bypasses it"
            )


def _did_you_mean(name: str) -> str:
    """The field an unknown keyword most likely meant: the one spelling of an option whose name in the
    other front-ends differs (``avspo_alpha`` -> ``virtual_sample_alpha``), else the closest field."""
    import difflib

    for (owner, key), alias in ALIASES.items():
        if name in (f"{owner}_{key}", key):
            return alias
    close = difflib.get_close_matches(name, [f.name for f in dataclasses.fields(GRPOConfig)], n=1, cutoff=0.75)
    return close[0] if close else ""


def _checked_init(init):
    """GRPOConfig's dataclass __init__, an unknown keyword refused with the field it likely meant."""

    @functools.wraps(init)
    def __init__(self, *args, **kwargs):
        known = {f.name for f in dataclasses.fields(type(self))}
        for name in kwargs:
            if name not in known:
                hint = _did_you_mean(name)
                raise TypeError(
                    f"GRPOConfig got an unexpected keyword argument {name!r}"
                    + (f"; did you mean {hint!r}?" if hint else "")
                )
        init(self, *args, **kwargs)

    return __init__


GRPOConfig.__init__ = _checked_init(GRPOConfig.__init__)


def _configs(args):
    """``(remedy, remedy config, ACRConfig, MonitorConfig)`` an (our or TRL's own) ``GRPOConfig``
    describes; TRL's own config measures only. The typed fields set (not None) are ``given``: the
    same option in an options dict is refused, and errors name the field the user set."""
    remedy = getattr(args, "remedy", None)
    given = {"acr": {"tau_init": getattr(args, "acr_threshold_init", ACRConfig.tau_init)}, "remedy": {}, "monitor": {}}
    renamed = {k: v for k, v in TRL_NAMES.renamed.items() if k != ("remedy", "alpha") or remedy == "avspo"}
    if remedy == "avspo" and getattr(args, "virtual_sample_alpha", None) is not None:
        given["remedy"]["alpha"] = args.virtual_sample_alpha
    dicts = {
        section: _as_dict(getattr(args, f"{section}_options", None), f"{section}_options")
        for section in ("remedy", "acr", "monitor")
    }
    for (owner, key), alias in ALIASES.items():  # the paper's name is the one spelling of these
        section = owner if owner in ("acr", "monitor") else "remedy"
        if (section != "remedy" or owner == remedy) and key in dicts[section]:
            raise ValueError(f"set {alias}, not {section}_options[{key!r}]")
    for name, (section, owner, _, f) in FLAT_OPTIONS.items():
        if section == "remedy" and owner != remedy:
            continue
        value = getattr(args, name, None)
        if value is not None or f.name not in dicts[section]:  # errors name the typed field unless only the dict set it
            renamed[(section, f.name)] = name
        if value is not None:
            given[section][f.name] = tuple(value) if isinstance(value, list) else value
    names = dataclasses.replace(TRL_NAMES, renamed=renamed)
    return build_configs(
        remedy,
        std_convention=TRL_STD_CONVENTION,
        eps=TRL_EPS,
        options=getattr(args, "remedy_options", None),
        acr=getattr(args, "acr_options", None),
        monitor=getattr(args, "monitor_options", None),
        given=given,
        names=names,
    )


def _controller_for(args) -> tuple[Any, str | None]:
    """The controller an (our or TRL's own) ``GRPOConfig`` describes; TRL's own config measures only."""
    built = _configs(args)
    return build_controller(built, seed=args.seed), built.remedy


class GRPOTrainer(trl.GRPOTrainer):
    """TRL's ``GRPOTrainer`` with ACR logged on every generation batch and the advantages of
    ``args.remedy`` (see :class:`GRPOConfig`). ``controller`` holds the state that goes into checkpoints."""

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.controller, self.remedy = _controller_for(self.args)
        self.stop_on_alarm = frozenset(_configs(self.args).monitor.stop_on_alarm)
        self.stop_reason = ""  # set when an alarm of monitor_stop_on_alarm fires
        self._gathered_rewards: torch.Tensor | None = None
        self._token_inputs: dict | None = None
        self._check_setup()

    def _check_setup(self) -> None:
        """What only the trainer knows (the reward functions); GRPOConfig checked the rest when built."""
        func = getattr(self.args, "acr_reward_func", None)
        if func is not None and func not in self.reward_func_names:
            raise ValueError(f"acr_reward_func {func!r} is not a reward function; have {self.reward_func_names}")

    # ---- rewards and advantages -------------------------------------------------------------------

    def _calculate_rewards(self, inputs, prompts, completions, completion_ids_list):
        # [B_all, F]: every process's completions, in process order (TRL gathers them here)
        self._gathered_rewards = super()._calculate_rewards(inputs, prompts, completions, completion_ids_list)
        return self._gathered_rewards

    def _generate_and_score_completions(self, inputs):
        output = super()._generate_and_score_completions(inputs)
        per_func, self._gathered_rewards = self._gathered_rewards, None
        mode = "train" if self.model.training else "eval"
        g = self.num_generations if mode == "train" else self.num_generations_eval
        if per_func is None or g < 2:
            return output
        shaped = (per_func * self.reward_weights.to(per_func.device).unsqueeze(0)).nansum(dim=1)  # TRL's sum
        shaped[torch.isnan(per_func).all(dim=1)] = torch.nan  # TRL's unscorable completions
        func = getattr(self.args, "acr_reward_func", None)
        raw = shaped if func is None else per_func[:, self.reward_func_names.index(func)]
        raw, shaped = raw.view(-1, g).float().cpu(), shaped.view(-1, g).float().cpu()
        # docs/algorithm.md#unscored: ACR on each group's scored completions; the remedy's advantages
        # on the fully scored groups, TRL's own (nan-aware baseline, zero for the unscored) elsewhere
        scored = _scored(raw, shaped)
        if mode == "eval":  # measure only: evaluation must not move the gate, threshold or window
            stats = collapse_stats(raw, self.controller.tol, self.controller.reward_range, scored).metrics()
            for key, value in framework_metrics(stats).items():
                self._metrics[mode][key].append(value)
            return output
        ours, metrics = self.controller.step(raw, shaped, scored)
        full = scored.all(dim=1)
        if ours is not None:
            output["advantages"] = self._remedy_advantages(output["advantages"], ours, shaped, full, metrics)
        if self.controller.needs_entropy:
            sign = torch.zeros(shaped.shape[0], dtype=torch.int8)
            if full.any():
                sign[full] = zero_variance_sign(shaped[full], self.controller.tol, self.controller.reward_range)
            local = self._local_slice(sign.repeat_interleave(g), len(output["advantages"]))
            output[SIGN_KEY] = local.to(output["advantages"].device)
        for key, value in framework_metrics(metrics).items():
            self._metrics[mode][key].append(value)
        self._stop_on_alarm()  # the ACR alarms move with each batch
        return output

    def _stop_on_alarm(self) -> None:
        """monitor_stop_on_alarm as avspo-train does it: the run stops at the end of this step, through
        the Trainer's own ``control.should_training_stop``, with a checkpoint unless save_strategy is "no"."""
        if not self.stop_on_alarm or self.stop_reason:
            return
        fired = sorted(
            a
            for a, on in self.controller.alarms().items()
            if on and ("any" in self.stop_on_alarm or a in self.stop_on_alarm)
        )
        if fired:
            self.stop_reason = f"alarm {', '.join(fired)}"
            self.control.should_training_stop = True
            if self.args.save_strategy != "no":  # a checkpoint at the stop, as avspo-train writes one
                self.control.should_save = True
            print(f"[avspo] stopping: {self.stop_reason} (monitor_stop_on_alarm)", flush=True)

    def _local_slice(self, full: torch.Tensor, n_local: int) -> torch.Tensor:
        """This process's rows of a gathered ``[B_all]`` tensor: TRL's ``process_slice``."""
        if full.shape[0] != n_local * self.accelerator.num_processes:
            raise ValueError(f"gathered {full.shape[0]} rewards, expected {n_local} x {self.accelerator.num_processes}")
        i = self.accelerator.process_index
        return full[i * n_local : (i + 1) * n_local]

    def _remedy_advantages(self, trl_local, ours, shaped, full, metrics) -> torch.Tensor:
        """TRL's local ``[B]`` advantages with the remedy's on the fully scored groups (``full``) where
        it differs from TRL's estimator; ``metrics['remedy_groups']``: the share of such groups."""
        std = None if self.scale_rewards == "none" else TRL_STD_CONVENTION
        g = shaped.shape[1]
        use = torch.zeros(shaped.shape[0], dtype=torch.bool)
        if full.any():
            use[full] = remedy_groups(ours[full], base_advantages(shaped[full], self.controller, std, TRL_EPS))
        full_adv = torch.where(use[:, None], ours.to(shaped.dtype), torch.zeros_like(shaped))
        metrics["remedy_groups"] = float(use.float().mean()) if use.numel() else 0.0
        use_local = self._local_slice(use.repeat_interleave(g), len(trl_local)).to(trl_local.device)
        ours_local = self._local_slice(full_adv.reshape(-1), len(trl_local)).to(trl_local)
        self._log_table_advantages(full_adv.reshape(-1), use.repeat_interleave(g))
        return torch.where(use_local, ours_local, trl_local)

    def _log_table_advantages(self, ours: torch.Tensor, use: torch.Tensor) -> None:
        # the completions table TRL logs holds its own advantages of this batch last: show the trained ones
        logged = self._logs["advantages"]
        n = ours.numel()
        if len(logged) < n:
            return
        tail = torch.tensor([logged.pop() for _ in range(n)][::-1], dtype=ours.dtype)
        logged.extend(torch.where(use, ours, tail).tolist())

    # ---- token-level remedies (RL-ZVP): token advantages from the loss's own entropies -------------

    def _compute_loss(self, model, inputs):
        if SIGN_KEY not in inputs:
            return super()._compute_loss(model, inputs)
        # a copy: the buffered batch keeps its sequence-level advantages for the next iteration
        self._token_inputs = dict(inputs)
        try:
            return super()._compute_loss(model, self._token_inputs)
        finally:
            self._token_inputs = None

    def _get_per_token_logps_and_entropies(self, *args, **kwargs):
        logps, entropies, aux = super()._get_per_token_logps_and_entropies(*args, **kwargs)
        inputs = self._token_inputs
        if inputs is not None and entropies is not None:
            self._token_inputs = None  # once per loss
            mask = inputs["completion_mask"]
            if "tool_mask" in inputs:
                mask = mask * inputs["tool_mask"]
            extra = self.controller.token_advantages(entropies.detach(), mask, inputs[SIGN_KEY])
            inputs["advantages"] = inputs["advantages"].unsqueeze(1) + extra.to(inputs["advantages"].dtype)
            self._log_token_advantages(extra, mask, inputs[SIGN_KEY])
        return logps, entropies, aux

    def _log_token_advantages(self, extra: torch.Tensor, mask: torch.Tensor, sign: torch.Tensor) -> None:
        mode = "train" if self.model.training else "eval"
        local = torch.stack([extra.abs().sum(), (mask * (sign != 0).unsqueeze(1)).sum(), (sign != 0).sum()]).float()
        abs_sum, tokens, samples = self.accelerator.gather(local.unsqueeze(0)).sum(dim=0).tolist()
        self._metrics[mode][f"{self.remedy}/token_adv_abs_mean"].append(abs_sum / tokens if tokens else 0.0)
        self._metrics[mode][f"{self.remedy}/zero_variance_samples"].append(samples)

    # ---- alarms and state -------------------------------------------------------------------------

    def training_step(self, model, inputs, num_items_in_batch):
        loss = super().training_step(model, inputs, num_items_in_batch)
        ga = self.current_gradient_accumulation_steps
        if self._step % ga == 0:  # an optimizer step ended: TRL's entropy/kl of its micro-batches
            m = self._metrics["train"]
            status = {
                k: sum(m[src][-ga:]) / len(m[src][-ga:])
                for k, src in (("entropy_loss", "entropy"), ("kl", "kl"))
                if m.get(src)
            }
            for key, value in framework_metrics(self.controller.after_train(status)).items():
                m[key].append(value)
            self._stop_on_alarm()  # the entropy and KL alarms move with each optimizer step
        return loss

    def _save_checkpoint(self, model, trial):
        super()._save_checkpoint(model, trial)
        if self.args.should_save:
            folder = os.path.join(
                self._get_output_dir(trial=trial), f"{PREFIX_CHECKPOINT_DIR}-{self.state.global_step}"
            )
            with open(os.path.join(folder, STATE_FILE), "w") as f:
                json.dump(self.controller.state_dict(), f)

    def _load_optimizer_and_scheduler(self, checkpoint):
        super()._load_optimizer_and_scheduler(checkpoint)
        path = os.path.join(checkpoint, STATE_FILE) if checkpoint is not None else None
        if path is not None and os.path.exists(path):
            with open(path) as f:
                self.controller.load_state_dict(json.load(f))


__all__ = ["GRPOConfig", "GRPOTrainer", "STATE_FILE", "TESTED_TRL", "TRL_EPS", "TRL_STD_CONVENTION", "measure_acr"]
