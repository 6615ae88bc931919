"""An in-process ``ray`` for a GPU machine that has no Ray (its wheel is 70 MB; a bare machine may
only take small transfers): enough of Ray's module surface for OpenRLHF 0.11.2 and this package to
import, with actors built in this process. ``ray.remote(cls)`` keeps the class as
``__ray_actor_class__`` (what the tests instantiate), ``ray.get``/``ray.put`` pass values through.
Anything that needs a real cluster (placement groups, collective groups, queues between processes)
raises when called: tests that need it skip where this stand-in is installed."""

from __future__ import annotations

import importlib.machinery
import sys
import types


def _module(name: str, **attrs) -> types.ModuleType:
    mod = types.ModuleType(name)
    mod.__spec__ = importlib.machinery.ModuleSpec(name, None)
    mod.__dict__.update(attrs)
    mod.__avspo_ray_stand_in__ = True
    return mod


def _cluster_only(name: str):
    def fn(*args, **kwargs):
        raise RuntimeError(f"ray.{name} needs a real Ray cluster; this process runs the in-process stand-in")

    return fn


class ObjectRef:
    def __init__(self, value):
        self.value = value


def get(refs, timeout=None):
    if isinstance(refs, list):
        return [get(r) for r in refs]
    return refs.value if isinstance(refs, ObjectRef) else refs


def put(value, **_):
    return ObjectRef(value)


class _BoundMethod:
    def __init__(self, fn):
        self.fn = fn

    def remote(self, *args, **kwargs):
        return ObjectRef(self.fn(*get(list(args)), **{k: get(v) for k, v in kwargs.items()}))

    def options(self, **_):
        return self


class ActorHandle:
    """A handle whose actor lives in this process: ``handle.method.remote(...)`` calls it now."""

    def __init__(self, instance):
        self._instance = instance

    def __getattr__(self, name):
        if name.startswith("__"):
            raise AttributeError(name)
        return _BoundMethod(getattr(self._instance, name))


class ActorClass:
    def __init__(self, cls, options):
        self.__ray_actor_class__ = cls
        self._options = options

    def remote(self, *args, **kwargs):
        return ActorHandle(self.__ray_actor_class__(*get(list(args)), **{k: get(v) for k, v in kwargs.items()}))

    def options(self, **options):
        return ActorClass(self.__ray_actor_class__, {**self._options, **options})


class RemoteFunction:
    def __init__(self, fn):
        self._function = fn

    def remote(self, *args, **kwargs):
        return ObjectRef(self._function(*get(list(args)), **{k: get(v) for k, v in kwargs.items()}))

    def options(self, **_):
        return self


def remote(*args, **options):
    def wrap(obj):
        return ActorClass(obj, options) if isinstance(obj, type) else RemoteFunction(obj)

    if len(args) == 1 and not options and callable(args[0]):  # @ray.remote without arguments
        return wrap(args[0])
    return wrap


class PlacementGroup:
    def __init__(self, *args, **kwargs):
        raise RuntimeError("placement groups need a real Ray cluster; this process runs the in-process stand-in")


class PlacementGroupSchedulingStrategy:
    def __init__(self, *args, **kwargs):
        self.args, self.kwargs = args, kwargs


def install() -> bool:
    """Register the stand-in as ``ray`` when Ray is not installed; True when it was registered."""
    import importlib.util

    if sys.modules.get("ray") is not None or ("ray" not in sys.modules and importlib.util.find_spec("ray")):
        return False  # a real Ray (sys.modules["ray"] = None, as a test may set it, means none)
    ray = _module(
        "ray",
        __version__="0.0.0-stand-in",
        ObjectRef=ObjectRef,
        get=get,
        put=put,
        remote=remote,
        wait=lambda refs, num_returns=1, timeout=None: (list(refs)[:num_returns], list(refs)[num_returns:]),
        is_initialized=lambda: True,
        init=lambda *a, **k: None,
        shutdown=lambda *a, **k: None,
        get_gpu_ids=lambda: [0],
        nodes=lambda: [],
        kill=lambda *a, **k: None,
    )
    pg = _module(
        "ray.util.placement_group", PlacementGroup=PlacementGroup, placement_group=_cluster_only("util.placement_group")
    )
    strategies = _module(
        "ray.util.scheduling_strategies", PlacementGroupSchedulingStrategy=PlacementGroupSchedulingStrategy
    )
    queue = _module("ray.util.queue", Queue=_cluster_only("util.queue.Queue"))
    collective = _module("ray.util.collective")
    util = _module(
        "ray.util",
        placement_group=pg,
        scheduling_strategies=strategies,
        queue=queue,
        collective=collective,
        placement_group_table=_cluster_only("util.placement_group_table"),
    )
    services = _module("ray._private.services", get_node_ip_address=lambda: "127.0.0.1")
    worker = _module("ray._private.worker", global_worker=None)
    private = _module("ray._private", services=services, worker=worker)
    actor = _module("ray.actor", ActorClass=ActorClass, ActorHandle=ActorHandle)
    ray.util, ray._private, ray.actor = util, private, actor
    sys.modules.update(
        {m.__name__: m for m in (ray, util, pg, strategies, queue, collective, services, worker, private, actor)}
    )
    return True


def is_stand_in() -> bool:
    return getattr(sys.modules.get("ray"), "__avspo_ray_stand_in__", False)
