"""Ray for the CPU backend: its workers' environment, its start on loopback, and that start run beside
the driver's checks instead of after them.

``ray.init`` spends 3.5-4.8 s of a CPU run's start-up mostly waiting for the processes it starts (the
GCS, the raylet and its agents; 2-core Intel Xeon with native bf16). :class:`RayStart` runs it in a
thread of its own once the user's input is checked (a mistake still fails before any Ray process
starts), beside the driver's imports of the backend, and that thread launches the vLLM engine, the
start-up's longest chain, as soon as Ray is up.
"""

from __future__ import annotations

import contextlib
import ipaddress
import logging
import os
import threading
import time
import warnings
from collections.abc import Callable
from typing import Any

import ray

from avspo_openrlhf.cpu.cores import resolve_split, thread_env
from avspo_openrlhf.cpu.ops import EXT_ENV, extensions_dir

CPU_ENV = {
    "DS_ACCELERATOR": "cpu",
    "VLLM_ENABLE_V1_MULTIPROCESSING": "0",  # engine in-process: 3-7 s start instead of 14-24 s
    "VLLM_CPU_KVCACHE_SPACE": os.environ.get("VLLM_CPU_KVCACHE_SPACE", "1"),
    "TOKENIZERS_PARALLELISM": "false",
    "RAY_ENABLE_ZERO_COPY_TORCH_TENSORS": "1",
    "WANDB_MODE": os.environ.get("WANDB_MODE", "offline"),
    "OMP_NUM_THREADS": os.environ.get("OMP_NUM_THREADS", str(os.cpu_count() or 2)),
    # OMP_WAIT_POLICY: per run, from the mode and the core split (cores.thread_env)
    # OpenRLHF's @torch.compile'd entropy (the entropy monitor's) compiled C++ with inductor in the
    # first training step, and again for new shapes: 4-6 s of a CPU run, for an op that runs eagerly
    # in well under a second (the vLLM-cpu engine runs eager already)
    "TORCHDYNAMO_DISABLE": os.environ.get("TORCHDYNAMO_DISABLE", "1"),
}
if extensions_dir():  # DeepSpeed's compiled ops: the environment's own folder, in every worker (ops.py)
    CPU_ENV[EXT_ENV] = extensions_dir()

_REAPER: list = []  # one watcher per driver process (cpu/reaper.py)


def is_loopback(host: str) -> bool:
    ip = ipaddress.ip_address(host.strip("[]"))
    return ip.is_loopback or bool(getattr(ip, "ipv4_mapped", None) and ip.ipv4_mapped.is_loopback)


def worker_env(args) -> dict[str, str]:
    """The run's thread settings for every Ray worker (``cores.thread_env``: its mode and core split)."""
    engine_cores, _ = resolve_split(args.cpu.engine_cores, args.cpu.train_cores)
    return thread_env(args.train.async_enable, bool(engine_cores))


def _environment(extra_env: dict[str, str] | None) -> dict[str, str]:
    """``CPU_ENV`` plus ``extra_env``, also set in this process where the user has not set them."""
    env = {**CPU_ENV, **(extra_env or {})}
    os.environ.update({k: v for k, v in env.items() if k not in os.environ})
    return env


def init_ray(extra_env: dict[str, str] | None = None) -> None:
    """Ray for the CPU backend, every worker with ``CPU_ENV`` plus ``extra_env`` (the run's thread
    settings, :func:`worker_env`)."""
    if not ray.is_initialized():
        _start(_environment(extra_env))


def _start(env: dict[str, str]) -> None:
    runtime_env = {"worker_process_setup_hook": "avspo_openrlhf.cpu.worker.install_cpu_worker", "env_vars": env}
    address = os.environ.get("RAY_ADDRESS")
    if address:  # a cluster someone started (the SLURM launcher's): its CPUs, its ports, its auth
        ray.init(address=address, runtime_env=runtime_env)
        print(f"[avspo] CPU backend: joined the Ray cluster at {address}")
        return
    # one machine: every port on loopback (docs/security.md). Ray 2.55 binds its GCS, raylet, object
    # manager, worker, agent and metrics servers to the node's address, but ray.init replaces
    # _node_ip_address="127.0.0.1" by the host's address unless multi-node clusters are off (as on
    # Windows/macOS): off for this call only. The token (ray_auth) still guards every Ray port.
    from ray._private import ray_constants  # private: tests/test_loopback.py guards it

    from avspo_openrlhf.ray_auth import loopback_env  # gloo's and vLLM's sockets, in every worker

    multi_node, ray_constants.ENABLE_RAY_CLUSTER = ray_constants.ENABLE_RAY_CLUSTER, False
    try:
        ray.init(
            # a new cluster of our own: without "local", ray.init() joins any `ray start` cluster on this
            # machine (another job's or user's), or fails on the stale address one left behind
            address="local",
            # logical CPUs: the trainer, generator, engine and model actors each reserve one to be scheduled
            num_cpus=max(8, os.cpu_count() or 1),
            include_dashboard=False,
            # no idle Python workers started ahead: every process this run needs is an actor with its own
            # worker, and up to num_cpus idle ones competed with the actors' start-up for 2 cores (a tiny
            # run's start-up 68-70 s -> 60-64 s on a 2-core AMD EPYC without native bf16, fp32; startup.json)
            _system_config={"enable_worker_prestart": False, "prestart_worker_first_driver": False},
            _node_ip_address="127.0.0.1",
            runtime_env={**runtime_env, "env_vars": {**env, **loopback_env()}},
        )
    finally:
        ray_constants.ENABLE_RAY_CLUSTER = multi_node
    node = ray.util.get_node_ip_address()
    if not is_loopback(node):
        print(f"[avspo] CPU backend: Ray's node is on {node}, not loopback: its ports are reachable from other hosts")
    if not _REAPER:  # kill -9 of this driver must not leave Ray's agents running (ray.init's hooks don't run)
        from avspo_openrlhf.cpu.reaper import start_reaper

        _REAPER.append(start_reaper())


class RayStart:
    """:func:`init_ray` in a thread of its own, started now; :meth:`wait` joins it where the run needs
    Ray, :meth:`close` stops Ray after the run (or when the run fails before it used Ray).

    The thread lives until :meth:`close`: Ray starts its GCS and raylet with ``PR_SET_PDEATHSIG``,
    which Linux ties to the *thread* that forked them, so a starter thread that ended took them with it
    (the driver's next Ray call then hung for 60 s). What Ray logs or warns from that thread while it
    starts (``Started a local Ray instance``, a tip about accelerator variables) is held and replayed
    by :meth:`wait`, inside the driver's console, so it reaches the run's log as before rather than a
    terminal the console has not taken yet. The workers' environment is set in the calling thread,
    before it goes on. ``then``, if given, runs in the thread once Ray is up (the run's vLLM engines,
    launched a second or so before the driver's own imports would let it): :attr:`launched` holds what
    it returned and when; its error is re-raised by :meth:`wait`, like Ray's own."""

    def __init__(self, extra_env: dict[str, str] | None = None, then: Callable[[], Any] | None = None):
        env = _environment(extra_env)
        self._held = _HeldOutput()
        self._ready, self._done = threading.Event(), threading.Event()
        self._error: BaseException | None = None
        self._then = then
        self.span = (time.time(), time.time())  # (started, ready), wall clock: the start-up timeline's
        self.launched: tuple[Any, float] | None = None  # (what ``then`` returned, when it returned)
        self._thread = threading.Thread(target=self._run, args=(env,), name="avspo-ray-start", daemon=True)
        self._thread.start()

    def _run(self, env: dict[str, str]) -> None:
        ready = None
        try:
            with self._held.capture():
                if not ray.is_initialized():
                    _start(env)
                ready = time.time()
                if self._then is not None:  # what needs Ray first (the vLLM engines: cli/train.py)
                    self.launched = (self._then(), time.time())
        except BaseException as e:  # re-raised by wait(), in the driver's thread
            self._error = e
        finally:
            self.span = (self.span[0], ready or time.time())
            self._ready.set()
        self._done.wait()  # Ray's GCS and raylet die with this thread

    def wait(self) -> None:
        """Ray is up (its start's error re-raised here); its held lines written now."""
        self._ready.wait()
        self._held.replay()
        if self._error is not None:
            raise self._error

    def close(self) -> None:
        """Ray shut down if it is still up, then the thread ends (a no-op once closed)."""
        self._ready.wait()
        if not self._done.is_set():
            if ray.is_initialized():
                ray.shutdown()
            self._done.set()


class _HeldOutput:
    """The log records and warnings one thread makes while :meth:`capture` is open, held (not written)
    until :meth:`replay`. Other threads' output passes as it comes."""

    def __init__(self):
        self.records: list[logging.LogRecord] = []
        self.warnings: list[tuple] = []

    @contextlib.contextmanager
    def capture(self):
        ident = threading.get_ident()
        held = self

        class Hold(logging.Filter):
            def filter(self, record: logging.LogRecord) -> bool:
                if record.thread != ident:
                    return True
                if not any(r is record for r in held.records):  # one record meets each handler's filter
                    held.records.append(record)
                return False

        def show(message, category, filename, lineno, file=None, line=None):
            if threading.get_ident() == ident:
                held.warnings.append((message, category, filename, lineno, file, line))
            else:
                shown(message, category, filename, lineno, file, line)

        handlers = {*logging.getLogger("ray").handlers, *logging.getLogger().handlers}
        hold, shown = Hold(), warnings.showwarning
        for handler in handlers:
            handler.addFilter(hold)
        warnings.showwarning = show
        try:
            yield
        finally:
            for handler in handlers:
                handler.removeFilter(hold)
            if warnings.showwarning is show:
                warnings.showwarning = shown

    def replay(self) -> None:
        records, self.records, held, self.warnings = self.records, [], self.warnings, []
        for record in records:
            logging.getLogger(record.name).handle(record)
        for w in held:
            warnings.showwarning(*w)
