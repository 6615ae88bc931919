"""One run of a remedies study on one device (a GPU, or the CPU for tests), without Ray, vLLM or
DeepSpeed: plain torch + transformers, so many runs share one GPU in separate processes
(``study/scheduler.py``) and a bare GPU machine needs nothing beyond what it has.

One step, nanochat's ``chat_rl.py`` shape::

    prompts  <- the training pool, a seeded permutation per epoch (GRESO: some skipped before rollout)
    complete <- G sampled completions per prompt, batched (bf16 autocast on CUDA, fp32 on the CPU)
    reward   <- the task's verifier (or, for the random-reward control, a coin that ignores it)
    DAPO-DS  <- collapsed groups dropped and refilled from new prompts; the refill's tokens count
    adv      <- CollapseController.step: ACR, the gate, the chosen estimator's advantages
    loss     <- - mean over completion tokens of A * log pi (RL-ZVP adds its token advantages,
                from the same forward's entropies); one AdamW step
    stop     <- when the generated tokens reach the budget: every arm pays the same generation

Simplifications, the same for every arm: one optimizer step per rollout batch (on-policy, so the
PPO ratio is 1 and there is nothing to clip, no old-log-prob pass), no KL term and no reference
model, constant learning rate, gradient norm clipped at 1. The held-out evaluation samples
``eval_n`` completions per problem at ``eval_temperature`` under its own seed, outside the training
random stream, so evaluating mid-run does not change what the run trains on.

Resumable: a checkpoint (weights, AdamW moments, controller, GRESO, sampler position and every
random state) is written atomically every ``ckpt_every`` steps; a killed run started again on the
same folder continues exactly (on the CPU, bit for bit). ``result.json`` is written once, at the end.

    python -m avspo_openrlhf.study.loop SPEC.json RUN_DIR     # SPEC: RunSpec.to_json()
"""

from __future__ import annotations

import argparse
import dataclasses
import importlib
import json
import os
import random
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import torch

from avspo_openrlhf.algo import (
    ESTIMATORS,
    ACRConfig,
    CollapseController,
    GRESOConfig,
    GRESOSelector,
    collapse_stats,
    zero_variance_sign,
)
from avspo_openrlhf.data.io import DataError, iter_raw
from avspo_openrlhf.data.tasks import TEMPLATES, make_prompt
from avspo_openrlhf.folder_lock import lock_folder

REWARD_CONTROLS = ("task", "random")  # an arm trains on the task's reward, or on a coin that ignores it


def _require(ok: bool, message: str) -> None:
    if not ok:
        raise ValueError(message)


def _build(cls, options: dict, where: str):
    """``cls(**options)``, a wrong key named with ``where`` (the study's field) instead of a TypeError."""
    names = {f.name for f in dataclasses.fields(cls)}
    unknown = sorted(set(options) - names)
    _require(not unknown, f"{where}: unknown option(s) {unknown} for {cls.__name__}; known: {sorted(names)}")
    try:
        cfg = cls(**options)
    except (TypeError, ValueError) as e:
        raise ValueError(f"{where}: {e}") from None
    if hasattr(cfg, "check"):
        try:
            cfg.check()
        except ValueError as e:
            raise ValueError(f"{where}: {e}") from None
    return cfg


@dataclass(frozen=True)
class Arm:
    """What one method of a study changes; everything else is the study's :class:`Settings`.

    estimator: a registered advantage estimator (``algo.ESTIMATORS``: grpo, avspo, sign, rl_zvp, ...).
    options: that estimator's config fields (``{"strategy": "opposite"}`` for AVSPO, ...).
    dynamic: DAPO dynamic sampling: collapsed groups are dropped and refilled from new prompts.
    greso: GRESO's config fields (``{}`` for its defaults): prompts skipped before rollout; None: off.
    reward: ``task`` (the verifier) or ``random`` (a fair coin per completion: the control that says
        how much of a gain needs no correctness at all).
    """

    estimator: str = "grpo"
    options: dict = field(default_factory=dict)
    dynamic: bool = False
    greso: dict | None = None
    reward: str = "task"

    def __post_init__(self):
        _require(self.estimator in ESTIMATORS, f"Arm.estimator: {self.estimator!r} is not a registered estimator; "
                 f"known: {sorted(ESTIMATORS)}")  # fmt: skip
        _require(self.reward in REWARD_CONTROLS, f"Arm.reward must be one of {REWARD_CONTROLS}, got {self.reward!r}")
        self.estimator_config()  # refuses a wrong option now, not at the run's first step
        if self.greso is not None:
            _require(float(self.greso.get("audit", 0.0)) == 0.0,
                     "Arm.greso.audit: the study loop does not roll out audits (their tokens would be charged to "
                     "the budget); use 0")  # fmt: skip
            _build(GRESOConfig, self.greso, "Arm.greso")

    def estimator_config(self):
        cls = ESTIMATORS[self.estimator].config
        if cls is None:
            _require(not self.options, f"Arm.options: estimator {self.estimator!r} takes no options")
            return None
        return _build(cls, self.options, f"Arm.options ({self.estimator})")


@dataclass(frozen=True)
class Settings:
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
    mid_eval_every: int = 0  # steps between mid-run evaluations (0: none)
    mid_eval_problems: int = 200  # the first this many held-out problems, at n = 2
    final_eval: bool = True  # False: train only (the throughput measurement)
    ckpt_every: int = 10  # steps between checkpoints (0: none)
    micro_batch: int = 16  # sequences per forward/backward (activations, not the logits, bound the memory)
    gen_batch: int = 512  # sequences per generate call (rollouts and evaluation)
    grad_clip: float = 1.0
    dtype: str = "auto"  # auto: bf16 autocast on CUDA, fp32 on the CPU; or bf16 / fp32
    max_steps: int = 10_000  # a budget that is never reached (empty completions) stops here

    def __post_init__(self):
        for name in ("group_size", "prompts_per_step", "max_new_tokens", "token_budget", "dynamic_max_rounds",
                     "eval_n", "micro_batch", "gen_batch", "max_steps"):  # fmt: skip
            v = getattr(self, name)
            _require(isinstance(v, int) and v >= 1, f"Settings.{name} must be an integer >= 1, got {v!r}")
        _require(self.group_size >= 2, f"Settings.group_size must be >= 2 (a group of one has no variance), "
                 f"got {self.group_size}")  # fmt: skip
        for name in ("mid_eval_every", "mid_eval_problems", "ckpt_every"):
            v = getattr(self, name)
            _require(isinstance(v, int) and v >= 0, f"Settings.{name} must be an integer >= 0, got {v!r}")
        _require(self.temperature > 0 and self.eval_temperature > 0, "Settings.temperature and eval_temperature "
                 f"must be > 0, got {self.temperature}, {self.eval_temperature}")  # fmt: skip
        _require(self.lr > 0, f"Settings.lr must be > 0, got {self.lr}")
        _require(self.grad_clip > 0, f"Settings.grad_clip must be > 0, got {self.grad_clip}")
        _require(
            self.dtype in ("auto", "bf16", "fp32"), f"Settings.dtype must be auto, bf16 or fp32, got {self.dtype!r}"
        )
        _require(self.template in TEMPLATES, f"Settings.template must be one of {TEMPLATES}, got {self.template!r}")
        _require(self.reward in ("arith", "math") or ":" in self.reward,
                 f"Settings.reward must be arith, math or module:function, got {self.reward!r}")  # fmt: skip
        _build(ACRConfig, self.acr, "Settings.acr")


@dataclass(frozen=True)
class RunSpec:
    """Everything one run depends on: two runs with equal specs train the same way."""

    method: str
    seed: int
    arm: Arm
    settings: Settings
    model: str  # a local HF folder
    train: str  # jsonl: problem, answer, unique_id (level optional)
    heldout: str

    def to_json(self) -> str:
        return json.dumps(dataclasses.asdict(self), indent=1, sort_keys=True)

    @classmethod
    def from_json(cls, text: str) -> RunSpec:
        d = json.loads(text)
        return cls(**{**d, "arm": Arm(**d["arm"]), "settings": Settings(**d["settings"])})


# ── rewards ──


def reward_function(name: str) -> Callable[[list[str], list[str]], list[float]]:
    """``(completions, answers) -> rewards`` in [0, 1] for the task: ``arith`` (integer answers,
    ``rewards.arith_reward``), ``math`` (math-verify in a pool of processes with a per-sample timeout),
    or ``module:function`` taking one completion and its answer."""
    if name == "arith":
        from avspo_openrlhf.rewards.arith_reward import score_arith

        return lambda texts, golds: [float(score_arith(t, g) == "correct") for t, g in zip(texts, golds)]
    if name == "math":
        from avspo_openrlhf.rewards.pool import VerifierPool

        pool = VerifierPool()
        return lambda texts, golds: [float(r.status == "correct") for r in pool.score(texts, golds)]
    module, _, fn = name.partition(":")
    one = getattr(importlib.import_module(module), fn)
    return lambda texts, golds: [float(one(t, g)) for t, g in zip(texts, golds)]


# ── model ──


def device_and_dtype(settings: Settings) -> tuple[torch.device, torch.dtype]:
    """Where the run computes and its autocast precision: CUDA with bf16, the CPU with fp32 (``auto``)."""
    dev = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    if settings.dtype == "auto":
        return dev, torch.bfloat16 if dev.type == "cuda" else torch.float32
    return dev, torch.bfloat16 if settings.dtype == "bf16" else torch.float32


def device_name(dev: torch.device) -> str:
    """What a measured number names as its hardware: the GPU's name, or the CPU's model and cores."""
    if dev.type == "cuda":
        return torch.cuda.get_device_name(dev)
    from avspo_openrlhf.cpu.dtype import cpu_kind

    return cpu_kind()


def load_policy(model: str, device: torch.device):
    """Weights in fp32 (the optimizer's master copy; compute precision comes from autocast)."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    tok = AutoTokenizer.from_pretrained(model, padding_side="left")
    tok.pad_token = tok.pad_token or tok.eos_token
    policy = AutoModelForCausalLM.from_pretrained(model, dtype=torch.float32).to(device)
    eos = policy.generation_config.eos_token_id
    eos_ids = sorted({*(eos if isinstance(eos, list) else [eos] if eos is not None else []), tok.eos_token_id})
    return policy, tok, torch.tensor(eos_ids, device=device)


def completion_mask(comp: torch.Tensor, eos_ids: torch.Tensor) -> torch.Tensor:
    """``[B, T]`` 1 for the completion's tokens up to and including its first EOS, 0 after it."""
    is_eos = torch.isin(comp, eos_ids).long()
    return ((is_eos.cumsum(-1) - is_eos) == 0).long()


@dataclass
class Rollout:
    """Completions of ``P`` prompts, ``n`` each; row ``i * n + j`` is completion ``j`` of prompt ``i``."""

    ids: torch.Tensor  # [P*n, L + T] left-padded prompt, then the completion
    attn: torch.Tensor  # [P*n, L + T]
    mask: torch.Tensor  # [P*n, T] completion tokens (up to the first EOS)
    texts: list[str]

    @property
    def tokens(self) -> int:
        return int(self.mask.sum())


class Policy:
    """The model, its tokenizer and how this run computes with it."""

    def __init__(self, model: str, settings: Settings):
        self.device, self.dtype = device_and_dtype(settings)
        self.model, self.tok, self.eos_ids = load_policy(model, self.device)
        self.template = settings.template

    def autocast(self):
        return torch.autocast(self.device.type, dtype=self.dtype, enabled=self.dtype != torch.float32)

    @torch.no_grad()
    def generate(self, problems: list[str], n: int, max_new_tokens: int, temperature: float, batch: int) -> Rollout:
        """``n`` sampled completions of each problem, ``batch`` sequences per ``generate`` call."""
        tok = self.tok
        chats = [p if isinstance(p, str) else tok.apply_chat_template(p, tokenize=False, add_generation_prompt=True)
                 for p in (make_prompt(q, self.template) for q in problems)]  # fmt: skip
        per_call = max(1, batch // n)
        parts = []
        self.model.eval()
        for i in range(0, len(chats), per_call):
            enc = tok(chats[i : i + per_call], return_tensors="pt", padding=True).to(self.device)
            with self.autocast():
                out = self.model.generate(**enc, do_sample=True, temperature=temperature, top_p=1.0, top_k=0,
                                          max_new_tokens=max_new_tokens, num_return_sequences=n,
                                          pad_token_id=tok.pad_token_id)  # fmt: skip
            plen = enc["input_ids"].shape[1]
            comp = out[:, plen:]
            mask = completion_mask(comp, self.eos_ids)
            attn = torch.cat([enc["attention_mask"].repeat_interleave(n, 0), mask], 1)
            parts.append((out, attn, mask))
        width_p = max(p[0].shape[1] - p[2].shape[1] for p in parts)
        width_c = max(p[2].shape[1] for p in parts)

        def pad(t: torch.Tensor, plen: int, value: int) -> torch.Tensor:  # prompts left, completions right
            left, right = width_p - plen, width_c - (t.shape[1] - plen)
            return torch.nn.functional.pad(t, (left, right), value=value)

        ids = torch.cat([pad(o, o.shape[1] - m.shape[1], tok.pad_token_id) for o, _, m in parts])
        attn = torch.cat([pad(a, a.shape[1] - m.shape[1], 0) for _, a, m in parts])
        mask = torch.cat([torch.nn.functional.pad(m, (0, width_c - m.shape[1])) for _, _, m in parts])
        texts = tok.batch_decode(ids[:, width_p:] * mask + tok.pad_token_id * (1 - mask), skip_special_tokens=True)
        return Rollout(ids, attn, mask, texts)

    def logprobs_entropy(self, ids: torch.Tensor, attn: torch.Tensor, width_c: int, entropy: bool):
        """Log-probs ``[B, T]`` of the completion tokens (with grad) and, when asked, their entropies
        (no grad); logits only at the completion's positions."""
        pos = (attn.cumsum(-1) - 1).clamp_min(0)
        with self.autocast():
            logits = self.model(input_ids=ids, attention_mask=attn, position_ids=pos,
                                logits_to_keep=width_c + 1).logits[:, :-1].float()  # fmt: skip
        # log pi = logit - logsumexp: one [B, T, V] tensor kept for backward, not a second log-softmax
        lse = torch.logsumexp(logits, -1)
        lp = logits.gather(-1, ids[:, -width_c:, None]).squeeze(-1) - lse
        ent = None
        if entropy:
            with torch.no_grad():  # H = logsumexp - E_p[logit]
                ent = lse - (torch.softmax(logits, -1) * logits).sum(-1)
        return lp, ent


# ── the run's state ──


class PromptStream:
    """The training pool in a seeded permutation per epoch; its position is the whole state."""

    def __init__(self, size: int, seed: int):
        self.size, self.seed, self.epoch, self.pos = size, seed, 0, 0
        self._order = self._perm()

    def _perm(self) -> list[int]:
        g = torch.Generator().manual_seed(self.seed * 1_000_003 + self.epoch)
        return torch.randperm(self.size, generator=g).tolist()

    def take(self, k: int) -> list[int]:
        out = []
        while len(out) < k:
            if self.pos == self.size:
                self.epoch, self.pos = self.epoch + 1, 0
                self._order = self._perm()
            n = min(k - len(out), self.size - self.pos)
            out += self._order[self.pos : self.pos + n]
            self.pos += n
        return out

    def state_dict(self) -> dict:
        return {"epoch": self.epoch, "pos": self.pos}

    def load_state_dict(self, s: dict) -> None:
        self.epoch, self.pos = int(s["epoch"]), int(s["pos"])
        self._order = self._perm()


def _rng_state(device: torch.device) -> dict:
    return {"torch": torch.get_rng_state(), "cuda": torch.cuda.get_rng_state_all() if device.type == "cuda" else None,
            "python": random.getstate()}  # fmt: skip


def _set_rng_state(s: dict, device: torch.device) -> None:
    torch.set_rng_state(s["torch"])
    if device.type == "cuda" and s["cuda"] is not None:
        torch.cuda.set_rng_state_all(s["cuda"])
    random.setstate(s["python"])


def atomic_write(path: Path, text: str) -> None:
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(text, encoding="utf-8")
    os.replace(tmp, path)


def read_rows(path: str) -> list[dict]:
    """A jsonl of problems: each row needs ``problem`` and ``answer``; a bad row names file and line."""
    rows = []
    for i, row in iter_raw(path):
        if isinstance(row, Exception):
            raise DataError(f"{path}:{i}: {row}")
        if not isinstance(row, dict) or "problem" not in row or "answer" not in row:
            raise DataError(f"{path}:{i}: a row needs 'problem' and 'answer'")
        row.setdefault("unique_id", f"{Path(path).stem}/{len(rows)}")
        rows.append(row)
    if not rows:
        raise DataError(f"{path}: no problems")
    return rows


def tensorboard_writer(folder: Path):
    """A TensorBoard writer (x axis: generated tokens, the study's budget unit), or None where
    tensorboard is not installed (a bare GPU machine: metrics.jsonl has the same numbers)."""
    try:
        from torch.utils.tensorboard import SummaryWriter
    except ImportError:
        return None
    return SummaryWriter(str(folder))


# ── evaluation ──


def evaluate(policy: Policy, rows: list[dict], n: int, s: Settings, score, seed: int) -> dict[str, float]:
    """Per-problem accuracy over ``n`` samples (``unique_id -> correct / n``), under its own seed and
    outside the training random stream."""
    devices = [policy.device] if policy.device.type == "cuda" else []
    with torch.random.fork_rng(devices=devices):
        torch.manual_seed(seed)
        ro = policy.generate([r["problem"] for r in rows], n, s.max_new_tokens, s.eval_temperature, s.gen_batch)
    correct = torch.tensor(score(ro.texts, [str(r["answer"]) for r in rows for _ in range(n)])).view(len(rows), n)
    return {r["unique_id"]: float(c) for r, c in zip(rows, correct.mean(1).tolist())}


# ── one run ──


class Run:
    """One (method, seed) run: :meth:`train` to the budget, then the held-out evaluation."""

    def __init__(self, spec: RunSpec, run_dir: Path):
        self.spec, self.dir, s = spec, Path(run_dir), spec.settings
        lock_folder(
            str(self.dir), "study run"
        )  # a second process on this run (an orphan of a killed scheduler) fails at once
        self._check_spec()
        self.train_rows, self.heldout_rows = read_rows(spec.train), read_rows(spec.heldout)
        random.seed(spec.seed)
        torch.manual_seed(spec.seed)
        self.policy = Policy(spec.model, s)
        self.score = reward_function(s.reward)
        self.optimizer = torch.optim.AdamW(self.policy.model.parameters(), lr=s.lr, betas=(0.9, 0.95),
                                           weight_decay=0.0)  # fmt: skip
        arm = spec.arm
        self.controller = CollapseController(arm.estimator, arm.estimator_config(), acr=ACRConfig(**s.acr),
                                             seed=spec.seed)  # fmt: skip
        self.greso = None
        if arm.greso is not None:
            self.greso = GRESOSelector(GRESOConfig(**arm.greso), acr=self.controller.acr, seed=spec.seed)
        self.coin = torch.Generator().manual_seed(spec.seed + 7_919)  # the random-reward control's draws
        self.stream = PromptStream(len(self.train_rows), spec.seed)
        self.state = {"step": 0, "tokens": 0, "groups_generated": 0, "groups_trained": 0, "groups_accepted": 0,
                      "skipped_updates": 0, "train_s": 0.0, "curve": [], "mid_evals": [], "resumed": 0}  # fmt: skip
        self._resume()

    # ── checkpoints ──

    def _check_spec(self) -> None:
        path = self.dir / "spec.json"
        text = self.spec.to_json()
        if path.exists() and path.read_text(encoding="utf-8") != text:
            raise ValueError(f"{self.dir} holds a run of another spec ({path}); use another folder or delete it")
        atomic_write(path, text)

    def _resume(self) -> None:
        path = self.dir / "ckpt.pt"
        if not path.exists():
            return
        ck = torch.load(path, map_location="cpu", weights_only=False)
        self.policy.model.load_state_dict(ck["model"])
        self.optimizer.load_state_dict(ck["optimizer"])
        self.controller.load_state_dict(ck["controller"])
        if self.greso is not None:
            self.greso.load_state_dict(ck["greso"])
        self.coin.set_state(ck["coin"])
        self.stream.load_state_dict(ck["stream"])
        self.state = {**ck["state"], "resumed": ck["state"]["resumed"] + 1}
        _set_rng_state(ck["rng"], self.policy.device)

    def _checkpoint(self) -> None:
        ck = {"model": self.policy.model.state_dict(), "optimizer": self.optimizer.state_dict(),
              "controller": self.controller.state_dict(), "greso": self.greso.state_dict() if self.greso else None,
              "coin": self.coin.get_state(), "stream": self.stream.state_dict(), "state": self.state,
              "rng": _rng_state(self.policy.device)}  # fmt: skip
        tmp = self.dir / "ckpt.pt.tmp"
        torch.save(ck, tmp)
        os.replace(tmp, self.dir / "ckpt.pt")  # a kill mid-write leaves the previous checkpoint whole

    # ── one step ──

    def _prompts(self, k: int) -> list[int]:
        """``k`` prompts from the stream; GRESO skips some before rollout (they cost no generation)."""
        if self.greso is None:
            return self.stream.take(k)
        kept: list[int] = []
        for _ in range(100):  # p ** z has a floor (min_keep): this ends long before, in practice
            cand = self.stream.take(k)
            skip, _ = self.greso.select([self.train_rows[i]["problem"] for i in cand])
            kept += [i for i, s in zip(cand, skip.tolist()) if not s][: k - len(kept)]
            if len(kept) == k:
                break
        return kept or cand[:1]

    def _rewards(self, ro: Rollout, idx: list[int]) -> tuple[torch.Tensor, torch.Tensor]:
        """``(trained, task)`` rewards ``[P, G]``: the task's verdicts, or the control's coin."""
        G = self.spec.settings.group_size
        golds = [str(self.train_rows[i]["answer"]) for i in idx for _ in range(G)]
        task = torch.tensor(self.score(ro.texts, golds), dtype=torch.float32).view(len(idx), G)
        if self.spec.arm.reward == "random":
            return torch.bernoulli(torch.full_like(task, 0.5), generator=self.coin), task
        return task, task

    def _rollout(self) -> tuple[Rollout, list[int], torch.Tensor, torch.Tensor, int, int]:
        """Generate, score and (DAPO-DS) filter/refill: the groups to train on, their rewards, the
        generated tokens and groups."""
        s, arm = self.spec.settings, self.spec.arm
        P, G = s.prompts_per_step, s.group_size
        parts, tokens, groups = [], 0, 0
        for _ in range(s.dynamic_max_rounds if arm.dynamic else 1):
            idx = self._prompts(P)
            ro = self.policy.generate([self.train_rows[i]["problem"] for i in idx], G, s.max_new_tokens,
                                      s.temperature, s.gen_batch)  # fmt: skip
            rewards, task = self._rewards(ro, idx)
            tokens, groups = tokens + ro.tokens, groups + len(idx)
            if self.greso is not None:
                self.greso.observe([self.train_rows[i]["problem"] for i in idx], rewards)
            keep = torch.ones(len(idx), dtype=torch.bool)
            if arm.dynamic:
                acr = self.controller.acr
                keep = ~collapse_stats(rewards, acr.tol, tuple(acr.reward_range)).collapsed
            parts.append((ro, idx, rewards, task, keep))
            if sum(int(p[4].sum()) for p in parts) >= P:
                break
        # the trained groups: the kept ones, in generation order, at most P (DAPO drops the surplus)
        kept, room = [], P
        for ro, idx, rewards, task, keep in parts:  # at most dynamic_max_rounds parts
            g = torch.nonzero(keep).flatten()[:room]
            room -= len(g)
            if len(g):
                rows = (g[:, None] * G + torch.arange(G)).flatten()  # the groups' completions
                kept.append((ro, rows, [idx[i] for i in g.tolist()], rewards[g], task[g]))
        if not kept:
            return None, [], torch.zeros(0, G), torch.zeros(0, G), tokens, groups
        width_p = max(ro.ids.shape[1] - ro.mask.shape[1] for ro, *_ in kept)
        width_c = max(ro.mask.shape[1] for ro, *_ in kept)

        def fit(t: torch.Tensor, prompt_width: int, value: int) -> torch.Tensor:
            """Rows of one part padded to the widths of all: prompts on the left, completions on the right."""
            return torch.nn.functional.pad(
                t, (width_p - prompt_width, width_c - (t.shape[1] - prompt_width)), value=value
            )

        pad_id = self.policy.tok.pad_token_id
        merged = Rollout(
            torch.cat([fit(ro.ids[r.to(ro.ids.device)], ro.ids.shape[1] - ro.mask.shape[1], pad_id) for ro, r, *_ in kept]),
            torch.cat([fit(ro.attn[r.to(ro.ids.device)], ro.ids.shape[1] - ro.mask.shape[1], 0) for ro, r, *_ in kept]),
            torch.cat([torch.nn.functional.pad(ro.mask[r.to(ro.ids.device)], (0, width_c - ro.mask.shape[1])) for ro, r, *_ in kept]),
            [ro.texts[i] for ro, r, *_ in kept for i in r.tolist()],
        )  # fmt: skip
        idx = [i for k in kept for i in k[2]]
        return merged, idx, torch.cat([k[3] for k in kept]), torch.cat([k[4] for k in kept]), tokens, groups

    def _update(self, ro: Rollout, adv: torch.Tensor, rewards: torch.Tensor) -> dict[str, float]:
        """One AdamW step on - mean over completion tokens of A * log pi (token advantages added for a
        token-level estimator), micro-batched with the whole batch's token count as the divisor."""
        s, ctrl = self.spec.settings, self.controller
        self.policy.model.train()
        width_c = ro.mask.shape[1]
        mask = ro.mask.float()
        total = mask.sum().clamp_min(1.0)
        adv = adv.reshape(-1).to(self.policy.device)
        sign = (zero_variance_sign(rewards, ctrl.tol, ctrl.reward_range).repeat_interleave(s.group_size)
                if ctrl.needs_entropy else None)  # fmt: skip
        loss_sum, ent_sum, tok_adv_sum = 0.0, 0.0, 0.0
        self.optimizer.zero_grad(set_to_none=True)
        for i in range(0, ro.ids.shape[0], s.micro_batch):
            sl = slice(i, i + s.micro_batch)
            lp, ent = self.policy.logprobs_entropy(ro.ids[sl], ro.attn[sl], width_c, True)
            m = mask[sl]
            a = adv[sl, None].expand_as(lp)
            if ctrl.needs_entropy:
                tok_adv = ctrl.token_advantages(ent, m, sign[sl].to(ent.device))
                a = a + tok_adv
                tok_adv_sum += float((tok_adv.abs() * m).sum())
            loss = -(a.detach() * lp * m).sum() / total
            loss.backward()
            loss_sum += float(loss.detach())
            ent_sum += float((ent * m).sum())
        grad_norm = torch.nn.utils.clip_grad_norm_(self.policy.model.parameters(), s.grad_clip)
        if not torch.isfinite(grad_norm):
            raise FloatingPointError(f"non-finite gradient norm at step {self.state['step'] + 1}")
        self.optimizer.step()
        out = {"loss": loss_sum, "entropy": ent_sum / float(total), "grad_norm": float(grad_norm)}
        if ctrl.needs_entropy:
            out["token_adv_abs_mean"] = tok_adv_sum / float(total)
        return out

    def step(self) -> dict:
        st = self.state
        t0 = time.perf_counter()
        ro, idx, rewards, task, tokens, groups = self._rollout()
        st["tokens"] += tokens
        st["groups_generated"] += groups
        row = {"step": st["step"] + 1, "tokens": st["tokens"], "step_tokens": tokens, "groups_generated": groups,
               "groups_trained": len(idx)}  # fmt: skip
        if ro is None:  # DAPO-DS found no mixed group in its rounds: nothing to train on this step
            st["skipped_updates"] += 1
            row.update(reward=float("nan"), task_reward=float("nan"), acr=float("nan"), acr_effective=float("nan"))
        else:
            adv, metrics = self.controller.step(rewards)
            accepted = round((1.0 - metrics["acr_effective"]) * len(idx))
            st["groups_trained"] += len(idx)
            st["groups_accepted"] += accepted
            row.update(reward=float(rewards.mean()), task_reward=float(task.mean()), acr=metrics["acr"],
                       acr_all_wrong=metrics["acr_all_wrong"], acr_all_right=metrics["acr_all_right"],
                       acr_effective=metrics["acr_effective"], gate_open=metrics.get("gate_open", 0.0),
                       groups_accepted=accepted, **self._update(ro, adv, rewards))  # fmt: skip
        st["step"] += 1
        st["train_s"] += time.perf_counter() - t0
        row["wall_s"] = st["train_s"]
        st["curve"].append(row)
        return row

    def _mid_eval(self) -> None:
        """Held-out pass@1 on the first ``mid_eval_problems`` problems at n = 2: the accuracy curve
        against generated tokens and the tokens to reach a target."""
        s, st = self.spec.settings, self.state
        per = evaluate(self.policy, self.heldout_rows[: s.mid_eval_problems], 2, s, self.score,
                       self.spec.seed + 104_729 + st["step"])  # fmt: skip
        st["mid_evals"].append({"step": st["step"], "tokens": st["tokens"], "pass1": sum(per.values()) / len(per)})

    def train(self, log: Callable[[str], None] = print) -> None:
        s, st = self.spec.settings, self.state
        if s.mid_eval_every and not st["mid_evals"]:
            self._mid_eval()  # the curve's start: the model before training
        # the steps so far, one JSON line each, for watching a run live (TensorBoard too, where installed);
        # rewritten from the checkpoint's curve on resume, so a step after the checkpoint is not there twice
        atomic_write(self.dir / "metrics.jsonl", "".join(json.dumps(c) + "\n" for c in st["curve"]))
        tb = tensorboard_writer(self.dir / "tensorboard")
        while st["tokens"] < s.token_budget and st["step"] < s.max_steps:
            row = self.step()
            with open(self.dir / "metrics.jsonl", "a", encoding="utf-8") as f:
                f.write(json.dumps(row) + "\n")
            if tb is not None:
                for k, v in row.items():
                    if isinstance(v, (int, float)) and k != "step":
                        tb.add_scalar(f"train/{k}", v, global_step=row["tokens"])
            log(f"step {row['step']} tokens {row['tokens']}/{s.token_budget} reward {row['task_reward']:.3f} "
                f"acr {row['acr']:.2f} acr_effective {row['acr_effective']:.2f} {row['wall_s']:.0f}s")  # fmt: skip
            if s.mid_eval_every and st["step"] % s.mid_eval_every == 0:
                self._mid_eval()
            if s.ckpt_every and st["step"] % s.ckpt_every == 0:
                self._checkpoint()
        if tb is not None:
            tb.close()

    def result(self) -> dict:
        """The run's record: what the study's tables and its paired statistics read."""
        s, st = self.spec.settings, self.state
        t0 = time.perf_counter()
        per = evaluate(self.policy, self.heldout_rows, s.eval_n, s, self.score, self.spec.seed + 15_485_863) \
            if s.final_eval else {}  # fmt: skip
        levels: dict[str, list[float]] = {}
        for r in self.heldout_rows:
            if "level" in r and r["unique_id"] in per:
                levels.setdefault(str(r["level"]), []).append(per[r["unique_id"]])
        trained = [c for c in st["curve"] if c["groups_trained"]]

        def avg(key: str) -> float:
            return sum(c[key] for c in trained) / len(trained) if trained else float("nan")

        dev = self.policy.device
        return {
            "method": self.spec.method, "seed": self.spec.seed, "arm": dataclasses.asdict(self.spec.arm),
            "steps": st["step"], "generated_tokens": st["tokens"], "token_budget": s.token_budget,
            "last_step_tokens": st["curve"][-1]["step_tokens"] if st["curve"] else 0,
            "groups_generated": st["groups_generated"], "groups_trained": st["groups_trained"],
            "groups_accepted": st["groups_accepted"], "skipped_updates": st["skipped_updates"],
            "accepted_per_mtok": 1e6 * st["groups_accepted"] / st["tokens"] if st["tokens"] else 0.0,
            "heldout_pass1": sum(per.values()) / len(per) if per else None, "heldout_problems": len(per),
            "heldout_by_level": {k: sum(v) / len(v) for k, v in levels.items()}, "per_problem": per,
            "eval_n": s.eval_n, "acr_raw": avg("acr"), "acr_effective": avg("acr_effective"),
            "acr_all_wrong": avg("acr_all_wrong"), "acr_all_right": avg("acr_all_right"),
            "curve": st["curve"], "mid_evals": st["mid_evals"], "train_s": st["train_s"],
            "eval_s": time.perf_counter() - t0, "resumed": st["resumed"],
            "device": device_name(dev),
            "precision": {"weights": "fp32", "compute": "bf16 autocast" if self.policy.dtype == torch.bfloat16 else "fp32"},
            "torch": torch.__version__,
        }  # fmt: skip


def run(spec: RunSpec, run_dir: Path, log: Callable[[str], None] = print) -> dict:
    """Train ``spec`` in ``run_dir`` to its token budget (resuming a checkpoint there), evaluate, and
    write ``result.json``; a folder that already holds ``result.json`` is returned as it is."""
    run_dir = Path(run_dir)
    if (run_dir / "result.json").exists():
        return json.loads((run_dir / "result.json").read_text(encoding="utf-8"))
    r = Run(spec, run_dir)
    if r.state["step"]:
        log(f"resumed at step {r.state['step']} ({r.state['tokens']} tokens)")
    r.train(log)
    res = r.result()
    atomic_write(run_dir / "result.json", json.dumps(res, indent=1))
    (run_dir / "ckpt.pt").unlink(missing_ok=True)  # the result is final: the weights are not kept
    return res


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("spec", help="a RunSpec as JSON (RunSpec.to_json)")
    p.add_argument("run_dir", help="the run's folder: its checkpoint and result.json (rerun to resume)")
    p.add_argument("--threads", type=int, default=0, help="torch CPU threads (0: torch's default)")
    args = p.parse_args(argv)
    if args.threads:
        torch.set_num_threads(args.threads)
    spec = RunSpec.from_json(Path(args.spec).read_text(encoding="utf-8"))
    res = run(spec, Path(args.run_dir), lambda line: print(f"[{spec.method} seed {spec.seed}] {line}", flush=True))
    pass1 = res["heldout_pass1"]
    print(f"[{spec.method} seed {spec.seed}] done: {res['steps']} steps, {res['generated_tokens']} tokens, "
          f"held-out pass@1 {'-' if pass1 is None else f'{100 * pass1:.1f} %'}", flush=True)  # fmt: skip
    return 0


if __name__ == "__main__":
    sys.exit(main())
