"""Keep secrets (wandb key, hub tokens, passwords) out of config dumps, logs and run configs.

A field or environment variable is secret when its name's last part is ``key`` / ``*api_key`` /
``token`` / ``*_token`` or contains ``secret``, ``password``, ``passwd`` or ``credential``
(case-insensitive). Dataset field names such as ``--data.input_key`` are not secrets.

``avspo-train`` moves ``--logger.wandb.key`` into the process's ``WANDB_API_KEY`` right after
parsing and leaves :data:`REDACTED` in the args, so nothing downstream (the ``--dry-run`` dump,
OpenRLHF's ``wandb.init(config=args.__dict__)``, checkpoints) ever holds the key. Launch scripts
take the key from ``WANDB_API_KEY`` in the environment, never from a command line.
"""

from __future__ import annotations

import os
import re
from types import SimpleNamespace
from typing import Any

REDACTED = "<redacted>"
_SECRET_RE = re.compile(
    r"(?:^|[._-])(?:api[_-]?)?key$|(?:^|[._-])[a-z]*token$|secret|passw(?:or)?d|credential", re.IGNORECASE
)
# names that end in "key" but hold a dataset field or metric name
NOT_SECRET = frozenset({"input_key", "label_key", "image_key", "output_key", "prompt_key", "best_metric_key"})


def is_secret(name: str) -> bool:
    """Whether a field (``logger.wandb.key``), flag (``--logger.wandb.key``) or env var name is secret."""
    last = name.lstrip("-").rsplit(".", 1)[-1]
    return last.lower() not in NOT_SECRET and bool(_SECRET_RE.search(last))


def redact(obj: Any, _name: str = "") -> Any:
    """A copy of ``obj`` (nested dicts / namespaces / lists) with every non-empty secret value
    replaced by :data:`REDACTED`."""
    if isinstance(obj, SimpleNamespace):
        return SimpleNamespace(**{k: redact(v, k) for k, v in vars(obj).items()})
    if isinstance(obj, dict):
        return {k: redact(v, str(k)) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return type(obj)(redact(v) for v in obj)
    if _name and is_secret(_name) and obj not in (None, "", False) and not isinstance(obj, (bool, int, float)):
        return REDACTED
    return obj


def move_wandb_key_to_env(args) -> None:
    """``--logger.wandb.key K``: K goes to ``WANDB_API_KEY`` of this process (inherited by a Ray
    cluster this process starts) and the args keep :data:`REDACTED`, which still switches
    OpenRLHF's wandb logger on; its ``wandb.login`` is skipped because the environment has the key."""
    wandb = getattr(getattr(args, "logger", None), "wandb", None)
    key = getattr(wandb, "key", None)
    if key and key != REDACTED:
        os.environ.setdefault("WANDB_API_KEY", key)
        wandb.key = REDACTED


def check_wandb_key_in_env(args) -> None:
    """Inside a Ray actor: a redacted key needs ``WANDB_API_KEY`` in the cluster's environment
    (export it before ``ray start``); without it wandb is switched off with a warning instead of
    logging in with the placeholder."""
    wandb = getattr(getattr(args, "logger", None), "wandb", None)
    if getattr(wandb, "key", None) == REDACTED and not os.environ.get("WANDB_API_KEY"):
        print("[avspo] wandb off: this Ray worker has no WANDB_API_KEY (export it before `ray start` on every node)")
        wandb.key = None
