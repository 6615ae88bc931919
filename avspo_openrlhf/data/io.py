"""Reading raw rows (local files or the hub) and writing the prepared jsonl, with bad rows
reported by file and line (or skipped and counted with ``skip_bad_rows``); nothing is dropped
silently."""

from __future__ import annotations

import json
import os
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field

from avspo_openrlhf.atomic import atomic_file

from .sources import SOURCES, BadRow


class DataError(ValueError):
    """A malformed input row, named by file and line."""


@dataclass
class LoadReport:
    rows: list[dict] = field(default_factory=list)
    skipped: list[str] = field(default_factory=list)  # "file:line: reason"

    def summary(self) -> str:
        text = f"{len(self.rows)} rows"
        if self.skipped:
            text += f", {len(self.skipped)} bad rows skipped (first: {self.skipped[0]})"
        return text


def iter_raw(path: str) -> Iterator[tuple[int, object]]:
    """``(line_number, parsed_row_or_exception)`` for a .jsonl file or a .json list."""
    if path.endswith(".json"):
        with open(path, "rb") as f:
            raw = f.read()
        try:
            data = json.loads(raw.decode("utf-8"))
        except UnicodeDecodeError as e:
            yield raw.count(b"\n", 0, e.start) + 1, DataError(f"not UTF-8 (byte 0x{raw[e.start]:02x})")
            return
        except json.JSONDecodeError as e:
            yield e.lineno, DataError(f"broken JSON ({e.msg})")
            return
        if not isinstance(data, list):
            yield 1, DataError("a .json file must hold a list of rows")
            return
        yield from ((i + 1, row) for i, row in enumerate(data))
        return
    with open(path, "rb") as f:  # bytes: a non-UTF-8 byte is one bad row, named by its line
        for lineno, raw in enumerate(f, 1):
            try:
                line = raw.decode("utf-8")
            except UnicodeDecodeError as e:
                yield lineno, DataError(f"not UTF-8 (byte 0x{raw[e.start]:02x} at column {e.start + 1})")
                continue
            if not line.strip():
                continue
            try:
                yield lineno, json.loads(line)
            except json.JSONDecodeError as e:
                yield lineno, DataError(f"broken JSON ({e.msg})")


def convert_rows(raw: Iterable[tuple[str, object]], source: str, skip_bad_rows: bool = False) -> LoadReport:
    """Convert ``(location, raw_row)`` pairs with the source's converter."""
    convert = SOURCES[source].convert
    report = LoadReport()
    for loc, row in raw:
        try:
            if isinstance(row, Exception):
                raise row
            if not isinstance(row, dict):
                raise BadRow(f"a row must be a JSON object, got {type(row).__name__}")
            out = convert(row, source)
            if not out["unique_id"]:
                out["unique_id"] = f"{source}/{len(report.rows)}"
        except (BadRow, DataError) as e:
            msg = f"{loc}: {e}"
            if not skip_bad_rows:
                raise DataError(f"{msg} (use --skip-bad-rows to skip and count such rows)") from None
            report.skipped.append(msg)
            continue
        report.rows.append(out)
    return report


def load_local(path: str, source: str, skip_bad_rows: bool = False) -> LoadReport:
    if not os.path.exists(path):
        raise FileNotFoundError(f"{path}: no such file")
    return convert_rows(((f"{path}:{n}", row) for n, row in iter_raw(path)), source, skip_bad_rows)


def load_hub(source: str, skip_bad_rows: bool = False) -> LoadReport:
    """Download with ``datasets.load_dataset`` (needs network and the hub)."""
    from datasets import load_dataset  # the Hugging Face package (our datasets/ folder is no package)

    src = SOURCES[source]

    def rows():
        for config in src.hub_configs:
            ds = load_dataset(src.hub_id, config, split=src.split)
            for i, row in enumerate(ds):
                yield f"{src.hub_id}[{config or 'default'}]/{src.split}#{i}", dict(row)

    return convert_rows(rows(), source, skip_bad_rows)


def write_jsonl(rows: Iterable[dict], path: str) -> int:
    """Write atomically (temp file + rename): an interrupted run never leaves half a file."""
    os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
    n = 0
    with atomic_file(path) as f:
        for row in rows:
            f.write(json.dumps(row, ensure_ascii=False) + "\n")
            n += 1
    return n


def read_jsonl(path: str) -> list[dict]:
    out = []
    for n, row in iter_raw(path):
        if isinstance(row, Exception):
            raise DataError(f"{path}:{n}: {row}")
        out.append(row)
    return out
