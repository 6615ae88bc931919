"""When our trainers stop: Ctrl-C in ``avspo-train`` (the STOP file, ``stop_file.py``), ``--run.max_steps``,
the generated-token budget (``--run.max_generated_tokens``) and ``--monitor.stop_on_alarm``. A stop
checkpoints first where the regular save did not, then asks the samples generator to report
"exhausted", so OpenRLHF's ``fit`` ends normally.
"""

from __future__ import annotations

import os

import ray
from openrlhf.utils.logging_utils import init_logger

from .stop_file import stop_file, stopped_marker

logger = init_logger(__name__)


class StopPolicyMixin:
    """Goes before an OpenRLHF trainer class in the MRO (with ``RemedyTrainerMixin``): reads
    ``cfg``, ``counters`` and ``controller``, sets ``stop_reason``."""

    def _stopped(self, global_step: int) -> bool:
        """Whether this batch must not be trained: the run was stopped (batches still in flight), or
        a resumed run had already reached its step limit or token budget (no extra step)."""
        if not self.stop_reason and (reason := self._limit_reason(global_step)):
            self.stop_reason = reason
            logger.info(f"[avspo] {self.stop_reason} before this batch: not trained")
            self._request_stop()
        return bool(self.stop_reason)

    def _maybe_stop(self, global_step: int, client_states: dict) -> None:
        if self.stop_reason:
            return
        if os.path.exists(stop_file(self.args)):  # Ctrl-C in avspo-train: checkpoint, then stop
            self._save_now(global_step, client_states)
            os.remove(stop_file(self.args))
            with open(stopped_marker(self.args), "w") as f:  # tells avspo-train to exit 130 (resume me)
                f.write(f"{global_step}\n")
            self.stop_reason = f"interrupted at step {global_step}"
            logger.warning(f"[avspo] {self.stop_reason}: checkpoint saved in {self.args.ckpt.path}")
            self._request_stop()
            return
        self.stop_reason = self._limit_reason(global_step)
        if self.stop_reason:
            logger.info(f"[avspo] {self.stop_reason}")
            self._request_stop()
            return
        stop = set(self.cfg.monitor.stop_on_alarm)
        fired = [a for a, on in self.controller.alarms().items() if on and (a in stop or "any" in stop)]
        if not fired:
            return
        self._save_now(global_step, client_states)
        self.stop_reason = f"alarm(s) {fired} at step {global_step}"
        logger.error(
            f"[avspo] stopping: {self.stop_reason} (--monitor.stop_on_alarm); checkpoint in {self.args.ckpt.path}"
        )
        self._request_stop()

    def _limit_reason(self, global_step: int) -> str:
        """Why the run must not train another step (``--run.max_steps``, the token budget), or ""."""
        limit, budget = self.cfg.run.max_steps, self.cfg.run.max_generated_tokens
        if limit is not None and global_step >= limit:
            return f"--run.max_steps {limit} reached"
        tokens = self.counters.get("generated_tokens", 0.0)
        if budget is not None and tokens >= budget:
            return f"--run.max_generated_tokens {budget} reached ({tokens:.0f})"
        return ""

    def _save_now(self, global_step: int, client_states: dict) -> None:
        if global_step % self.args.ckpt.save_steps == 0:
            return  # saved by save_logs_and_checkpoints already
        tag = f"global_step{global_step}"
        refs = self.actor_model_group.async_run_method(
            method_name="save_checkpoint", tag=tag, client_states=client_states
        )
        if self.critic_model_group is not None:
            refs.extend(self.critic_model_group.async_run_method(method_name="save_checkpoint", tag=tag))
        ray.get(refs)

    def _request_stop(self) -> None:
        self.samples_generator.stop = True  # the generator reports "exhausted"; fit() ends normally
