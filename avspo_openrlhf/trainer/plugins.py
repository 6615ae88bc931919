"""``--plugin``: a user's module that registers remedies, imported once per process, before the
flags are built (their ``--NAME.*`` groups) and in every process that reads them."""

from __future__ import annotations

import importlib
import importlib.util
import os
import sys

from avspo_openrlhf.algo.advantages import ESTIMATORS


def load_plugins(specs) -> None:
    """Import each ``--plugin`` (a dotted module name or a ``.py`` file) once per process, so that its
    ``register_estimator`` calls add its remedies. avspo-train calls this before it builds the parser
    (their flags and ``--help`` sections), and :func:`settings` in every process that reads the
    flags, so each Ray worker imports the module too. A module that cannot be found is one line."""
    for spec in specs or ():
        if not isinstance(spec, str) or not spec:
            raise ValueError(f"--plugin must name a module or a .py file, got {spec!r}")
        if not spec.endswith(".py"):
            # a module name is looked up from the current folder too, as the message below says (a console
            # script's sys.path does not hold it)
            if os.getcwd() not in sys.path:
                sys.path.append(os.getcwd())
            try:
                importlib.import_module(spec)
            except ModuleNotFoundError as e:
                if e.name is None or not spec.startswith(e.name):
                    raise  # the plugin itself imports something missing: its own traceback
                raise ValueError(
                    f"--plugin {spec}: no module named {e.name!r} (on sys.path: PYTHONPATH or the current folder)"
                ) from None
            continue
        path = os.path.abspath(spec)
        name = os.path.splitext(os.path.basename(path))[0]
        loaded = sys.modules.get(name)
        if loaded is not None:
            if os.path.abspath(getattr(loaded, "__file__", None) or "") != path:
                raise ValueError(f"--plugin {spec}: a module named {name!r} is already loaded from elsewhere")
            continue
        if not os.path.isfile(path):
            raise ValueError(f"--plugin {spec}: no such file")
        module_spec = importlib.util.spec_from_file_location(name, path)
        module = importlib.util.module_from_spec(module_spec)
        sys.modules[name] = module  # before it runs: dataclasses and pickle look their module up by name
        try:
            module_spec.loader.exec_module(module)
        except BaseException:
            del sys.modules[name]
            raise


def remedy_configs() -> dict[str, type]:
    """The advantage remedies ``--remedy`` offers that have options: every registered estimator with a
    config, its flag namespace its name (``--avspo.*``), in registration order. Read when called, so
    that an estimator a ``--plugin`` module registered is one like this package's."""
    import avspo_openrlhf.algo  # noqa: F401  (importing the remedy modules registers them)

    return {name: e.config for name, e in ESTIMATORS.items() if e.config is not None}
