"""The page people land on covers the whole suite: every lab folder and every package module."""

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
README = ROOT / "README.md"


def layout_block(text: str) -> str:
    """The fenced tree under README's `## Layout` heading."""
    section = text.split("\n## Layout\n", 1)[1]
    return section.split("```", 2)[1]


def expected_entries() -> list[str]:
    """What the tree must name: each lab folder, each `src/paralab/` subpackage and module."""
    package = ROOT / "src" / "paralab"
    labs = [f"{p.name}/" for p in sorted((ROOT / "labs").iterdir()) if re.match(r"\d\d_", p.name)]
    subpackages = [f"{p.name}/" for p in sorted(package.iterdir()) if (p / "__init__.py").exists()]
    modules = [p.name for p in sorted(package.glob("*.py")) if p.name != "__init__.py"]
    return labs + subpackages + modules


def missing_from_layout(text: str) -> list[str]:
    """The entries the README's layout tree does not name, each as the first word of a line."""
    named = {line.split()[0] for line in layout_block(text).splitlines() if line.strip()}
    return [entry for entry in expected_entries() if entry not in named]


def test_the_layout_names_every_lab_and_every_package_module():
    assert missing_from_layout(README.read_text()) == []


def test_a_lab_left_out_of_the_layout_is_caught():
    text = README.read_text()
    without = "\n".join(line for line in text.splitlines() if "09_expert_parallel/ " not in line)
    assert missing_from_layout(without) == ["09_expert_parallel/"]
    without_tp = "\n".join(line for line in text.splitlines() if not line.startswith("    tp/"))
    assert missing_from_layout(without_tp) == ["tp/"]


def test_the_question_table_points_at_labs_that_exist():
    text = README.read_text()
    table = text.split("## Which lab answers my question", 1)[1].split("\n## ", 1)[0]
    targets = re.findall(r"\]\((labs/[^)]+)\)", table)
    rows = [line for line in table.splitlines() if line.startswith("| ") and "---" not in line]
    assert len(rows) - 1 >= 5, "the table answers at least five questions"
    assert targets and all((ROOT / t).is_file() for t in targets), targets
    every_lab = {
        f"labs/{p.name}/README.md" for p in (ROOT / "labs").iterdir() if re.match(r"\d\d_", p.name)
    }
    assert every_lab <= set(targets), sorted(every_lab - set(targets))
