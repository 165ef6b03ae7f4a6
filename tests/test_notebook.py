"""
The lesson notebook, lesson.ipynb: stored with the outputs of one full run, so that it reads on GitHub without
running, and run top to bottom in a Jupyter kernel as a new user runs it.

    python -m pytest -q tests/test_notebook.py           # the stored notebook: valid, run in order, clean
    python -m pytest -q tests/test_notebook.py --slow    # also runs it, with its short run (under 3 minutes)
"""
import glob
import json
import os
import re
import shutil
import sys

import nbformat
import pytest

from helpers import ROOT

NOTEBOOK = os.path.join(ROOT, "lesson.ipynb")
# what the notebook reads: the scripts, support/, the configs and docs/corridor_runs.csv (data/ it prepares)
NEEDS = glob.glob("*.py", root_dir=ROOT) + ["support", "config", "docs"]
NOT_NEEDED = shutil.ignore_patterns("__pycache__", "*.png")
# a folder of the machine that ran it (the lesson prints relative paths): a home, /root, /tmp, /work, a drive
MACHINE_PATH = re.compile(r"(/work/|/root/|/tmp/|/home/|/Users/|/private/|/var/folders/|\b[A-Za-z]:\\)")


def code_cells(nb):
    return [cell for cell in nb.cells if cell.cell_type == "code"]


def texts(output):
    """What an output shows as text (its pictures are PNG bytes, in base64: no text to read)."""
    if output.output_type == "stream":
        return [output.text]
    if output.output_type == "error":
        return [output.ename, output.evalue, *output.traceback]
    return [v if isinstance(v, str) else json.dumps(v) for k, v in output.data.items() if k != "image/png"]


def pictures(cell):
    return [out for out in cell.outputs if "image/png" in out.get("data", {})]


def picture_cells(nb):
    """The cells tagged 'picture' (cell metadata): each draws at least one figure."""
    return [cell for cell in code_cells(nb) if "picture" in cell.metadata.get("tags", [])]


def training_output(nb):
    (cell,) = [cell for cell in code_cells(nb) if "train.main(args)" in cell.source]
    return "".join(t for out in cell.outputs for t in texts(out))


@pytest.fixture(scope="module")
def stored():
    return nbformat.read(NOTEBOOK, as_version=4)


def test_the_stored_lesson_is_a_valid_notebook(stored):
    nbformat.validate(stored)
    assert stored.metadata.kernelspec.name == "python3"


def test_every_code_cell_ran_once_from_the_top_and_shows_what_it_did(stored):
    cells = code_cells(stored)
    assert [cell.execution_count for cell in cells] == list(range(1, len(cells) + 1))
    assert [cell.id for cell in cells if not cell.outputs] == []


def test_no_output_is_an_error_or_names_a_folder_of_the_machine_that_ran_it(stored):
    for cell in code_cells(stored):
        for out in cell.outputs:
            assert out.output_type != "error", (cell.id, out.ename, out.evalue)
            for text in texts(out):
                assert "Traceback" not in text, (cell.id, text)
                assert not MACHINE_PATH.search(text), (cell.id, MACHINE_PATH.search(text).group())


def test_the_stored_outputs_are_the_full_runs_with_every_picture(stored):
    out = training_output(stored)
    assert "max_iters=1500" in out and "step 1500:" in out  # the README's demo, not the short run
    assert len(picture_cells(stored)) >= 5  # parts 1, 2, 4, 6 and 7 of the lesson
    assert [cell.id for cell in picture_cells(stored) if not pictures(cell)] == []


@pytest.mark.slow
def test_the_lesson_runs_top_to_bottom_in_a_jupyter_kernel(tmp_path, monkeypatch):
    """A copy of what the notebook needs, in a fresh folder (nothing in the repository is written), run by
    nbclient in an ipykernel, with the short run the notebook documents (LESSON_SHORT=1): no cell raises, and
    every picture cell draws."""
    from nbclient import NotebookClient
    repo = tmp_path / "repo"
    repo.mkdir()
    for name in NEEDS:
        if os.path.isdir(os.path.join(ROOT, name)):
            shutil.copytree(os.path.join(ROOT, name), repo / name, ignore=NOT_NEEDED)
        else:
            shutil.copy(os.path.join(ROOT, name), repo / name)
    # the kernel is this Python (the environment under test), whatever kernel a Jupyter folder elsewhere holds
    spec = tmp_path / "jupyter" / "kernels" / "python3"
    spec.mkdir(parents=True)
    argv = [sys.executable, "-m", "ipykernel_launcher", "-f", "{connection_file}"]
    kernel = {"argv": argv, "display_name": "Python 3", "language": "python"}
    (spec / "kernel.json").write_text(json.dumps(kernel))
    monkeypatch.setenv("JUPYTER_PATH", str(tmp_path / "jupyter"))
    monkeypatch.setenv("LESSON_SHORT", "1")
    nb = nbformat.read(NOTEBOOK, as_version=4)
    for cell in code_cells(nb):
        cell.outputs = []
    where = {"metadata": {"path": str(repo)}}  # the kernel's working folder: the copy's root
    NotebookClient(nb, timeout=600, kernel_name="python3", resources=where).execute()
    assert [out.ename for cell in code_cells(nb) for out in cell.outputs if out.output_type == "error"] == []
    assert "max_iters=200" in training_output(nb)  # the short run it documents
    assert [cell.id for cell in picture_cells(nb) if not pictures(cell)] == []
