"""The built docs site as a reader sees it: every page rendered in headless Chromium at 1280 px wide,
and what the strict build cannot see reported per page.

    python tests/site_in_browser.py SITE_DIR [PAGE ...]    # e.g. mkdocs build -d /tmp/site first

A page fails on
- a flag or option name broken across two lines (``--acr.`` / ``reward_range``: Chromium breaks after
  a hyphen), in running text or in a table;
- a table cut: wider than the content column with nothing to scroll it, a cell whose content
  overflows it (an install command cut at ``pip insta``), or a scrolling table whose scrollbar takes
  no room (a browser that hides it until hovered leaves the right-hand columns looking cut off);
- a table squeezed below a readable width: a cell of several words laid out at about one or two
  words a line (``SQUEEZE``);
- an unrendered include (``--8<--``) or snippet marker left in the text.

Each page is a copy of the built one with a small script added at its end that measures the laid-out
page and writes its findings into the page; Chromium's ``--dump-dom`` returns them. Chromium is
Debian's package (``apt-get install chromium``); ``tests/test_docs.py`` runs this when it is installed.
Exit status 1 when a page fails; the findings are printed per page either way.
"""

from __future__ import annotations

import argparse
import html
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

WIDTH = 1280
# a cell of at least 6 words laid out at under 2 words a line is squeezed: the reader reads a column of
# single words (the install table's first column, beside a long command that would not wrap)
SQUEEZE = (6, 2.0)
CHROMIUM = ("chromium", "chromium-browser", "google-chrome")
# as root and offline: no sandbox (root), no background connections (refused here, slowly)
FLAGS = [
    "--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
    "--disable-background-networking", "--disable-component-update", "--disable-sync",
    f"--window-size={WIDTH},900", "--virtual-time-budget=4000",
]  # fmt: skip

# runs in the page after Material's own scripts: findings go into <pre id="site-check"> as JSON
PROBE = r"""
<script>
window.addEventListener("load", () => setTimeout(() => {
  const content = document.querySelector(".md-content") || document.body;
  const out = {broken_names: [], cut_tables: [], squeezed_cells: [], hidden_scrollbars: [], includes: [], wide_tables: 0};
  const NAME = /(^|[\s(\[,=`"'])(--?[A-Za-z][\w.\-]*[\w])/g;
  const lines = (range) => new Set([...range.getClientRects()].filter(r => r.width > 0).map(r => Math.round(r.top))).size;
  const walker = document.createTreeWalker(content, NodeFilter.SHOW_TEXT);
  for (let node; (node = walker.nextNode());) {
    if (node.parentElement.closest("pre, script, style, .headerlink")) continue;
    for (const m of node.data.matchAll(NAME)) {
      const range = document.createRange();
      const start = m.index + m[1].length;
      range.setStart(node, start);
      range.setEnd(node, start + m[2].length);
      if (lines(range) > 1) out.broken_names.push(m[2]);
    }
  }
  const label = (t) => (t.querySelector("th, td")?.textContent || "").trim().slice(0, 40);
  for (const table of content.querySelectorAll("table")) {
    const style = getComputedStyle(table);
    const box = table.getBoundingClientRect();
    const column = content.querySelector(".md-typeset") || content;
    const wide = table.scrollWidth > table.clientWidth + 1;
    if (wide) out.wide_tables += 1;
    if (wide && !["auto", "scroll"].includes(style.overflowX)) out.cut_tables.push(label(table) + " (wider than its box, no scroll)");
    if (box.right > column.getBoundingClientRect().right + 1) out.cut_tables.push(label(table) + " (past the content column)");
    if (wide && table.offsetHeight - table.clientHeight - parseFloat(style.borderTopWidth) - parseFloat(style.borderBottomWidth) < 1)
      out.hidden_scrollbars.push(label(table));
    for (const cell of table.querySelectorAll("th, td")) {
      const text = cell.textContent.trim();
      const c = cell.getBoundingClientRect();
      const words = text.split(/\s+/).filter(Boolean).length;
      const range = document.createRange();
      range.selectNodeContents(cell);
      const cs = getComputedStyle(cell);
      const lineHeight = parseFloat(cs.lineHeight) || 1.2 * parseFloat(cs.fontSize);
      const shown = Math.max(1, Math.round(range.getBoundingClientRect().height / lineHeight));
      if (words >= %(min_words)d && words / shown < %(words_per_line)s) out.squeezed_cells.push(text.slice(0, 40));
      for (const el of cell.querySelectorAll("code, a, span")) {
        const r = el.getBoundingClientRect();
        if (r.width > 0 && r.right > c.right + 1) { out.cut_tables.push(label(table) + " (cell cut: " + el.textContent.slice(0, 30) + ")"); break; }
      }
    }
  }
  const text = content.innerText;
  for (const m of text.matchAll(/-{1,2}\s*8\s*<\s*-{1,2}[^\n]{0,40}/g)) out.includes.push(m[0]);
  const pre = document.createElement("pre");
  pre.id = "site-check";
  pre.textContent = JSON.stringify(out);
  document.body.appendChild(pre);
}, 300));
</script>
""".replace("%(min_words)d", str(SQUEEZE[0])).replace("%(words_per_line)s", str(SQUEEZE[1]))
FINDING = re.compile(r'<pre id="site-check">(.*?)</pre>', re.S)
FAILS = ("broken_names", "cut_tables", "squeezed_cells", "hidden_scrollbars", "includes")


def chromium() -> str | None:
    return next((p for p in map(shutil.which, CHROMIUM) if p), None)


def pages(site: Path) -> list[str]:
    """Every content page of a built mkdocs site (``x/index.html``), the search page and 404 left out."""
    found = [p.relative_to(site).as_posix() for p in sorted(site.rglob("index.html"))]
    return [p for p in found if not p.startswith(("search/", "assets/"))]


def _probe_copy(site: Path, scratch: Path) -> None:
    """The site copied with the probe added to each page (the built site is left as it is)."""
    shutil.copytree(site, scratch, dirs_exist_ok=True)
    for page in scratch.rglob("*.html"):
        text = page.read_text(encoding="utf-8")
        page.write_text(text.replace("</body>", PROBE + "</body>", 1), encoding="utf-8")


def render(browser: str, page: Path, profile: Path, timeout_s: float = 60) -> dict:
    cmd = [browser, *FLAGS, f"--user-data-dir={profile}", "--dump-dom", page.as_uri()]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout_s)
    m = FINDING.search(proc.stdout)
    if not m:
        return {"error": f"no findings (exit {proc.returncode}): {proc.stderr.strip()[-300:]}"}
    return json.loads(html.unescape(m.group(1)))


def check(site: Path, only: list[str] | None = None, workers: int = 2) -> dict[str, dict]:
    """``{page: findings}`` for every page (or the pages named, as ``install/index.html`` or
    ``install``)."""
    browser = chromium()
    if browser is None:
        raise FileNotFoundError("no Chromium: apt-get install chromium")
    wanted = pages(site)
    if only:

        def folder(page: str) -> str:  # install, install/, install/index.html -> install ("" is the home page)
            return page.strip("/").removesuffix("index.html").strip("/")

        names = {folder(o) for o in only}
        wanted = [p for p in wanted if folder(p) in names]
    with tempfile.TemporaryDirectory(prefix="site_in_browser_") as tmp:
        scratch = Path(tmp) / "site"
        _probe_copy(site, scratch)

        def one(i_page):
            i, page = i_page
            return page, render(browser, scratch / page, Path(tmp) / f"profile{i}")

        # a profile per page: two Chromiums at once must not share one
        with ThreadPoolExecutor(workers) as pool:
            return dict(pool.map(one, enumerate(wanted)))


def failures(findings: dict[str, dict]) -> dict[str, dict]:
    return {
        p: {k: v for k, v in f.items() if k in (*FAILS, "error") and v}
        for p, f in findings.items()
        if any(f.get(k) for k in (*FAILS, "error"))
    }


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(
        description=__doc__.split("\n\n")[0], formatter_class=argparse.RawDescriptionHelpFormatter
    )
    ap.add_argument("site", type=Path, help="a built site (mkdocs build -d SITE)")
    ap.add_argument("pages", nargs="*", help="only these pages (install, experiments/async_throughput, ...)")
    ap.add_argument("--workers", type=int, default=min(2, os.cpu_count() or 1), help="Chromiums at once")
    args = ap.parse_args(argv)
    findings = check(args.site, args.pages, args.workers)
    for page, f in findings.items():
        bad = {k: v for k, v in f.items() if k in (*FAILS, "error") and v}
        print(
            f"{'FAIL' if bad else 'ok  '} {page}: {f.get('wide_tables', 0)} wide table(s) scrolling"
            + (f" {bad}" if bad else "")
        )
    bad = failures(findings)
    print(f"{len(findings)} pages at {WIDTH} px: {len(bad)} failing")
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
