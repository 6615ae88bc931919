"""``avspo-train --backend cpu``: the same OpenRLHF pipeline on one CPU machine.

Reused unchanged from OpenRLHF: ``SamplesGenerator`` and the agent/reward-file path (through our
subclasses), the experience maker, ``RayActorGroup``, ``PolicyModelActor``/``ActorPPOTrainer``/
``PolicyLoss``/``NaiveReplayBuffer`` on DeepSpeed (gloo), ``ReferenceModelActor``, the sync and
async trainers, checkpoints. Added here, and only here:

- :class:`CPUEngine` (``engine.py``): a rollout actor with ``RolloutRayActor``'s interface (its own
  ``generate_responses`` and agent executor run) whose engine is an in-process ``vllm.LLM`` on CPU,
  batching continuously: a ``generate`` call that arrives during a generation joins its batch.
- :class:`CPUPolicyModelActor`: weight sync by ``reload_weights`` on the engine instead of NCCL.
- ``--cpu.engine_cores`` / ``--cpu.train_cores`` (``cores.py``): the engine and the DeepSpeed actors
  on disjoint cores, each pinned from inside its own process and read back.
- ``worker.install_cpu_worker``: every Ray worker gets the stand-ins for GPU-only modules and the CUDA-call
  shims (``cuda_shims.py``).
- :func:`train_cpu`: the CPU counterpart of ``openrlhf.cli.train_ppo_ray.train`` (no GPUs, no
  placement groups, logical CPUs so that the generator and model actors all fit; OpenRLHF's trainer runs in the driver).
"""

from __future__ import annotations

import os
import time

import ray

from avspo_openrlhf import startup_gc
from avspo_openrlhf.cpu.cores import pin_process, resolve_split
from avspo_openrlhf.cpu.engine import launch_engines
from avspo_openrlhf.cpu.ray_start import RayStart, init_ray, is_loopback, worker_env


def _policy_base():
    from openrlhf.trainer.ray.ppo_actor import PolicyModelActor

    return PolicyModelActor.__ray_actor_class__


def _entropy_mixin():
    from avspo_openrlhf.trainer.token_level import TokenEntropyMixin

    return TokenEntropyMixin


def _response_logits():
    from avspo_openrlhf.trainer.response_logits import ResponseLogitsMixin

    return ResponseLogitsMixin


def _reference_base():
    from openrlhf.trainer.ray.launcher import ReferenceModelActor

    return ReferenceModelActor.__ray_actor_class__


class _Pinnable:
    def pin_cores(self, cores: list[int]) -> dict:
        """Called before the model loads, so DeepSpeed's and torch's threads start on ``cores``."""
        return pin_process(cores)

    def param_dtype(self) -> str:
        """The dtype the loaded model's weights are held in (read back for ``precision.json``)."""
        model = getattr(self, "actor", None)  # policy: .actor (OpenRLHF's Actor); reference: .model
        model = self.model if model is None else model
        return str(next(model.parameters()).dtype).removeprefix("torch.")


class _FrozenImports:
    """The model actors' imports (torch, transformers, DeepSpeed, OpenRLHF: some 600,000 objects) frozen
    before the model loads (``startup_gc.freeze_imports``): OpenRLHF's ``save_ckpt`` runs a full
    ``gc.collect()`` after every checkpoint."""

    def init_model_from_pretrained(self, *args, **kwargs):
        startup_gc.freeze_imports()
        try:
            return super().init_model_from_pretrained(*args, **kwargs)
        finally:
            startup_gc.resume()  # paused by the worker's setup hook for its imports (cpu/worker.py)


class _LoopbackRendezvous:
    """DeepSpeed's ``env://`` rendezvous starts a torch ``TCPStore`` that listens on every interface,
    whatever ``MASTER_ADDR`` says (torch 2.13). On a loopback node (a single-machine run) the actor
    serves the store itself from a socket bound to ``MASTER_ADDR``, and torch's rendezvous joins it as
    a client: torchelastic's agent-store contract (``TORCHELASTIC_USE_AGENT_STORE``)."""

    def __init__(self, world_size, rank, master_addr=None, master_port=None):
        super().__init__(world_size, rank, master_addr, master_port)
        host = os.environ["MASTER_ADDR"]
        if world_size == 1 and is_loopback(host):  # the CPU backend: one DeepSpeed process per group
            import socket

            from torch.distributed import TCPStore

            self._store_socket = socket.create_server(
                (host, 0), family=socket.AF_INET6 if ":" in host else socket.AF_INET
            )
            self._master_port = self._store_socket.getsockname()[1]
            self._store = TCPStore(
                host, self._master_port, 1, True, wait_for_workers=False, master_listen_fd=self._store_socket.fileno()
            )
            os.environ.update(MASTER_PORT=str(self._master_port), TORCHELASTIC_USE_AGENT_STORE="True")


class CPUReferenceModelActor(_FrozenImports, _Pinnable, _LoopbackRendezvous, _response_logits(), _reference_base()):
    """OpenRLHF's reference actor, pinnable to the training cores."""


class _SkipOldLogProbPass:
    """Skips experience making's no-grad log-prob pass of the policy where
    ``trainer.old_log_probs.skips_old_log_prob_pass`` (about a fifth of a CPU step): ``forward``
    returns ``skipped_old_log_probs`` and the loss takes the training forward's log-probs (``OldIsCurrent``);
    a token-level remedy takes its entropies from the training forward too
    (``trainer/token_level.py: TokenLevelTraining``), so it adds no forward either."""

    reuse_old = False
    token_step = None  # TokenLevelTraining, where the pass is skipped

    def init_model_from_pretrained(self, strategy, *args, **kwargs):
        from avspo_openrlhf.trainer.old_log_probs import OldIsCurrent, skips_old_log_prob_pass
        from avspo_openrlhf.trainer.token_level import TokenLevelTraining

        out = super().init_model_from_pretrained(strategy, *args, **kwargs)
        self.reuse_old = skips_old_log_prob_pass(strategy.args)
        if self.reuse_old:
            self.trainer.actor_loss_fn = OldIsCurrent(self.trainer.actor_loss_fn)
            self.token_step = TokenLevelTraining(self.trainer)  # steps without a token request pass through
        return out

    def forward(self, sequences, action_mask=None, attention_mask=None, *args, **kwargs):
        if self.reuse_old:
            if kwargs.get("entropy_rows") is not None:
                raise RuntimeError("entropies asked of a skipped old-log-prob pass; the experience maker defers them")
            from avspo_openrlhf.trainer.old_log_probs import skipped_old_log_probs

            return skipped_old_log_probs(action_mask)
        return super().forward(sequences, action_mask, attention_mask, *args, **kwargs)

    def fit(self, *args, **kwargs):
        buffer = self.trainer.replay_buffer
        if self.reuse_old and len(buffer) > self.strategy.args.train.batch_size:  # a second step would need them
            raise RuntimeError(
                f"{len(buffer)} samples for one optimizer step of {self.strategy.args.train.batch_size}: "
                "the skipped old log-probs are needed; old_log_probs_are_current() is wrong here"
            )
        status = super().fit(*args, **kwargs)
        if self.token_step is not None:  # the token advantages' metrics, from the training forwards
            status.update(self.token_step.metrics())
        return status


class CPUPolicyModelActor(
    _FrozenImports,
    _Pinnable,
    _LoopbackRendezvous,
    _SkipOldLogProbPass,
    _response_logits(),
    _entropy_mixin(),
    _policy_base(),
):
    """OpenRLHF's policy actor; weight sync goes to :class:`CPUEngine` through Ray."""

    cpu_engines: list = []
    sync_count = 0

    def set_cpu_engines(self, engines) -> None:
        self.cpu_engines = list(engines)

    def broadcast_to_vllm(self):
        import torch

        if not self.cpu_engines or torch.distributed.get_rank() != 0:
            return
        model = self.actor.model.module if hasattr(self.actor.model, "module") else self.actor.model
        # ray.put copies the weights into the object store once, for every engine (no copy of our own
        # first: the next optimizer step cannot reach them there)
        state = ray.put({k: v.detach() for k, v in model.state_dict().items()})
        self.sync_count += 1
        ray.get([e.load_weights.remote(state, self.sync_count) for e in self.cpu_engines])


def _pin_and_report(args, engines, groups, train_cores: list[int]) -> None:
    """Pin the training actors; read every side's binding back from inside its process."""
    import json

    train = [b for g in groups for b in ray.get(g.async_run_method("pin_cores", train_cores))]
    report = {"engine": ray.get([e.get_cpu_binding.remote() for e in engines]), "train": train}
    print(
        f"[avspo] CPU split: engine cores {[b['affinity'] for b in report['engine']]}, "
        f"training cores {[b['affinity'] for b in train]} (read back from the actors)"
    )
    if args.report.dir:
        os.makedirs(args.report.dir, exist_ok=True)
        with open(os.path.join(args.report.dir, "cpu_binding.json"), "w", encoding="utf-8") as f:
            json.dump(report, f, indent=1)


def _report_precision(args, engines, actor, ref) -> dict:
    """The dtype each stage holds its weights in, read back from inside the actors: printed and
    written to ``<report.dir>/precision.json`` (the quickstart's summary reports it)."""
    import json

    held = {
        "rollout engine": ray.get(engines[0].get_dtype.remote()),
        "policy": ray.get(actor.async_run_method("param_dtype"))[0],
        "reference": ray.get(ref.async_run_method("param_dtype"))[0] if ref is not None else None,
        "requested": args.cpu.dtype,
    }
    print("[avspo] CPU precision (read back): " + ", ".join(f"{k} {v}" for k, v in held.items() if k != "requested"))
    if args.report.dir:
        os.makedirs(args.report.dir, exist_ok=True)
        with open(os.path.join(args.report.dir, "precision.json"), "w", encoding="utf-8") as f:
            json.dump(held, f, indent=1)
    return held


def count_max_steps(strategy) -> int:
    """The run's step count as OpenRLHF's trainer computes it (``prepare_datasets``, the same
    function on the same data), here in the driver so that the policy's DeepSpeed init (its
    scheduler needs the count) need not wait for the trainer actor's start-up."""
    from openrlhf.trainer.ppo_trainer import prepare_datasets
    from openrlhf.utils import get_tokenizer

    args = strategy.args
    tokenizer = get_tokenizer(
        args.actor.model_name_or_path, None, "left", strategy, use_fast=not args.data.disable_fast_tokenizer
    )
    return prepare_datasets(strategy, tokenizer)[2]


def train_cpu(args, on_ray_started=None, ray_start: RayStart | None = None) -> None:
    """``openrlhf.cli.train_ppo_ray.train`` for one CPU machine (same trainers, same flags); ``args``
    as ``avspo-train`` completed and validated them (``cpu/args.py``).
    ``on_ray_started`` runs right after Ray is up (the driver takes its SIGTERM handler back from Ray there).
    ``ray_start``: Ray's start, begun in a thread once the input was checked (``avspo-train``), joined
    here before the actors launch, the vLLM engines it launched (``RayStart.launched``) taken as they
    are; without it, Ray starts here and the engines are launched here.

    OpenRLHF's trainer (sync or async) is built and run in this process rather than an actor of its
    own: it drives the step through Ray calls on the other actors, and in a process of its own it
    imported the whole stack again (~14 s of CPU beside the other actors' on 2 cores)."""
    import contextlib

    from avspo_openrlhf.cpu import cuda_shims

    # the sync trainer's own compute reaches OpenRLHF's CUDA-only calls: the replacements every actor
    # process has (cpu/worker.py) hold in this process too while it runs (the async one only drives actors)
    with contextlib.nullcontext() if args.train.async_enable else cuda_shims.in_place():
        _train_cpu(args, on_ray_started, ray_start)


def _train_cpu(args, on_ray_started, ray_start) -> None:
    import copy

    from openrlhf.trainer.ray.launcher import RayActorGroup

    from avspo_openrlhf.cpu.strategy import cpu_strategy
    from avspo_openrlhf.startup import TIMELINE
    from avspo_openrlhf.trainer.trainers import _PPOTrainer, _PPOTrainerAsync

    TIMELINE.mark("the backend's imports (Ray, vLLM, OpenRLHF's trainers, DeepSpeed), begun beside preflight")
    engine_cores, train_cores = resolve_split(args.cpu.engine_cores, args.cpu.train_cores)
    strategy = cpu_strategy(args)
    # the trainer gets a copy of the strategy, as an actor of its own did: its __init__ writes -1 steps as
    # inf into the args it is given, and the driver's args stay as parsed
    trainer_strategy = copy.deepcopy(strategy)
    if ray_start is None:
        init_ray(worker_env(args))
        phase = "Ray"
    else:
        ray_start.wait()
        TIMELINE.span("Ray (GCS, raylet, agents), started after preflight", *ray_start.span, "Ray start")
        phase = "waiting for Ray"
    if on_ray_started is not None:
        on_ray_started()
    TIMELINE.mark(phase)
    # the processes first, the vLLM engine's (the start-up's longest chain) before all, launched by Ray's
    # starter thread as soon as Ray is up (cli/train.py): they import while this one builds the ops, counts
    # the steps and starts wandb's run (each actor's own work waits for nothing of that but the policy's
    # init, sent below with the step count)
    model = args.actor.model_name_or_path
    if ray_start is not None and ray_start.launched is not None:
        engines, engines_at = ray_start.launched
    else:
        engines, engines_at = launch_engines(args), time.time()
    for i, engine in enumerate(engines):
        TIMELINE.watch(
            "vLLM engine (process, imports, model, engine)", engine.get_dtype.remote(), f"engine {i}", engines_at
        )
    launched = time.time()
    actor = RayActorGroup(1, 1, ray.remote(num_gpus=0)(CPUPolicyModelActor), num_gpus_per_actor=0)
    ref = None
    if args.algo.kl.init_coef > 0:
        ref = RayActorGroup(1, 1, ray.remote(num_gpus=0)(CPUReferenceModelActor), num_gpus_per_actor=0)
    TIMELINE.mark("engine and model processes launched")
    from avspo_openrlhf.cpu.ops import build, is_built, ops_for

    ops = ops_for(args.ds.adam_offload)
    if not os.environ.get("RAY_ADDRESS"):  # one machine: its ops built (and said so) before the actors load them
        build(ops, say=lambda msg: print(msg, flush=True))
    elif missing := [n for n in ops if not is_built(n)]:  # a cluster's nodes build their own: say so at least
        print(
            f"[avspo] DeepSpeed compiles {', '.join(missing)} in the actors on first use (about a minute on 2 "
            "cores; python -m avspo_openrlhf.cpu.ops builds them ahead)",
            flush=True,
        )
    TIMELINE.mark("DeepSpeed's CPU ops (built or found)")
    # the policy's scheduler needs the count: known before its init is sent
    max_steps = count_max_steps(strategy)
    TIMELINE.mark("step count (tokenizer, dataset)")
    if not args.train.async_enable and args.report.wandb and not args.logger.wandb.key:
        # the sync trainer, built in this process later, takes this run (trainers.py: _setup_reports)
        from avspo_openrlhf.report import WandbAutoLogger

        WandbAutoLogger.start_early(args, args.report.dir)
        TIMELINE.mark("wandb's run (the sync trainer takes it)")
    trainer_args = (model, trainer_strategy, actor, None, None, ref, engines)
    generate_kwargs = dict(
        do_sample=True,
        max_len=args.data.max_len,
        max_new_tokens=args.rollout.max_new_tokens,
        temperature=args.rollout.temperature,
        top_p=args.rollout.top_p,
    )
    if args.train.async_enable:
        # OpenRLHF's async trainer only builds and drives its generator and training actors (ray.get on them)
        trainer = _PPOTrainerAsync(*trainer_args, **generate_kwargs)
        TIMELINE.watch(
            "generator actor (process, imports, dataset)", trainer.generator_actor.get_max_steps.remote(), "generator"
        )
        TIMELINE.mark("generator actor launched")
    if engine_cores:
        _pin_and_report(args, engines, [g for g in (actor, ref) if g is not None], train_cores)
        TIMELINE.mark("cores pinned (waits for the actors' processes)")
    # vllm_engines=None: no NCCL/gloo group with the engines; weights go through CPUPolicyModelActor
    refs = actor.async_init_model_from_pretrained(strategy, model, max_steps, None)
    TIMELINE.watch("policy (process, imports, model, DeepSpeed init)", refs[0], "policy actor", launched)
    if ref is not None:
        refs += ref.async_init_model_from_pretrained(strategy, model)
        TIMELINE.watch("reference (process, imports, model, DeepSpeed init)", refs[-1], "reference actor", launched)
    if not args.train.async_enable:
        # OpenRLHF's sync trainer drives each step through Ray calls to the engines and the policy (its own
        # compute: the rewards' advantages): built here while the policy loads
        trainer = _PPOTrainer(*trainer_args, **generate_kwargs)
        TIMELINE.mark("the trainer (tokenizer, dataset, samples generator), in this process")
    ray.get(refs)
    TIMELINE.mark("waiting for the policy (and reference)")
    if (trainer_steps := trainer.get_max_steps()) != max_steps:  # async: the generator actor's count
        raise RuntimeError(f"the trainer counts {trainer_steps} steps, the scheduler was built for {max_steps}")
    if args.train.async_enable:
        TIMELINE.mark("waiting for the generator actor")
    ray.get(actor.async_run_method("set_cpu_engines", engines))
    _report_precision(args, engines, actor, ref)
    TIMELINE.mark("engines attached (waits for the vLLM engine)")
    TIMELINE.write(args.report.dir)
    print(f"[avspo] {TIMELINE.summary()} (timeline: startup.json; the first step begins now)", flush=True)
    startup_gc.resume()  # paused by avspo-train for the start-up's imports (startup_gc.py)
    trainer.fit()
    from avspo_openrlhf.trainer.stop_file import trainer_stopped

    # a run the trainer stopped (it checkpointed) resumes instead; one that ran to its end saves the
    # final model even when a stop request came after the last step's check
    if not trainer_stopped(args):
        ray.get(actor.async_save_model())
