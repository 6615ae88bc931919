"""Checks ``avspo-train`` runs in seconds, before Ray, vLLM or DeepSpeed start: a user's mistake
(a truncated dataset line, a missing key, a wrong model path, a broken reward file) is one clear
line and a non-zero exit, not a traceback inside a Ray actor minutes later."""

from __future__ import annotations

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


def _in_hub_cache(name: str) -> bool:
    try:
        from huggingface_hub import try_to_load_from_cache

        return isinstance(try_to_load_from_cache(name, "config.json"), str)
    except Exception:  # noqa: BLE001 - an odd name or an old hub library: not cached
        return False


def check_model(name: str | None) -> None:
    if not name:
        return
    # "org/name" and "gpt2" are hub ids (OpenRLHF downloads them); a path is checked here
    looks_local = name.startswith((".", "/", "~")) or os.path.exists(name) or name.count("/") >= 2
    offline = any(
        os.environ.get(v, "").lower() in ("1", "true", "yes") for v in ("HF_HUB_OFFLINE", "TRANSFORMERS_OFFLINE")
    )
    if not looks_local and offline and not _in_hub_cache(name):
        raise PreflightError(
            f"--actor.model_name_or_path {name}: no such local folder, and the hub is offline (HF_HUB_OFFLINE) with "
            "no cached copy; give the model's folder (a relative path is taken for a hub id org/name)"
        )
    if looks_local:
        path = os.path.expanduser(name)
        if not os.path.isdir(path):
            raise PreflightError(f"--actor.model_name_or_path {name}: no such folder (and not a hub id like org/name)")
        if not os.path.exists(os.path.join(path, "config.json")):
            raise PreflightError(f"--actor.model_name_or_path {name}: no config.json in that folder")


# Runs in a child process: a reward file that hangs (at import or on a sample) or eats memory is
# killed at the deadline instead of hanging avspo-train with no message.
_REWARD_PROBE = r"""
import importlib.util, json, math, sys
path, payload = sys.argv[1], json.loads(sys.stdin.read())
def done(**kw):
    print("\nAVSPO_PREFLIGHT " + json.dumps(kw), flush=True)
    sys.exit(0)
spec = importlib.util.spec_from_file_location("avspo_preflight_reward", path)
module = importlib.util.module_from_spec(spec)
try:
    spec.loader.exec_module(module)
except BaseException as e:
    done(error=f"import failed: {type(e).__name__}: {e}")
fn = getattr(module, "reward_func", None)
if not callable(fn):
    done(error="defines no reward_func(queries, prompts, labels)")
if payload is None:
    done(ok=True)
try:
    out = fn(**payload)
except BaseException as e:
    done(error=f"reward_func failed on the first row: {type(e).__name__}: {e}")
if not isinstance(out, dict) or "rewards" not in out:
    done(error=f"reward_func must return a dict with 'rewards', got {type(out).__name__}")
r = out["rewards"]
r = r.tolist() if hasattr(r, "tolist") else r
try:
    r = [float(x) for x in r]
except (TypeError, ValueError) as e:
    done(error=f"reward_func's 'rewards' must be numbers, one per query: {e}")
n = len(payload["queries"])
if len(r) != n:
    done(error=f"reward_func returned {len(r)} rewards for {n} queries (one per query expected)")
if not all(math.isfinite(x) for x in r):
    done(error=f"reward_func returned a non-finite reward {r}")
done(ok=True)
"""
REWARD_CHECK_TIMEOUT_S = float(os.environ.get("AVSPO_PREFLIGHT_REWARD_TIMEOUT", "120"))


def check_reward_file(path: str, row: dict | None, input_key: str, label_key: str | None,
                      timeout_s: float | None = None) -> None:  # fmt: skip
    """A ``.py`` reward file imports, has ``reward_func``, and returns one finite reward per query
    for two samples of the first row, within ``timeout_s`` (default
    ``AVSPO_PREFLIGHT_REWARD_TIMEOUT``, 120 s), in a child process that is killed at the deadline."""
    import subprocess

    if not os.path.isfile(path):
        raise PreflightError(f"--reward.remote_url {path}: no such file")
    payload = None
    if row is not None:
        prompt = row.get(input_key)
        prompt = prompt if isinstance(prompt, str) else json.dumps(prompt)
        label = row.get(label_key) if label_key else None
        payload = {"queries": [prompt + " 0", prompt + " 1"], "prompts": [prompt] * 2, "labels": [label] * 2}
    timeout_s = REWARD_CHECK_TIMEOUT_S if timeout_s is None else timeout_s
    proc = subprocess.Popen([sys.executable, "-c", _REWARD_PROBE, path], stdin=subprocess.PIPE,
                            stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True,
                            start_new_session=True)  # fmt: skip
    try:
        out, _ = proc.communicate(json.dumps(payload), timeout=timeout_s)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, 9)
        proc.wait()
        what = "importing it or scoring the first row" if payload else "importing it"
        raise PreflightError(
            f"--reward.remote_url {path}: no answer after {timeout_s:.0f} s ({what}); a reward that hangs would "
            "hang training (raise AVSPO_PREFLIGHT_REWARD_TIMEOUT if it is only slow)"
        ) from None
    lines = [ln for ln in out.splitlines() if ln.startswith("AVSPO_PREFLIGHT ")]
    if not lines:
        raise PreflightError(f"--reward.remote_url {path}: the check process died (exit {proc.returncode})")
    result = json.loads(lines[-1].removeprefix("AVSPO_PREFLIGHT "))
    if "error" in result:
        raise PreflightError(f"--reward.remote_url {path}: {result['error']}")


def check_checkpoints(args) -> None:
    """A resumed run whose checkpoints are all torn fails here in one line, not in DeepSpeed's
    bare AssertionError inside a Ray actor (``trainer/checkpoint.py`` picks what to resume)."""
    ckpt = args.ckpt
    if not (ckpt.load_enable and ckpt.path):
        return
    for role in ("_actor", "_critic"):
        if os.path.isdir(os.path.join(ckpt.path, role)):
            from avspo_openrlhf.trainer.checkpoint import IncompleteCheckpoints, resume_tag

            try:
                resume_tag(os.path.join(ckpt.path, role), say=lambda _msg: None)
            except IncompleteCheckpoints as e:
                raise PreflightError(str(e)) from None


def preflight(args) -> None:
    """All checks; raises :class:`PreflightError` with one line."""
    check_checkpoints(args)
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
