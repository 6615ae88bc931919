"""The Ray ``worker_process_setup_hook`` of the CPU backend (named by ``backend.py`` as a string,
which Ray imports in each worker: it lives in this layer so that string points down, never up)."""

from __future__ import annotations

import sys


def install_cpu_worker() -> None:
    """Stand-ins for the GPU-only modules (``compat.py``), then the CUDA-call replacements of
    ``cuda_shims.py`` for the rest of this worker process (a worker lives for one run: never
    restored), each set applied when the module that holds it is first imported. Imports nothing
    heavy: applied eagerly, they imported torch, OpenRLHF and DeepSpeed in every worker, 14 CPU-s
    each (2-core AMD EPYC), also in the async trainer's queue and lock actors, which use none of them."""
    from avspo_openrlhf import startup_gc
    from avspo_openrlhf.cpu.compat import install_gpu_module_stubs
    from avspo_openrlhf.cpu.cuda_shims import replacements_by_module
    from avspo_openrlhf.swap import Swap

    def apply(build):
        def action(module) -> None:
            for obj, name, value in build(module):
                Swap(obj, name, value).start()

        return action

    install_gpu_module_stubs()
    after_import({name: apply(build) for name, build in replacements_by_module().items()})
    # the actor's imports come next: without the collector walking them (startup_gc.py); the engine and
    # the model actors resume it when ready, any other actor once its imports settle
    startup_gc.pause()
    startup_gc.resume_after_imports()


def after_import(actions: dict) -> None:
    """Run ``actions[name](module)`` once, right after module ``name`` is first imported, before the
    importer gets it (so no one holds what the action replaces); at once for one already imported."""
    pending = {}
    for name, action in actions.items():
        if name in sys.modules:
            action(sys.modules[name])
        else:
            pending[name] = action
    if pending:
        sys.meta_path.insert(0, _AfterImport(pending))


class _AfterImport:
    """A meta-path finder that finds nothing itself: for a watched name it asks the finders after it
    and wraps the loader they return, so that the action runs after the module's own code."""

    def __init__(self, actions: dict):
        self.actions = actions

    def find_spec(self, name, path, target=None):
        if name not in self.actions:
            return None
        for finder in sys.meta_path[sys.meta_path.index(self) + 1 :]:
            spec = finder.find_spec(name, path, target) if hasattr(finder, "find_spec") else None
            if spec is not None:
                break
        else:
            return None
        spec.loader = _Then(spec.loader, self.actions.pop(name))
        if not self.actions:
            sys.meta_path.remove(self)
        return spec


class _Then:
    """A loader that runs its loader, then the action; the module keeps the original loader."""

    def __init__(self, loader, action):
        self.loader, self.action = loader, action

    def create_module(self, spec):
        return self.loader.create_module(spec)

    def exec_module(self, module) -> None:
        module.__loader__ = module.__spec__.loader = self.loader
        self.loader.exec_module(module)
        self.action(module)

    def __getattr__(self, name):
        return getattr(self.loader, name)
