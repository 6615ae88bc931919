"""The tokenizer sent to the rollout engines once, not with every prompt.

OpenRLHF's ``SamplesGenerator`` passes its Hugging Face tokenizer as an argument of every
``generate_responses`` call, one call per prompt: the engine unpickled it each time (0.11 s for
SmolLM2's on a 2-core Intel Xeon, so 7 s of engine time a step at 64 prompts). An engine with
:class:`HoldsTokenizer` keeps one copy under a key; the generator then sends :class:`TokenizerByKey`,
which pickles as that key and unpickles, in the engine, as the held tokenizer. A module of its own
that imports nothing: the engine's process unpickles through it."""

from __future__ import annotations

_HELD: dict[str, object] = {}  # key -> tokenizer, in an engine's process


def held_tokenizer(key: str):
    try:
        return _HELD[key]
    except KeyError:
        raise RuntimeError(
            f"this engine holds no tokenizer {key!r}: it was not given one (HoldsTokenizer.hold_tokenizer) "
            "or it restarted since"
        ) from None


class HoldsTokenizer:
    """Engine-actor mixin: the generator's tokenizer, kept for the calls that name it by key."""

    async def hold_tokenizer(self, key: str, tokenizer) -> None:
        _HELD[key] = tokenizer


class TokenizerByKey:
    """The generator's tokenizer in its process, its key on the wire (``held_tokenizer`` on the other side)."""

    def __init__(self, tokenizer, key: str):
        self.tokenizer, self.key = tokenizer, key

    def __reduce__(self):
        return held_tokenizer, (self.key,)

    def __getattr__(self, name):
        return getattr(self.__dict__["tokenizer"], name)

    def __call__(self, *args, **kwargs):
        return self.tokenizer(*args, **kwargs)


def send_once(tokenizer, engines) -> object:
    """``tokenizer`` given to every engine that can hold it, and what to send in its place; engines
    without :class:`HoldsTokenizer` (OpenRLHF's GPU ones) keep getting the tokenizer itself."""
    import uuid

    import ray

    if not engines or not all(hasattr(e, "hold_tokenizer") for e in engines):
        return tokenizer
    key = uuid.uuid4().hex
    ray.get([e.hold_tokenizer.remote(key, tokenizer) for e in engines])
    return TokenizerByKey(tokenizer, key)
