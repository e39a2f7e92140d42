"""The prose points only at things that exist: lab sections, tests, code and upstream sources.

A chapter or README that names "section 6", a test, a `paralab` function or an upstream commit is
making a claim a reader will follow. These guards check each kind of pointer against what the
repository holds, so that moving a section, renaming a test or re-reading upstream at another
commit fails here instead of leaving a stale pointer behind:

- a lab section is named only inside a link to its heading's anchor, and the heading the anchor
  resolves to carries the number the link text says (`[section 6](cfgp_lab.ipynb#6-the-...)`);
  anchors are the site's (mkdocs-jupyter: the heading's text, lower-cased, punctuation dropped,
  spaces to hyphens), resolved against the committed notebooks' markdown headings;
- every `test_*` name and `tests/test_*.py` path is defined in `tests/`;
- every `paralab.x.y` name imports and every `src/paralab/...py[:name]` file and def exists;
- every upstream citation is written `owner/repo@commit` (optionally `:path`), or as a GitHub
  URL, or `owner/repo#N` for a thread, and is listed in `docs/sources.toml`, the one registry of
  what was read, where each commit's default branch is recorded. A commit hash anywhere else in
  prose is an unregistered citation.

Each checker takes markdown text and returns its problems, so the planted-pointer tests at the
bottom feed it a stale reference and see it reported.
"""

from __future__ import annotations

import ast
import importlib
import json
import re
import unicodedata
from functools import cache
from pathlib import Path

import pytest
import tomllib

ROOT = Path(__file__).resolve().parents[1]
REGISTRY = ROOT / "docs" / "sources.toml"


def prose_pages() -> list[Path]:
    """The chapters and READMEs a reader follows pointers from."""
    pages = [*ROOT.glob("labs/*/[0-9][0-9]_*.md"), *ROOT.glob("labs/*/README.md")]
    return sorted(pages) + [ROOT / "labs" / "README.md", ROOT / "README.md"]


FENCE = re.compile(r"^(```|~~~).*?^\1", re.S | re.M)
CODE_SPAN = re.compile(r"(`+)(.+?)\1", re.S)
LINK = re.compile(r"(?<!!)\[((?:[^\[\]]|\[[^\[\]]*\])*)\]\(([^)\s]+)\)")
SECTION_WORD = re.compile(r"(?:\b[Ss]ections?\s+|§\s*)[*_]?(\d+)")
SECTION_TEXT = re.compile(r"^(?:[Ss]ections?\s+|§\s*)[*_]?(\d+)\b")
HEADING = re.compile(r"^(#{1,6})\s+(.+?)\s*#*\s*$", re.M)


def line_of(text: str, offset: int) -> int:
    return text.count("\n", 0, offset) + 1


def blank(match: re.Match) -> str:
    """Keep offsets (and so line numbers) while hiding a span from a later search."""
    return re.sub(r"[^\n]", " ", match.group(0))


def slugify(value: str) -> str:
    """mkdocs-jupyter's heading id: ASCII, punctuation dropped, lower case, runs of space to '-'."""
    value = unicodedata.normalize("NFKD", value).encode("ascii", "ignore").decode("ascii")
    value = re.sub(r"[^\w\s-]", "", value).strip().lower()
    return re.sub(r"[-\s]+", "-", value)


def heading_text(markdown: str) -> str:
    """A heading's markdown as the rendered text the anchor is made from (code, links, emphasis)."""
    text = re.sub(r"\[([^\]]*)\]\([^)]*\)", r"\1", markdown)
    text = re.sub(r"<[^>]+>", "", text)
    return re.sub(r"`+([^`]*)`+", r"\1", text)


def headings_of(markdown: str) -> dict[str, str]:
    """anchor -> heading text, for every heading outside code blocks."""
    markdown = FENCE.sub(blank, markdown)
    return {
        slugify(heading_text(m.group(2))): heading_text(m.group(2))
        for m in HEADING.finditer(markdown)
    }


@cache
def anchors(path: Path) -> dict[str, str]:
    """The heading anchors a page offers: a notebook's markdown cells, or a markdown file."""
    if path.suffix == ".ipynb":
        cells = json.loads(path.read_text())["cells"]
        markdown = "\n\n".join("".join(c["source"]) for c in cells if c["cell_type"] == "markdown")
    else:
        markdown = path.read_text()
    return headings_of(markdown)


def section_problems(text: str, page: Path) -> list[str]:
    """Bare section numbers, and links whose file, anchor or section number does not resolve."""
    problems = []
    text = FENCE.sub(blank, text)
    text = CODE_SPAN.sub(blank, text)
    for link in LINK.finditer(text):
        label, target = " ".join(link.group(1).split()), link.group(2)
        where = line_of(text, link.start())
        external = re.match(r"[a-z]+:", target) is not None
        numbered = SECTION_TEXT.match(label)
        if not external and "#" in target:
            name, anchor = target.split("#", 1)
            file = (page.parent / name).resolve() if name else page
            if not file.exists():
                problems.append(f"line {where}: [{label}]({target}): no file {name}")
                continue
            heading = anchors(file).get(anchor)
            if heading is None:
                problems.append(f"line {where}: [{label}]({target}): {file.name} has no #{anchor}")
            elif numbered and not re.match(rf"{numbered.group(1)}\b", heading):
                problems.append(
                    f"line {where}: [{label}]({target}) is a link to section "
                    f"{heading.split('.')[0]}, not {numbered.group(1)}"
                )
        elif numbered and not external:
            problems.append(f"line {where}: [{label}]({target}) names a section but no anchor")
        if numbered or external:
            text = text[: link.start()] + blank(link) + text[link.end() :]
    for bare in SECTION_WORD.finditer(text):
        problems.append(
            f"line {line_of(text, bare.start())}: bare {bare.group(0).strip()!r}: "
            "link it to the section's heading anchor"
        )
    return problems


@cache
def defined_tests() -> dict[str, set[str]]:
    """test file name -> the test functions (and Test classes) it defines."""
    defined = {}
    for path in (ROOT / "tests").glob("test_*.py"):
        tree = ast.parse(path.read_text())
        defined[path.name] = {
            node.name
            for node in ast.walk(tree)
            if isinstance(node, (ast.FunctionDef, ast.ClassDef))
            and node.name.startswith(("test_", "Test"))
        }
    return defined


TEST_FILE = re.compile(r"(?<![\w/])(?:tests/)?(test_\w+)\.py(?:::(\w+))?")
TEST_NAME = re.compile(r"(?<![\w/.:])test_\w+\b(?!\.py|::|/)")


def named_test_problems(text: str) -> list[str]:
    """`tests/test_x.py[::test_y]` and bare `test_y` names that `tests/` does not define."""
    problems, defined = [], defined_tests()
    everything = set().union(*defined.values())
    for m in TEST_FILE.finditer(text):
        file, name = f"{m.group(1)}.py", m.group(2)
        if file not in defined:
            problems.append(f"line {line_of(text, m.start())}: no tests/{file}")
        elif name and name not in defined[file]:
            problems.append(f"line {line_of(text, m.start())}: tests/{file} defines no {name}")
    for m in TEST_NAME.finditer(TEST_FILE.sub(blank, text)):
        if m.group(0) not in everything and f"{m.group(0)}.py" not in defined:
            problems.append(
                f"line {line_of(text, m.start())}: no test named {m.group(0)} in tests/"
            )
    return problems


DOTTED = re.compile(r"(?<![\w/.])paralab(?:\.\w+)+")
SOURCE_FILE = re.compile(r"(?<![\w/])(?:src/)?(paralab/[\w/]+\.py)(?::(\w+(?:\.\w+)?))?")


def resolves(dotted: str) -> bool:
    """Whether `paralab.a.b.c` is a module, or an attribute path under the longest module prefix."""
    parts = dotted.split(".")
    for cut in range(len(parts), 0, -1):
        try:
            thing = importlib.import_module(".".join(parts[:cut]))
        except ImportError:
            continue
        try:
            for attribute in parts[cut:]:
                thing = getattr(thing, attribute)
        except AttributeError:
            return False
        return True
    return False


def defs_in(path: Path) -> set[str]:
    """Every top-level def and class in a file, and `Class.method` for each method."""
    names = set()
    for node in ast.parse(path.read_text()).body:
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef, ast.Assign)):
            if isinstance(node, ast.Assign):
                names |= {t.id for t in node.targets if isinstance(t, ast.Name)}
                continue
            names.add(node.name)
            if isinstance(node, ast.ClassDef):
                names |= {
                    f"{node.name}.{item.name}"
                    for item in node.body
                    if isinstance(item, (ast.FunctionDef, ast.AsyncFunctionDef))
                }
    return names


def code_problems(text: str) -> list[str]:
    """`paralab.x.y` names that do not import, and `src/paralab/...py[:def]` that do not exist."""
    problems = []
    for m in DOTTED.finditer(text):
        if not resolves(m.group(0)):
            problems.append(f"line {line_of(text, m.start())}: {m.group(0)} does not resolve")
    for m in SOURCE_FILE.finditer(text):
        path, name = ROOT / "src" / m.group(1), m.group(2)
        if "NN" in m.group(1):  # a file name pattern: `exercises/labNN.py` is one per lab
            if not list((ROOT / "src").glob(m.group(1).replace("NN", "[0-9][0-9]"))):
                problems.append(f"line {line_of(text, m.start())}: no file like src/{m.group(1)}")
            continue
        if not path.exists():
            problems.append(f"line {line_of(text, m.start())}: no src/{m.group(1)}")
        elif name and name not in defs_in(path):
            problems.append(f"line {line_of(text, m.start())}: src/{m.group(1)} defines no {name}")
    return problems


CITATION = re.compile(
    r"(?<![\w/.-])(?P<project>[A-Za-z0-9][\w.-]*/[\w.-]*\w)@(?P<commit>[0-9a-f]{7,40})\b"
    r"(?::(?P<path>[\w./-]*\w))?"
)
GITHUB_URL = re.compile(
    r"https://github\.com/(?P<project>[\w.-]+/[\w.-]+)/(?:blob|tree|commit)/"
    r"(?P<commit>[0-9a-f]{7,40})(?:/(?P<path>[\w./-]*\w))?"
)
THREAD = re.compile(
    r"(?<![\w/.-])(?P<project>[A-Za-z0-9][\w.-]*/[\w.-]*\w)#(?P<number>\d+)\b"
    r"|https://github\.com/(?P<url_project>[\w.-]+/[\w.-]+)/(?:pull|issues)/(?P<url_number>\d+)"
)
HASH = re.compile(
    r"(?<![\w/.#@-])(?=[0-9a-f]*\d)(?=[0-9a-f]*[a-f])[0-9a-f]{7,40}\b|`[0-9a-f]{7,40}`"
)


def registry(path: Path = REGISTRY) -> list[dict]:
    return tomllib.loads(path.read_text())["source"]


def citation_problems(text: str, sources: list[dict]) -> list[str]:
    """Citations that `docs/sources.toml` does not list, and commit hashes outside a citation."""
    problems = []
    for pattern in (CITATION, GITHUB_URL):
        for m in pattern.finditer(text):
            where = f"line {line_of(text, m.start())}: {m.group(0)}"
            entries = [
                s
                for s in sources
                if s["project"].lower() == m["project"].lower()
                and s["commit"].startswith(m["commit"])
            ]  # a commit read twice has two entries: a path listed in either counts
            if not entries:
                problems.append(f"{where}: project and commit not in docs/sources.toml")
            elif m["path"] and all(m["path"] not in e.get("paths", []) for e in entries):
                problems.append(f"{where}: path not listed for it in docs/sources.toml")
            text = text[: m.start()] + blank(m) + text[m.end() :]
    for m in THREAD.finditer(text):
        project, number = m["project"] or m["url_project"], int(m["number"] or m["url_number"])
        if not any(
            s["project"].lower() == project.lower() and number in s.get("threads", [])
            for s in sources
        ):
            problems.append(
                f"line {line_of(text, m.start())}: {m.group(0)}: thread not in docs/sources.toml"
            )
    for m in HASH.finditer(text):
        problems.append(
            f"line {line_of(text, m.start())}: bare commit {m.group(0)}: "
            "cite it as owner/repo@commit and list it in docs/sources.toml"
        )
    return problems


def page_id(page: Path) -> str:
    return str(page.relative_to(ROOT))


@pytest.mark.parametrize("page", prose_pages(), ids=page_id)
def test_section_references_link_to_headings_that_exist(page):
    problems = section_problems(page.read_text(), page)
    assert not problems, f"{page_id(page)}:\n" + "\n".join(problems)


@pytest.mark.parametrize("page", prose_pages(), ids=page_id)
def test_named_tests_exist(page):
    problems = named_test_problems(page.read_text())
    assert not problems, f"{page_id(page)}:\n" + "\n".join(problems)


@pytest.mark.parametrize("page", prose_pages(), ids=page_id)
def test_named_code_resolves(page):
    problems = code_problems(page.read_text())
    assert not problems, f"{page_id(page)}:\n" + "\n".join(problems)


@pytest.mark.parametrize("page", prose_pages(), ids=page_id)
def test_upstream_citations_are_registered(page):
    problems = citation_problems(page.read_text(), registry())
    assert not problems, f"{page_id(page)}:\n" + "\n".join(problems)


def test_registry_entries_are_full_commits_checked_on_a_default_branch():
    for entry in registry():
        assert re.fullmatch(r"[0-9a-f]{40}", entry["commit"]), entry
        assert entry["default_branch"] in {"main", "master"}, entry
        assert entry["project"].count("/") == 1, entry


# Planted stale pointers: each guard must report them.

LAB = ROOT / "labs" / "03_cfgp"
PAGE = LAB / "01_planted.md"


def test_a_bare_section_number_is_reported():
    problems = section_problems("The bug clinic (section 10, or §10) shows it.", PAGE)
    assert len(problems) == 2 and all("bare" in p for p in problems)


def test_a_link_to_a_missing_or_renumbered_heading_is_reported():
    real, number = next(
        (anchor, heading.split(".")[0])
        for anchor, heading in anchors(LAB / "cfgp_lab.ipynb").items()
        if re.match(r"\d+\.", heading)
    )
    wrong = int(number) + 1
    assert section_problems(f"[section {number}](cfgp_lab.ipynb#{real})", PAGE) == []
    stale = section_problems(f"[section {wrong}](cfgp_lab.ipynb#{real})", PAGE)
    assert len(stale) == 1 and f"not {wrong}" in stale[0]
    missing = section_problems("[section 6](cfgp_lab.ipynb#6-the-bug-clinic)", PAGE)
    assert len(missing) == 1 and "has no #6-the-bug-clinic" in missing[0]
    unanchored = section_problems("[section 6](cfgp_lab.ipynb)", PAGE)
    assert len(unanchored) == 1 and "no anchor" in unanchored[0]


def test_a_missing_test_name_is_reported():
    assert (
        named_test_problems("`tests/test_engine_claims.py::test_what_the_backward_recomputes`")
        == []
    )
    problems = named_test_problems(
        "`tests/test_vae_lb_planner.py::test_ties_go_to_the_first_rank`, "
        "`test_no_such_thing` and `tests/test_gone.py`"
    )
    assert len(problems) == 3


def test_a_bad_code_reference_is_reported():
    assert code_problems("`paralab.check.summary` in `src/paralab/check.py:summary`") == []
    problems = code_problems(
        "`paralab.x`, `paralab.check.no_such_helper`, `src/paralab/gone.py` and "
        "`src/paralab/check.py:no_such_def`"
    )
    assert len(problems) == 4


def test_an_unregistered_citation_is_reported():
    sources = [
        {
            "project": "pytorch/torchtitan",
            "commit": "238fa9953e4aec2a62582121564273d7cbb1e9f1",
            "default_branch": "main",
            "paths": ["torchtitan/models/llama3/infra/parallelize.py"],
            "threads": [472],
        }
    ]
    good = (
        "`pytorch/torchtitan@238fa99:torchtitan/models/llama3/infra/parallelize.py`, "
        "pytorch/torchtitan#472"
    )
    assert citation_problems(good, sources) == []
    problems = citation_problems(
        "`pytorch/torchtitan@018740b`, `vinjn/cosmos-rl@1d7bbfa`, "
        "`pytorch/torchtitan@238fa99:torchtitan/other.py`, pytorch/torchtitan#1147, "
        "and at commit `2fc04c6`.",
        sources,
    )
    assert len(problems) == 5


# The lab notebooks themselves, where their prose already follows the rules (the others still
# name sections bare): every section link resolves, every cited source is registered.
LINKED_LABS = ["10_four_d_composition", "11_scale"]


def notebook_markdown(lab: str) -> tuple[Path, str]:
    notebook = next((ROOT / "labs" / lab).glob("*_lab.ipynb"))
    cells = json.loads(notebook.read_text())["cells"]
    return notebook, "\n\n".join(
        "".join(c["source"]) for c in cells if c["cell_type"] == "markdown"
    )


@pytest.mark.parametrize("lab", LINKED_LABS)
def test_a_lab_notebooks_pointers_resolve(lab):
    notebook, text = notebook_markdown(lab)
    problems = (
        section_problems(text, notebook)
        + named_test_problems(text)
        + code_problems(text)
        + citation_problems(text, registry())
    )
    assert not problems, f"{lab}:\n" + "\n".join(problems)


def scale_citations() -> dict[str, str]:
    """Every citation string of `paralab.scale`: each preset's and reason's source, each case's."""
    from paralab.scale.cases import SHIPPED, load_cases
    from paralab.scale.hardware import SOURCES as HARDWARE_SOURCES
    from paralab.scale.heldout import GENERALIZATION, MISSES
    from paralab.scale.models import SOURCES as MODEL_SOURCES

    found = {f"hardware.SOURCES[{k!r}]": v for k, v in HARDWARE_SOURCES.items()}
    found |= {f"models.SOURCES[{k!r}]": v for k, v in MODEL_SOURCES.items()}
    found |= {f"heldout.MISSES[{k!r}]": v for k, v in MISSES.items()}
    for path in (SHIPPED, GENERALIZATION):
        found |= {f"{path.name}: {c.name}": c.source for c in load_cases(path)}
        comments = [line for line in path.read_text().splitlines() if line.lstrip().startswith("#")]
        found[f"{path.name} comments"] = "\n".join(comments)
    return found


def test_the_scale_models_citations_are_registered():
    sources, pages = registry(), tomllib.loads(REGISTRY.read_text()).get("page", [])
    urls = {p["url"] for p in pages}
    problems = []
    for where, text in scale_citations().items():
        problems += [f"{where}: {p}" for p in citation_problems(text, sources)]
        for url in re.findall(r"(?:nvidia\.com/[\w./-]*\w/|discuss\.pytorch\.org/t/\d+)", text):
            if url not in urls:
                problems.append(f"{where}: {url} is no [[page]] of docs/sources.toml")
    assert not problems, "\n".join(problems)
