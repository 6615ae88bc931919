"""One run of a remedies study on one device (a GPU, or the CPU for tests), without Ray, vLLM or
DeepSpeed: plain torch + transformers, so many runs share one GPU in separate processes
(``study/scheduler.py``) and a bare GPU machine needs nothing beyond what it has.

This file is the run (:class:`Run`: its logic, state, checkpoints, evaluation and result). What a run
is (``Arm``, ``StudySettings``, ``RunSpec``) lives in ``study/spec.py``; what it asks of its engine
(``Generate``, ``Update``) in ``study/protocol.py``; the engine of one run per process (``HFEngine``,
``Policy``) in ``study/hf_engine.py``, and the engine of K runs in one process in ``study/engine.py``.

One step, nanochat's ``chat_rl.py`` shape::

    prompts  <- the training pool, a seeded permutation per epoch (GRESO: some skipped before rollout)
    complete <- G sampled completions per prompt, batched (bf16 autocast on CUDA, fp32 on the CPU)
    reward   <- the task's verifier (controls: a coin that ignores it, or 1 for any extractable answer)
    DAPO-DS  <- collapsed groups dropped and refilled from new prompts; the refill's tokens count
                (no refill round starts once the budget is reached)
    adv      <- CollapseController.step: ACR, the gate, the chosen estimator's advantages (the
                random-sign control: a fair coin's +-1 on each collapsed group)
    loss     <- - mean over completion tokens of A * log pi_T, pi_T = softmax(logits / T) at the
                sampling temperature T, so the samples are on-policy (RL-ZVP adds its token
                advantages, from the same forward's entropies); one AdamW step, or none when the
                gradient is not finite (skipped, counted and diagnosed)
    stop     <- when the generated tokens reach the budget: every arm pays the same generation

Common random numbers: each generation round draws from a generator seeded by (seed, step, round),
so two arms with one seed sample with the same random numbers at every step, and the same weights
give the same tokens whatever the arm did before; the mid-run evaluations fall at fixed generated-
token milestones (``mid_eval_tokens``), the same in every arm, each under the milestone's own seed.

Simplifications, the same for every arm: one optimizer step per rollout batch (on-policy, so the
PPO ratio is 1 and there is nothing to clip, no old-log-prob pass), no KL term and no reference
model, constant learning rate, gradient norm clipped at 1. The held-out evaluation samples
``eval_n`` completions per problem at ``eval_temperature`` under its own seed, outside the training
random stream, so evaluating mid-run does not change what the run trains on.

Resumable: a checkpoint (weights, AdamW moments, controller, GRESO, sampler position and every
random state) is taken every ``ckpt_every`` steps, a snapshot copied to host memory and written
atomically in the background while training goes on (written in the foreground, the K runs of a
stacked batch stalled 30-40 s every 10 steps on an H200); a killed run started again on the same
folder continues exactly (on the CPU, bit for bit). ``result.json`` is written once, at the end.

    python -m avspo_openrlhf.study.loop SPEC.json RUN_DIR     # SPEC: RunSpec.to_json()
"""

from __future__ import annotations

import argparse
import copy
import dataclasses
import json
import os
import random
import sys
import time
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor
from pathlib import Path

import torch

from avspo_openrlhf.algo import (
    GRESOConfig,
    GRESOSelector,
    build_controller,
    collapse_stats,
    zero_variance_sign,
)
from avspo_openrlhf.atomic import atomic_file, atomic_write
from avspo_openrlhf.folder_lock import lock_folder
from avspo_openrlhf.study.controls import format_reward, random_sign_advantages, sampling_seed
from avspo_openrlhf.study.fingerprint import (
    code_fingerprint,
    settings_hash,
)
from avspo_openrlhf.study.hf_engine import HFEngine
from avspo_openrlhf.study.protocol import Generate, Rollout, Update
from avspo_openrlhf.study.spec import NONFINITE_FLAG, STUDY_NAMES, RunSpec, StudySettings, code_commit, device_name
from avspo_openrlhf.study.task import level_of, read_rows, reward_function  # noqa: F401  (reward_function: tests call loop's)

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
    return {
        "torch": torch.get_rng_state(),
        "cuda": torch.cuda.get_rng_state_all() if device.type == "cuda" else None,
        "python": random.getstate(),
    }


def _set_rng_state(s: dict, device: torch.device) -> None:
    torch.set_rng_state(s["torch"])
    if device.type == "cuda" and s["cuda"] is not None:
        torch.cuda.set_rng_state_all(s["cuda"])
    random.setstate(s["python"])


class SpecMismatch(ValueError):
    """A run folder holds a run of another spec: the caller's mistake, not the run's failure."""


def own_error(exc: BaseException) -> bool:
    """Whether an exception is the run's own failure (its logic, its data, its numbers), which a study's
    rule counts (``compare.FAIL_ATTEMPTS``), or the machine's: out of memory, a CUDA or device
    error (sticky: every run of the process meets it), a folder locked by another process, a run folder
    of another spec. Those are not the run's: it resumes when started again."""
    from avspo_openrlhf.folder_lock import FolderBusy

    if isinstance(exc, (MemoryError, torch.OutOfMemoryError, FolderBusy, SpecMismatch)):
        return False
    if isinstance(exc, getattr(torch, "AcceleratorError", ())) or "CUDA error" in str(exc):
        return False
    return isinstance(exc, Exception)


def note_failure(run_dir: Path, error: str) -> dict:
    """Record in ``failure.json`` that the run in ``run_dir`` stopped on an error of its own (a raise in
    its logic or its part of a batched call; not a crash of the process it shared): the launches that
    ended so, and the last error. A study's rule reads it (``compare.FAIL_ATTEMPTS``)."""
    path = Path(run_dir) / "failure.json"
    old = json.loads(path.read_text(encoding="utf-8")) if path.exists() else {"attempts": 0}
    record = {"attempts": int(old["attempts"]) + 1, "error": error.strip().splitlines()[-1][:500], "time": time.time()}
    atomic_write(path, json.dumps(record))
    return record


def snapshot(obj, _copies: dict | None = None):
    """A copy of a checkpoint's contents that training can no longer change: tensors copied to host
    memory (whatever their device; two views of one memory, tied weights, stay one copy), containers
    rebuilt, everything else deep-copied."""
    copies = {} if _copies is None else _copies
    if isinstance(obj, torch.Tensor):
        key = (obj.device, obj.data_ptr(), obj.dtype, tuple(obj.shape), obj.stride())
        if key not in copies:
            copies[key] = obj.detach().to("cpu", copy=True)
        return copies[key]
    if isinstance(obj, dict):
        return {k: snapshot(v, copies) for k, v in obj.items()}
    if isinstance(obj, list):
        return [snapshot(v, copies) for v in obj]
    return copy.deepcopy(obj)


_writer: ThreadPoolExecutor | None = None


def save_in_background(ck: dict, path: Path) -> Future:
    """``torch.save`` of ``ck`` to ``path`` atomically, on this process's one writer thread (writes
    finish in order; the interpreter waits for the last one at exit)."""
    global _writer
    if _writer is None:
        _writer = ThreadPoolExecutor(1, thread_name_prefix="checkpoint")

    def save() -> None:
        with atomic_file(path, "wb") as f:  # a kill mid-write leaves the previous checkpoint whole
            torch.save(ck, f)

    return _writer.submit(save)


def tensorboard_writer(folder: Path):
    """A TensorBoard writer (x axis: generated tokens, the study's budget unit), or None where
    tensorboard is not installed (a bare GPU machine: metrics.jsonl has the same numbers)."""
    try:
        from torch.utils.tensorboard import SummaryWriter
    except ImportError:
        return None
    return SummaryWriter(str(folder))


# ── evaluation ──


def evaluate(rows: list[dict], n: int, s: StudySettings, score, seed: int, temperature: float | None = None):
    """Per-problem accuracy over ``n`` samples (``unique_id -> correct / n``) at ``temperature``
    (default ``eval_temperature``; 0: greedy), under its own seed and outside the training random
    stream (a generator of one :class:`Generate` request)."""
    t = s.eval_temperature if temperature is None else temperature
    ro = yield Generate([r["problem"] for r in rows], n, s.max_new_tokens, t, seed, s.gen_batch)
    correct = torch.tensor(score(ro.texts, [str(r["answer"]) for r in rows for _ in range(n)])).view(len(rows), n)
    return {r["unique_id"]: float(c) for r, c in zip(rows, correct.mean(1).tolist())}


# ── one run ──


class Run:
    """One (method, seed) run: :meth:`train` to the budget, then the held-out evaluation.

    Its logic asks its engine for what needs the model (:class:`Generate`, :class:`Update`): the
    ``*_g`` methods are generators of those requests, so the same run is driven by its own engine
    (:class:`HFEngine`, the default: :meth:`step`, :meth:`train`, :meth:`result`) or, beside K - 1
    others, by the stacked engine (``study/engine.py``), with the same semantics."""

    def __init__(self, spec: RunSpec, run_dir: Path, engine=None):
        self.spec, self.dir, s = spec, Path(run_dir), spec.settings
        lock_folder(
            str(self.dir), "study run"
        )  # a second process on this run (a killed scheduler's orphan) fails at once
        self._check_spec()
        self.train_rows, self.heldout_rows = read_rows(spec.train), read_rows(spec.heldout)
        random.seed(spec.seed)
        torch.manual_seed(spec.seed)
        self.score = reward_function(s.reward)
        self.format_score = format_reward(s.reward) if spec.arm.reward == "format" else None
        arm = spec.arm
        self.lr = arm.lr if arm.lr is not None else s.lr
        self.controller = build_controller(
            arm.estimator, options=arm.options, acr=s.acr, names=STUDY_NAMES, seed=spec.seed
        )
        self.engine = engine if engine is not None else HFEngine(spec, self.controller)
        self.policy = self.engine.policy  # the tokenizer (and, with its own engine, the model)
        self.optimizer = getattr(self.engine, "optimizer", None)
        self.greso = None
        if arm.greso is not None:
            self.greso = GRESOSelector(GRESOConfig(**arm.greso), acr=self.controller.acr, seed=spec.seed)
        self.stream = PromptStream(len(self.train_rows), spec.seed)
        self._ckpt_write: Future | None = None  # the checkpoint being written in the background
        self.state = {
            "step": 0,
            "tokens": 0,
            "groups_generated": 0,
            "groups_collapsed_generated": 0,
            "completions": 0,
            "truncated": 0,
            "groups_trained": 0,
            "groups_signal": 0,
            "update_sequences": 0,  # sequences through the training forward and backward
            "update_tokens": 0,  # their tokens, prompt and completion: the update's cost
            "skipped_updates": 0,
            "nonfinite": [],
            "train_s": 0.0,
            "curve": [],
            "mid_evals": [],
            "resumed": 0,
        }
        self._resume()

    def drive(self, requests):
        """Run a generator of requests to its end with this run's own engine; its return value."""
        try:
            req = next(requests)
            while True:
                req = requests.send(self.engine.serve(req))
        except StopIteration as done:
            return done.value

    # ── checkpoints ──

    def _check_spec(self) -> None:
        path = self.dir / "spec.json"
        text = self.spec.to_json()
        if path.exists() and path.read_text(encoding="utf-8") != text:
            raise SpecMismatch(f"{self.dir} holds a run of another spec ({path}); use another folder or delete it")
        atomic_write(path, text)

    def _resume(self) -> None:
        path = self.dir / "ckpt.pt"
        if not path.exists():
            return
        ck = torch.load(path, map_location="cpu", weights_only=False)
        self.engine.load_states(ck["model"], ck["optimizer"])
        self.controller.load_state_dict(ck["controller"])
        if self.greso is not None:
            self.greso.load_state_dict(ck["greso"])
        self.stream.load_state_dict(ck["stream"])
        self.state = {**ck["state"], "resumed": ck["state"]["resumed"] + 1}
        _set_rng_state(ck["rng"], self.policy.device)

    def _checkpoint(self) -> None:
        """The run's state now, written in the background (:func:`snapshot`: training may change
        it at once); the previous write of this run is finished first."""
        self.wait_checkpoint()
        ck = {
            "model": self.engine.model_state(),
            "optimizer": self.engine.optimizer_state(),
            "controller": self.controller.state_dict(),
            "greso": self.greso.state_dict() if self.greso else None,
            "stream": self.stream.state_dict(),
            "state": self.state,
            "rng": _rng_state(self.policy.device),
        }
        self._ckpt_write = save_in_background(snapshot(ck), self.dir / "ckpt.pt")

    def wait_checkpoint(self) -> None:
        """Until the last checkpoint taken is on disk (a failed write, a full disk, raises here)."""
        pending, self._ckpt_write = self._ckpt_write, None
        if pending is not None:
            pending.result()

    # ── one step ──

    def _generator(self, stream: str, round_: int = 0) -> torch.Generator:
        """A CPU generator for one random stream of this step: a function of (seed, step, round) only."""
        return torch.Generator().manual_seed(sampling_seed(self.spec.seed, self.state["step"], round_, stream))

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

    def _rewards(self, ro: Rollout, idx: list[int], round_: int) -> tuple[torch.Tensor, torch.Tensor]:
        """``(trained, task)`` rewards ``[P, G]``: the task's verdicts, or a control's reward."""
        G = self.spec.settings.group_size
        golds = [str(self.train_rows[i]["answer"]) for i in idx for _ in range(G)]
        task = torch.tensor(self.score(ro.texts, golds), dtype=torch.float32).view(len(idx), G)
        if self.spec.arm.reward == "random":
            return torch.bernoulli(torch.full_like(task, 0.5), generator=self._generator("coin", round_)), task
        if self.spec.arm.reward == "format":
            return torch.tensor(self.format_score(ro.texts), dtype=torch.float32).view(len(idx), G), task
        return task, task

    def _rollout_g(self):
        """Generate, score and (DAPO-DS) filter/refill: the groups to train on, their rewards, and what
        the step generated (tokens, groups, collapsed groups, completions, truncated completions)."""
        s, arm, st = self.spec.settings, self.spec.arm, self.state
        P, G = s.prompts_per_step, s.group_size
        acr = self.controller.acr
        parts = []
        gen = {"tokens": 0, "groups": 0, "collapsed": 0, "completions": 0, "truncated": 0, "rounds": 0}
        for round_ in range(s.dynamic_max_rounds if arm.dynamic else 1):
            if round_ and st["tokens"] + gen["tokens"] >= s.token_budget:
                break  # DAPO-DS starts no refill round past the budget: it overshoots by one round at most
            idx = self._prompts(P)
            # common random numbers: this round's sampling is a function of (seed, step, round) only
            ro = yield Generate(
                [self.train_rows[i]["problem"] for i in idx],
                G,
                s.max_new_tokens,
                s.temperature,
                sampling_seed(self.spec.seed, st["step"], round_),
                s.gen_batch,
            )
            rewards, task = self._rewards(ro, idx, round_)
            collapsed = collapse_stats(rewards, acr.tol, tuple(acr.reward_range)).collapsed
            for k, v in (
                ("tokens", ro.tokens),
                ("groups", len(idx)),
                ("collapsed", int(collapsed.sum())),
                ("completions", len(ro.texts)),
                ("truncated", int(ro.truncated.sum())),
                ("rounds", 1),
            ):
                gen[k] += v
            if self.greso is not None:
                self.greso.observe([self.train_rows[i]["problem"] for i in idx], rewards)
            keep = ~collapsed if arm.dynamic else torch.ones(len(idx), dtype=torch.bool)
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
            return None, [], torch.zeros(0, G), torch.zeros(0, G), gen
        width_p = max(ro.ids.shape[1] - ro.mask.shape[1] for ro, *_ in kept)
        width_c = max(ro.mask.shape[1] for ro, *_ in kept)

        def fit(t: torch.Tensor, prompt_width: int, value: int) -> torch.Tensor:
            """Rows of one part padded to the widths of all: prompts on the left, completions on the right."""
            return torch.nn.functional.pad(
                t, (width_p - prompt_width, width_c - (t.shape[1] - prompt_width)), value=value
            )

        pad_id = self.policy.tok.pad_token_id
        merged = Rollout(
            torch.cat(
                [fit(ro.ids[r.to(ro.ids.device)], ro.ids.shape[1] - ro.mask.shape[1], pad_id) for ro, r, *_ in kept]
            ),
            torch.cat([fit(ro.attn[r.to(ro.ids.device)], ro.ids.shape[1] - ro.mask.shape[1], 0) for ro, r, *_ in kept]),
            torch.cat(
                [
                    torch.nn.functional.pad(ro.mask[r.to(ro.ids.device)], (0, width_c - ro.mask.shape[1]))
                    for ro, r, *_ in kept
                ]
            ),
            [ro.texts[i] for ro, r, *_ in kept for i in r.tolist()],
            torch.cat([ro.truncated[r] for ro, r, *_ in kept]),
        )
        idx = [i for k in kept for i in k[2]]
        return merged, idx, torch.cat([k[3] for k in kept]), torch.cat([k[4] for k in kept]), gen

    def _update_g(self, ro: Rollout, adv: torch.Tensor, rewards: torch.Tensor):
        """One optimizer step through the engine; a skipped one (non-finite gradient) is counted and
        its diagnosis kept, with the batch saved beside the run (``nonfinite_step<N>.pt``) to replay."""
        ctrl, G = self.controller, self.spec.settings.group_size
        sign = (
            zero_variance_sign(rewards, ctrl.tol, ctrl.reward_range).repeat_interleave(G)
            if ctrl.needs_entropy
            else None
        )
        out = yield Update(ro, adv.reshape(-1), sign)
        diag = out.pop("diagnosis", None)
        if diag is not None:
            step = self.state["step"] + 1
            diag = {
                "step": step,
                **diag,
                "completion_tokens": int(ro.mask.sum()),
                "truncated": int(ro.truncated.sum()),
                "max_prompt_padding": int((ro.attn[:, : ro.attn.shape[1] - ro.mask.shape[1]] == 0).sum(1).max()),
            }
            self.state["nonfinite"].append(diag)
            torch.save(
                {
                    "ids": ro.ids.cpu(),
                    "attn": ro.attn.cpu(),
                    "mask": ro.mask.cpu(),
                    "adv": adv.cpu(),
                    "rewards": rewards.cpu(),
                    "diagnosis": diag,
                },
                self.dir / f"nonfinite_step{step}.pt",
            )
        return out

    def step_g(self):
        st, ctrl = self.state, self.controller
        t0 = time.perf_counter()
        ro, idx, rewards, task, gen = yield from self._rollout_g()
        st["tokens"] += gen["tokens"]
        st["groups_generated"] += gen["groups"]
        st["groups_collapsed_generated"] += gen["collapsed"]
        st["completions"] += gen["completions"]
        st["truncated"] += gen["truncated"]
        row = {
            "step": st["step"] + 1,
            "tokens": st["tokens"],
            "step_tokens": gen["tokens"],
            "rounds": gen["rounds"],
            "groups_generated": gen["groups"],
            "acr_generated": gen["collapsed"] / max(1, gen["groups"]),
            "truncation_rate": gen["truncated"] / max(1, gen["completions"]),
            "completion_tokens_mean": gen["tokens"] / max(1, gen["completions"]),
            "groups_trained": len(idx),
        }
        if ro is None:  # DAPO-DS found no mixed group in its rounds: nothing to train on this step
            st["skipped_updates"] += 1
            row.update(
                reward=float("nan"),
                task_reward=float("nan"),
                acr=float("nan"),
                acr_effective=float("nan"),
                groups_signal=0,
                update_skipped=1,
            )
        else:
            adv, metrics = ctrl.step(rewards)
            if self.spec.arm.control == "random_sign":
                collapsed = collapse_stats(rewards, ctrl.tol, ctrl.reward_range).collapsed
                adv = random_sign_advantages(adv, collapsed, self._generator("random_sign"))
                metrics["acr_effective"] = float(((adv == 0).all(1)).float().mean())
            # groups that carry a signal: a non-zero advantage, or (RL-ZVP) token advantages
            signal = (adv != 0).any(1)
            if ctrl.needs_entropy:
                signal |= zero_variance_sign(rewards, ctrl.tol, ctrl.reward_range) != 0
            st["groups_trained"] += len(idx)
            st["groups_signal"] += int(signal.sum())
            st["update_sequences"] += int(ro.ids.shape[0])
            st["update_tokens"] += int(ro.attn.sum())
            update = yield from self._update_g(ro, adv, rewards)
            row.update(
                reward=float(rewards.mean()),
                task_reward=float(task.mean()),
                acr=metrics["acr"],
                acr_all_wrong=metrics["acr_all_wrong"],
                acr_all_right=metrics["acr_all_right"],
                acr_effective=metrics["acr_effective"],
                gate_open=metrics.get("gate_open", 0.0),
                groups_signal=int(signal.sum()),
                **update,
            )
        st["step"] += 1
        st["train_s"] += time.perf_counter() - t0
        row["wall_s"] = st["train_s"]
        st["curve"].append(row)
        return row

    def step(self) -> dict:
        """One step with this run's own engine."""
        return self.drive(self.step_g())

    def milestones(self) -> list[int]:
        """The generated-token milestones of the mid-run evaluations: every ``mid_eval_tokens`` up to
        the budget, the same in every arm (0: before training)."""
        s = self.spec.settings
        return list(range(0, s.token_budget + 1, s.mid_eval_tokens)) if s.mid_eval_tokens else []

    def _mid_eval_g(self):
        """Held-out pass@1 on the first ``mid_eval_problems`` problems at n = 2, at every milestone the
        generated tokens reached since the last one (one evaluation, each milestone's seed its own:
        the same in every arm)."""
        s, st = self.spec.settings, self.state
        done = {e["milestone"] for e in st["mid_evals"]}
        due = [m for m in self.milestones() if m <= st["tokens"] and m not in done]
        if not due:
            return
        rows = self.heldout_rows[: s.mid_eval_problems]
        per = yield from evaluate(rows, 2, s, self.score, self.spec.seed + 104_729 + due[-1])
        pass1 = level_mean(per, rows)
        st["mid_evals"] += [{"milestone": m, "tokens": st["tokens"], "step": st["step"], "pass1": pass1} for m in due]
        # beside the checkpoint: what a run that fails for good is scored by (compare.FAIL_ATTEMPTS)
        atomic_write(self.dir / "mid_evals.json", json.dumps(st["mid_evals"]))

    def train_g(self, log: Callable[[str], None] = print):
        s, st = self.spec.settings, self.state
        yield from self._mid_eval_g()  # milestone 0: the model before training
        # the steps so far, one JSON line each, for watching a run live (TensorBoard too, where installed);
        # rewritten from the checkpoint's curve on resume, so a step after the checkpoint is not there twice
        atomic_write(self.dir / "metrics.jsonl", "".join(json.dumps(c) + "\n" for c in st["curve"]))
        tb = tensorboard_writer(self.dir / "tensorboard")
        try:
            while st["tokens"] < s.token_budget and st["step"] < s.max_steps:
                row = yield from self.step_g()
                with open(self.dir / "metrics.jsonl", "a", encoding="utf-8") as f:
                    f.write(json.dumps(row) + "\n")
                if tb is not None:
                    for k, v in row.items():
                        if isinstance(v, (int, float)) and k != "step":
                            tb.add_scalar(f"train/{k}", v, global_step=row["tokens"])
                skipped = (
                    " (update skipped: non-finite gradient)"
                    if row.get("update_skipped") and row["groups_trained"]
                    else ""
                )
                log(
                    f"step {row['step']} tokens {row['tokens']}/{s.token_budget} reward {row['task_reward']:.3f} "
                    f"acr {row['acr']:.2f} acr_effective {row['acr_effective']:.2f} {row['wall_s']:.0f}s{skipped}"
                )
                yield from self._mid_eval_g()
                if s.ckpt_every and st["step"] % s.ckpt_every == 0:
                    self._checkpoint()
        finally:
            if tb is not None:
                tb.close()
            self.wait_checkpoint()  # training over (or stopped): its last checkpoint is on disk

    def train(self, log: Callable[[str], None] = print) -> None:
        self.drive(self.train_g(log))

    def result_g(self):
        """The run's record: what the study's tables and its paired statistics read."""
        s, st = self.spec.settings, self.state
        t0 = time.perf_counter()
        per = (
            (yield from evaluate(self.heldout_rows, s.eval_n, s, self.score, self.spec.seed + 15_485_863))
            if s.final_eval
            else {}
        )
        greedy = (
            (yield from evaluate(self.heldout_rows, 1, s, self.score, self.spec.seed + 15_485_863, temperature=0.0))
            if s.final_eval and s.greedy_eval
            else {}
        )
        levels: dict[str, list[float]] = {}
        for r in self.heldout_rows:
            if "level" in r and r["unique_id"] in per:
                levels.setdefault(level_of(r), []).append(per[r["unique_id"]])
        trained = [c for c in st["curve"] if c["groups_trained"]]

        def avg(key: str) -> float:
            return sum(c[key] for c in trained) / len(trained) if trained else float("nan")

        dev = self.policy.device
        precision = {"weights": "fp32", "compute": "bf16 autocast" if self.policy.dtype == torch.bfloat16 else "fp32"}
        record = {**self.spec.settings_record(), "precision": precision["compute"]}
        nonfinite = len(st["nonfinite"])
        return {
            "method": self.spec.method,
            "seed": self.spec.seed,
            "arm": dataclasses.asdict(self.spec.arm),
            "settings": record,
            "settings_hash": settings_hash(record),
            "commit": code_commit(),
            "code": code_fingerprint(),  # information: a docstring edit changes it, not the pairing
            "lr": self.lr,
            "steps": st["step"],
            "generated_tokens": st["tokens"],
            "token_budget": s.token_budget,
            "last_step_tokens": st["curve"][-1]["step_tokens"] if st["curve"] else 0,
            "groups_generated": st["groups_generated"],
            "groups_trained": st["groups_trained"],
            "groups_signal": st["groups_signal"],
            "skipped_updates": st["skipped_updates"],
            "signal_groups_per_mtok": 1e6 * st["groups_signal"] / st["tokens"] if st["tokens"] else 0.0,
            "acr_generated": st["groups_collapsed_generated"] / st["groups_generated"]
            if st["groups_generated"]
            else float("nan"),
            "truncation_rate": st["truncated"] / st["completions"] if st["completions"] else float("nan"),
            "completion_tokens_mean": st["tokens"] / st["completions"] if st["completions"] else float("nan"),
            "nonfinite_steps": st["nonfinite"],
            "nonfinite_share": nonfinite / st["step"] if st["step"] else 0.0,
            "flagged": bool(st["step"] and nonfinite / st["step"] > NONFINITE_FLAG),
            "heldout_pass1": level_mean(per, self.heldout_rows) if per else None,
            "heldout_problems": len(per),
            "heldout_by_level": {k: sum(v) / len(v) for k, v in levels.items()},
            "per_problem": per,
            "eval_n": s.eval_n,
            "heldout_greedy_pass1": level_mean(greedy, self.heldout_rows) if greedy else None,
            "per_problem_greedy": greedy,
            "update_sequences": st["update_sequences"],
            "update_tokens": st["update_tokens"],
            "acr_raw": avg("acr"),
            "acr_effective": avg("acr_effective"),
            "acr_all_wrong": avg("acr_all_wrong"),
            "acr_all_right": avg("acr_all_right"),
            "curve": st["curve"],
            "mid_evals": st["mid_evals"],
            "train_s": st["train_s"],
            "eval_s": time.perf_counter() - t0,
            "resumed": st["resumed"],
            "engine": s.engine,
            "device": device_name(dev),
            "precision": precision,
            "torch": torch.__version__,
            # what shared the device with this run: its wall time is an arm's cost only alone or beside its own arm
            "batch": getattr(
                self.engine,
                "batch",
                {"engine": "process", "runs_at_once": int(os.environ.get("AVSPO_RUNS_AT_ONCE", "1")), "methods": None},
            ),
        }

    def result(self) -> dict:
        return self.drive(self.result_g())

    def life_g(self, log: Callable[[str], None] = print):
        """The whole run: train to the budget, evaluate, write ``result.json`` (the checkpoint is then
        deleted: the result is final)."""
        if self.state["step"]:
            log(f"resumed at step {self.state['step']} ({self.state['tokens']} tokens)")
        yield from self.train_g(log)
        res = yield from self.result_g()
        atomic_write(self.dir / "result.json", json.dumps(res, indent=1))
        (self.dir / "ckpt.pt").unlink(missing_ok=True)
        return res


def level_mean(per: dict[str, float], rows: list[dict]) -> float:
    """Held-out pass@1 with each level weighing the same, whatever its count of distinct problems (a
    level with few distinct problems, single-digit products, is not outweighed); the plain mean over
    problems where the rows have no level."""
    levels: dict[str, list[float]] = {}
    for r in rows:
        if r["unique_id"] in per:
            levels.setdefault(level_of(r), []).append(per[r["unique_id"]])
    return sum(sum(v) / len(v) for v in levels.values()) / len(levels) if levels else float("nan")


def run(spec: RunSpec, run_dir: Path, log: Callable[[str], None] = print) -> dict:
    """Train ``spec`` in ``run_dir`` to its token budget (resuming a checkpoint there), evaluate, and
    write ``result.json``; a folder that already holds ``result.json`` is returned as it is."""
    run_dir = Path(run_dir)
    if (run_dir / "result.json").exists():
        return json.loads((run_dir / "result.json").read_text(encoding="utf-8"))
    r = Run(spec, run_dir)
    return r.drive(r.life_g(log))


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("spec", help="a RunSpec as JSON (RunSpec.to_json)")
    p.add_argument("run_dir", help="the run's folder: its checkpoint and result.json (rerun to resume)")
    p.add_argument("--threads", type=int, default=0, help="torch CPU threads (0: torch's default)")
    args = p.parse_args(argv)
    if args.threads:
        torch.set_num_threads(args.threads)
    spec = RunSpec.from_json(Path(args.spec).read_text(encoding="utf-8"))
    try:
        res = run(spec, Path(args.run_dir), lambda line: print(f"[{spec.method} seed {spec.seed}] {line}", flush=True))
    except Exception as e:  # its traceback follows in its log; a kill is no exception
        if own_error(e):  # the run's own, not the machine's (out of memory, a device error, a busy folder)
            note_failure(Path(args.run_dir), f"{type(e).__name__}: {e}")
        raise
    pass1 = res["heldout_pass1"]
    print(
        f"[{spec.method} seed {spec.seed}] done: {res['steps']} steps, {res['generated_tokens']} tokens, "
        f"held-out pass@1 {'-' if pass1 is None else f'{100 * pass1:.1f} %'}",
        flush=True,
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
