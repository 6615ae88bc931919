"""The policy actor in this process, for tests that run OpenRLHF's ``make_experience`` without a
Ray cluster: stand-ins for OpenRLHF's ``RayActorGroup`` (``async_run_method_batch`` /
``async_run_method``, as the experience maker calls them), a policy group without a model, and our
experience maker on either. ``in_process_ray`` makes ``ray.get``/``ray.put`` pass values through."""

from __future__ import annotations

import socket
from types import SimpleNamespace as NS

import ray_stand_in


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("", 0))
        return s.getsockname()[1]


def in_process_ray(monkeypatch) -> None:
    """The real Ray's (or the stand-in's) ``get``/``put`` on this process's values."""
    import ray

    monkeypatch.setattr(ray, "get", ray_stand_in.get)
    monkeypatch.setattr(ray, "put", ray_stand_in.put)


class LocalGroup:
    """OpenRLHF's ``RayActorGroup`` of one actor living in this process: the actor's own
    ``execute_batch`` runs each batched call, results come back as resolved refs."""

    def __init__(self, actor):
        self.actor = actor

    def async_run_method_batch(self, method_name, **kwargs):
        n = len(next(iter(kwargs.values())))
        return [ray_stand_in.ObjectRef(self.actor.execute_batch(method_name, kwargs, 0, n))]

    def async_run_method(self, method_name, *args, **kwargs):
        return [ray_stand_in.ObjectRef(getattr(self.actor, method_name)(*args, **kwargs))]


class ScriptedPolicyGroup(LocalGroup):
    """A policy group without a model: log-probs and token entropies are fixed functions of the
    tokens, on the tokens' device, so two makers fed the same samples get the same numbers. It
    answers ``forward`` as our policy actor does (with ``entropy_rows``: the entropies too)."""

    def __init__(self):
        super().__init__(self)
        self.calls: list[str] = []

    def execute_batch(self, method_name, kwargs, start, end):
        return [getattr(self, method_name)(**{k: v[i] for k, v in kwargs.items()}) for i in range(start, end)]

    def empty_cache(self):
        return None

    def forward(self, sequences, action_mask, attention_mask, entropy_rows=None, **_):
        from avspo_openrlhf.trainer.token_level import ForwardWithEntropy

        self.calls.append("forward")
        tokens = sequences[:, -action_mask.shape[1] :].float()
        log_probs = -0.05 * (tokens % 11) * action_mask
        if entropy_rows is None:
            return log_probs
        entropy = ((0.1 + 0.07 * (tokens % 13)) * action_mask)[entropy_rows.to(tokens.device)]
        return ForwardWithEntropy(log_probs, entropy)


def maker_for(args, group, controller=None, tokenizer=None):
    """Our experience maker on ``group`` (no critic, reward or reference model: rule rewards, KL 0)."""
    from avspo_openrlhf.trainer.experience_maker import RemedyExperienceMaker

    strategy = getattr(getattr(group, "actor", None), "strategy", None) or NS(args=args)
    tokenizer = tokenizer or NS(pad_token_id=0)
    return RemedyExperienceMaker(group, None, None, None, NS(value=0.0), strategy, tokenizer, controller=controller)
