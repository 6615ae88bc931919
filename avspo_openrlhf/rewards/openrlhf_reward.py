"""OpenRLHF reward-function file: ``--reward.remote_url <path to this file>``.

OpenRLHF 0.11.2 (``openrlhf/utils/agent.py``) loads this file by path and, for every generated
sample, calls ``reward_func([query], [prompt], [label])`` from a thread (``asyncio.to_thread``)
inside the rollout actor. ``query`` is the decoded prompt + response with special tokens; ``label``
is the gold answer (``--data.label_key``). It reads ``rewards`` (the training reward), ``scores``
(0..1, used by ``--algo.dynamic_filtering``) and ``extra_logs`` (per-sample scalars, logged as
batch means).

Every sample gets a status; ``extra_logs`` carries a one-hot of it (``verify/correct``,
``verify/no_answer``, ``verify/timeout``, ...) so their batch means are the status rates.
Verification runs in a process pool with a hard per-sample timeout (``AVSPO_REWARD_WORKERS``,
``AVSPO_REWARD_TIMEOUT``) on the worker's CPU time from when it begins the sample, retried once
on another worker before it is final (``verify/retried`` is the share of retried samples): a
pathological completion costs at most twice the timeout, never a hang, and a busy machine does not
turn a correct completion into reward 0.
Exceptions never escape (OpenRLHF would log and drop the reward silently).
"""

from __future__ import annotations

import torch

from avspo_openrlhf.rewards.extract import response_from_query
from avspo_openrlhf.rewards.pool import default_pool
from avspo_openrlhf.rewards.verify import STATUSES


def reward_func(queries: list[str], prompts: list[str], labels: list[str]) -> dict:
    responses = [response_from_query(q, p) for q, p in zip(queries, prompts)]
    results = default_pool().score(responses, [str(lb) if lb is not None else "" for lb in labels])
    rewards = torch.tensor([r.reward for r in results], dtype=torch.float32)
    extra_logs = {f"verify/{s}": torch.tensor([float(r.status == s) for r in results]) for s in STATUSES}
    # not a status: 1 where the verification overran the timeout once and was retried (its status is
    # the retry's), so the batch mean is the retry rate; verify/timeout counts the final timeouts
    extra_logs["verify/retried"] = torch.tensor([float(r.retries > 0) for r in results])
    return {"rewards": rewards, "scores": rewards.clone(), "extra_logs": extra_logs}
