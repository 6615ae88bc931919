"""Math answer verification: extraction, math-verify comparison with explicit statuses, and a
process pool whose per-sample timeout cannot be defeated."""

from .extract import extract_answer, last_boxed, response_from_query
from .pool import VerifierPool, default_pool
from .verify import STATUSES, VerifyResult, verify_answer

__all__ = [
    "STATUSES",
    "VerifierPool",
    "VerifyResult",
    "default_pool",
    "extract_answer",
    "last_boxed",
    "response_from_query",
    "verify_answer",
]
