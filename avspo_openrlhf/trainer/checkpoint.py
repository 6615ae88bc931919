"""Crash-safe DeepSpeed checkpoints: the new one is complete before an old one is removed.

OpenRLHF 0.11.2's ``DeepspeedStrategy.save_ckpt`` evicts old checkpoints to make room *before* it
writes the new one, and DeepSpeed rewrites ``latest`` in place. With ``--ckpt.max_num 1`` (the
quickstart's) a ``kill -9`` during a save left no checkpoint at all, ``latest`` naming the deleted
folder, and every rerun died in DeepSpeed's bare ``AssertionError``. :class:`CrashSafeStrategy`
changes the order and nothing else:

1. DeepSpeed writes the new ``<tag>/`` with no eviction and without touching ``latest``;
2. rank 0 marks it complete (:data:`COMPLETE`) and points ``latest`` at it atomically
   (temporary file + ``os.replace``);
3. only then are old checkpoints evicted, by OpenRLHF's own order (no metric first, then worst
   metric, then oldest) and limits (``max_num`` including the new one, ``max_mem`` GB).

On resume, :func:`resume_tag` picks what to load: ``latest`` when it names a complete checkpoint,
else the newest complete one (said in one line); a folder with checkpoints but none complete is
one clear error. Checkpoints written before this marker existed are loaded as ``latest`` says.
"""

from __future__ import annotations

import os
import re
import shutil

from openrlhf.utils.deepspeed import DeepspeedStrategy

from avspo_openrlhf.atomic import atomic_write

COMPLETE = "AVSPO_COMPLETE"
_STEP = re.compile(r"global_step(\d+)")


class IncompleteCheckpoints(RuntimeError):
    """Checkpoint folders exist, none of them complete."""


def _checkpoints(save_dir: str) -> list[str]:
    if not os.path.isdir(save_dir):
        return []
    return sorted(d for d in os.listdir(save_dir) if os.path.isdir(os.path.join(save_dir, d)))


def is_complete(save_dir: str, tag: str) -> bool:
    return os.path.exists(os.path.join(save_dir, tag, COMPLETE))


def _order(save_dir: str, tag: str) -> tuple:
    """Newest first: the step number in the tag, then the folder's time."""
    m = _STEP.search(tag)
    return (int(m.group(1)) if m else -1, os.path.getmtime(os.path.join(save_dir, tag)))


def resume_tag(save_dir: str, say=print) -> str | None:
    """The checkpoint to resume from in ``save_dir`` (see the module docstring); None when there
    is none. Raises :class:`IncompleteCheckpoints` when every checkpoint there is torn."""
    tags = _checkpoints(save_dir)
    latest_file = os.path.join(save_dir, "latest")
    latest = None
    if os.path.exists(latest_file):
        with open(latest_file, encoding="utf-8", errors="replace") as f:
            latest = f.read().strip() or None
    complete = [t for t in tags if is_complete(save_dir, t)]
    if not complete:
        if latest in tags:
            return latest  # saved before the completion marker existed: DeepSpeed's 'latest', as before
        if tags:
            raise IncompleteCheckpoints(
                f"{save_dir} holds checkpoint folders ({', '.join(tags)}) but none is complete (every save was "
                "interrupted): delete it to start over, or point --ckpt.path elsewhere"
            )
        return None
    if latest in complete:
        return latest
    best = max(complete, key=lambda t: _order(save_dir, t))
    say(
        f"[avspo] {save_dir}: 'latest' names {latest!r}, which is not a complete checkpoint (a save was "
        f"interrupted): resuming from {best}"
    )
    return best


class CrashSafeStrategy(DeepspeedStrategy):
    """OpenRLHF's DeepSpeed strategy whose checkpoints survive a kill at any moment."""

    def save_ckpt(
        self,
        model,
        save_dir,
        tag=None,
        max_num=3,
        max_mem=1000,
        client_state=None,
        save_latest=True,
        metric_value=None,
        metric_key=None,
    ):
        if tag is None:  # DeepSpeed names it; keep OpenRLHF's behaviour for this rare call
            return super().save_ckpt(
                model, save_dir, tag, max_num, max_mem, client_state, save_latest, metric_value, metric_key
            )
        # no eviction and no 'latest' yet: both happen below, once the new checkpoint is whole
        super().save_ckpt(
            model,
            save_dir,
            tag,
            max_num=10**9,
            max_mem=10**9,
            client_state=client_state,
            save_latest=False,
            metric_value=metric_value,
            metric_key=metric_key,
        )
        if not self.is_rank_0():
            return
        atomic_write(os.path.join(save_dir, tag, COMPLETE), "", fsync=True)
        if save_latest:
            atomic_write(os.path.join(save_dir, "latest"), tag, fsync=True)
        self._evict(save_dir, tag, max_num, max_mem)

    def _evict(self, save_dir: str, keep: str, max_num: int, max_mem: float) -> None:
        """OpenRLHF's eviction order and limits, applied after the new checkpoint ``keep`` is whole;
        torn folders (no completion marker) go first."""

        def size(path):
            return sum(os.path.getsize(os.path.join(d, f)) for d, _, fs in os.walk(path) for f in fs)

        tags = [t for t in _checkpoints(save_dir) if not t.startswith("best") and t != keep]
        torn = [t for t in tags if not is_complete(save_dir, t)]
        for t in torn:
            shutil.rmtree(os.path.join(save_dir, t), ignore_errors=True)
        regular = [t for t in tags if t not in torn]
        candidates = sorted(
            regular,
            key=lambda t: (
                (m := self._read_ckpt_metric(os.path.join(save_dir, t))) is not None,
                m if m is not None else float("-inf"),
                os.path.getmtime(os.path.join(save_dir, t)),
            ),
        )
        total = sum(size(os.path.join(save_dir, t)) for t in _checkpoints(save_dir))
        while candidates and (len(candidates) + 1 > max_num or total > max_mem * 1024**3):
            victim = os.path.join(save_dir, candidates.pop(0))
            total -= size(victim)
            shutil.rmtree(victim, ignore_errors=True)
            self.print(f"Deleted checkpoint {victim} (after {keep} was complete)")

    def load_ckpt(self, model, load_dir, tag=None, **kwargs):
        if tag is None:
            tag = resume_tag(load_dir, say=self.print)
            if tag is None:  # nothing saved yet: OpenRLHF's own warning and an empty state
                return super().load_ckpt(model, load_dir, None, **kwargs)
        return super().load_ckpt(model, load_dir, tag, **kwargs)


def crash_safe_strategy(args) -> CrashSafeStrategy:
    """``openrlhf.utils.get_strategy(args)`` with crash-safe checkpoints: the same object,
    built by OpenRLHF from ``args``; our class adds only the two methods above."""
    from openrlhf.utils import get_strategy

    strategy = get_strategy(args)
    strategy.__class__ = CrashSafeStrategy
    return strategy
