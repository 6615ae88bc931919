"""Our trainers' state in OpenRLHF's checkpoints: the controller's (ACR tracker, adaptive threshold,
monitors, random generator) and the cumulative counters, saved in ``client_states[STATE_KEY]``
beside OpenRLHF's and restored on resume, with the policy version and ``metrics.jsonl`` rewound to
the checkpoint's step.
"""

from __future__ import annotations

from openrlhf.utils.logging_utils import init_logger

logger = init_logger(__name__)

STATE_KEY = "controller_state"
LEGACY_STATE_KEYS = ("avspo_state",)  # written before 0.2: still resumed


class RemedyStateMixin:
    """Goes before an OpenRLHF trainer class in the MRO (with ``RemedyTrainerMixin``): reads and
    restores ``controller``, ``counters`` and ``policy_version``."""

    def remedy_state_dict(self) -> dict:
        return {"controller": self.controller.state_dict(), "counters": dict(self.counters)}

    def load_remedy_state_dict(self, state: dict) -> None:
        self.controller.load_state_dict(state["controller"])
        self.counters.update(state["counters"])

    def restore_best_checkpoint_state(self, checkpoint_states) -> None:
        super().restore_best_checkpoint_state(checkpoint_states)
        if checkpoint_states:
            self.policy_version = int(checkpoint_states.get("global_step", 0))
            state = next(
                (checkpoint_states[k] for k in (STATE_KEY, *LEGACY_STATE_KEYS) if checkpoint_states.get(k)), None
            )
            if state:
                self.load_remedy_state_dict(state)
                logger.info(f"[avspo] restored ACR/threshold state at step {self.policy_version}")
            # steps logged after it are trained again: logged once. From no checkpoint (step 0) too: an
            # earlier attempt that saved none (stopped by --run.max_steps before --save-steps, killed
            # while writing its final model) is trained again from the start, and its rows go
            if self.cfg.report.dir:
                from avspo_openrlhf.report import JsonlLogger

                dropped = JsonlLogger(self.cfg.report.dir).truncate_after(self.policy_version)
                if dropped:
                    logger.info(f"[avspo] metrics.jsonl: {dropped} row(s) after step {self.policy_version} dropped")

    def save_best_checkpoint(self, eval_metrics, global_step, client_states=None):
        client_states = dict(client_states or {}, **{STATE_KEY: self.remedy_state_dict()})
        return super().save_best_checkpoint(eval_metrics, global_step, client_states)
