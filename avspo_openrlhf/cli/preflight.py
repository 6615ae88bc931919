"""Checks ``avspo-train`` runs in seconds, before Ray, vLLM or DeepSpeed start: a user's mistake
(a truncated dataset line, a missing key, a wrong model path, a broken reward file) is one clear
line and a non-zero exit, not a traceback inside a Ray actor minutes later."""

from __future__ import annotations

import json
import os
import sys

DATA_SUFFIXES = (".jsonl", ".json")
TABLE_SUFFIXES = (".csv", ".parquet", ".arrow")  # OpenRLHF loads these too (blending_datasets)
SAVED_DATASET_FILES = ("dataset_info.json", "state.json", "dataset_dict.json")  # Dataset.save_to_disk


class PreflightError(ValueError):
    pass


class MissingPath(PreflightError):
    """A local path that is not there. On a login node (``submit.sh``'s check) it may be one that
    only the compute nodes see: ``AVSPO_ALLOW_MISSING_PATHS=1`` makes it a warning there."""


ALLOW_MISSING_ENV = "AVSPO_ALLOW_MISSING_PATHS"


def _offline() -> bool:
    return any(
        os.environ.get(v, "").lower() in ("1", "true", "yes")
        for v in ("HF_HUB_OFFLINE", "HF_DATASETS_OFFLINE", "TRANSFORMERS_OFFLINE")
    )


def _local_files(spec: str | None, keys: list[str] | None = None) -> list[str]:
    """The local row files (.jsonl/.json) of an OpenRLHF dataset argument (comma-separated), after
    checking what else it names: a .csv/.parquet/.arrow file has the keys as columns, a folder holds
    a saved dataset or data files, a hub id is reachable (not offline without a cached copy)."""
    out = []
    for part in (spec or "").split(","):
        part = part.strip().split("@")[0].strip()  # OpenRLHF's "path@data_dir"
        if not part:
            continue
        if part.endswith(DATA_SUFFIXES + TABLE_SUFFIXES) and not os.path.exists(part):
            raise MissingPath(f"{part}: no such file")
        if os.path.isdir(part):
            out += _folder_files(part)
        elif part.endswith(TABLE_SUFFIXES):
            _check_table(part, keys or [])
        elif part.endswith(DATA_SUFFIXES):
            out.append(part)
        elif (
            os.path.sep in part
            and not os.path.exists(part)
            and (part.startswith((".", "/", "~")) or part.count("/") > 1)
        ):
            raise MissingPath(f"{part}: no such file or folder")
        elif not os.path.exists(part) and _offline() and not _dataset_cached(part):
            raise PreflightError(
                f"{part}: not a local file or folder, and the hub is offline (HF_HUB_OFFLINE) with no "
                "cached copy of this dataset id; give a local .jsonl (avspo-prepare-data writes one)"
            )
    return out


def _folder_files(folder: str) -> list[str]:
    names = os.listdir(folder)
    if any(n in names for n in SAVED_DATASET_FILES):
        return []  # a Dataset.save_to_disk folder: OpenRLHF's load_from_disk reads it
    rows = sorted(os.path.join(folder, n) for n in names if n.endswith(DATA_SUFFIXES))
    if rows or any(n.endswith(TABLE_SUFFIXES) for n in names):
        return rows
    raise PreflightError(
        f"{folder}: a folder with no dataset in it (no .jsonl/.json/.csv/.parquet file, no Dataset.save_to_disk files)"
    )


def _check_table(path: str, keys: list[str]) -> None:
    """A .csv/.parquet/.arrow file has the needed columns (and, for .csv, every row its columns)."""
    if path.endswith(".csv"):
        import csv

        with open(path, newline="", encoding="utf-8", errors="replace") as f:
            reader = csv.reader(f)
            header = next(reader, None)
            if not header:
                raise PreflightError(f"{path}: no rows")
            for lineno, row in enumerate(reader, 2):
                if row and len(row) != len(header):
                    raise PreflightError(f"{path}:{lineno}: {len(row)} fields, the header has {len(header)}")
        columns = header
    else:
        try:
            import pyarrow.parquet as pq

            columns = pq.read_schema(path).names if path.endswith(".parquet") else _arrow_columns(path)
        except Exception as e:  # noqa: BLE001 - unreadable: say so in one line
            raise PreflightError(f"{path}: cannot read it ({type(e).__name__}: {e})") from None
    missing = [k for k in keys if k not in columns]
    if missing:
        raise PreflightError(f"{path}: no column {', '.join(map(repr, missing))} (columns: {', '.join(columns[:8])})")


def _arrow_columns(path: str) -> list[str]:
    import pyarrow as pa

    with pa.memory_map(path) as source:
        try:
            return pa.ipc.open_stream(source).schema.names
        except pa.ArrowInvalid:
            return pa.ipc.open_file(source).schema.names


def _dataset_cached(name: str) -> bool:
    try:
        from huggingface_hub import scan_cache_dir

        return any(r.repo_id == name and r.repo_type == "dataset" for r in scan_cache_dir().repos)
    except Exception:  # noqa: BLE001 - no cache folder yet, or an old hub library: not cached
        return False


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
            # a null or empty prompt/label reaches the reward as None/"": every sample scored against nothing
            empty = [k for k in keys if k in row and (row[k] is None or row[k] == "" or row[k] == [])]
            if missing:
                bad.append(
                    f"{path}:{lineno}: no field {', '.join(map(repr, missing))} (keys: {', '.join(list(row)[:8])})"
                )
            elif empty:
                bad.append(f"{path}:{lineno}: field {', '.join(map(repr, empty))} is empty")
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


def check_model(name: str | None, flag: str = "--actor.model_name_or_path") -> None:
    if not name:
        return
    # "org/name" and "gpt2" are hub ids (OpenRLHF downloads them); a path is checked here
    looks_local = name.startswith((".", "/", "~")) or os.path.exists(name) or name.count("/") >= 2
    offline = any(
        os.environ.get(v, "").lower() in ("1", "true", "yes") for v in ("HF_HUB_OFFLINE", "TRANSFORMERS_OFFLINE")
    )
    if not looks_local and offline and not _in_hub_cache(name):
        raise PreflightError(
            f"{flag} {name}: no such local folder, and the hub is offline (HF_HUB_OFFLINE) with "
            "no cached copy; give the model's folder (a relative path is taken for a hub id org/name)"
        )
    if looks_local:
        path = os.path.expanduser(name)
        if not os.path.isdir(path):
            raise MissingPath(f"{flag} {name}: no such folder (and not a hub id like org/name)")
        if not os.path.exists(os.path.join(path, "config.json")):
            raise PreflightError(f"{flag} {name}: no config.json in that folder")


# the model config's position limit under the names transformers' configs use (vLLM reads the same)
_POSITION_KEYS = ("max_position_embeddings", "n_positions", "max_seq_len", "seq_length", "max_sequence_length")


def model_max_positions(folder: str) -> int | None:
    """The longest sequence a local model folder's config.json allows, or None when it does not say
    (or rope scaling stretches it: vLLM's own rule then decides)."""
    try:
        with open(os.path.join(os.path.expanduser(folder), "config.json"), encoding="utf-8") as f:
            cfg = json.load(f)
    except (OSError, ValueError):
        return None
    cfg = cfg.get("text_config", cfg) if isinstance(cfg, dict) else {}
    if cfg.get("rope_scaling"):
        return None
    limits = [int(cfg[k]) for k in _POSITION_KEYS if isinstance(cfg.get(k), (int, float)) and cfg[k] > 0]
    return min(limits) if limits else None


def check_max_len(args) -> None:
    """``--data.max_len`` (the rollout engine's max_model_len) within the model's positions: vLLM
    refuses it only after Ray and the engine have started, deep in a traceback."""
    name, max_len = args.actor.model_name_or_path, getattr(args.data, "max_len", None)
    if not name or not max_len or not os.path.isdir(os.path.expanduser(name)):
        return
    limit = model_max_positions(name)
    if limit is not None and max_len > limit:
        raise PreflightError(
            f"--data.max_len {max_len} (prompt + completion, the engine's max_model_len) is longer than "
            f"{name}'s {limit} positions (config.json); set --data.max_len {limit} or less"
        )


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
print("\nAVSPO_PREFLIGHT_IMPORTED", flush=True)
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
# scoring two samples: a reward that needs longer for two is as good as hung for a training batch
REWARD_CALL_TIMEOUT_S = float(os.environ.get("AVSPO_PREFLIGHT_REWARD_CALL_TIMEOUT", "20"))


def _read_until_done(proc, timeout_s: float, call_timeout_s: float) -> tuple[str | None, str]:
    """The probe's output, or ``(None, phase)`` at a deadline: ``timeout_s`` for the import (heavy
    imports are slow), then ``call_timeout_s`` for the call once the child says it imported."""
    import select
    import time

    fd, out, phase = proc.stdout.fileno(), b"", "importing it"
    deadline = time.monotonic() + timeout_s
    while True:
        left = deadline - time.monotonic()
        if left <= 0:
            return None, phase
        ready, _, _ = select.select([fd], [], [], left)
        if not ready:
            continue
        chunk = os.read(fd, 65536)
        if not chunk:
            return out.decode("utf-8", "replace"), phase
        out += chunk
        if phase == "importing it" and b"AVSPO_PREFLIGHT_IMPORTED" in out:
            phase, deadline = "scoring the first row", time.monotonic() + call_timeout_s


def check_reward_file(
    path: str,
    row: dict | None,
    input_key: str,
    label_key: str | None,
    timeout_s: float | None = None,
    call_timeout_s: float | None = None,
) -> None:
    """A ``.py`` reward file imports, has ``reward_func``, and returns one finite reward per query
    for two samples of the first row, in a child process that is killed at the deadline: ``timeout_s``
    for the import (``AVSPO_PREFLIGHT_REWARD_TIMEOUT``, 120 s), ``call_timeout_s`` for the call
    (``AVSPO_PREFLIGHT_REWARD_CALL_TIMEOUT``, 20 s)."""
    import subprocess

    if not os.path.isfile(path):
        raise MissingPath(f"--reward.remote_url {path}: no such file")
    payload = None
    if row is not None:
        prompt = row.get(input_key)
        prompt = prompt if isinstance(prompt, str) else json.dumps(prompt)
        label = row.get(label_key) if label_key else None
        payload = {"queries": [prompt + " 0", prompt + " 1"], "prompts": [prompt] * 2, "labels": [label] * 2}
    timeout_s = REWARD_CHECK_TIMEOUT_S if timeout_s is None else timeout_s
    call_timeout_s = REWARD_CALL_TIMEOUT_S if call_timeout_s is None else call_timeout_s
    proc = subprocess.Popen(
        [sys.executable, "-c", _REWARD_PROBE, path],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL,
        start_new_session=True,
    )
    proc.stdin.write(json.dumps(payload).encode())  # small; the child reads it all before importing
    proc.stdin.close()
    out, phase = _read_until_done(proc, timeout_s, call_timeout_s)
    if out is None:
        os.killpg(proc.pid, 9)
        proc.wait()
        limit, env = (
            (timeout_s, "AVSPO_PREFLIGHT_REWARD_TIMEOUT")
            if phase == "importing it"
            else (call_timeout_s, "AVSPO_PREFLIGHT_REWARD_CALL_TIMEOUT")
        )
        raise PreflightError(
            f"--reward.remote_url {path}: no answer after {limit:.0f} s ({phase}); a reward that hangs would "
            f"hang training (raise {env} if it is only slow)"
        )
    proc.wait()
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


_LABEL_CHECK = r"""
import json, sys
from avspo_openrlhf.data.io import iter_raw
from avspo_openrlhf.rewards.verify import _parse_gold
path, key, limit = sys.argv[1], sys.argv[2], int(sys.argv[3])
bad, n = [], 0
for lineno, row in iter_raw(path):
    if not isinstance(row, dict) or key not in row:
        continue
    n += 1
    label = str(row[key])
    try:
        ok = bool(label.strip()) and bool(_parse_gold(label))
    except Exception:
        ok = False
    if not ok:
        bad.append(f"{path}:{lineno}: {label[:60]!r}")
    if n >= limit:
        break
print(json.dumps({"checked": n, "bad": bad}))
"""


def check_labels(path: str, label_key: str, limit: int = 2000, timeout_s: float = 120.0) -> str | None:
    """The math reward compares answers with math-verify's parse of each label: a label it cannot
    parse makes every answer to that prompt wrong. Checks the first ``limit`` rows in a child
    process (killed at the deadline); all unparsable is an error, some is a warning returned as one
    line (None when all parse)."""
    import subprocess

    try:
        r = subprocess.run(
            [sys.executable, "-c", _LABEL_CHECK, path, label_key, str(limit)],
            capture_output=True,
            text=True,
            timeout=timeout_s,
        )
        result = json.loads(r.stdout.strip().splitlines()[-1])
    except subprocess.TimeoutExpired:
        return f"[avspo] {path}: the label check did not finish in {timeout_s:.0f} s (labels not checked)"
    except (json.JSONDecodeError, IndexError):
        return f"[avspo] {path}: the label check failed ({(r.stderr or '').strip().splitlines()[-1:]})"
    n, bad = result["checked"], result["bad"]
    if n and len(bad) == n:
        raise PreflightError(
            f"{path}: none of the {n} labels ({label_key!r}) can be parsed by math-verify, so every "
            f"answer would be scored wrong; e.g. {bad[0]}"
        )
    if bad:
        more = f" (and {len(bad) - 3} more)" if len(bad) > 3 else ""
        return (
            f"[avspo] warning: {len(bad)} of {n} labels math-verify cannot parse (those prompts always score "
            f"0): " + "; ".join(bad[:3]) + more
        )
    return None


def _uses_math_reward(urls) -> bool:
    from avspo_openrlhf.rewards import openrlhf_reward

    target = os.path.abspath(openrlhf_reward.__file__)
    return any(os.path.abspath(u) == target for u in ([urls] if isinstance(urls, str) else urls or []))


def check_ray_address(address: str | None) -> None:
    """``RAY_ADDRESS=HOST:PORT`` (a launcher's cluster, which the CPU backend joins) must answer:
    ``ray.init`` retries a dead address for minutes, printing connection errors."""
    if not address or address in ("auto", "local") or "://" in address or ":" not in address:
        return
    from avspo_openrlhf.cluster.ray_wait import listening

    if not listening(address, timeout=5):
        raise PreflightError(
            f"RAY_ADDRESS={address}: no Ray cluster answers there; start it, or unset RAY_ADDRESS to let this "
            "run start its own"
        )


STALE_BUILD_LOCK_S = 600.0  # building DeepSpeed's CPU ops takes a minute or two


def clear_stale_build_locks(root: str | None = None, max_age_s: float = STALE_BUILD_LOCK_S) -> list[str]:
    """Remove torch-extension build locks older than ``max_age_s``. DeepSpeed JIT-loads its ops
    (``deepspeed_shm_comm``, ``fused_adam``) under torch's ``FileBaton``, a bare ``lock`` file with no
    owner: a process killed while holding it (kill -9, the OOM killer) leaves it behind, and every
    later run waits on it forever inside a Ray actor, printing nothing."""
    import glob
    import time

    from avspo_openrlhf.cpu.ops import extensions_dir

    # the environment's folder (cpu/ops.py) and torch's default one, which other runs may use
    roots = [root] if root else [extensions_dir(), os.path.join(os.path.expanduser("~"), ".cache", "torch_extensions")]
    removed = []
    locks = [
        lk
        for r in dict.fromkeys(filter(None, roots))
        for pattern in ("*/lock", "*/*/lock")
        for lk in glob.glob(os.path.join(r, pattern))
    ]
    for lock in locks:
        try:
            if time.time() - os.path.getmtime(lock) > max_age_s:
                os.remove(lock)
                removed.append(lock)
        except OSError:  # another run released or removed it meanwhile
            continue
    return removed


def preflight(args, *, dry_run: bool = False, allow_missing: bool = False) -> list[str]:
    """All checks; raises :class:`PreflightError` with one line. ``dry_run`` (``avspo-train
    --dry-run``, ``submit.sh``'s check): the checks that need no Ray and no network and change
    nothing (no stale-lock cleanup, no probe of ``RAY_ADDRESS``). ``allow_missing`` (dry run only):
    a missing path is a warning, printed and returned, and the checks that need it are skipped."""
    warnings: list[str] = []

    def tolerate(check, *a):
        try:
            return check(*a)
        except MissingPath as e:
            if not (dry_run and allow_missing):
                raise
            warnings.append(f"[avspo] warning: {e} ({ALLOW_MISSING_ENV}=1: it must exist where the job runs)")
            print(warnings[-1], file=sys.stderr)
            return None

    if not dry_run:
        for lock in clear_stale_build_locks():
            print(
                f"[avspo] removed a stale build lock {lock} (left by a process killed while building DeepSpeed's "
                "ops; every run would have waited on it forever)",
                file=sys.stderr,
            )
    check_checkpoints(args)
    if getattr(args, "backend", "gpu") == "cpu" and not dry_run:  # OpenRLHF's GPU path handles RAY_ADDRESS itself
        check_ray_address(os.environ.get("RAY_ADDRESS"))
    data = args.data
    keys = [data.input_key] + ([data.label_key] if data.label_key else [])
    first = None
    train_files = tolerate(_local_files, data.prompt_dataset, keys) or []
    for path in train_files:
        row = check_rows(path, keys)
        first = first or row
    for path in tolerate(_local_files, getattr(args.eval, "dataset", None), keys) or []:
        check_rows(path, keys)
    tolerate(check_model, args.actor.model_name_or_path)
    check_max_len(args)
    urls = args.reward.remote_url  # OpenRLHF's checks split "a,b" into a list
    for url in [urls] if isinstance(urls, str) else urls or []:
        if url.endswith(".py"):
            tolerate(check_reward_file, url, first, data.input_key, data.label_key)
    if data.label_key and _uses_math_reward(urls):
        for path in train_files:
            warning = check_labels(path, data.label_key)
            if warning:
                print(warning, file=sys.stderr)
    return warnings
