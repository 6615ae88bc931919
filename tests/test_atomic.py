"""``avspo_openrlhf/atomic.py``: a file is replaced whole or not at all."""

import os

import pytest

from avspo_openrlhf.atomic import atomic_file, atomic_write, write_json


def test_a_write_replaces_the_file_whole_and_leaves_no_temporary(tmp_path):
    path = tmp_path / "a.json"
    atomic_write(path, "old")
    write_json(path, {"x": "é"}, indent=1)
    assert path.read_text(encoding="utf-8") == '{\n "x": "\\u00e9"\n}'
    atomic_write(path, b"\x00bytes", fsync=True)
    assert path.read_bytes() == b"\x00bytes"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["a.json"]


def test_a_failed_write_keeps_the_previous_file_and_removes_its_temporary(tmp_path):
    path = tmp_path / "ckpt.txt"
    atomic_write(path, "step 3")
    with pytest.raises(RuntimeError, match="killed"):
        with atomic_file(path) as f:
            f.write("step 4, half")
            raise RuntimeError("killed mid-write")
    assert path.read_text(encoding="utf-8") == "step 3"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["ckpt.txt"]


def test_the_file_is_created_under_the_umask_and_a_mode_is_checked(tmp_path):
    old = os.umask(0o027)
    try:
        atomic_write(tmp_path / "f", "x")
    finally:
        os.umask(old)
    assert (tmp_path / "f").stat().st_mode & 0o777 == 0o640
    with pytest.raises(ValueError, match="mode must be"):
        with atomic_file(tmp_path / "g", "a"):
            pass
