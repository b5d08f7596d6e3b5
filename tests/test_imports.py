"""Every module of the package imports, and no two of them import each other, directly or round a circle.

Imports inside functions count: a lazy import that hides a circle is still one."""

from __future__ import annotations

import ast
import importlib
from pathlib import Path

import pytest

import eagle_mdsd

PACKAGE = "eagle_mdsd"


def modules(root: Path, package: str) -> dict[str, Path]:
    """Dotted name -> source file of every module of the package at `root` (a package is its __init__.py)."""
    found = {}
    for path in sorted(root.rglob("*.py")):
        parts = path.relative_to(root).with_suffix("").parts
        if parts[-1] == "__init__":
            parts = parts[:-1]
        found[".".join((package, *parts))] = path
    return found


def import_graph(root: Path, package: str) -> dict[str, set[str]]:
    """Module -> the package's modules it imports anywhere in its source."""
    known = modules(root, package)
    graph = {}
    for name, path in known.items():
        here = name if path.name == "__init__.py" else name.rpartition(".")[0]
        targets = set()
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if isinstance(node, ast.Import):
                targets.update(alias.name for alias in node.names)
            elif isinstance(node, ast.ImportFrom):
                base = node.module or ""
                if node.level:
                    parts = here.split(".")
                    stem = ".".join(parts[: len(parts) - node.level + 1])
                    base = f"{stem}.{base}" if base else stem
                # `from a import b` imports the module a.b where there is one, else a name of a
                targets.update(f"{base}.{alias.name}" if f"{base}.{alias.name}" in known else base
                               for alias in node.names)
        graph[name] = {target for target in targets if target in known and target != name}
    return graph


def circles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The circles a depth-first walk meets, each as a closed path of names; none where there is none."""
    found, finished = [], set()

    def walk(name: str, path: list[str]) -> None:
        for following in sorted(graph[name]):
            if following in path:
                found.append(path[path.index(following):] + [following])
            elif following not in finished:
                walk(following, path + [following])
        finished.add(name)

    for start in sorted(graph):
        if start not in finished:
            walk(start, [start])
    return found


def test_every_module_of_the_package_imports():
    for name in modules(Path(eagle_mdsd.__file__).parent, PACKAGE):
        if not name.endswith(".__main__"):  # runs the command when imported
            importlib.import_module(name)


def test_no_two_modules_of_the_package_import_each_other_round_a_circle():
    found = circles(import_graph(Path(eagle_mdsd.__file__).parent, PACKAGE))
    assert not found, "import circles: " + "; ".join(" -> ".join(circle) for circle in found)


def test_a_circle_hidden_by_a_lazy_import_is_found(tmp_path):
    package = tmp_path / "toy"
    (package / "inner").mkdir(parents=True)
    (package / "__init__.py").write_text("")
    (package / "a.py").write_text("from .b import thing\n")
    (package / "b.py").write_text("def thing():\n    from .inner import c\n")
    (package / "inner" / "__init__.py").write_text("")
    (package / "inner" / "c.py").write_text("from .. import a\n")
    (package / "d.py").write_text("from . import a\n")  # on no circle itself
    graph = import_graph(package, "toy")
    assert graph["toy.a"] == {"toy.b"} and graph["toy.b"] == {"toy.inner.c"} and graph["toy.inner.c"] == {"toy.a"}
    found = circles(graph)
    assert found and {tuple(circle[:-1]) for circle in found} <= {
        ("toy.a", "toy.b", "toy.inner.c"), ("toy.b", "toy.inner.c", "toy.a"), ("toy.inner.c", "toy.a", "toy.b")}
    assert not circles({name: targets - {"toy.a"} for name, targets in graph.items()})


@pytest.mark.parametrize("source, expected", [("import toy.b\n", {"toy.b"}), ("from toy import b\n", {"toy.b"}),
                                              ("from .b import thing\n", {"toy.b"}), ("import os\n", set())])
def test_each_form_of_import_is_an_edge(tmp_path, source, expected):
    package = tmp_path / "toy"
    package.mkdir()
    (package / "__init__.py").write_text("")
    (package / "a.py").write_text(source)
    (package / "b.py").write_text("thing = 1\n")
    assert import_graph(package, "toy")["toy.a"] == expected


def test_the_benchmarks_parts_never_import_their_orchestrators():
    """Data flows down: `run` and `sweep` call the parts of the benchmark package, and no part calls back up."""
    graph = import_graph(Path(eagle_mdsd.__file__).parent, PACKAGE)
    orchestrators = {f"{PACKAGE}.benchmark.run", f"{PACKAGE}.benchmark.sweep"}
    climbs = {name: targets & orchestrators for name, targets in graph.items()
              if name not in orchestrators and targets & orchestrators and not name.startswith(f"{PACKAGE}.cli")}
    assert not climbs, f"imports up into the orchestrators: {climbs}"


def test_the_wheel_lists_every_package_and_ships_the_trees():
    """pyproject.toml names the packages one by one (tree_configs/ is mapped in beside them), so a new package
    must join the list; scripts/wheel_check.sh proves the installed wheel finds the trees."""
    import tomllib

    root = Path(eagle_mdsd.__file__).parent
    setup = tomllib.loads((root.parent / "pyproject.toml").read_text())["tool"]["setuptools"]
    packages = {name for name, path in modules(root, PACKAGE).items() if path.name == "__init__.py"}
    assert set(setup["packages"]) == packages | {f"{PACKAGE}.tree_configs"}
    assert setup["package-dir"] == {f"{PACKAGE}.tree_configs": "tree_configs"}
    assert (root.parent / "tree_configs" / "eagle_default.json").is_file()
