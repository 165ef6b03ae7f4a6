"""
The layering the README promises, read from every import statement (lazy ones inside functions too):
support/ never imports model.py or a script; model.py stands alone like nanoGPT's; the leaves (operators.py,
kernel.py) import only torch and triton.

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
    "model.py": {"torch", "operators", "kernel", "support.configurator", "support.pretrained"},
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
