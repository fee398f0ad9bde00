"""The package's layout as docs/architecture.md draws it: its imports (lazy ones and those for
type checking included) form no circle, and the page names every module the package has."""

from __future__ import annotations

import ast
import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
PACKAGE = ROOT / "harel_edge"


def modules() -> dict[str, Path]:
    found = {}
    for path in PACKAGE.rglob("*.py"):
        name = ".".join(path.relative_to(ROOT).with_suffix("").parts)
        found[name.removesuffix(".__init__")] = path
    return found


def import_graph() -> dict[str, set[str]]:
    """Each module's imports of the package's modules, wherever in the module they are written."""
    known = modules()
    graph: dict[str, set[str]] = {name: set() for name in known}
    for name, path in known.items():
        package = name if path.name == "__init__.py" else name.rpartition(".")[0]
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Import):
                targets = [alias.name for alias in node.names]
            elif isinstance(node, ast.ImportFrom):
                base = node.module or ""
                if node.level:
                    parts = package.split(".")[: len(package.split(".")) - node.level + 1]
                    base = ".".join([*parts, base] if base else parts)
                subs = [f"{base}.{alias.name}" for alias in node.names]
                targets = [t for t in subs if t in known] + ([base] if any(t not in known for t in subs) else [])
            else:
                continue
            graph[name] |= {t for t in targets if t in known and t != name}
    return graph


def circles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected parts of more than one module (Tarjan's algorithm)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    found: list[list[str]] = []

    def visit(node: str) -> None:
        index[node] = low[node] = len(index)
        stack.append(node)
        for target in graph[node]:
            if target not in index:
                visit(target)
                low[node] = min(low[node], low[target])
            elif target in stack:
                low[node] = min(low[node], index[target])
        if low[node] == index[node]:
            part = []
            while (member := stack.pop()) != node:
                part.append(member)
            part.append(node)
            if len(part) > 1:
                found.append(sorted(part))

    for node in graph:
        if node not in index:
            visit(node)
    return found


def test_no_module_of_the_package_imports_itself_through_others():
    graph = import_graph()
    assert len(graph) > 40, "the package's modules were found"
    assert circles(graph) == []


def test_the_circle_check_finds_a_circle_when_there_is_one():
    assert circles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]


def test_docs_architecture_names_every_module_of_the_package():
    page = (ROOT / "docs" / "architecture.md").read_text()
    rows = [line for line in page.splitlines() if line.startswith("| `")]
    named: set[str] = set()
    for row in rows:
        where = row.split("|")[1]
        folder = re.match(r" `(\w+)/`", where)
        for file in re.findall(r"`(\w+\.py)`", row):
            named.add(f"{folder.group(1)}/{file}" if folder else file)
    missing = []
    for path in PACKAGE.rglob("*.py"):
        relative = path.relative_to(PACKAGE)
        if path.name == "__init__.py" or relative.parts[0] in ("testing", "examples", "cli"):
            continue  # a package's own face, and the folders the page names as a whole
        if str(relative) not in named:
            missing.append(str(relative))
    assert missing == [], f"docs/architecture.md does not name {missing}"


def test_every_name_the_package_exports_can_be_imported():
    import harel_edge

    missing = []
    for name in harel_edge.__all__:
        try:
            getattr(harel_edge, name)
        except AttributeError as exc:
            missing.append(f"{name}: {exc}")
    assert missing == []


def test_no_module_compares_a_profiles_name_outside_the_settings_and_the_executor_factory():
    allowed = {"settings.py", "settings_combination.py", "settings_variables.py", "executor/__init__.py"}
    comparison = re.compile(r"\bprofile\b\s*(==|!=|\bin\b|\bnot in\b)")
    found = [
        f"{path.relative_to(PACKAGE)}:{number}: {line.strip()}"
        for path in PACKAGE.rglob("*.py")
        if str(path.relative_to(PACKAGE)) not in allowed
        for number, line in enumerate(path.read_text().splitlines(), 1)
        if comparison.search(line)
    ]
    assert found == [], "use EdgeSettings.has_file / has_primary / syncs"


def test_one_sync_bridge_no_event_loop_is_run_or_made_outside_loop_thread():
    bridge = re.compile(r"asyncio\.run\(|new_event_loop|run_coroutine_threadsafe|run_until_complete")
    found = [
        f"{path.relative_to(PACKAGE)}:{number}"
        for path in PACKAGE.rglob("*.py")
        if path.name != "loop_thread.py"
        for number, line in enumerate(path.read_text().splitlines(), 1)
        if bridge.search(line)
    ]
    assert found == []
