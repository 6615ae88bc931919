"""Checks ``avspo-train`` runs in seconds, before Ray, vLLM or DeepSpeed start: a user's mistake
(a truncated dataset line, a missing key, a wrong model path, a broken reward file) is one clear
line and a non-zero exit, not a traceback inside a Ray actor minutes later."""

from __future__ import annotations

import importlib.util
import json
import os
import sys

DATA_SUFFIXES = (".jsonl", ".json")


class PreflightError(ValueError):
    pass


def _local_files(spec: str | None) -> list[str]:
    """The local dataset files of an OpenRLHF dataset argument (comma-separated; hub ids and
    other formats are left to OpenRLHF)."""
    out = []
    for part in (spec or "").split(","):
        part = part.strip()
        if not part:
            continue
        if part.endswith(DATA_SUFFIXES) or os.path.sep in part and os.path.exists(part):
            if not os.path.exists(part):
                raise PreflightError(f"{part}: no such file")
            if os.path.isfile(part) and part.endswith(DATA_SUFFIXES):
                out.append(part)
    return out


def check_rows(path: str, keys: list[str], max_report: int = 3) -> dict | None:
    """Every row of ``path`` parses and has ``keys``; all bad rows are counted, the first few named
    by file and line. Returns the first row (for the reward check)."""
    from avspo_openrlhf.data.io import iter_raw

    bad, first, n = [], None, 0
    for lineno, row in iter_raw(path):
        n += 1
        if isinstance(row, Exception):
            bad.append(f"{path}:{lineno}: {row}")
        elif not isinstance(row, dict):
            bad.append(f"{path}:{lineno}: a row must be a JSON object, got {type(row).__name__}")
        else:
            missing = [k for k in keys if k not in row]
            if missing:
                bad.append(
                    f"{path}:{lineno}: no field {', '.join(map(repr, missing))} (keys: {', '.join(list(row)[:8])})"
                )
            elif first is None:
                first = row
    if n == 0:
        raise PreflightError(f"{path}: no rows")
    if bad:
        more = f" (and {len(bad) - max_report} more)" if len(bad) > max_report else ""
        raise PreflightError(f"{len(bad)} bad row(s) of {n}: " + "; ".join(bad[:max_report]) + more)
    return first


def check_model(name: str | None) -> None:
    if not name:
        return
    # "org/name" and "gpt2" are hub ids (OpenRLHF downloads them); a path is checked here
    looks_local = name.startswith((".", "/", "~")) or os.path.exists(name) or name.count("/") >= 2
    if looks_local:
        path = os.path.expanduser(name)
        if not os.path.isdir(path):
            raise PreflightError(f"--actor.model_name_or_path {name}: no such folder (and not a hub id like org/name)")
        if not os.path.exists(os.path.join(path, "config.json")):
            raise PreflightError(f"--actor.model_name_or_path {name}: no config.json in that folder")


def check_reward_file(path: str, row: dict | None, input_key: str, label_key: str | None) -> None:
    """A ``.py`` reward file imports, has ``reward_func``, and returns ``rewards`` for one sample."""
    if not os.path.isfile(path):
        raise PreflightError(f"--reward.remote_url {path}: no such file")
    spec = importlib.util.spec_from_file_location("avspo_preflight_reward", path)
    module = importlib.util.module_from_spec(spec)
    try:
        spec.loader.exec_module(module)
    except Exception as e:  # noqa: BLE001 - any import failure is the user's to see, in one line
        raise PreflightError(f"--reward.remote_url {path}: import failed: {type(e).__name__}: {e}") from None
    fn = getattr(module, "reward_func", None)
    if not callable(fn):
        raise PreflightError(f"--reward.remote_url {path}: defines no reward_func(queries, prompts, labels)")
    if row is None:
        return
    prompt = row.get(input_key)
    prompt = prompt if isinstance(prompt, str) else json.dumps(prompt)
    label = row.get(label_key) if label_key else None
    try:
        out = fn(queries=[prompt + " 0"], prompts=[prompt], labels=[label])
    except Exception as e:  # noqa: BLE001
        raise PreflightError(
            f"--reward.remote_url {path}: reward_func failed on the first row: {type(e).__name__}: {e}"
        ) from None
    finally:
        pool = sys.modules.get("avspo_openrlhf.rewards.pool")
        if pool is not None and getattr(pool, "_default_pool", None) is not None:
            pool._default_pool.close()  # the trainer's reward actors start their own
    if not isinstance(out, dict) or "rewards" not in out:
        raise PreflightError(
            f"--reward.remote_url {path}: reward_func must return a dict with 'rewards', got {type(out).__name__}"
        )


def preflight(args) -> None:
    """All checks; raises :class:`PreflightError` with one line."""
    data = args.data
    keys = [data.input_key] + ([data.label_key] if data.label_key else [])
    first = None
    for path in _local_files(data.prompt_dataset):
        row = check_rows(path, keys)
        first = first or row
    for path in _local_files(getattr(args.eval, "dataset", None)):
        check_rows(path, keys)
    check_model(args.actor.model_name_or_path)
    urls = args.reward.remote_url  # OpenRLHF's checks split "a,b" into a list
    for url in [urls] if isinstance(urls, str) else urls or []:
        if url.endswith(".py"):
            check_reward_file(url, first, data.input_key, data.label_key)
