"""The run's reward files: ``--reward.remote_url avspo:NAME`` resolved to this package's file, and a
user's own file wrapped in a guard (a hard timeout and a memory cap per call, errors naming the file)."""

from __future__ import annotations

from .run_settings import settings

# --reward.remote_url avspo:NAME -> the installed reward file's absolute path (configs and launch
# scripts do not depend on the working directory or on where the package is installed)
REWARD_ALIASES = {"math": "avspo_openrlhf.rewards.openrlhf_reward", "arith": "avspo_openrlhf.rewards.arith_reward"}


def resolve_reward_alias(args) -> None:
    import importlib.util

    urls = getattr(getattr(args, "reward", None), "remote_url", None)
    if not isinstance(urls, str) or "avspo:" not in urls:
        return
    out = []
    for u in urls.split(","):
        if u.startswith("avspo:"):
            name = u.split(":", 1)[1]
            if name not in REWARD_ALIASES:
                raise ValueError(
                    f"--reward.remote_url {u}: unknown alias; choose from "
                    + ", ".join(f"avspo:{k}" for k in REWARD_ALIASES)
                )
            u = importlib.util.find_spec(REWARD_ALIASES[name]).origin
        out.append(u)
    args.reward.remote_url = ",".join(out)


def guard_reward_files(args) -> list[str]:
    """Point OpenRLHF at a guarded wrapper (rewards/guard.py) of every reward file of the user's:
    a hard timeout and a memory cap per call, errors that name the file. The wrappers live in
    ``<ckpt.path>/.avspo``, which every Ray process of the run reads. Returns the user files wrapped."""
    import os

    from avspo_openrlhf.rewards.guard import write_guard_file

    urls = args.reward.remote_url
    if not urls:
        return []
    as_list = urls if isinstance(urls, list) else str(urls).split(",")
    ours = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    run = settings(args).run
    wrapped, out = [], []
    for url in as_list:
        local = url.endswith(".py") and os.path.isfile(url)
        if local and not os.path.abspath(url).startswith(ours + os.sep):
            folder = os.path.join(args.ckpt.path, ".avspo")
            url = write_guard_file(url, folder, run.reward_timeout_s, run.reward_memory_mb or None, run.reward_workers)
            wrapped.append(url)
        out.append(url)
    args.reward.remote_url = out if isinstance(urls, list) else ",".join(out)
    return wrapped
