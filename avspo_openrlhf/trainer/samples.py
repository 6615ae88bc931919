"""OpenRLHF's ``SamplesGenerator`` with policy-version tags, a std-based dynamic filter, correct
filter accounting, generator idle time, and prompts re-queued by the async staleness bound.

Every sample leaves with a typed :class:`RolloutMeta` in its ``rollout_meta`` attribute (beside
OpenRLHF's ``Experience`` fields, so OpenRLHF's info merging never sees it); the trainer and the
experience maker read a batch's as one :class:`BatchMeta`.
"""

from __future__ import annotations

import dataclasses
import time
from collections import deque
from dataclasses import dataclass

import ray
import torch
from openrlhf.trainer.ppo_utils.samples_generator import SamplesGenerator, _collect_prompt_batch
from openrlhf.trainer.ray.vllm_engine import batch_vllm_engine_call
from tqdm import tqdm

from avspo_openrlhf.algo import dynamic_sampling_keep_mask

from .config import settings


@dataclass(frozen=True)
class RolloutMeta:
    """What the generator knows about one sample."""

    policy_version: int  # trainer step whose weights the engines held when it was generated
    datasource: str | None = None  # its prompt's dataset field (per-level ACR); None for eval samples
    gen_cost: float = 1.0  # generated / kept samples of its generation call (dynamic sampling)
    gen_idle_s: float = 0.0  # generator idle time before that call
    gen_t0: float = 0.0  # wall-clock start and end of that call (the async timeline)
    gen_t1: float = 0.0


@dataclass(frozen=True)
class BatchMeta:
    """One training batch's :class:`RolloutMeta`, summarized (fields are None for samples that
    carry none, e.g. samples built by hand)."""

    policy_version: int | None = None  # the oldest weights in the batch
    gen_cost_sum: float | None = None
    gen_cost_mean: float | None = None
    gen_idle_s: float | None = None  # the longest generator wait among the batch's calls
    gen_start: float | None = None
    gen_end: float | None = None
    group_datasources: list[str] | None = None  # one per prompt group (samples come n per prompt)

    @classmethod
    def of(cls, samples, n: int) -> BatchMeta:
        metas = [getattr(s, "rollout_meta", None) for s in samples]
        if not metas or any(m is None for m in metas):
            return cls()
        cost = [m.gen_cost for m in metas]
        sources = [m.datasource for m in metas[::n]]
        return cls(
            policy_version=min(m.policy_version for m in metas),
            gen_cost_sum=float(sum(cost)),
            gen_cost_mean=float(sum(cost)) / len(cost),
            gen_idle_s=max(m.gen_idle_s for m in metas),
            gen_start=min(m.gen_t0 for m in metas),
            gen_end=max(m.gen_t1 for m in metas),
            group_datasources=None if None in sources else sources,
        )


def _update_meta(samples, **fields) -> None:
    for s in samples:
        s.rollout_meta = dataclasses.replace(s.rollout_meta, **fields)


class _PromptSource:
    """Iterator over prompt batches ``(datasources, prompts, labels, images)``: re-queued ones
    first, then the dataloader; remembers each prompt's datasource (for per-level ACR)."""

    def __init__(self, pending: deque, it, ds_of: dict):
        self.pending, self.it, self.ds_of = pending, it, ds_of

    def __iter__(self):
        return self

    def __next__(self):
        item = self.pending.popleft() if self.pending else next(self.it)
        for ds, prompt in zip(item[0] or [], item[1]):
            if ds is not None:
                self.ds_of[prompt] = ds
        return item


class AVSPOSamplesGenerator(SamplesGenerator):
    """Args (besides OpenRLHF's): ``version_fn() -> int`` gives the policy version in the engines
    now; ``stop_fn() -> bool`` ends generation early (alarms); ``requeue_fn() -> list`` returns prompt batches ``(None, [prompt], [label], [image])`` to
    generate before new ones (over-stale batches in async mode)."""

    def __init__(self, *args, version_fn=None, requeue_fn=None, stop_fn=None, **kwargs):
        super().__init__(*args, **kwargs)
        self.cfg = settings(self.args)  # our flag groups, typed
        self.version_fn = version_fn or (lambda: 0)
        self.requeue_fn = requeue_fn
        self.stop_fn = stop_fn
        self.stop = False  # set by the trainer (or stop_fn) when an alarm stops the run
        self.pending: deque = deque()
        self._version = 0
        self._last_end: float | None = None
        self._training_call = False
        self._last_kept_groups = 0
        self.ds_of: dict[str, str] = {}

    def generate_samples(self, **generate_kwargs):
        if self.stop or (self.stop_fn is not None and self.stop_fn()):
            return [], None, 0, True
        t0 = time.time()
        idle = 0.0 if self._last_end is None else t0 - self._last_end
        if self.requeue_fn is not None:
            self.pending.extend(self.requeue_fn())
        self._training_call = True
        try:
            samples, pass_rate, consumed, exhausted = super().generate_samples(**generate_kwargs)
        finally:
            self._training_call = False
        self._last_end = time.time()
        if pass_rate is not None:
            # OpenRLHF 0.11.2 divides kept *samples* by consumed *prompts*: inflated by n
            pass_rate /= self.args.rollout.n_samples_per_prompt
        elif self.cfg.dynamic.std_filter and consumed:
            pass_rate = 100.0 * self._last_kept_groups / consumed
        _update_meta(samples, gen_idle_s=idle, gen_t0=t0, gen_t1=self._last_end)
        return samples, pass_rate, consumed, exhausted

    def generate_eval_samples(self, **generate_kwargs):
        """The whole eval set in one dispatch. OpenRLHF 0.11.2 generates it in chunks of
        --rollout.batch_size prompts and waits for each chunk, so with a small rollout batch (the CPU
        quickstart's 2 prompts per step) an evaluation is dozens of sequential engine calls: 170 s for
        60 problems on 2 cores, against ~60 s for 45 problems in one dispatch."""
        if self.args.vllm.enable_sleep:
            batch_vllm_engine_call(self.vllm_engines, "wake_up")
        try:
            samples, _, _ = self._generate_vllm(iter(self.eval_dataloader), max(1, len(self.eval_dataloader.dataset)),
                                                False, **generate_kwargs)  # fmt: skip
        finally:
            if self.args.vllm.enable_sleep:
                batch_vllm_engine_call(self.vllm_engines, "sleep")
        return samples

    def _generate_vllm(self, dataloader_iter, num_prompts: int, dynamic_filtering, **generate_kwargs):
        self._version = int(self.version_fn())
        training = self._training_call
        if training:
            dataloader_iter = _PromptSource(self.pending, dataloader_iter, self.ds_of)
        if training and self.cfg.dynamic.std_filter:
            out = self._generate_std_filtered(dataloader_iter, num_prompts, **generate_kwargs)
        else:
            out = super()._generate_vllm(dataloader_iter, num_prompts, dynamic_filtering, **generate_kwargs)
        samples, consumed, _ = out
        n = generate_kwargs.get("n_samples_per_prompt", self.args.rollout.n_samples_per_prompt)
        self._last_kept_groups = len(samples) // max(n, 1)
        if training:
            _update_meta(samples, gen_cost=consumed * n / len(samples) if samples else 0.0)
        return out

    def _process_response_into_experience(self, response, **generate_kwargs):
        exp = super()._process_response_into_experience(response, **generate_kwargs)
        source = str(self.ds_of.get(response["prompt"], "default")) if self._training_call else None
        exp.rollout_meta = RolloutMeta(policy_version=self._version, datasource=source)
        return exp

    def _generate_std_filtered(self, dataloader_iter, num_prompts: int, **generate_kwargs):
        """DAPO dynamic sampling: keep a group only if its reward std >= --acr.tol; every dropped
        group is replaced by a new prompt until the batch is full or the data runs out."""
        tol = self.cfg.acr.tol
        prompts, labels, images, exhausted = _collect_prompt_batch(dataloader_iter, num_prompts)
        if not prompts:
            return [], 0, True
        consumed = len(prompts)
        pending = self._dispatch_prompts_to_vllm(prompts, labels, images=images, **generate_kwargs)
        accepted = []
        pbar = tqdm(total=len(prompts), desc="Generate samples (std filter)")
        while pending:
            ready, pending = ray.wait(pending, num_returns=1, timeout=10.0)
            for ref in ready:
                group = [self._process_response_into_experience(r, **generate_kwargs) for r in ray.get(ref)]
                if any(e.rewards is None for e in group):
                    raise ValueError("--dynamic.std_filter needs rule-based rewards (--reward.remote_url)")
                rewards = torch.cat([e.rewards for e in group]).float()[None]
                if bool(dynamic_sampling_keep_mask(rewards, tol)[0]):
                    accepted.extend(group)
                    pbar.update()
                    continue
                new_p, new_l, new_i, exhausted = _collect_prompt_batch(dataloader_iter, 1)
                consumed += len(new_p)
                if new_p:
                    pending.extend(self._dispatch_prompts_to_vllm(new_p, new_l, images=new_i, **generate_kwargs))
            pbar.set_postfix({"prompts_consumed": consumed})
        pbar.close()
        return accepted, consumed, exhausted
