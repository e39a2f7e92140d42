"""The suite as a static site: READMEs, chapters and executed notebooks -> `site/`.

    python _build_nb.py --site          # -> site/ (open site/index.html through a web server)

Built with mkdocs + mkdocs-material + mkdocs-jupyter, entirely offline: the
theme's assets come with its pip package, Google fonts are switched off, and
MathJax is served from the `jupyter-server-mathjax` pip package (copied into
the site), never from a CDN, and only to the pages that have math (`has_math`):
it is the heaviest script a page can load. Notebooks are rendered as committed
(outputs and pictures included), never re-executed here.

The docs tree is generated into `build/site-docs/` from what the repository
holds now, so a new lab folder (its README, its `NN_topic.md` chapters, its
notebook) appears without editing this file. The tree mirrors the
repository's layout (labs/, src/, tests/; the root README becomes about.md,
as README.md beside the landing index.md would be dropped), so a relative link
that works on GitHub works on the site. Each lab gets its own navigation
section: README, then chapters, then notebook.

This module is also the mkdocs hook file (`on_page_content`, `on_post_page`):
mkdocs loads it by path, so it keeps no state and imports nothing from paralab.
"""

from __future__ import annotations

import importlib.util
import json
import re
import shutil
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
DOCS = ROOT / "build" / "site-docs"
SITE = ROOT / "site"

CHAPTER = re.compile(r"^\d\d_.+\.md$")
MATHJAX_PLACEHOLDER = "paralab-mathjax-placeholder.js"
EXTERNAL_SCRIPT = re.compile(r'<script[^>]*\ssrc="(?:https?:)?//[^"]*"[^>]*>\s*</script>')
HEADING = re.compile(r'<h([1-3]) id="([^"]+)"[^>]*>(.*?)</h\1>', re.S)
ARITHMATEX = re.compile(r'<(span|div) (class="arithmatex")>')
LAB_LINK = re.compile(r'href="\.\./(\d\d_\w+)/(\w+)\.ipynb(#[^"]*)?"')
"""A notebook's link to another lab's notebook, relative to the notebook's file (as JupyterLab
follows it): on the site the page is a folder deeper (`labs/11_scale/scale_lab/`) and is a page,
not the file."""
CHAPTER_LINK = re.compile(r'href="(\d\d_\w+)\.md(#[^"]*)?"')
"""A notebook's link to a chapter beside it (`03_why_pp_crosses_nodes.md`): on the site the
chapter is a page one folder up from the notebook's page."""
NOTEBOOK_MARKDOWN = re.compile(r'<div class="[^"]*jp-RenderedMarkdown[^"]*"[^>]*>.*?</div>', re.S)
INLINE_MATH = re.compile(r"(?<![\\$])\$\$?[^$<>\n]+?\$\$?")
SKIPPED_BY_MATHJAX = re.compile(
    r"<(pre|code|script|style|textarea|noscript)\b[^>]*>.*?</\1>", re.S | re.I
)
"""The elements MathJax 2's tex2jax never typesets (its default `skipTags`)."""
TEX_DELIMITER = re.compile(r"\$[^$]+\$|\\\(|\\\[")
"""What tex2jax typesets, as configured in MATHJAX_CONFIG: $...$ and $$...$$ (across lines too),
\\(...\\) and \\[...\\] (arithmatex writes these). A false match only loads MathJax for nothing."""
MATHJAX_SCRIPTS = ("assets/mathjax-config.js", "assets/mathjax/MathJax.js")
RELATIVE_LINK = re.compile(r"\]\((?!https?:|mailto:|#|/)([^)\s]+)\)")

MATHJAX_CONFIG = """\
// MathJax 2 from the jupyter-server-mathjax pip package, configured as Jupyter does: the one
// combined config it ships, HTML-CSS output with its bundled STIX-Web fonts (no font fetch).
// $...$ and \\(...\\) inline, $$...$$ and \\[...\\] display, as in a notebook.
window.MathJax = {
  config: ["TeX-AMS-MML_HTMLorMML-full.js", "Safe.js"],
  MMLorHTML: {prefer: "HTML"},
  tex2jax: {inlineMath: [["$", "$"], ["\\\\(", "\\\\)"]], displayMath: [["$$", "$$"], ["\\\\[", "\\\\]"]],
            processEscapes: true, processEnvironments: true},
  "HTML-CSS": {availableFonts: [], imageFont: null, preferredFont: null, webFont: "STIX-Web", font: "STIX-Web"},
  messageStyle: "none",
  showMathMenu: false
};
"""


def lab_dirs() -> list[Path]:
    """Every lab folder (`labs/NN_name/`) with something to read, in lab order."""
    return sorted(
        p
        for p in (ROOT / "labs").iterdir()
        if p.is_dir() and re.match(r"\d\d_", p.name) and lab_pages(p)
    )


def lab_pages(lab: Path) -> list[str]:
    """One lab's pages, docs-relative, in reading order: README, chapters, notebooks."""
    chapters = sorted(p.name for p in lab.iterdir() if CHAPTER.match(p.name))
    notebooks = sorted(
        p.name for p in lab.glob("*.ipynb") if not p.name.endswith("_exercise.ipynb")
    )
    readme = ["README.md"] if (lab / "README.md").exists() else []
    return [f"labs/{lab.name}/{name}" for name in [*readme, *chapters, *notebooks]]


def first_heading(path: Path) -> str | None:
    """A page's `# ` heading as plain text (navigation titles cannot hold markdown)."""
    if path.suffix == ".ipynb":
        cells = json.loads(path.read_text())["cells"]
        lines = [
            line
            for cell in cells
            if cell["cell_type"] == "markdown"
            for line in "".join(cell["source"]).splitlines()
        ]
    else:
        lines = path.read_text().splitlines()
    heading = next((line[2:].strip() for line in lines if line.startswith("# ")), None)
    return heading.replace("`", "") if heading else None


def lab_nav(lab: Path) -> dict:
    """A lab's navigation section: its README as "Overview", each chapter, then "Notebook: <name>"."""
    entries = []
    for page in lab_pages(lab):
        path = ROOT / page
        if path.name == "README.md":
            title = "Overview"
        elif path.suffix == ".ipynb":
            title = "Notebook: " + path.stem
        else:
            title = first_heading(path) or path.stem
        entries.append({title: page})
    readme = lab / "README.md"
    return {(first_heading(readme) if readme.exists() else None) or lab.name: entries}


def section_titles(labs: list[Path], titles: list[str]) -> list[str]:
    """Labs that share a number (`00_collectives_primer`, `00_parallel_dims`) get a letter in
    folder order, `Lab 00a`, `Lab 00b`, so no two navigation sections start alike."""
    numbers = [lab.name[:2] for lab in labs]
    renamed = []
    for i, (number, title) in enumerate(zip(numbers, titles, strict=True)):
        if numbers.count(number) > 1:
            letter = "abcdefghij"[numbers[:i].count(number)]
            title = re.sub(rf"^Lab {number}\b", f"Lab {number}{letter}", title, count=1)
        renamed.append(title)
    return renamed


def landing_page() -> str:
    """The home page: what paralab is (README's first paragraph), then labs/README.md's map
    and reading order, its links re-rooted from labs/ to the site root."""
    readme = (ROOT / "README.md").read_text().split("\n\n")
    intro = next(block for block in readme[1:] if block.strip() and not block.startswith("#"))
    labs_readme = (ROOT / "labs" / "README.md").read_text()
    labs_readme = re.sub(r"^# .*\n", "", labs_readme, count=1)
    labs_readme = RELATIVE_LINK.sub(lambda m: f"](labs/{m.group(1)})", labs_readme)
    return (
        "# paralab\n\n"
        f"{intro}\n\n"
        "Each lab below has a README (overview and code map), chapters that align one topic "
        "with the production code of real engines, and its executed notebook. "
        "The repository's own [README](about.md) has the commands and the layout.\n\n"
        f"{labs_readme}"
    )


def nav() -> list:
    """Home, the labs overview, one section per lab (README -> chapters -> notebook), docs/, the repo README."""
    labs = lab_dirs()
    navs = [lab_nav(lab) for lab in labs]
    titles = section_titles(labs, [next(iter(n)) for n in navs])
    sections = [{title: next(iter(n.values()))} for title, n in zip(titles, navs, strict=True)]
    contracts = [
        {first_heading(page) or page.stem: f"docs/{page.name}"}
        for page in sorted((ROOT / "docs").glob("*.md"))
    ]
    return [
        {"Home": "index.md"},
        {"All labs": "labs/README.md"},
        *sections,
        *contracts,
        {"Repository README": "about.md"},
        *([{"Contributing": "CONTRIBUTING.md"}] if (ROOT / "CONTRIBUTING.md").exists() else []),
    ]


def mathjax_dir() -> Path:
    """MathJax 2's files as shipped in the jupyter-server-mathjax wheel: found, not imported
    (importing it imports a Jupyter server: 2 CPU-s of a build, for a folder's name)."""
    spec = importlib.util.find_spec("jupyter_server_mathjax")
    if spec is None or spec.origin is None:
        raise SystemExit(
            "the site needs `pip install -r requirements.txt` (jupyter-server-mathjax)"
        )
    return Path(spec.origin).parent / "static"


def write_docs(docs: Path = DOCS) -> None:
    """Generate the docs tree: the repo's markdown, notebooks and sources, plus the landing page."""
    if docs.exists():
        shutil.rmtree(docs)
    (docs / "labs").mkdir(parents=True)
    shutil.copy(ROOT / "README.md", docs / "about.md")  # README.md beside index.md would be dropped
    if (ROOT / "CONTRIBUTING.md").exists():  # the README links it
        shutil.copy(ROOT / "CONTRIBUTING.md", docs / "CONTRIBUTING.md")
    shutil.copy(ROOT / "labs" / "README.md", docs / "labs" / "README.md")
    for lab in lab_dirs():
        target = docs / "labs" / lab.name
        target.mkdir()
        for page in lab_pages(lab):
            shutil.copy(ROOT / page, docs / page)
        for source in lab.glob("*_lab.py"):
            shutil.copy(source, target / source.name)
    for page in (ROOT / "docs").glob(
        "*.md"
    ):  # the contracts the code and tests cite (docs/parallel_dims.md)
        (docs / "docs").mkdir(exist_ok=True)
        shutil.copy(page, docs / "docs" / page.name)
    for folder in ("src/paralab", "tests"):
        for source in (ROOT / folder).rglob("*.py"):
            destination = docs / source.relative_to(ROOT)
            destination.parent.mkdir(parents=True, exist_ok=True)
            shutil.copy(source, destination)
    (docs / "index.md").write_text(landing_page())
    assets = docs / "assets"
    shutil.copytree(mathjax_dir(), assets / "mathjax")
    (assets / "mathjax-config.js").write_text(MATHJAX_CONFIG)


def mkdocs_config(docs: Path = DOCS, site: Path = SITE) -> dict:
    """The mkdocs configuration, as a dict (written out as YAML by `build`)."""
    return {
        "site_name": "paralab",
        "site_description": "Parallelism labs you can run on a laptop and trust",
        "docs_dir": str(docs),
        "site_dir": str(site),
        "use_directory_urls": True,
        "theme": {
            "name": "material",
            "font": False,  # no Google Fonts request: the system font stack
            "features": ["navigation.sections", "navigation.top", "search.highlight"],
        },
        "plugins": [
            "search",
            {
                "mkdocs-jupyter": {
                    "include": ["*.ipynb"],  # the lab sources (*_lab.py) stay plain files
                    "execute": False,
                    "include_source": True,
                    "ignore_h1_titles": True,  # keep the navigation titles ("Notebook: ...")
                    "custom_mathjax_url": MATHJAX_PLACEHOLDER,
                    "cache_dir": str(
                        ROOT / "build" / "mkdocs-jupyter-cache"
                    ),  # rendered notebooks, by content hash
                }
            },
        ],
        "markdown_extensions": [
            "tables",
            "sane_lists",  # an ordered list keeps its start number ("4." stays 4)
            "admonition",
            "attr_list",
            "md_in_html",
            "toc",
            "pymdownx.details",
            "pymdownx.superfences",
            {"pymdownx.arithmatex": {"generic": True}},
        ],
        "hooks": [__file__],
        "nav": nav(),
    }


def on_page_content(html: str, page, config, files) -> str:
    """mkdocs hook. mkdocs-jupyter builds a notebook's table of contents from a markdown
    conversion whose anchors drop code spans (`#6-the-mesh-to-hand` for a heading rendered
    with id `6-fsdp_mesh-the-mesh-to-hand-fully_shard`): rebuild it from the rendered
    headings, so every entry of the page's contents points at a heading that exists."""
    from html import unescape

    from mkdocs.structure.toc import get_toc

    html = searchable(html)
    if not page.file.src_uri.endswith(".ipynb"):
        return html
    html = LAB_LINK.sub(lambda m: f'href="../../{m[1]}/{m[2]}/{m[3] or ""}"', html)
    html = CHAPTER_LINK.sub(lambda m: f'href="../{m[1]}/{m[2] or ""}"', html)
    root: list[dict] = []
    stack: list[dict] = []
    for level, anchor, inner in HEADING.findall(html):
        name = unescape(re.sub(r"<[^>]+>", "", inner)).replace("\u00b6", "").strip()
        token = {"level": int(level), "id": anchor, "name": name, "children": []}
        while stack and stack[-1]["level"] >= token["level"]:
            stack.pop()
        (stack[-1]["children"] if stack else root).append(token)
        stack.append(token)
    page.toc = get_toc(root)
    return download_link(Path(page.file.src_uri).name) + html


def download_link(notebook: str) -> str:
    """A notebook page's link to its .ipynb (mkdocs-jupyter's `include_source` copies it beside
    the page; the theme shows no button for it)."""
    return (
        f'<p class="paralab-download"><a href="{notebook}" download>'
        f"Download this notebook ({notebook})</a> to run it yourself.</p>\n"
    )


def searchable(html: str) -> str:
    """Math kept out of the search index, so a result's snippet never shows raw TeX (`$n$`):
    arithmatex's spans and divs, and the `$...$` of notebook markdown cells, are marked
    `data-search-exclude` (MathJax still typesets them)."""
    html = ARITHMATEX.sub(r"<\1 \2 data-search-exclude>", html)
    return NOTEBOOK_MARKDOWN.sub(
        lambda cell: INLINE_MATH.sub(r"<span data-search-exclude>\g<0></span>", cell.group(0)),
        html,
    )


def on_post_page(output: str, page, config) -> str:
    """mkdocs hook. Notebook pages carry nbconvert's own script tags: drop the MathJax one
    and any script from another host (mermaid from a CDN), so a page never reaches the
    network. Then MathJax, from the site's own assets, on the pages that have math."""
    from mkdocs.utils import get_relative_url

    output = re.sub(
        rf'<script[^>]*src="{re.escape(MATHJAX_PLACEHOLDER)}"[^>]*>\s*</script>', "", output
    )
    output = EXTERNAL_SCRIPT.sub("", output)
    if not has_math(output):
        return output
    scripts = "".join(
        f'<script src="{get_relative_url(script, page.url)}"></script>'
        for script in MATHJAX_SCRIPTS
    )
    head, body_end, tail = output.rpartition("</body>")
    return head + scripts + body_end + tail if body_end else output + scripts


def has_math(html: str) -> bool:
    """Whether MathJax would typeset anything on this page: a TeX delimiter outside the
    elements it skips (code, preformatted outputs, scripts)."""
    return TEX_DELIMITER.search(SKIPPED_BY_MATHJAX.sub("", html)) is not None


MKDOCS = (
    "import sys; sys.modules['rfc3987_syntax'] = None; import jsonschema; "
    "del sys.modules['rfc3987_syntax']; from mkdocs.__main__ import cli; cli(prog_name='mkdocs')"
)
"""`python -m mkdocs`, less the IRI grammar jsonschema would build when mkdocs-jupyter imports
nbformat: no schema here asks for it (`paralab.notebook_format` says why), and it was 2.3 of a
build's 7.6 CPU-s."""


def build(site: Path = SITE, docs: Path = DOCS) -> float:
    """Generate the docs tree and run `mkdocs build --strict` (a link to a missing page fails
    the build); returns the seconds it took."""
    import yaml

    start = time.perf_counter()
    write_docs(docs)
    config_file = docs.parent / "mkdocs.yml"
    config_file.write_text(
        yaml.safe_dump(mkdocs_config(docs, site), sort_keys=False, allow_unicode=True)
    )
    result = subprocess.run(
        [
            sys.executable,
            "-c",
            MKDOCS,
            "build",
            "--strict",
            "--clean",
            "--quiet",
            "-f",
            str(config_file),
        ],
        cwd=ROOT,
        capture_output=True,
        text=True,
    )
    if result.returncode != 0:
        raise RuntimeError(
            f"mkdocs build failed (config {config_file}):\n{result.stdout}{result.stderr}"
        )
    return time.perf_counter() - start
