"""The shape of the code (#25): sizes a newcomer can read, and a package search that
ships every package.  (The adapters' narrow port: tests/unit/core/test_broker_core.py.)"""

from __future__ import annotations

import ast
import pathlib
import re
import tomllib

ROOT = pathlib.Path(__file__).resolve().parents[2]
PACKAGE = ROOT / "mqttamqp"
MAX_MODULE_LINES = 600
MAX_CLASS_LINES = 400


def _modules() -> list[pathlib.Path]:
    return sorted(PACKAGE.rglob("*.py"))


def test_no_module_is_over_600_lines() -> None:
    """Every module of the broker fits in 600 lines."""
    long = {str(p.relative_to(ROOT)): n for p in _modules()
            if (n := p.read_text(encoding="utf-8").count("\n")) > MAX_MODULE_LINES}
    assert long == {}


def test_no_class_is_over_400_lines() -> None:
    """Every class of the broker fits in 400 lines."""
    long = {}
    for path in _modules():
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, ast.ClassDef) and node.end_lineno is not None:
                size = node.end_lineno - node.lineno + 1
                if size > MAX_CLASS_LINES:
                    long[f"{path.relative_to(ROOT)}:{node.name}"] = size
    assert long == {}


def test_packaging_finds_every_package() -> None:
    """pyproject.toml's package search finds every package under mqttamqp/ and the
    twistd plugin folder, and nothing else (not the console's templates or static
    files, not a data directory): a package left out would be missing from a
    non-editable install."""
    from setuptools import find_namespace_packages

    find = tomllib.loads((ROOT / "pyproject.toml").read_text(encoding="utf-8"))[
        "tool"]["setuptools"]["packages"]["find"]
    assert find["namespaces"] is True
    packed = set(find_namespace_packages(str(ROOT), include=find["include"],
                                         exclude=find["exclude"]))
    found = {".".join(p.parent.relative_to(ROOT).parts) for p in PACKAGE.rglob("__init__.py")}
    assert packed == found | {"twisted.plugins"}


def test_test_modules_have_unique_names() -> None:
    """No two test modules share a file name: the suite imports them by basename
    (rootdir-relative, no packages), so a second ``test_x.py`` stops the collection."""
    names: dict[str, list[str]] = {}
    for path in (ROOT / "tests").rglob("test_*.py"):
        names.setdefault(path.name, []).append(str(path.relative_to(ROOT)))
    assert {name: paths for name, paths in names.items() if len(paths) > 1} == {}


def test_no_test_module_imports_a_conftest() -> None:
    """No test module does ``from conftest import``: with several test folders in one
    run, ``conftest`` is whichever folder's was imported first (the collection stops);
    helpers shared by a folder's tests live in ``tests/support``."""
    pattern = re.compile(r"^\s*(from conftest import|import conftest)\b", re.M)
    offenders = [str(path.relative_to(ROOT)) for path in (ROOT / "tests").rglob("*.py")
                 if pattern.search(path.read_text())]
    assert offenders == []
