"""The manual: the README stays short, the docs site builds in strict mode (a broken link, a missing
page or a missing included file fails) and reads well (no table left as text, every page titled, names in
tables kept whole, wide tables scrolling), every page of the site is reachable from the docs index, and
no hand-written page copies numbers that a study generates (study pages include or link their
generated ``results*.md``: numbers typed by hand drift from the files they were copied from).

What counts as copied: a run of numbers next to each other in a page that are also next to each other
in a generated file (an interval, a "mean ± sd", a "before → after", a table row) and carry at least
5 significant digits together (two 2-digit numbers coincide by chance too often), or a single number
precise enough not to coincide by chance (3 decimals, or 4 significant digits: a p-value, an ACR). A
lone one-decimal number is not checked: the generated files hold a third of all of them."""

from __future__ import annotations

import html
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
README_MAX_LINES = 200

# Written by hand: the README, the docs pages and the pages that live beside their code.
HAND_WRITTEN = [
    "README.md",
    "docs/*.md",
    "experiments/**/README.md",
    "eval/README.md",
    "datasets/README.md",
    "launch_scripts/**/README.md",
]
# Settings stated in code are not measurements: a number that is also in one of these files (a
# default, a protocol constant, a paper's setting) may appear in a page.
SETTINGS = [
    "avspo_openrlhf/**/*.py",
    "experiments/*/run.py",
    "launch_scripts/**/*.args",
    "launch_scripts/**/*.sh",
    "tests/test_algo*.py",  # the closed forms docs/algorithm.md states
    "tests/test_remedies.py",
]
CONFIDENCE_LEVEL = "95"  # "95 % interval": the level of every interval, not a measurement

# A decimal number (not part of a version like 0.11.2, a name like Qwen2.5 or a size like 1.5B),
# or an integer or decimal followed by %.
NUMBER = re.compile(r"(?<![\w.])(\d+\.\d+)(?![\w.]*\w)|(?<![\w.])(\d+(?:\.\d+)?)\s?%")
# code (commands and flags are settings), comments, and the flag table the code generates (docs/flags.md)
CODE = re.compile(r"```.*?```|`[^`\n]*`|<!-- flag-table.*?<!-- /flag-table -->|<!--.*?-->", re.S)


def _files(patterns: list[str]) -> list[Path]:
    return sorted({p for pattern in patterns for p in ROOT.glob(pattern) if p.is_file()})


def generated_files() -> list[Path]:
    """What the studies write: every .md and .json under experiments/ except the pages."""
    return [
        p
        for p in _files(["experiments/**/*.md", "experiments/**/*.json"])
        if p.name != "README.md" and "runs" not in p.parts
    ]


def numbers(text: str) -> list[str]:
    return [m.group(1) or m.group(2) for m in NUMBER.finditer(text)]


def digits(n: str) -> int:
    """Significant digits as written (0.062: 2, 14.4: 3)."""
    return max(1, len(n.replace(".", "").lstrip("0")))


def precise(n: str) -> bool:
    return len(n.partition(".")[2]) >= 3 or digits(n) >= 4


def prose(text: str) -> str:
    """A page without its code, comments and generated flag table; line breaks kept."""
    return CODE.sub(lambda m: "\n" * m.group(0).count("\n"), text)


def generated_numbers() -> tuple[dict[frozenset, str], dict[str, str]]:
    """Pairs of neighbouring numbers (within a line of a .md file, along a .json file) and the
    precise single numbers of every generated file, each with the file it is in."""
    pairs: dict[frozenset, str] = {}
    singles: dict[str, str] = {}
    for path in generated_files():
        text, name = path.read_text(encoding="utf-8"), path.relative_to(ROOT).as_posix()
        for chunk in text.splitlines() if path.suffix == ".md" else [text]:
            found = numbers(chunk)
            for a, b in zip(found, found[1:]):
                pairs.setdefault(frozenset((a, b)), name)
            for n in found:
                if precise(n):
                    singles.setdefault(n, name)
    return pairs, singles


def copied_numbers(name: str, text: str, pairs: dict, singles: dict, allowed: set[str]) -> list[str]:
    """``name:line: a … b …`` for the runs of numbers (and the precise single numbers) that ``text``
    shares with the generated files."""
    out, line = [], 1
    for paragraph in re.split(r"(\n[ \t]*\n)", prose(text)):
        found, hits, run = numbers(paragraph), set(), []
        for a, b in zip(found + [None], found[1:] + [None]):
            if b is not None and frozenset((a, b)) in pairs:
                run = run or [a]
                run.append(b)
                continue
            if sum(digits(n) for n in run) >= 5 and not set(run) <= allowed:
                hits.add(" … ".join(run))
            run = []
        hits |= {n for n in found if precise(n) and n in singles and n not in allowed}
        out += [f"{name}:{line}: {h}" for h in sorted(hits)]
        line += paragraph.count("\n")
    return out


def test_number_extraction():
    text = "gain +14.4 [−6.1, +8.3], 45 % → 8%, Qwen2.5-Math-1.5B, torch==2.13.0, lr 1e-5, 1.36×, 0.5."
    assert numbers(text) == ["14.4", "6.1", "8.3", "45", "8", "1.36", "0.5"]
    assert numbers(prose("`--rollout.temperature 1.0` and\n```\n0.7\n```\nT = 0.9")) == ["0.9"]
    assert precise("0.062") and precise("16.25") and not precise("59.5") and not precise("0.25")
    assert [digits(n) for n in ("0.062", "14.4", "0.0", "100")] == [2, 3, 1, 3]


def test_the_copy_check_catches_a_copied_interval_and_p_value():
    pairs = {frozenset(p) for p in [("14.4", "6.7"), ("6.7", "22.2"), ("0.7", "3.3"), ("0.93", "0.06")]}
    text = "Intro, 3.3 alone.\n\nIt gained +14.4 [+6.7,\n+22.2] points (p = 0.062), at T = 0.7, 3.3 min.\n"
    hits = copied_numbers("page.md", text, dict.fromkeys(pairs, "r.md"), {"0.062": "r.md"}, allowed={"0.7"})
    assert hits == ["page.md:3: 0.062", "page.md:3: 14.4 … 6.7 … 22.2"]
    # two short numbers that happen to sit side by side somewhere are not a copy; neither is a lone one
    assert copied_numbers("page.md", "from 0.93 to 0.06, 59.5, 0.25", dict.fromkeys(pairs, "r.md"), {}, set()) == []


def test_readme_is_short():
    lines = (ROOT / "README.md").read_text(encoding="utf-8").count("\n")
    assert lines <= README_MAX_LINES, f"README.md has {lines} lines (at most {README_MAX_LINES}): move detail to docs/"


def test_no_hand_written_page_copies_a_generated_number():
    pairs, singles = generated_numbers()
    assert len(pairs) > 1000, "found no generated results to compare with"
    allowed = {CONFIDENCE_LEVEL}.union(*(numbers(p.read_text(encoding="utf-8")) for p in _files(SETTINGS)))
    copied = [
        hit
        for page in _files(HAND_WRITTEN)
        for hit in copied_numbers(
            page.relative_to(ROOT).as_posix(), page.read_text(encoding="utf-8"), pairs, singles, allowed
        )
    ]
    assert not copied, (
        "numbers a study generates, typed into hand-written pages (include or link the generated file "
        "instead):\n" + "\n".join(copied)
    )


def _nav_pages(nav) -> list[str]:
    out = []
    for item in nav:
        value = next(iter(item.values())) if isinstance(item, dict) else item
        out += _nav_pages(value) if isinstance(value, list) else [value]
    return out


def _mkdocs_config() -> dict:
    yaml = pytest.importorskip("yaml")

    class Loader(yaml.SafeLoader):  # mkdocs.yml may carry !ENV / !!python tags; the nav has none
        pass

    Loader.add_multi_constructor("", lambda loader, suffix, node: None)
    return yaml.load((ROOT / "mkdocs.yml").read_text(encoding="utf-8"), Loader=Loader)


def test_every_page_is_linked_from_the_docs_index():
    index = (ROOT / "docs" / "index.md").read_text(encoding="utf-8")
    targets = {Path(t.split("#")[0]).as_posix() for t in re.findall(r"\]\(([^)\s]+)\)", index)}
    pages = [p for p in _nav_pages(_mkdocs_config()["nav"]) if p != "index.md"]
    # a docs page is linked as "x.md", a page mounted from elsewhere as "../folder/README.md"
    missing = [p for p in pages if p not in targets and f"../{p}" not in targets]
    assert not missing, f"pages in the nav but not linked from docs/index.md: {missing}"


@pytest.fixture(scope="module")
def built_site(tmp_path_factory) -> subprocess.CompletedProcess:
    """The site, built once for the tests below: ``mkdocs build --strict`` into a temporary folder."""
    pytest.importorskip("mkdocs", reason="the docs tools are not installed: pip install -r requirements-docs.txt")
    pytest.importorskip("material", reason="the docs tools are not installed: pip install -r requirements-docs.txt")
    site = tmp_path_factory.mktemp("docs") / "site"
    proc = subprocess.run(
        [sys.executable, "-m", "mkdocs", "build", "--strict", "--quiet", "-d", str(site)],
        cwd=ROOT, capture_output=True, text=True, timeout=600,
    )  # fmt: skip
    proc.site = site
    return proc


@pytest.fixture
def site(built_site) -> Path:
    proc = built_site
    assert proc.returncode == 0, f"mkdocs build --strict failed:\n{proc.stdout[-4000:]}\n{proc.stderr[-4000:]}"
    return proc.site


# a line of a paragraph that is a table row: Markdown left a table as text (a table must follow a blank line)
TABLE_ROW = re.compile(r"^\s*\|.*\|.*\|\s*$", re.M)


def raw_tables(page_html: str) -> list[str]:
    """The table rows a page shows as text: lines starting and ending with ``|`` inside a paragraph."""
    out = []
    for paragraph in re.findall(r"<p>(.*?)</p>", page_html, re.S):
        out += TABLE_ROW.findall(html.unescape(re.sub(r"<[^>]+>", "", paragraph)))
    return out


def test_the_raw_table_check_finds_a_table_glued_to_a_line_of_text():
    glued = "<p>workload untuned: model tiny\n| mode | s/step |\n| --- | --- |\n| sync | 0.54 |</p>"
    assert raw_tables(glued) == ["| mode | s/step |", "| --- | --- |", "| sync | 0.54 |"]
    table = "<table><tr><td>| a | b |</td></tr></table><p>a | b, and `x | y`</p>"
    assert raw_tables(table) == []


@pytest.mark.slow
def test_the_built_site_shows_no_table_as_text(site):
    found = {
        page.relative_to(site).as_posix(): rows[0].strip()
        for page in sorted(site.rglob("*.html"))
        if (rows := raw_tables(page.read_text(encoding="utf-8")))
    }
    assert not found, f"tables left as raw text (a table needs a blank line before it): {found}"


def test_every_page_has_its_own_title(site):
    """A generated page carries its study's title (docs/hooks.py), not its file name's "Results"."""
    titles = {}
    for page in sorted(site.rglob("index.html")):
        m = re.search(r"<title>(.*?)</title>", page.read_text(encoding="utf-8"), re.S)
        if m:
            titles[page.relative_to(site).parent.as_posix()] = html.unescape(m.group(1)).rsplit(" - ", 1)[0].strip()
    bare = sorted(p for p, t in titles.items() if t.lower() in ("results", "readme", "index", ""))
    assert not bare, f"pages titled after their file name: {bare}"
    assert titles["experiments/async_throughput/untuned-bf16/results"] == "Async throughput: untuned-bf16 results"


def test_the_sites_stylesheet_keeps_names_whole_and_wide_tables_scrolling(site):
    css = (site / "stylesheets" / "extra.css").read_text(encoding="utf-8")
    assert re.search(r"span\.nobr\s*\{\s*white-space: nowrap", css)
    flags = (site / "flags" / "index.html").read_text(encoding="utf-8")
    assert '<code><span class="nobr">--acr.reward_range</span></code>' in flags  # docs/hooks.py wraps the names
    assert "overflow-x: auto" in css
    assert 'href="../stylesheets/extra.css"' in (site / "flags" / "index.html").read_text(encoding="utf-8")


def test_the_site_builds_in_strict_mode(site):
    # the study pages include their generated tables, and the remedy table is computed by the code
    remedies = (site / "experiments" / "remedies" / "index.html").read_text(encoding="utf-8")
    first_line = (ROOT / "experiments/remedies/results/results.md").read_text(encoding="utf-8").splitlines()[0]
    assert first_line.split(",")[0] in remedies and "--8&lt;--" not in remedies
    choosing = (site / "choosing" / "index.html").read_text(encoding="utf-8")
    assert "generated: collapsed-group-advantages" not in choosing
    assert "-0.333" in choosing  # NGRPO on an all-wrong group of 8: -1/sqrt(G + 1)


# an include marker (pymdownx.snippets' "--8<--") in any spelling a formatter might leave behind
INCLUDE_MARKER = re.compile(r"-{1,2}\s*8\s*<\s*-{1,2}")


def test_no_include_marker_is_mangled_in_the_sources():
    """A formatter once rewrote '--8<--' as '--8 < --': the strict build passed and the page showed the
    marker instead of the module."""
    bad = [f"{p.relative_to(ROOT)}:{i}" for p in [*ROOT.glob("docs/*.md"), *ROOT.glob("experiments/*/README.md")]
           for i, line in enumerate(p.read_text(encoding="utf-8").splitlines(), 1)
           if INCLUDE_MARKER.search(line) and '--8<-- "' not in line]  # fmt: skip
    assert not bad, f"mangled include markers: {bad}"


def test_the_built_site_shows_no_include_marker(site):
    """Every include was rendered: no page shows the marker itself."""
    shown = [
        p.relative_to(site).as_posix()
        for p in sorted(site.rglob("*.html"))
        if INCLUDE_MARKER.search(html.unescape(re.sub(r"<[^>]+>", "", p.read_text(encoding="utf-8"))))
    ]
    assert not shown, f"pages showing an include marker: {shown}"


def _hooks():
    import importlib.util

    spec = importlib.util.spec_from_file_location("docs_hooks", ROOT / "docs" / "hooks.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_option_names_are_kept_whole_outside_code_blocks_and_short_cells_on_one_line():
    pytest.importorskip("mkdocs", reason="the docs tools are not installed: pip install -r requirements-docs.txt")
    hooks = _hooks()
    page = (
        "<p>set <code>--acr.reward_range 0 10</code> or --x.y, not non-zero, -0.5, a--b</p>"
        "<pre><code>avspo-train --backend cpu</code></pre><td>short</td><td>" + "long " * 12 + "</td>"
    )
    out = hooks.short_cells_on_one_line(hooks.keep_names_whole(page))
    assert re.findall(r'<span class="nobr">([^<]*)</span>', out) == ["--acr.reward_range", "--x.y"]
    assert "<pre><code>avspo-train --backend cpu</code></pre>" in out  # a code block wraps nothing
    assert '<td class="short">short</td>' in out and "<td>long" in out
    assert re.sub(r"<[^>]+>", "", out) == re.sub(r"<[^>]+>", "", page)  # the text a reader copies is the same


def _browser():
    sys.path.insert(0, str(ROOT / "tests"))
    import site_in_browser

    if site_in_browser.chromium() is None:
        if os.environ.get("CI"):
            pytest.fail("CI installs Chromium (.ci/run): the site's layout check must run there")
        pytest.skip("no Chromium (apt-get install chromium): the site was not checked in a browser")
    return site_in_browser


def test_the_browser_check_finds_a_broken_name_a_cut_table_a_squeezed_cell_and_an_include(tmp_path):
    """The checker itself, on a page made to fail each way (a checker that finds nothing proves nothing)."""
    browser = _browser()
    words = " ".join(["word"] * 12)
    (tmp_path / "page").mkdir()
    (tmp_path / "page" / "index.html").write_text(
        '<html><body><div class="md-content" style="width:300px"><div class="md-typeset">'
        '<p style="width:120px">see the option --acr.reward_range here</p>'
        '<table style="display:block;overflow:hidden;width:200px"><tr><td>x</td><td style="white-space:nowrap">'
        + "wide "
        * 40
        + "</td></tr></table>"
        f'<table><tr><td style="width:20px">{words}</td><td style="white-space:nowrap">{"w" * 200}</td></tr></table>'
        '<p>--8&lt;-- "examples/qae_remedy.py"</p></div></div></body></html>',
        encoding="utf-8",
    )
    [(page, found)] = browser.check(tmp_path).items()
    assert found["broken_names"] == ["--acr.reward_range"], found
    assert found["cut_tables"] and found["squeezed_cells"] and found["includes"], found


@pytest.mark.slow
def test_the_site_reads_whole_in_a_browser_at_1280_px(site):
    """Every page in headless Chromium at 1280 px: no name broken across lines, no table cut or squeezed,
    no unrendered include (tests/site_in_browser.py says how each is measured)."""
    browser = _browser()
    findings = browser.check(site)
    assert len(findings) > 30 and not any("error" in f for f in findings.values()), findings
    bad = browser.failures(findings)
    assert not bad, f"pages that do not read whole at {browser.WIDTH} px: {bad}"


# a backticked path in docs/architecture.md: `algo/build.py`, `avspo_openrlhf/cli/train.py`, `examples/x.py`
MAP_PATH = re.compile(r"`((?:[\w.-]+/)*[\w.-]+\.py)`")


def architecture_paths(text: str) -> set[str]:
    """The .py paths docs/architecture.md names, package paths relative to the package
    (``avspo_openrlhf/`` dropped), OpenRLHF's (``openrlhf/...``) and the repository's as written."""
    return {p.removeprefix("avspo_openrlhf/") for p in MAP_PATH.findall(text)}


def test_the_architecture_map_names_every_module_and_nothing_that_is_gone():
    """docs/architecture.md is drawn from the code: every module of the package is on it, and every
    file it names exists (ours in the package or the repository, OpenRLHF's in the installed package)."""
    named = architecture_paths((ROOT / "docs" / "architecture.md").read_text(encoding="utf-8"))
    package = ROOT / "avspo_openrlhf"
    modules = {p.relative_to(package).as_posix() for p in package.rglob("*.py") if "__pycache__" not in p.parts}
    missing = sorted(m for m in modules if m not in named and not m.endswith("__init__.py"))
    assert not missing, f"package modules missing from docs/architecture.md: {missing}"
    openrlhf = None
    gone = []
    for path in sorted(named):
        if path.startswith("openrlhf/"):
            if openrlhf is None:
                import importlib.util

                spec = importlib.util.find_spec("openrlhf")
                openrlhf = Path(spec.origin).parent.parent if spec else None
            if openrlhf is not None and not (openrlhf / path).exists():
                gone.append(path)
        elif "/" not in path:  # a bare file name, in the context of its folder: some file of ours has it
            if not any(
                p.name == path
                for d in ("avspo_openrlhf", "benchmarks", "experiments", "examples", "tests")
                for p in (ROOT / d).rglob(path)
            ):
                gone.append(path)
        elif not ((package / path).exists() or (ROOT / path).exists()):
            gone.append(path)
    assert not gone, f"docs/architecture.md names files that do not exist: {gone}"


def test_the_architecture_check_sees_a_missing_module_and_a_gone_one():
    text = "| `algo/build.py` | x |\n`avspo_openrlhf/cli/train.py`, `examples/avspo_loop.py`, `openrlhf/cli/train_ppo_ray.py`"
    assert architecture_paths(text) == {
        "algo/build.py",
        "cli/train.py",
        "examples/avspo_loop.py",
        "openrlhf/cli/train_ppo_ray.py",
    }
