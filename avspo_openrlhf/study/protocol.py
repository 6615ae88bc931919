"""What a run asks of its engine, and what the engine answers: the contract between a study run
(``study/loop.py``'s ``Run``, whose logic is a generator of requests) and the two engines that serve
it (``study/hf_engine.py``'s ``HFEngine``, one run per process; ``study/engine.py``'s
``StackedEngine``, K runs in one process).

- :class:`Generate` → a :class:`Rollout`: ``n`` completions per problem, sampled with the random
  numbers of the request's ``seed`` alone (``stacked.draw_uniforms``), so both engines give the same
  tokens from the same weights whatever else they serve.
- :class:`Update` → a dict of the step's metrics (``loss``, ``entropy``, ``grad_norm``,
  ``update_skipped``; ``token_adv_abs_mean`` for a token-level estimator; ``diagnosis`` when the
  gradient was not finite and the step was skipped): one AdamW step on the objective of
  ``Update``'s docstring.

An engine gives the run ``policy`` (the tokenizer side: encoding, rollouts), ``model_state()``,
``optimizer_state()`` and ``load_states(model, optimizer)`` for its checkpoints (:class:`Engine`).
The process engine answers a request through ``serve`` (the run drives itself: ``Run.drive``); the
stacked engine answers the request generators of K runs itself and gives each run a view
(``engine.RunView``) without ``serve``."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol

import torch


@dataclass
class Rollout:
    """Completions of ``P`` prompts, ``n`` each; row ``i * n + j`` is completion ``j`` of prompt ``i``."""

    ids: torch.Tensor  # [P*n, L + T] left-padded prompt, then the completion
    attn: torch.Tensor  # [P*n, L + T]
    mask: torch.Tensor  # [P*n, T] completion tokens (up to the first EOS)
    texts: list[str]
    truncated: torch.Tensor  # [P*n] bool: no EOS within max_new_tokens

    @property
    def tokens(self) -> int:
        return int(self.mask.sum())


@dataclass
class Generate:
    """Sample ``n`` completions of each problem at ``temperature`` (0: greedy), ``max_new_tokens`` at
    most, with the random numbers of ``seed`` alone (common random numbers: ``stacked.draw_uniforms``,
    the same in both engines), ``batch`` sequences per call."""

    problems: list[str]
    n: int
    max_new_tokens: int
    temperature: float
    seed: int
    batch: int


@dataclass
class Update:
    """One optimizer step on - mean over completion tokens of A * log pi_T (token advantages added
    for a token-level estimator: ``sign`` the rows' zero-variance signs). The engine answers with the
    step's metrics, and ``diagnosis`` when the gradient was not finite (the step then skipped)."""

    ro: Rollout
    adv: torch.Tensor  # [B]
    sign: torch.Tensor | None  # [B]


class Engine(Protocol):
    """What :class:`~avspo_openrlhf.study.loop.Run` calls on its engine."""

    policy: object  # study/hf_engine.Policy (with the model, or the tokenizer side only)

    def serve(self, req: Generate | Update) -> Rollout | dict: ...  # the process engine's

    def model_state(self) -> dict: ...

    def optimizer_state(self) -> dict: ...

    def load_states(self, model: dict, optimizer: dict) -> None: ...
