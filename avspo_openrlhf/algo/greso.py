"""GRESO (arXiv 2506.02177): skip prompts predicted to collapse before they are rolled out
(docs/algorithm.md#greso).

Each prompt keeps the kind of its latest group (all-right "easy", all-wrong "hard", or mixed) and
``z``, how many of its most recent consecutive rollouts were of that kind. A prompt is skipped with
probability

    P_skip = 1 - max(p ** z, min_keep)          p = p_easy (easy) or p_hard (hard); z = 0: never skipped

A skipped visit records nothing, so z stays frozen while a prompt is skipped (GRESO's code). After
each step's rollouts, p_easy (p_hard) moves by ``delta`` down when the share of all-right (all-wrong)
groups is at or above its target, up otherwise, within ``p_bounds``. An optional audit rolls out a
random fraction of the skipped prompts, not to train on them but to count *false skips* (a skipped
prompt whose group would have been mixed).

Pure torch: prompt keys are strings; the state is tensors indexed by a key -> row map, so the
per-batch math is vectorized; :meth:`GRESOSelector.state_dict` round-trips everything, the random
generator included.
"""

from __future__ import annotations

import hashlib

import torch

from .collapse import collapse_stats
from .options import ACRConfig, GRESOConfig, config_of

MIXED, EASY, HARD = 0, 1, 2


def prompt_key(prompt: str) -> str:
    """A stable, short id of a prompt's text (checkpoints hold keys, not prompts)."""
    return hashlib.blake2b(prompt.encode("utf-8"), digest_size=8).hexdigest()


class GRESOSelector:
    """Pre-rollout skipping from per-prompt reward history.

    Args:
        config: the :class:`GRESOConfig`: ``p_easy``, ``p_hard`` (initial base keep-probabilities, the
            paper's 0.5, 0.5), ``target_easy``, ``target_hard`` (target shares of all-right / all-wrong
            groups among the prompts rolled out in a step, the paper's 1/12, 1/6), ``delta`` (step of
            the p adaptation per training step), ``p_bounds`` (clip range of p), ``min_keep`` (floor
            of the keep probability p ** z), ``audit`` (fraction of skipped prompts rolled out anyway
            to measure false skips) and ``seed`` (the skip and audit draws; ``None``: ``seed``).
        acr: the :class:`ACRConfig` whose ``tol`` and ``reward_range`` give the collapse test.
        seed: seeds the draws when ``config.seed`` is ``None``.
    """

    def __init__(self, config: GRESOConfig | None = None, *, acr: ACRConfig | None = None, seed: int = 0):
        c, acr = config_of(GRESOConfig, config, "config"), config_of(ACRConfig, acr, "acr")
        self.p = {"easy": float(c.p_easy), "hard": float(c.p_hard)}
        self.target = {"easy": float(c.target_easy), "hard": float(c.target_hard)}
        self.delta, self.p_bounds, self.min_keep, self.audit = (
            float(c.delta),
            tuple(c.p_bounds),
            float(c.min_keep),
            float(c.audit),
        )
        self.tol, self.reward_range = float(acr.tol), tuple(acr.reward_range)
        seed = c.seed if c.seed is not None else seed
        self.generator = torch.Generator(device="cpu").manual_seed(int(seed))
        self.index: dict[str, int] = {}
        # the history and the generator live on the CPU whatever torch's default device is
        self.kind = torch.zeros(0, dtype=torch.int8, device="cpu")
        self.z = torch.zeros(0, dtype=torch.int32, device="cpu")
        # audit_tokens: tokens generated for audits, which the token budget of a run does not count
        self.counts = dict(seen=0, skipped=0, kept=0, audited=0, false_skips=0, adapted_steps=0, audit_tokens=0)
        self.revisits = False  # p adapts once some prompt is rolled out a second time (GRESO: epoch >= 1)

    # ── history ──
    def _rows(self, keys: list[str], grow: bool) -> torch.Tensor:
        if grow:
            rows = [self.index.setdefault(k, len(self.index)) for k in keys]
            if len(self.index) > len(self.kind):
                extra = len(self.index) - len(self.kind)
                self.kind = torch.cat([self.kind, torch.zeros(extra, dtype=torch.int8, device="cpu")])
                self.z = torch.cat([self.z, torch.zeros(extra, dtype=torch.int32, device="cpu")])
        else:
            rows = [self.index.get(k, -1) for k in keys]
        return torch.tensor(rows, dtype=torch.long, device="cpu")

    def skip_probability(self, keys: list[str]) -> torch.Tensor:
        """``[M]`` probability that each prompt is skipped now (0 without history)."""
        rows = self._rows(keys, grow=False)
        if not self.index:
            return torch.zeros(len(keys), dtype=torch.float64, device="cpu")
        known = rows >= 0
        kind = torch.where(known, self.kind[rows.clamp_min(0)], MIXED)
        z = torch.where(known, self.z[rows.clamp_min(0)], 0).double()
        p = torch.where(kind == EASY, self.p["easy"], self.p["hard"]).double()
        keep = (p**z).clamp_min(self.min_keep)
        return torch.where((kind == MIXED) | (z == 0), 0.0, 1.0 - keep)

    def select(self, keys: list[str]) -> tuple[torch.Tensor, torch.Tensor]:
        """Draw this visit's decisions: ``(skip [M] bool, audit [M] bool)``; audited prompts are a
        subset of the skipped ones (rolled out for measurement only)."""
        prob = self.skip_probability(keys)
        u = torch.rand(len(keys), generator=self.generator, dtype=torch.float64, device="cpu")
        a = torch.rand(len(keys), generator=self.generator, dtype=torch.float64, device="cpu")
        skip = u < prob
        audit = skip & (a < self.audit)
        n_skip = int(skip.sum())
        self.counts["skipped"] += n_skip
        self.counts["kept"] += len(keys) - n_skip
        self.counts["audited"] += int(audit.sum())
        return skip, audit

    def observe(self, keys: list[str], rewards: torch.Tensor) -> dict[str, float]:
        """Record the groups rolled out for training (``rewards`` ``[M, G]``, one row per key, filtered
        groups included) and adapt p_easy / p_hard toward their targets. Returns the step's metrics."""
        if len(keys) != rewards.shape[0]:
            raise ValueError(f"{len(keys)} keys for {rewards.shape[0]} reward groups")
        if not keys:
            return {}
        before = len(self.index)
        rows = self._rows(keys, grow=True)
        self.revisits = self.revisits or before + len(set(keys)) > len(self.index)
        stats = collapse_stats(rewards.detach().float().cpu(), self.tol, self.reward_range)
        new = torch.full((len(keys),), MIXED, dtype=torch.int8, device="cpu")
        new[stats.all_wrong] = HARD
        new[stats.all_right] = EASY
        same = (self.kind[rows] == new) & (new != MIXED)
        self.z[rows] = torch.where(same, self.z[rows] + 1, (new != MIXED).to(torch.int32))
        self.kind[rows] = new
        self.counts["seen"] += len(keys)
        frac = {"easy": stats.num_all_right / len(keys), "hard": stats.num_all_wrong / len(keys)}
        if self.revisits:
            lo, hi = self.p_bounds
            for k in ("easy", "hard"):  # at or above target: skip that kind more (lower p)
                step = -self.delta if frac[k] >= self.target[k] else self.delta
                self.p[k] = min(max(self.p[k] + step, lo), hi)
            self.counts["adapted_steps"] += 1
        return {f"greso/frac_{k}": v for k, v in frac.items()}

    def record_audit(self, rewards: torch.Tensor, tokens: int = 0) -> int:
        """Audited (skipped, rolled out anyway) groups ``[A, G]`` that cost ``tokens`` generated
        tokens: count those that were mixed."""
        self.counts["audit_tokens"] += int(tokens)
        if rewards.shape[0] == 0:
            return 0
        stats = collapse_stats(rewards.detach().float().cpu(), self.tol, self.reward_range)
        false = stats.num_groups - stats.num_collapsed
        self.counts["false_skips"] += false
        return false

    def metrics(self) -> dict[str, float]:
        c = self.counts
        visits = c["skipped"] + c["kept"]
        return {
            "greso/p_easy": self.p["easy"],
            "greso/p_hard": self.p["hard"],
            "greso/skipped_cum": float(c["skipped"]),
            "greso/kept_cum": float(c["kept"]),
            "greso/skip_rate_cum": c["skipped"] / visits if visits else 0.0,
            "greso/audited_cum": float(c["audited"]),
            "greso/false_skips_cum": float(c["false_skips"]),
            "greso/false_skip_rate": c["false_skips"] / c["audited"] if c["audited"] else float("nan"),
            "greso/audit_tokens_cum": float(c["audit_tokens"]),
            "greso/prompts_tracked": float(len(self.index)),
        }

    # ── checkpoint ──
    def state_dict(self) -> dict:
        return {
            "keys": list(self.index),
            "kind": self.kind.tolist(),
            "z": self.z.tolist(),
            "p": dict(self.p),
            "counts": dict(self.counts),
            "revisits": self.revisits,
            "generator": self.generator.get_state().tolist(),
        }

    def load_state_dict(self, state: dict) -> None:
        self.index = {k: i for i, k in enumerate(state["keys"])}
        self.kind = torch.tensor(state["kind"], dtype=torch.int8, device="cpu")
        self.z = torch.tensor(state["z"], dtype=torch.int32, device="cpu")
        self.p = dict(state["p"])
        self.counts = {**self.counts, **state["counts"]}  # a checkpoint from before a counter existed: 0
        self.revisits = bool(state["revisits"])
        self.generator.set_state(torch.tensor(state["generator"], dtype=torch.uint8, device="cpu"))  # a CPU ByteTensor
