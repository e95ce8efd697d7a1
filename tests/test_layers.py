"""The code's shape: layers that import downward only, no import circle, a Code map that is true.

The layers contract lives in pyproject.toml (``[tool.importlinter]``) and is checked by
``lint-imports`` itself, so ``make test`` (and CI) fails on an import that points up. The
circle check builds the import graph with grimp (import-linter's engine) over every project
package, type-checking and function-level imports included, and looks for strongly connected
components; it is first shown to find a circle planted in a graph of its own.
"""

from __future__ import annotations

import re
import subprocess
import sys
from collections.abc import Iterable, Mapping
from pathlib import Path

import grimp

from pipeline.io.config import PROJECT_ROOT

PACKAGES = ("pipeline", "producers", "operators", "bench")
LINT_IMPORTS = Path(sys.executable).parent / "lint-imports"


def import_circles(graph: Mapping[str, Iterable[str]]) -> list[list[str]]:
    """The strongly connected components with more than one module (Tarjan, iterative)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    circles: list[list[str]] = []
    counter = 0
    for root in graph:
        if root in index:
            continue
        work = [(root, iter(graph.get(root, ())))]
        index[root] = low[root] = counter
        counter += 1
        stack.append(root)
        on_stack.add(root)
        while work:
            node, edges = work[-1]
            advanced = False
            for target in edges:
                if target not in index:
                    index[target] = low[target] = counter
                    counter += 1
                    stack.append(target)
                    on_stack.add(target)
                    work.append((target, iter(graph.get(target, ()))))
                    advanced = True
                    break
                if target in on_stack:
                    low[node] = min(low[node], index[target])
            if advanced:
                continue
            work.pop()
            if work:
                low[work[-1][0]] = min(low[work[-1][0]], low[node])
            if low[node] == index[node]:
                component = []
                while True:
                    member = stack.pop()
                    on_stack.discard(member)
                    component.append(member)
                    if member == node:
                        break
                if len(component) > 1:
                    circles.append(sorted(component))
    return circles


def test_the_circle_finder_finds_a_planted_circle() -> None:
    graph = {"a": ["b"], "b": ["c"], "c": ["a", "d"], "d": [], "e": ["e2"], "e2": []}
    assert import_circles(graph) == [["a", "b", "c"]]
    assert import_circles({"x": ["y"], "y": []}) == []


def test_no_import_circle_among_the_project_modules() -> None:
    imports = grimp.build_graph(*PACKAGES, cache_dir=None)
    graph = {
        module: sorted(imports.find_modules_directly_imported_by(module))
        for module in sorted(imports.modules)
    }
    assert len(graph) > 80  # every module of the four packages was seen
    assert import_circles(graph) == []


def test_lint_imports_contracts_hold() -> None:
    """The layers (cli > runs > stages > observe > services > io > workloads > operators),
    bench above pipeline, and a pure core: ``lint-imports`` as CI runs it."""
    result = subprocess.run(
        [str(LINT_IMPORTS), "--no-cache"],
        cwd=PROJECT_ROOT,
        capture_output=True,
        text=True,
        check=False,
        timeout=300,
    )
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-2000:]
    assert "Contracts: 3 kept, 0 broken." in result.stdout


def test_code_map_names_only_files_that_exist_and_every_layer() -> None:
    design = (PROJECT_ROOT / "docs" / "design.md").read_text()
    section = design.split("\n## Code map\n", 1)[1].split("\n## ", 1)[0]
    paths = set(
        re.findall(
            r"`((?:pipeline|producers|operators|bench|deploy|grafana|tests|docs)"
            r"/[\w/.]*)`",
            section,
        )
    )
    assert len(paths) > 20
    missing = sorted(p for p in paths if not (PROJECT_ROOT / p).exists())
    assert missing == []
    layers = {p.name for p in (PROJECT_ROOT / "pipeline").iterdir() if (p / "__init__.py").exists()}
    assert layers == {"cli", "runs", "stages", "observe", "services", "io"}
    assert all(f"`pipeline/{layer}/`" in section for layer in layers)
    # Module names the map gives inside a layer's row exist in that layer's folder.
    for row in re.findall(r"^\| \d \| `(pipeline/\w+)/`[^|]*\| (.*) \|$", section, re.M):
        folder, text = PROJECT_ROOT / row[0], row[1]
        for name in re.findall(r"`(\w+\.py)`", text):
            assert (folder / name).exists(), f"{row[0]}/{name}"


def test_every_pipeline_module_says_what_it_is_and_its_layer() -> None:
    import ast

    layered = sorted(
        path
        for path in [*PROJECT_ROOT.glob("pipeline/*/*.py"), *PROJECT_ROOT.glob("producers/*.py")]
        if path.name not in ("__init__.py", "__main__.py")
    )
    assert len(layered) > 40
    for path in layered:
        docstring = ast.get_docstring(ast.parse(path.read_text())) or ""
        assert docstring.strip(), path
        assert re.search(r"\(layer: \w+\)|^Layer: \w+", docstring, re.M), path
