"""docs/guarantees.md names the test behind every promise; this keeps those names true.

Every `path::name` in the document must be a test file that defines a test function (or test class)
of that name, so a renamed or deleted test fails here instead of leaving a promise unchecked. Names
are read with ``ast`` (nothing is imported or run); a parametrised test counts by its function name.
"""

from __future__ import annotations

import ast
import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
DOC = ROOT / "docs" / "guarantees.md"
# `path/to/test_file.py::test_name` or `path::TestClass` or `path::TestClass::test_method`
REFERENCE = re.compile(r"`(?P<path>[\w./-]+\.py)::(?P<name>\w+)(?:::(?P<method>\w+))?`")
# A test named without its file (`::test_x` or a bare `test_x`) cannot be checked: the doc must not use one.
BARE = re.compile(r"`(?:::)?(?P<name>(?:test_|Test)\w*)`")


def _references() -> list[tuple[str, str, str | None]]:
    text = DOC.read_text(encoding="utf-8")
    return sorted({(m["path"], m["name"], m["method"]) for m in REFERENCE.finditer(text)})


def _defined_tests(path: Path) -> dict[str, set[str]]:
    """Top-level test functions and classes of a file -> the test methods of each class (empty for functions)."""
    tree = ast.parse(path.read_text(encoding="utf-8"), filename=str(path))
    tests: dict[str, set[str]] = {}
    for node in tree.body:
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)) and node.name.startswith("test"):
            tests[node.name] = set()
        elif isinstance(node, ast.ClassDef) and node.name.startswith("Test"):
            tests[node.name] = {n.name for n in node.body
                                if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef)) and n.name.startswith("test")}
    return tests


REFERENCES = _references()


def test_the_document_names_many_tests():
    """Guards the parser itself: a regex that matched nothing would make every check below vacuous."""
    assert len(REFERENCES) >= 100, REFERENCES
    assert len({path for path, _, _ in REFERENCES}) >= 20


def test_no_test_is_named_without_its_file():
    text = DOC.read_text(encoding="utf-8")
    bare = [m.group(0) for m in BARE.finditer(text)]
    assert not bare, f"write these as `path::name` so they can be checked: {bare}"


@pytest.mark.parametrize(("path", "name", "method"), REFERENCES,
                         ids=[f"{p}::{n}" + (f"::{m}" if m else "") for p, n, m in REFERENCES])
def test_every_named_test_exists(path, name, method):
    file = ROOT / path
    assert file.is_file(), f"docs/guarantees.md names {path}, which does not exist"
    assert file.name.startswith("test_"), f"{path} is not a test file pytest collects"
    tests = _defined_tests(file)
    assert name in tests, f"{path} defines no test {name!r} (docs/guarantees.md names it)"
    if method is not None:
        assert method in tests[name], f"{path}::{name} has no test method {method!r}"


def test_every_bad_input_test_is_in_the_matrix():
    """A new case in tests/test_bad_input.py must also be a row (or part of one) of the bad-input matrix."""
    named = {name for path, name, _ in REFERENCES if path == "tests/test_bad_input.py"}
    missing = sorted(set(_defined_tests(ROOT / "tests" / "test_bad_input.py")) - named)
    assert not missing, f"add these to the bad-input table in docs/guarantees.md: {missing}"
