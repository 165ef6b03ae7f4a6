"""
The layering the README promises, read from every import statement (lazy ones inside functions too):
support/ never imports model.py or a script; model.py stands alone like nanoGPT's; the leaves (operators.py,
kernel.py) import only torch and triton. And no line is packed to look short (≤ 110 characters, one
statement a line).

    python -m pytest -q tests/test_layout.py
"""
import ast
import glob
import os
import sys

import pytest

from helpers import ROOT

SCRIPTS = {"train", "sample", "prepare_data", "bench", "corridor"}
ALLOWED = {  # file -> the project's modules and the third-party packages it may import
    "model.py": {"torch", "operators", "kernel", "support.configurator", "support.pretrained",
                 "support.rundir"},
    "operators.py": {"torch"},
    "kernel.py": {"torch", "triton"},
}


def imports(path):
    """Every module an import statement in the file names (its top-level name, and support.x in full)."""
    names = set()
    for node in ast.walk(ast.parse(open(path, encoding="utf-8").read())):
        modules = [a.name for a in node.names] if isinstance(node, ast.Import) else \
            [node.module] if isinstance(node, ast.ImportFrom) and node.module else []
        for module in modules:
            parts = module.split(".")
            names.add(".".join(parts[:2]) if parts[0] == "support" else parts[0])
    return names


@pytest.mark.parametrize("name", sorted(ALLOWED))
def test_model_and_the_leaves_import_only_what_they_may(name):
    ours = {n for n in imports(os.path.join(ROOT, name)) if n not in sys.stdlib_module_names}
    assert ours <= ALLOWED[name], ours - ALLOWED[name]


@pytest.mark.parametrize("path", sorted(glob.glob("support/*.py", root_dir=ROOT)))
def test_support_never_imports_the_model_or_a_script(path):
    assert imports(os.path.join(ROOT, path)) & (SCRIPTS | {"model"}) == set()


FOLDERS = ("", "support/", "tests/", "config/", "config/*/")  # the project's Python files, not a venv in it
PYTHON_FILES = sorted(path for folder in FOLDERS for path in glob.glob(f"{folder}*.py", root_dir=ROOT))


@pytest.mark.parametrize("path", PYTHON_FILES)
def test_lines_are_never_packed(path):
    """STYLE: at most 110 characters a line and one statement a line (no `a; b`, no `if x: y`)."""
    source = open(os.path.join(ROOT, path), encoding="utf-8").read()
    long = [i for i, line in enumerate(source.splitlines(), 1) if len(line) > 110]
    assert not long, f"{path}: lines over 110 characters: {long}"
    for node in ast.walk(ast.parse(source)):
        for field in ("body", "orelse", "finalbody"):
            block = getattr(node, field, None)
            lines = [s.lineno for s in block if isinstance(s, ast.stmt)] if isinstance(block, list) else []
            assert len(lines) == len(set(lines)), f"{path}: two statements on one line in {lines}"
            if isinstance(node, (ast.stmt, ast.excepthandler)) and lines:
                assert lines[0] > node.lineno, f"{path}:{node.lineno}: a block on its statement's line"
