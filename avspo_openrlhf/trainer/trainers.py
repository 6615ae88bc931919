"""OpenRLHF's trainers (sync ``PPOTrainer``, async ``PPOTrainerAsync``) with our experience maker,
samples generator, metrics, checkpointed state, alarms, and the version-tagged async buffer.

Ray forbids subclassing a ``@ray.remote`` class, so each class here subclasses the wrapped
``__ray_actor_class__`` and is wrapped again. The async trainer builds its actors itself
(:class:`_PPOTrainerAsync`): OpenRLHF's queue, slots and vLLM lock, plus our
:class:`AsyncCoordinator` actor (policy version, re-queued prompts, stop flag) passed to the
generator and the training actor; the lock and the coordinator live in ``async_actors.py``, whose
processes import nothing of the training stack.
"""

from __future__ import annotations

import math
import re
import time
import uuid

import ray
import torch
from openrlhf.trainer import ppo_trainer_async as _async
from openrlhf.trainer.ppo_trainer import BasePPOTrainer, PPOTrainer
from openrlhf.trainer.ray.vllm_engine import batch_vllm_engine_call
from openrlhf.utils.logging_utils import init_logger
from ray.util.queue import Queue

from avspo_openrlhf.redaction import check_wandb_key_in_env

from .async_actors import AsyncCoordinator, VLLMLock
from .experience_maker import RemedyExperienceMaker
from .remedy_state import STATE_KEY, RemedyStateMixin
from .run_settings import settings
from .samples import BatchMeta, RemedySamplesGenerator
from .staleness import StalenessMixin
from .stop_policy import StopPolicyMixin

logger = init_logger(__name__)

SKIPPED = "_avspo_skipped"  # a batch not trained (stopped run, over-stale): nothing logged or saved
# optimizer metrics that must be finite before an update may reach the engines or a checkpoint
LOSS_KEYS = ("policy_loss", "actor_grad_norm", "critic_loss", "entropy_loss", "kl")


_EVAL_KEY = re.compile(r"^eval_(?P<ds>.+)_(?P<metric>pass\d+|response_length_mean|truncated_rate)$")


def rename_eval_metrics(logs: dict) -> dict:
    """OpenRLHF's ``eval_<datasource>_pass1`` -> ``<datasource>/pass1`` (logged as ``eval/<benchmark>/pass1``)."""
    out = {}
    for k, v in logs.items():
        m = _EVAL_KEY.match(k)
        out[f"{m['ds']}/{m['metric']}" if m else k] = v
    return out


class _EvalRenamingLogger:
    def __init__(self, logger_):
        self._logger = logger_

    def log_eval(self, global_step, logs_dict):
        return self._logger.log_eval(global_step, rename_eval_metrics(logs_dict))

    def __getattr__(self, name):
        return getattr(self._logger, name)


def seed_prompt_order(dataloader, seed: int) -> None:
    """Make the prompt order a function of ``--train.seed``. OpenRLHF 0.11.2 builds the prompt
    dataloader in a process where torch's RNG is never seeded, so its shuffle differs run to run:
    two methods at the same seed saw different prompts, and comparisons were not paired. A resumed
    run still continues its order: the dataloader's state_dict (loaded later) holds the generator."""
    generator = getattr(getattr(dataloader, "sampler", None), "generator", None)
    if isinstance(generator, torch.Generator):
        generator.manual_seed(int(seed))


def attach_samples_generator(owner, strategy, vllm_engines, tokenizer, **hooks) -> None:
    """Gives ``owner`` (OpenRLHF's sync trainer or async generator actor) our samples generator over
    its prompt dataloader, in ``--train.seed``'s order; ``hooks`` are the generator's
    ``version_fn``/``requeue_fn``/``stop_fn``. OpenRLHF checkpoints the dataloader's state_dict:
    GRESO's history travels inside it."""
    seed_prompt_order(owner.prompts_dataloader, strategy.args.train.seed)
    owner.samples_generator = RemedySamplesGenerator(
        strategy=strategy,
        prompts_dataloader=owner.prompts_dataloader,
        eval_dataloader=owner.eval_dataloader,
        tokenizer=tokenizer,
        vllm_engines=vllm_engines,
        **hooks,
    )
    owner.prompts_dataloader = owner.samples_generator.state_with_extras(owner.prompts_dataloader)


class RemedyTrainerMixin(StopPolicyMixin, StalenessMixin, RemedyStateMixin):
    """Goes before an OpenRLHF trainer class in the MRO; call :meth:`_remedy_setup` after its
    ``__init__``. One step's flow and metrics here; the stop policy (``stop_policy.py``), the async
    staleness bound (``staleness.py``) and the checkpointed state (``remedy_state.py``) apart."""

    def _remedy_setup(self) -> None:
        self.cfg = settings(self.args)  # our flag groups, typed
        self.experience_maker = RemedyExperienceMaker(
            self.actor_model_group,
            self.critic_model_group,
            self.reward_model_group,
            self.reference_model_group,
            self.kl_ctl,
            self.strategy,
            self.tokenizer,
        )
        self.controller = self.experience_maker.controller
        self.policy_version = 0  # trainer step whose weights the rollout engines hold
        # cumulative async/dynamic-sampling counters, checkpointed with the controller
        self.counters = dict(
            trained_batches=0,
            dropped_stale_batches=0,
            requeued_prompts=0,
            generated=0.0,
            trained=0,
            generated_tokens=0.0,
        )
        self._idle_s = 0.0
        self._lock_wait_s = 0.0  # this step's wait for the engine lock before its weight sync (async)
        self.stop_reason = ""  # set when --monitor.stop_on_alarm fires
        self._setup_reports()

    def _setup_reports(self) -> None:
        from avspo_openrlhf.report import FanOutLogger, JsonlLogger, WandbAutoLogger

        rep = self.cfg.report
        extra = []
        if rep.dir:
            extra.append(JsonlLogger(rep.dir))
        if rep.wandb and getattr(self, "wandb_logger", None) is None:
            extra.append(WandbAutoLogger(self.args, rep.dir))
        if extra:
            self.wandb_logger = FanOutLogger(getattr(self, "wandb_logger", None), *extra)
        for name in ("wandb_logger", "tensorboard_logger"):
            if getattr(self, name, None) is not None:
                setattr(self, name, _EvalRenamingLogger(getattr(self, name)))

    # ── one step ──
    def train_step(self, rollout_samples, global_step: int):
        if self._stopped(global_step):
            return {SKIPPED: True}, global_step
        t_start = time.time()
        self._lock_wait_s = 0.0
        meta = BatchMeta.of(rollout_samples, self.args.rollout.n_samples_per_prompt)
        extra: dict[str, float] = {}
        is_async = self.args.train.async_enable
        if meta.policy_version is not None and is_async and self._too_stale(rollout_samples, meta, global_step, extra):
            return {SKIPPED: True}, global_step
        status, step = super().train_step(rollout_samples, global_step)
        self.policy_version = step
        c = self.counters
        c["trained_batches"] += 1
        c["trained"] += len(rollout_samples)
        if meta.gen_cost_sum is not None:
            c["generated"] += meta.gen_cost_sum
            extra["dynamic/generated_per_trained"] = meta.gen_cost_mean
            extra["dynamic/generated_per_trained_cum"] = c["generated"] / c["trained"]
        if meta.gen_tokens_sum is not None:  # the budget remedies are compared at (docs/algorithm.md#budget)
            c["generated_tokens"] = c.get("generated_tokens", 0.0) + meta.gen_tokens_sum
            extra["tokens/generated"] = meta.gen_tokens_sum
            extra["tokens/generated_cum"] = c["generated_tokens"]
            extra.update(meta.gen_metrics or {})
        if is_async:
            if meta.gen_idle_s is not None:
                extra["async/generator_idle_s"] = meta.gen_idle_s
            extra["async/trainer_idle_s"], self._idle_s = self._idle_s, 0.0
            extra["async/dropped_stale_batches_cum"] = float(c["dropped_stale_batches"])
            extra["async/sync_lock_wait_s"] = self._lock_wait_s
        if meta.gen_start is not None:  # the timeline of experiments/async_throughput and avspo-simulate
            extra["timeline/gen_start"], extra["timeline/gen_end"] = meta.gen_start, meta.gen_end
            extra["timeline/step_start"], extra["timeline/step_end"] = t_start, time.time()
        kl_key = "kl" if self.cfg.monitor.kl_source == "ref" else "ppo_kl"
        status.update(self.controller.after_train(status, kl_key))
        status.update(extra)
        return status, step

    def ppo_train(self, global_steps: int):
        status = super().ppo_train(global_steps)
        bad = {k: float(status[k]) for k in LOSS_KEYS if k in status and not math.isfinite(float(status[k]))}
        if bad:  # raised before the weights are synced to the engines or saved
            raise FloatingPointError(
                f"[avspo] non-finite {bad} in training step {global_steps + 1}: stopped before syncing or saving "
                f"these weights; resume from the last checkpoint in {self.args.ckpt.path} (e.g. with a lower --actor.adam.lr)"
            )
        return status

    def _compute_rollout_stats(self, experiences):
        stats = super()._compute_rollout_stats(experiences)
        stats.update(self.experience_maker.last_metrics)
        return stats

    def save_logs_and_checkpoints(self, global_step: int, logs_dict=None, client_states=None) -> None:
        if logs_dict and logs_dict.get(SKIPPED):
            return  # an over-stale batch: no step was taken, nothing to log or save
        client_states = dict(client_states or {}, **{STATE_KEY: self.remedy_state_dict()})
        super().save_logs_and_checkpoints(global_step, logs_dict, client_states)
        self._maybe_stop(global_step, client_states)


class _PPOTrainer(RemedyTrainerMixin, PPOTrainer.__ray_actor_class__):
    def __init__(
        self,
        pretrain,
        strategy,
        actor_model_group,
        critic_model_group,
        reward_model_group,
        reference_model_group,
        vllm_engines,
        **generate_kwargs,
    ):
        check_wandb_key_in_env(strategy.args)  # before OpenRLHF's WandbLogger logs in
        super().__init__(
            pretrain,
            strategy,
            actor_model_group,
            critic_model_group,
            reward_model_group,
            reference_model_group,
            vllm_engines,
            **generate_kwargs,
        )
        self._remedy_setup()
        attach_samples_generator(self, strategy, vllm_engines, self.tokenizer, version_fn=lambda: self.policy_version)


RemedyPPOTrainer = ray.remote(_PPOTrainer)


# ── async ──


class _TimedQueue:
    """Wraps the trainer's rollout queue; the time blocked in ``get`` is the trainer's idle time."""

    def __init__(self, queue, owner):
        self._queue, self._owner = queue, owner

    def get(self, *args, **kwargs):
        t0 = time.time()
        try:
            return self._queue.get(*args, **kwargs)
        finally:
            self._owner._idle_s += time.time() - t0

    def __getattr__(self, name):
        return getattr(self._queue, name)


class _GenerateSamplesActor(_async.GenerateSamplesActor.__ray_actor_class__):
    def __init__(
        self,
        pretrain,
        strategy,
        vllm_engines,
        *,
        vllm_lock,
        rollout_queue,
        rollout_slots,
        coordinator,
        **generate_kwargs,
    ):
        super().__init__(
            pretrain,
            strategy,
            vllm_engines,
            vllm_lock=vllm_lock,
            rollout_queue=rollout_queue,
            rollout_slots=rollout_slots,
            **generate_kwargs,
        )
        attach_samples_generator(
            self,
            strategy,
            vllm_engines,
            self.samples_generator.tokenizer,
            version_fn=lambda: ray.get(coordinator.get_version.remote()),
            requeue_fn=lambda: ray.get(coordinator.take_requeued.remote()),
            stop_fn=lambda: ray.get(coordinator.should_stop.remote()),
        )


class _TrainingActor(RemedyTrainerMixin, _async.TrainingActor.__ray_actor_class__):
    def __init__(self, pretrain, strategy, *args, coordinator, **kwargs):
        check_wandb_key_in_env(strategy.args)  # before OpenRLHF's WandbLogger logs in
        super().__init__(pretrain, strategy, *args, **kwargs)
        self.coordinator = coordinator
        self._remedy_setup()
        self.rollout_queue = _TimedQueue(self.rollout_queue, self)

    def _requeue(self, batches) -> None:
        ray.get(self.coordinator.requeue.remote(batches))

    def _request_stop(self) -> None:
        ray.get(self.coordinator.request_stop.remote())

    def broadcast_to_vllm(self):
        # OpenRLHF's TrainingActor.broadcast_to_vllm, plus publishing the new version while the
        # lock is held, so a generation that starts afterwards reads the weights it really uses;
        # the wait for the lock (a generation in progress) is logged apart from the sync itself
        t0 = time.time()
        ray.get(self.vllm_lock.acquire.remote())
        self._lock_wait_s = time.time() - t0
        if self._partial_rollout:
            batch_vllm_engine_call(self.vllm_engines, "pause_generation")
        try:
            BasePPOTrainer.broadcast_to_vllm(self)
            ray.get(self.coordinator.set_version.remote(self.policy_version))
        finally:
            if self._partial_rollout:
                batch_vllm_engine_call(self.vllm_engines, "resume_generation")
            ray.get(self.vllm_lock.release.remote())

    def train_step(self, rollout_samples, global_step: int):
        # broadcast (inside super().train_step) must publish the version being produced
        self.policy_version = global_step + 1
        step = global_step
        try:
            status, step = super().train_step(rollout_samples, global_step)
        finally:
            self.policy_version = step  # unchanged when the batch was skipped or training failed
        return status, step


class _PPOTrainerAsync(_async.PPOTrainerAsync.__ray_actor_class__):
    """OpenRLHF's async trainer (its ``fit`` and ``get_max_steps`` unchanged), built here: the same
    rollout queue, slot tokens and vLLM lock as OpenRLHF 0.11.2's ``__init__``, our generator and
    training actors, and the :class:`AsyncCoordinator` both are given."""

    def __init__(
        self,
        pretrain,
        strategy,
        actor_model_group,
        critic_model_group,
        reward_model_group,
        reference_model_group,
        vllm_engines,
        **generate_kwargs,
    ):
        args = strategy.args
        if args.eval.steps == -1:
            args.eval.steps = float("inf")  # do not evaluate
        if args.ckpt.save_steps == -1:
            args.ckpt.save_steps = float("inf")  # do not save checkpoints
        queue_size = args.train.async_queue_size
        if queue_size <= 0:
            raise ValueError(f"--train.async_queue_size must be positive, got {queue_size}")
        self.rollout_queue = Queue(maxsize=queue_size)
        self.rollout_slots = Queue(maxsize=queue_size)  # slot tokens: at most queue_size batches ahead
        for _ in range(queue_size):
            self.rollout_slots.put(0, block=True)
        # generation and weight sync never overlap (OpenRLHF's lock, from a module its process imports in ~1 s)
        vllm_lock = ray.remote(num_cpus=0)(VLLMLock).remote()
        coordinator = (
            ray.remote(num_cpus=0)(AsyncCoordinator).options(name=f"avspo-coordinator-{uuid.uuid4().hex[:8]}").remote()
        )
        shared = dict(
            vllm_lock=vllm_lock,
            rollout_queue=self.rollout_queue,
            rollout_slots=self.rollout_slots,
            coordinator=coordinator,
        )
        self.generator_actor = ray.remote(_GenerateSamplesActor).remote(
            pretrain=pretrain, strategy=strategy, vllm_engines=vllm_engines, **shared, **generate_kwargs
        )
        self.trainer_actor = ray.remote(_TrainingActor).remote(
            pretrain=pretrain,
            strategy=strategy,
            actor_model_group=actor_model_group,
            critic_model_group=critic_model_group,
            reward_model_group=reward_model_group,
            reference_model_group=reference_model_group,
            vllm_engines=vllm_engines,
            **shared,
        )


RemedyPPOTrainerAsync = ray.remote(_PPOTrainerAsync)
