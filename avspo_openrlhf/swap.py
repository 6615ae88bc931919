"""``Swap``: set ``obj.name = new`` for a ``with`` block (or between ``start`` and ``stop``) and put
the original back on exit; an attribute the object only inherited is removed again, not copied
down. The one mechanism behind every run-time replacement (``install.py``): no mocking library
in the package."""

from __future__ import annotations

_MISSING = object()


class Swap:
    def __init__(self, target, attribute: str, new):
        if not hasattr(target, attribute):
            raise AttributeError(f"{target!r} has no attribute {attribute!r} to replace")
        self.target, self.attribute, self.new = target, attribute, new
        self._saved = _MISSING

    def start(self):
        if self._saved is not _MISSING:
            raise RuntimeError(f"{self} is already applied")
        own = vars(self.target) if hasattr(self.target, "__dict__") else {}
        self._saved = own.get(self.attribute, _MISSING), getattr(self.target, self.attribute)
        self._inherited = self.attribute not in own
        setattr(self.target, self.attribute, self.new)
        return self.new

    def stop(self) -> None:
        if self._saved is _MISSING:
            return
        own, _ = self._saved
        if self._inherited:
            delattr(self.target, self.attribute)
        else:
            setattr(self.target, self.attribute, own)
        self._saved = _MISSING

    def original(self):
        """The attribute as it was before :meth:`start` (the current one when not applied)."""
        return getattr(self.target, self.attribute) if self._saved is _MISSING else self._saved[1]

    def __enter__(self):
        return self.start()

    def __exit__(self, *exc) -> None:
        self.stop()

    def __repr__(self) -> str:
        name = getattr(self.target, "__name__", type(self.target).__name__)
        return f"Swap({name}.{self.attribute})"
