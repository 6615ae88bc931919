"""What one run of a remedies study is: its arm (what a method changes), the settings every arm
shares, and the run spec with the record two runs must share to pair (``settings_record``, hashed by
``study/fingerprint.py``); the semantics version (``LOOP_SEMANTICS``) that a change of what a run
computes bumps. No model, no engine: the study, the scheduler and the report read only this."""

from __future__ import annotations

import dataclasses
import json
import os
import subprocess
from dataclasses import dataclass, field
from pathlib import Path

import torch

from avspo_openrlhf.algo import (
    ESTIMATORS,
    ACRConfig,
    GRESOConfig,
    Names,
    build_configs,
    typed,
)
from avspo_openrlhf.data.tasks import TEMPLATES
from avspo_openrlhf.study.controls import format_reward
from avspo_openrlhf.study.fingerprint import (
    device_kind,
    file_sha256,
    model_fingerprint,
    prompts_fingerprint,
    settings_difference,  # noqa: F401  re-exported: remedies_gpu and the tests import it from here
    tokenizer_fingerprint,
    versions,
)
from avspo_openrlhf.study.task import reward_source
from avspo_openrlhf.trainer.plugins import load_plugins

# what an arm trains on: the task's verifier; a fair coin per completion (the noise floor: with ratio 1
# and no clipping its expected gradient is zero); 1 for any extractable answer, whatever its value
# (the gain that needs no correctness: the answer format)
REWARD_CONTROLS = ("task", "random", "format")
ADVANTAGE_CONTROLS = ("random_sign",)  # a fair coin's +-1 on each collapsed group, GRPO elsewhere
NONFINITE_FLAG = 0.01  # a run with more than this share of its steps skipped (non-finite gradient) is flagged


def _require(ok: bool, message: str) -> None:
    if not ok:
        raise ValueError(message)


# how the one builder (algo/build.py) names a study's option in an error: Arm.options['alpha']
STUDY_NAMES = Names(
    {"remedy": "Arm.options", "acr": "StudySettings.acr", "monitor": "StudySettings.monitor", "greso": "Arm.greso"}
)


@dataclass(frozen=True)
class Arm:
    """What one method of a study changes; everything else is the study's :class:`StudySettings`.

    estimator: a registered advantage estimator (``algo.ESTIMATORS``: grpo, avspo, sign, rl_zvp, ...).
    options: that estimator's config fields (``{"strategy": "opposite"}`` for AVSPO, ...).
    dynamic: DAPO dynamic sampling: collapsed groups are dropped and refilled from new prompts.
    greso: GRESO's config fields (``{}`` for its defaults): prompts skipped before rollout; None: off.
    reward: ``task`` (the verifier); controls: ``random`` (a fair coin per completion: the noise
        floor) or ``format`` (1 for any extractable answer: the gain that needs no correctness).
    control: ``random_sign``: each collapsed group gets A = +1 or -1 from a fair coin that ignores
        its rewards (the virtual-sample family's control: a push with no information); None: off.
    lr: this arm's learning rate instead of the study's (a learning-rate check); None: the study's.
    """

    estimator: str = "grpo"
    options: dict = field(default_factory=dict)
    dynamic: bool = False
    greso: dict | None = None
    reward: str = "task"
    control: str | None = None
    lr: float | None = None

    def __post_init__(self):
        _require(
            self.estimator in ESTIMATORS,
            f"Arm.estimator: {self.estimator!r} is not a registered estimator; known: {sorted(ESTIMATORS)}",
        )
        _require(self.reward in REWARD_CONTROLS, f"Arm.reward must be one of {REWARD_CONTROLS}, got {self.reward!r}")
        _require(
            self.control is None or self.control in ADVANTAGE_CONTROLS,
            f"Arm.control must be None or one of {ADVANTAGE_CONTROLS}, got {self.control!r}",
        )
        _require(
            self.control is None or self.estimator == "grpo",
            f"Arm.control {self.control!r} replaces the collapsed groups' advantages of GRPO: use estimator "
            f"'grpo', got {self.estimator!r}",
        )
        _require(
            self.lr is None or (isinstance(self.lr, (int, float)) and self.lr > 0),
            f"Arm.lr must be None or > 0, got {self.lr!r}",
        )
        self.estimator_config()  # refuses a wrong option now, not at the run's first step
        if self.greso is not None:
            typed(GRESOConfig, self.greso, "greso", STUDY_NAMES)

    def estimator_config(self):
        return build_configs(self.estimator, options=self.options, names=STUDY_NAMES).config


def check_loop_arm(arm: Arm) -> None:
    """Refuse, naming the field, what an :class:`Arm` may say (the CPU study's ``avspo-train`` backend
    runs it) that this loop cannot run."""
    _require(
        arm.greso is None or float(arm.greso.get("audit", 0.0)) == 0.0,
        "Arm.greso.audit: the study loop does not roll out audits (their tokens would be charged to the budget); use 0",
    )


@dataclass(frozen=True)
class StudySettings:
    """What every arm of a study shares."""

    group_size: int = 8  # G completions per prompt
    prompts_per_step: int = 8  # groups trained per step
    max_new_tokens: int = 32
    temperature: float = 0.7
    lr: float = 1e-5
    token_budget: int = 64_000  # generated tokens per run: the equal-compute stop
    template: str = "user"  # data.tasks.make_prompt's template
    reward: str = "arith"  # arith | math (math-verify) | module:function (completion, answer) -> float
    acr: dict = field(default_factory=dict)  # ACRConfig fields (the gate of AVSPO, gated NGRPO)
    dynamic_max_rounds: int = 4  # DAPO-DS: generation rounds per step at most (DAPO's max_num_gen_batches)
    eval_n: int = 4  # held-out samples per problem
    eval_temperature: float = 0.7
    mid_eval_tokens: int = 0  # generated tokens between mid-run evaluations (0: none): the same milestones in every arm
    mid_eval_problems: int = 200  # the first this many held-out problems, at n = 2
    final_eval: bool = True  # False: train only (the throughput measurement)
    # beside pass@1 at eval_temperature, one greedy completion per held-out problem: a secondary reading
    # (sampling at T rewards a sharpened policy; greedy accuracy does not depend on it)
    greedy_eval: bool = True
    ckpt_every: int = 10  # steps between checkpoints (0: none)
    micro_batch: int = 16  # sequences per forward/backward (activations, not the logits, bound the memory)
    gen_batch: int = 512  # sequences per generate call (rollouts and evaluation)
    grad_clip: float = 1.0
    # by_device: bf16 autocast on CUDA, fp32 on a CPU (not --cpu.dtype's auto, which asks the CPU's bf16
    # support); or bf16 / fp32 everywhere
    dtype: str = "by_device"
    max_steps: int = 10_000  # a budget that is never reached (empty completions) stops here
    # process: one run per process, its own transformers model; stacked: K runs in one process, their
    # weights stacked (study/engine.py). Part of the settings hash: the two sample with other random numbers
    engine: str = "process"

    def __post_init__(self):
        for name in (
            "group_size",
            "prompts_per_step",
            "max_new_tokens",
            "token_budget",
            "dynamic_max_rounds",
            "eval_n",
            "micro_batch",
            "gen_batch",
            "max_steps",
        ):
            v = getattr(self, name)
            _require(isinstance(v, int) and v >= 1, f"StudySettings.{name} must be an integer >= 1, got {v!r}")
        _require(
            self.group_size >= 2,
            f"StudySettings.group_size must be >= 2 (a group of one has no variance), got {self.group_size}",
        )
        for name in ("mid_eval_tokens", "mid_eval_problems", "ckpt_every"):
            v = getattr(self, name)
            _require(isinstance(v, int) and v >= 0, f"StudySettings.{name} must be an integer >= 0, got {v!r}")
        _require(
            self.temperature > 0 and self.eval_temperature > 0,
            f"StudySettings.temperature and eval_temperature must be > 0, got {self.temperature}, {self.eval_temperature}",
        )
        _require(self.lr > 0, f"StudySettings.lr must be > 0, got {self.lr}")
        _require(self.grad_clip > 0, f"StudySettings.grad_clip must be > 0, got {self.grad_clip}")
        _require(
            self.dtype in ("by_device", "bf16", "fp32"),
            f"StudySettings.dtype must be by_device, bf16 or fp32, got {self.dtype!r}",
        )
        _require(
            self.engine in ("process", "stacked"),
            f"StudySettings.engine must be process or stacked, got {self.engine!r}",
        )
        _require(
            self.template in TEMPLATES, f"StudySettings.template must be one of {TEMPLATES}, got {self.template!r}"
        )
        _require(
            self.reward in ("arith", "math") or ":" in self.reward,
            f"StudySettings.reward must be arith, math or module:function, got {self.reward!r}",
        )
        typed(ACRConfig, self.acr, "acr", STUDY_NAMES)


@dataclass(frozen=True)
class RunSpec:
    """Everything one run depends on: two runs with equal specs train the same way."""

    method: str
    seed: int
    arm: Arm
    settings: StudySettings
    model: str  # a local HF folder
    train: str  # jsonl: problem, answer, unique_id (level optional)
    heldout: str
    plugins: tuple[str, ...] = ()  # modules (or .py files) imported first: a user's remedy can be an arm

    def __post_init__(self):
        object.__setattr__(self, "plugins", tuple(self.plugins))
        check_loop_arm(self.arm)
        if self.arm.reward == "format":
            try:
                format_reward(self.settings.reward)
            except ValueError as e:
                raise ValueError(f"Arm.reward format: {e}") from None

    def to_json(self) -> str:
        return json.dumps(dataclasses.asdict(self), indent=1, sort_keys=True)

    @classmethod
    def from_json(cls, text: str) -> RunSpec:
        d = json.loads(text)
        load_plugins(d.get("plugins", ()))  # before the Arm is built: its estimator may be the plugin's
        return cls(**{**d, "arm": Arm(**d["arm"]), "settings": StudySettings(**d["settings"])})

    def settings_record(self) -> dict:
        """Everything a run depends on except its arm and seed, each part by what it computes (weights,
        vocabulary, rendered prompts; ``study/fingerprint.py``): two runs pair only when these are equal
        (:func:`settings_hash`)."""
        s = dataclasses.asdict(self.settings)
        for name in PERFORMANCE_ONLY:  # they change how fast, not what is computed
            s.pop(name)
        record = {
            "settings": s,
            "semantics": LOOP_SEMANTICS,
            "model": model_fingerprint(self.model),
            "tokenizer": tokenizer_fingerprint(self.model),
            "prompts": prompts_fingerprint(self.model, self.settings.template, self.train, self.heldout),
            "train": file_sha256(self.train),
            "heldout": file_sha256(self.heldout),
            "plugins": list(self.plugins),
            "versions": versions(),
            "device_kind": device_kind(device_name(device_and_dtype(self.settings)[0])),
        }
        source = reward_source(self.settings.reward)
        if source is not None:  # a user's reward, by its source: an edited function under one name never pairs
            record["reward_source"] = source
        return record


# What a run computes, bumped by hand whenever the loop's meaning changes (a fix of the loop or of a remedy,
# another loss or sampling), so runs of the old meaning never pair with new ones; a docstring or a refactor
# that computes the same does not bump it. The code's hash is recorded beside, as information.
LOOP_SEMANTICS = 1

# StudySettings fields that change the speed or memory of a run, not its semantics (a micro-batch changes
# the floating-point rounding of a gradient sum, no more): left out of the pairing hash
PERFORMANCE_ONLY = ("micro_batch", "gen_batch", "ckpt_every")


def code_commit() -> str:
    """The git commit of the checkout the run came from (``AVSPO_COMMIT`` where the copy has no .git)."""
    if os.environ.get("AVSPO_COMMIT"):
        return os.environ["AVSPO_COMMIT"]
    try:
        out = subprocess.run(
            ["git", "rev-parse", "HEAD"],
            cwd=Path(__file__).resolve().parent,
            capture_output=True,
            text=True,
            timeout=10,
        )
        return out.stdout.strip() if out.returncode == 0 else "unknown"
    except (OSError, subprocess.SubprocessError):
        return "unknown"


def device_and_dtype(settings: StudySettings) -> tuple[torch.device, torch.dtype]:
    """Where the run computes and its autocast precision: CUDA with bf16, the CPU with fp32 (``auto``)."""
    dev = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    if settings.dtype == "by_device":
        return dev, torch.bfloat16 if dev.type == "cuda" else torch.float32
    return dev, torch.bfloat16 if settings.dtype == "bf16" else torch.float32


def device_name(dev: torch.device) -> str:
    """What a measured number names as its hardware: the GPU's name, or the CPU's model and cores."""
    if dev.type == "cuda":
        return torch.cuda.get_device_name(dev)
    from avspo_openrlhf.cpu.dtype import cpu_kind

    return cpu_kind()
