"""docs/design.md's module map against the tree: every module is on the map, and the map names
no module that is not there (it once listed a validate.py that had been gone for months)."""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def mapped() -> set[str]:
    """Every `name.py` the two module-by-module blocks name, with its folder."""
    page = (ROOT / "docs" / "design.md").read_text()
    blocks = [
        ("harness/", page.split("Inside `harness/`, module by module:")[1].split("```")[1]),
        ("", page.split("The plugins and kernels, module by module")[1].split("```")[1]),
    ]
    found = set()
    for root, block in blocks:
        folder = ""
        for line in block.splitlines():
            head = line.split()[0] if line.strip() else ""
            if head.endswith("/") and not line.startswith(" "):
                folder = head
                continue
            if line and not line.startswith(" "):
                folder = ""  # a top-level module of the block
            found.update(f"{root}{folder}{name}" for name in re.findall(r"\b\w+\.py\b", line))
    return found


def modules() -> set[str]:
    files = [*ROOT.glob("harness/**/*.py"), *ROOT.glob("plugins/**/*.py"), *ROOT.glob("kernels/*.py")]
    return {str(p.relative_to(ROOT)) for p in files if p.name != "__init__.py" and "__pycache__" not in p.parts}


def test_every_module_is_on_the_map_and_the_map_names_only_modules_that_exist():
    named = {m for m in mapped() if not m.endswith("__init__.py")}
    assert sorted(modules() - named) == [], "missing from docs/design.md's module map"
    assert sorted(named - modules()) == [], "on docs/design.md's module map but not in the tree"
