"""The async staleness bound (``--buffer.max_staleness``): a batch generated more policy versions
ago than the bound is not trained; its prompts are re-queued for generation with the current
weights (``--buffer.stale_policy regenerate``) or dropped. Sync batches are never stale.
"""

from __future__ import annotations

from openrlhf.utils.logging_utils import init_logger

from .samples import BatchMeta

logger = init_logger(__name__)


class StalenessMixin:
    """Goes before an OpenRLHF trainer class in the MRO (with ``RemedyTrainerMixin``); the async
    training actor overrides :meth:`_requeue` (through the ``AsyncCoordinator``)."""

    def _too_stale(self, rollout_samples, meta: BatchMeta, global_step: int, extra: dict) -> bool:
        """Logs the batch's staleness into ``extra``; True (the batch re-queued or dropped) when it
        exceeds the bound."""
        staleness = global_step - meta.policy_version
        extra["async/staleness"] = float(staleness)
        extra["async/policy_version"] = float(meta.policy_version)
        bound = self.cfg.buffer.max_staleness
        if bound is None or staleness <= bound:
            return False
        self.counters["dropped_stale_batches"] += 1
        n = self.args.rollout.n_samples_per_prompt
        if self.cfg.buffer.stale_policy == "regenerate":
            firsts = rollout_samples[::n]  # the generator emits each prompt's n samples together
            sources = meta.group_datasources or [None] * len(firsts)
            batches = [([ds], s.prompts[:1], s.labels[:1], (s.images or [None])[:1]) for ds, s in zip(sources, firsts)]
            self._requeue(batches)
            self.counters["requeued_prompts"] += len(batches)
        logger.warning(
            f"[avspo] batch of {len(rollout_samples)} samples is {staleness} versions stale "
            f"(> --buffer.max_staleness {bound}): {self.cfg.buffer.stale_policy}"
        )
        return True

    def _requeue(self, batches) -> None:
        raise NotImplementedError("re-generation needs the async trainer")
