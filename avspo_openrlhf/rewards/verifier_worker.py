"""The process a :class:`~avspo_openrlhf.rewards.pool.VerifierPool` worker runs.

It is started as ``python -I -c BOOT`` (see ``pool.py`` for why not with ``multiprocessing``): it
imports only the verifier (and the modules named in the pool's ``imports``), verifies one warm-up
sample so math-verify's lazy parser imports are paid before any real sample, says ``ready``, and
then, per task, says ``started`` before verifying and sends the result. The parent arms a
sample's deadline on ``started``: start-up and queueing are never charged to a sample.

Messages to the parent: ``("ready", None)``, ``("failed", text)`` (start-up failed),
``("started", CPU seconds so far)``, ``("done", VerifyResult)``. Tasks: ``(completion, gold, verifier)``;
``None`` or EOF ends the worker.
"""

from __future__ import annotations

import os
import signal
import time


def worker_tasks(conn):
    """The tasks a worker process receives, until its parent closes the pipe or sends ``None``."""
    while True:
        try:
            task = conn.recv()
        except EOFError:
            return
        if task is None:
            return
        yield task


def _die_with_parent(parent_pid: int) -> None:
    """SIGKILL this worker when the thread that started it (the pool's dispatcher) ends, so a
    worker stuck in a C-level computation never outlives a killed caller (Linux; elsewhere the
    worker ends on EOF once its computation returns)."""
    try:
        import ctypes

        ctypes.CDLL(None, use_errno=True).prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG
    except (OSError, AttributeError):
        return
    if os.getppid() != parent_pid:  # the parent died before prctl: nobody would signal us
        os._exit(0)


def main(config: dict) -> None:
    from multiprocessing.connection import Connection

    # Ctrl-C and SIGTERM reach the whole process group, and a run checkpoints on them: a worker keeps
    # verifying until the pool ends it (kill, EOF, or its dispatcher thread's end: _die_with_parent).
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    _die_with_parent(config["parent_pid"])
    conn = Connection(config["fd"])
    caps = (config["max_completion_chars"], config["max_answer_chars"])
    try:
        import importlib

        from avspo_openrlhf.rewards.verify import VERIFIERS, verify_answer

        for name in config.get("imports", ()):  # modules that add verifiers to VERIFIERS
            importlib.import_module(name)
        verify_answer("\\boxed{\\frac{1}{2}}", "0.5", *caps)  # warm-up: lazy parser imports happen here
    except BaseException as e:  # noqa: BLE001 - reported to the parent, which fails the pool clearly
        import traceback

        conn.send(("failed", f"{type(e).__name__}: {e}\n{traceback.format_exc(limit=5)}"[-4000:]))
        return
    conn.send(("ready", None))
    from avspo_openrlhf.rewards.verify import VerifyResult

    for completion, gold, verifier in worker_tasks(conn):
        conn.send(("started", time.process_time()))  # the parent charges CPU time from here
        if verifier not in VERIFIERS:  # registered in the caller only, at run time
            result = VerifyResult(
                "error",
                detail=f"verifier {verifier!r} is not registered in the worker processes: "
                "name the module that registers it in VerifierPool(imports=...)",
            )
        else:
            result = VERIFIERS[verifier](completion, gold, *caps)
        conn.send(("done", result))


# What the pool runs with ``python -I -c``: ``-I`` keeps the current folder, PYTHONPATH and user
# site-packages out of the path (nothing can shadow a module), then the caller's own ``sys.path``
# is installed, so the worker imports the same package versions as the caller.
BOOT = (
    "import json, sys; config = json.loads(sys.argv[1]); sys.path[:] = config['sys_path']; "
    "from avspo_openrlhf.rewards.verifier_worker import main; main(config)"
)
