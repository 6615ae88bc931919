"""mkdocs hooks (mkdocs.yml ``hooks:``): what the docs site needs beyond ``docs/``.

1. The pages that live beside their code (each study's ``experiments/<study>/README.md`` with its
   generated ``results*.md`` and plots, ``eval/README.md``, ``datasets/README.md``,
   ``launch_scripts/configs/README.md``) are mounted at their repository paths, so the links
   between them work on the site as on GitHub. A link a ``docs/`` page writes as on GitHub
   (``../experiments/remedies/README.md``) is mapped to the mounted page.
2. ``<!-- generated: collapsed-group-advantages -->`` in a page becomes the table of the advantage
   each remedy gives a collapsed group, computed by the code at build time (never typed by hand);
   ``<!-- generated: remedy-costs -->`` the table of each remedy's effect and costs, read from the
   remedies study's and the RL-ZVP benchmark's result files.
3. A study's generated page (``experiments/<study>/**/results*.md`` and the like, not its README) starts
   with a heading naming its study, as the nav calls the study, and what the file holds
   ("Async throughput: untuned-bf16 results"): the study writes the file without one, since its README
   includes it, and the page would otherwise be titled after its file name ("Results").
4. A short table cell (``SHORT_CELL`` characters of text or fewer: a number with its interval, a
   name, a setting) reads on one line (``class="short"``): a wide table scrolls sideways instead of
   laying its numbers out a word per line; longer cells wrap.
5. An option name in the text (``--acr.reward_range``, ``-e``; code blocks left alone) is kept on one
   line by a ``<span class="nobr">`` around it, and nothing else is: a long command in a table wraps
   at its spaces instead of squeezing the other columns, and a browser no longer breaks a name after
   its ``--`` (what it does with a hyphen). The text a reader copies is unchanged.
"""

from __future__ import annotations

import posixpath
import re
from pathlib import Path

from mkdocs.structure.files import File, InclusionLevel

ROOT = Path(__file__).resolve().parent.parent
MOUNTED = {  # folder -> file suffixes mounted from it (recursively)
    "experiments": (".md", ".png"),
    "eval": ("README.md",),
    "datasets": ("README.md",),
    "launch_scripts/configs": ("README.md",),
}
LINK = re.compile(r"(!?\[[^\]]*\]\()([^)\s#]+)(#[^)\s]*)?((?:\s+\"[^\"]*\")?\))")
TABLE_MARKER = "<!-- generated: collapsed-group-advantages -->"
COST_MARKER = "<!-- generated: remedy-costs -->"
REMEDIES_STUDY = "experiments/remedies/results/results.json"
RL_ZVP_BENCH = "benchmarks/results/bench_rl_zvp_step_cpu_runs.json"


def _mounted(repo_path: str) -> bool:
    return any(
        repo_path.startswith(folder + "/") and repo_path.endswith(suffixes) for folder, suffixes in MOUNTED.items()
    )


def _site_path(repo_path: str) -> str | None:
    if repo_path.startswith("docs/"):
        return repo_path[len("docs/") :]
    return repo_path if _mounted(repo_path) else None


def on_config(config):
    # snippets resolve from the repository root wherever mkdocs is started (mkdocs.yml says ".")
    config.mdx_configs["pymdownx.snippets"]["base_path"] = [str(ROOT)]
    return config


def on_files(files, config):
    for folder, suffixes in MOUNTED.items():
        for path in sorted((ROOT / folder).rglob("*")):
            rel = path.relative_to(ROOT).as_posix()
            if path.is_file() and rel.endswith(suffixes) and "/runs/" not in rel:
                # a study's generated tables are included in its page and linked from it, not in the nav
                inclusion = InclusionLevel.INCLUDED if path.name == "README.md" else InclusionLevel.NOT_IN_NAV
                files.append(File.generated(config, rel, abs_src_path=str(path), inclusion=inclusion))
    return files


def _repo_path(page) -> str:
    src = Path(page.file.abs_src_path).resolve()
    return src.relative_to(ROOT).as_posix()


def _rewrite_links(markdown: str, repo_path: str) -> str:
    """A relative link written for GitHub (from the page's repository path) -> the same target on
    the site (where docs/ is the root and the mounted folders keep their paths)."""
    here_repo, here_site = posixpath.dirname(repo_path), posixpath.dirname(_site_path(repo_path) or "")

    def fix(m: re.Match) -> str:
        target = m.group(2)
        if "://" in target or target.startswith(("/", "mailto:")):
            return m.group(0)
        site = _site_path(posixpath.normpath(posixpath.join(here_repo, target)))
        if site is None:
            return m.group(0)  # not on the site: the strict build names it
        new = posixpath.relpath(site, here_site or ".")
        return f"{m.group(1)}{new}{m.group(3) or ''}{m.group(4)}"

    return LINK.sub(fix, markdown)


def collapsed_group_table(g: int = 8) -> str:
    """The advantage each remedy gives the samples of a collapsed group of ``g`` 0/1 rewards (and,
    for comparison, of a mixed group with one right answer), from the estimators themselves."""
    import torch

    from avspo_openrlhf.algo import ESTIMATORS, AVSPOConfig, GroupNormConfig, NGRPOConfig, RLZVPConfig, group_advantages

    rewards = torch.tensor([[1.0] * g, [0.0] * g, [1.0] + [0.0] * (g - 1)], dtype=torch.float64)

    def values(estimator, config=None):
        adv, _ = group_advantages(rewards, estimator, config, acr_gate=1.0, tau_adapt=0.0)  # gate open
        picked = (adv[0, 0].item(), adv[1, 0].item(), adv[2, 0].item(), adv[2, 1].item())
        return [f"{v:+.3f}" if abs(v) >= 5e-4 else "0" for v in picked]

    shown = set()

    def row(name, flag, estimator, config=None, collapsed=None):
        shown.add(estimator)
        right, wrong, mixed_right, mixed_wrong = values(estimator, config)
        right, wrong = collapsed or (right, wrong)
        return f"| {name} | {flag} | {right} | {wrong} | {mixed_right} / {mixed_wrong} |"

    alpha = RLZVPConfig().alpha
    rows = [
        f"| remedy | flag | all-right group | all-wrong group | mixed group, 1 of {g} right: right / wrong |",
        "| --- | --- | --- | --- | --- |",
        row("GRPO, population std (the paper's)", "`--remedy grpo`", "grpo"),
        row(
            "GRPO, unbiased std (OpenRLHF's `group_norm`)", "`--remedy none`", "grpo", GroupNormConfig("unbiased", 1e-9)
        ),
        row("Dr. GRPO (centred only)", "`--remedy dr_grpo`", "dr_grpo"),
    ]
    rows += [
        row(f"AVSPO, stratified, K = {k}", "`--remedy avspo`", "avspo", AVSPOConfig(num_virtual=k))
        for k in (1, g // 2, g)
    ]
    rows += [
        row(
            "AVSPO, opposite (the authors' code)",
            "`--avspo.strategy opposite`",
            "avspo",
            AVSPOConfig(strategy="opposite"),
        ),
        row("NGRPO", "`--remedy ngrpo`", "ngrpo", NGRPOConfig()),
        row("sign advantage", "`--remedy sign`", "sign"),
        row(
            f"RL-ZVP (per token; α = {alpha})", "`--remedy rl_zvp`", "rl_zvp", collapsed=("+α·H_t", "−α·(max H − H_t)")
        ),
    ]
    # a remedy added to the registry appears with its defaults, titled by its config's docstring
    for name, entry in ESTIMATORS.items():
        if name not in shown and entry.token_fn is None:
            title = (entry.config.__doc__ or name).strip().splitlines()[0].split(" (``")[0] if entry.config else name
            rows.append(row(title, f"`--remedy {name}`", name))
    return "\n".join(rows) + "\n"


def _nav_titles(nav) -> dict[str, str]:
    """``{page path: its title in the nav}`` of mkdocs.yml's nav."""
    out: dict[str, str] = {}
    for item in nav or []:
        if isinstance(item, dict):
            for title, value in item.items():
                out.update(_nav_titles(value) if isinstance(value, list) else {value: title})
    return out


WORDS = {"acr": "ACR", "avx2": "AVX2"}  # how the file names' words are written in a title


def generated_page_title(repo_path: str, nav_titles: dict[str, str]) -> str | None:
    """The heading of a study's generated page: the study's nav title (its nearest README.md up the
    tree), then the file's folders and name below the study, ``results`` said once, at the end
    (``experiments/async_throughput/untuned-bf16/results.md``: "Async throughput: untuned-bf16
    results"). None for a page that is not a study's generated one."""
    if not repo_path.startswith("experiments/") or repo_path.endswith("/README.md"):
        return None
    folder = posixpath.dirname(repo_path)
    while folder and not (ROOT / folder / "README.md").is_file():
        folder = posixpath.dirname(folder)
    readme = f"{folder}/README.md"
    study = nav_titles.get(readme)
    if not folder or study is None:
        return None
    parts = posixpath.relpath(repo_path[: -len(".md")], folder).split("/")
    words = [w for part in parts if part != "results" for w in part.replace("_", " ").split()]
    words = [WORDS.get(w, w) for w in words] + (["results"] if parts[-1] == "results" else [])
    return f"{study}: {' '.join(words)}"


# what each remedy adds beyond GRPO's step by construction (docs/algorithm.md): memory is not measured
# per remedy, the arrays it keeps are named instead
COSTS = {  # study method -> (flag, extra compute in the step, extra memory)
    "GRPO": ("(none)", "none", "none"),
    "AVSPO": ("`--remedy avspo`", "an affine map of the `[N, G]` rewards", "`[N, G]` floats"),
    "DAPO-DS": (
        "`--dynamic.std_filter`",
        "the refill rounds' generation",
        "the kept groups of a step until it is full",
    ),
    "NGRPO": ("`--remedy ngrpo`", "an affine map of the `[N, G]` rewards", "`[N, G]` floats"),
    "GRESO": ("`--greso.enable`", "the audits' generation (`--greso.audit`)", "a short history per prompt seen"),
    "GRESO+AVSPO": ("`--greso.enable --remedy avspo`", "as GRESO and AVSPO", "as GRESO"),
    "RL-ZVP": (
        "`--remedy rl_zvp`",
        "token advantages from the step's own entropies: {rl_zvp}",
        "one float per token of the zero-variance groups",
    ),
}


def remedy_cost_table() -> str:
    """Each remedy's effect beside its costs: the remedies study's paired difference from GRPO, training
    wall time, updates and generation per trained sample at its equal token budget, and the extra step
    compute and memory, with the machine and precision the runs recorded."""
    import json
    import statistics

    from avspo_openrlhf.study import store

    study = json.loads((ROOT / REMEDIES_STUDY).read_text(encoding="utf-8"))
    published = store.read_runs((ROOT / REMEDIES_STUDY).parent)
    bench = json.loads((ROOT / RL_ZVP_BENCH).read_text(encoding="utf-8"))
    runs: dict[str, list[dict]] = {}
    for run in published:
        runs.setdefault(run["method"], []).append(run)
    # every run's machine and precision, named once when the runs agree (each one otherwise)
    kinds = sorted({(r["cpu"], r["precision"]["policy"], r["precision"]["rollout engine"]) for r in published})
    where = "; ".join(
        f"{cpu}, policy {p.replace('float', 'fp')}, rollout engine {e.replace('float', 'fp')}" for cpu, p, e in kinds
    )
    ratio = bench["step_ratio"]["after/grpo"]
    rl_zvp = (
        f"step time x{ratio:.2f} of GRPO's (`benchmarks/bench_rl_zvp_step.py`: "
        f"{bench['model']} model, {bench['device']}, {bench['dtype']})"
    )
    rows = [
        f"Measured on {where}, "
        f"every run stopped at {study['budget_tokens']:,} generated tokens ([the study](../experiments/remedies/README.md), "
        "[its table](../experiments/remedies/results/results.md)); mean over seeds, the difference paired by seed "
        "with its 95 % t interval over seeds:",
        "",
        "| remedy | flag | held-out vs GRPO (points) | training wall time (min) | updates | generated ÷ trained samples "
        "| extra compute in a step | extra memory |",
        "| --- | --- | --- | --- | --- | --- | --- | --- |",
    ]
    for method, (flag, compute, memory) in COSTS.items():
        mine = runs.get(method, [])
        if not mine:
            continue
        vs = study["summary"][method]["vs_GRPO"]
        effect = (
            "-"
            if vs is None
            else f"{100 * vs['diff']:+.1f} [{100 * vs['ci95'][0]:+.1f}, {100 * vs['ci95'][1]:+.1f}] ({vs['seeds']} seeds)"
        )
        wall = statistics.mean(r["train_wall_min"] for r in mine)
        steps = statistics.mean(r["steps"] for r in mine)
        per = statistics.mean(r["generated_per_trained"] for r in mine)
        rows.append(
            f"| {method} | {flag} | {effect} | {wall:.1f} | {steps:.0f} | {per:.2f} | {compute.format(rl_zvp=rl_zvp)} | {memory} |"
        )
    return "\n".join(rows)


def on_page_markdown(markdown, page, config, files):
    title = generated_page_title(_repo_path(page), _nav_titles(config.nav))
    if title and not markdown.lstrip().startswith("# "):
        markdown = f"# {title}\n\n{markdown}"
    if TABLE_MARKER in markdown:
        markdown = markdown.replace(TABLE_MARKER, collapsed_group_table())
    if COST_MARKER in markdown:
        markdown = markdown.replace(COST_MARKER, remedy_cost_table())
    return _rewrite_links(markdown, _repo_path(page))


# a page's tags and the text between them; text inside these is left as it is
TAG = re.compile(r"(<[^>]+>)")
VERBATIM = ("pre", "script", "style")
# an option name: one or two hyphens, a letter, then letters, digits, _ . - ending on a word character
OPTION = re.compile(r"(?<![\w.\-])(--?[A-Za-z][\w.\-]*\w)")


def keep_names_whole(html: str) -> str:
    """Each option name in the text (inline code or not; code blocks, scripts and styles left alone)
    wrapped in ``<span class="nobr">`` (``extra.css``)."""
    out, verbatim = [], 0
    for part in TAG.split(html):
        if part.startswith("<"):
            name = re.match(r"</?([a-zA-Z0-9]+)", part)
            if name and name.group(1).lower() in VERBATIM and not part.endswith("/>"):
                verbatim += -1 if part.startswith("</") else 1
            out.append(part)
        else:
            out.append(part if verbatim else OPTION.sub(r'<span class="nobr">\1</span>', part))
    return "".join(out)


SHORT_CELL = 48
CELL = re.compile(r"<(td|th)((?:\s[^>]*)?)>(.*?)</\1>", re.S)


def short_cells_on_one_line(html: str) -> str:
    """Each table cell of at most ``SHORT_CELL`` characters of text gets ``class="short"`` (``extra.css``)."""

    def cell(m: re.Match) -> str:
        tag, attrs, body = m.groups()
        text = re.sub(r"<[^>]+>", "", body).strip()
        if len(text) > SHORT_CELL or "class=" in attrs:
            return m.group(0)
        return f'<{tag}{attrs} class="short">{body}</{tag}>'

    return CELL.sub(cell, html)


def on_page_content(html, page, config, files):
    return short_cells_on_one_line(keep_names_whole(html))
