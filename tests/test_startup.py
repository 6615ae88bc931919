"""The start-up timeline (avspo_openrlhf/startup.py): the driver's phases follow one another from
the process's start, another process's phase is a span of its own, a later run in the same process
counts from its own start; the collector paused for the start-up and given back (startup_gc.py). The
timeline of a real run is checked in tests/test_cpu_pipeline.py."""

import json
import time

from avspo_openrlhf.startup import StartupTimeline, process_start_time


def test_driver_phases_tile_the_time_from_the_process_start():
    t = StartupTimeline(t0=100.0)
    t.mark("imports", now=103.0)
    t.mark("Ray", now=110.5)
    t.span("vLLM engine", 104.0, 112.0, "engine 0")
    t.mark("engines attached", now=112.0)
    state = t.state_dict()
    driver = [s for s in state["spans"] if s["where"] == "driver"]
    assert [(s["phase"], s["start_s"], s["end_s"]) for s in driver] == [
        ("imports", 0.0, 3.0),
        ("Ray", 3.0, 10.5),
        ("engines attached", 10.5, 12.0),
    ]
    assert state["total_s"] == 12.0 and state["process_start"] == 100.0
    assert "start-up 12.0 s: imports 3.0, Ray 7.5, engines attached 1.5" in t.summary()
    assert "vLLM engine 8.0 (ready at 12.0)" in t.summary()


def test_a_later_run_in_the_same_process_counts_from_its_own_start():
    t = StartupTimeline(t0=time.time() - 50)
    t.begin_run()  # the first run: from the process's start
    assert t.t0 < time.time() - 40
    t.mark("imports")
    t.begin_run()  # a second run: its phases start now, the first run's are gone
    assert t.spans == [] and time.time() - t.t0 < 5


def test_the_process_start_is_before_this_test(tmp_path):
    assert process_start_time() < time.time() - 0.01
    t = StartupTimeline()
    t.mark("everything so far")
    t.write(str(tmp_path / "report"))
    state = json.loads((tmp_path / "report" / "startup.json").read_text())
    assert state["spans"][0]["start_s"] == 0.0 and state["total_s"] > 0
    assert not list((tmp_path / "report").glob("*.tmp"))
    t.write(None)  # no report folder: nothing written, no error


def test_the_collector_is_paused_for_the_start_up_and_given_back():
    import gc
    import sys
    import types

    from avspo_openrlhf import startup_gc

    assert gc.isenabled()
    startup_gc.pause()
    try:
        assert not gc.isenabled()
        startup_gc.pause()  # paused twice, resumed once: on again
    finally:
        startup_gc.resume()
    assert gc.isenabled()
    startup_gc.resume()  # idempotent
    assert gc.isenabled()
    gc.disable()  # a process that turned the collector off itself keeps it off
    try:
        startup_gc.pause()
        startup_gc.resume()
        assert not gc.isenabled()
    finally:
        gc.enable()
    # a worker without a point of its own: resumed once no module was imported for quiet_s
    startup_gc.pause()
    try:
        watch = startup_gc.resume_after_imports(quiet_s=0.3, poll_s=0.05)
        for k in range(4):  # imports keep it paused
            sys.modules[f"_avspo_test_import_{k}"] = types.ModuleType("x")
            watch.join(0.1)
            assert not gc.isenabled() and watch.is_alive()
        watch.join(5)
        assert gc.isenabled() and not watch.is_alive()
    finally:
        startup_gc.resume()
        for k in range(4):
            sys.modules.pop(f"_avspo_test_import_{k}", None)


def test_the_imports_are_frozen_out_of_the_collectors_sight():
    import gc

    from avspo_openrlhf import startup_gc

    gc.unfreeze()
    try:
        startup_gc.freeze_imports()
        assert gc.get_freeze_count() > 0
        # an imported object (this function) is no longer in any generation the collector walks
        assert not any(o is startup_gc.freeze_imports for o in gc.get_objects())
    finally:
        gc.unfreeze()
