"""Fake ``ray`` for the launch tests: ``nodes()`` reads the nodes the fake ``ray start`` registered."""

import os


def init(address=None, **_):
    if not os.path.isdir(os.environ["FAKE_STATE"]):
        raise ConnectionError(f"no cluster at {address}")


def nodes():
    d = os.path.join(os.environ["FAKE_STATE"], "nodes")
    out = []
    for name in sorted(os.listdir(d)) if os.path.isdir(d) else []:
        gpus = float(open(os.path.join(d, name)).read().split()[0])
        out.append({"Alive": True, "NodeManagerHostname": name, "Resources": {"GPU": gpus}})
    return out


def shutdown():
    pass
