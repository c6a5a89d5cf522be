"""The import layering of docs/design.md, read from the page and checked against every import
(module level or inside a function) of every module: the map cannot drift from the code."""

from __future__ import annotations

import ast
import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PACKAGES = {"harness": "kvbench", "plugins": "kvbench.plugins", "kernels": "kvbench.kernels"}


def layers() -> list[list[str]]:
    page = (ROOT / "docs" / "design.md").read_text()
    table = page.split("Bottom to top;")[1].split("```")[1]
    return [re.split(r"\s{3,}", line)[0].split(", ") for line in table.strip().splitlines()]


def modules() -> dict[str, Path]:
    found = {}
    for folder, package in PACKAGES.items():
        for path in (ROOT / folder).rglob("*.py"):
            parts = [p for p in path.relative_to(ROOT / folder).with_suffix("").parts if p != "__init__"]
            found[".".join([package, *parts])] = path
    return found


def layer_of(module: str, table: list[list[str]]) -> int | None:
    """The layer of the longest entry that names `module` or a package above it."""
    name = module.removeprefix("kvbench.")
    matches = [
        (len(entry), i)
        for i, entries in enumerate(table)
        for entry in entries
        if re.match("^" + re.escape(entry).replace(r"\*", r"[^.]+") + r"(\.|$)", name)
    ]
    return max(matches)[1] if matches else None


def imports(path: Path, known: dict) -> set[str]:
    names = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ImportFrom) and node.module and node.module.startswith("kvbench."):
            names.add(node.module)
            names.update(f"{node.module}.{a.name}" for a in node.names if f"{node.module}.{a.name}" in known)
        elif isinstance(node, ast.Import):
            names.update(a.name for a in node.names if a.name.startswith("kvbench."))
    return names


def test_every_module_has_a_layer():
    table = layers()
    assert [m for m in modules() if m.count(".") and layer_of(m, table) is None] == []


def test_no_module_imports_from_a_layer_above_its_own():
    table, known = layers(), modules()
    upward = [
        f"{module} (layer {layer_of(module, table)}) imports {name} (layer {layer_of(name, table)})"
        for module, path in known.items()
        for name in sorted(imports(path, known))
        if layer_of(name, table) is not None and layer_of(name, table) > layer_of(module, table)
    ]
    assert upward == []


def test_the_check_catches_an_upward_import(tmp_path):
    table = layers()
    engine = tmp_path / "engine.py"
    engine.write_text("def later():\n    from kvbench.reporting.report import summarize\n")
    (name,) = imports(engine, {})
    assert layer_of(name, table) > layer_of("kvbench.core.engine", table)
