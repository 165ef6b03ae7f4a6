"""
The lesson notebook, lesson.ipynb: stored with the outputs of one full run, so that it reads on GitHub without
running, and run top to bottom in a Jupyter kernel as a new user runs it.

    python -m pytest -q tests/test_notebook.py           # the stored notebook: valid, run in order, clean
    python -m pytest -q tests/test_notebook.py --slow    # also runs it, with its short run (under 3 minutes)
"""
import base64
import csv
import glob
import json
import os
import re
import shutil
import struct
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
    check_lesson(stored)


def check_lesson(nb, run_dir=None):
    """What the lesson shows, read from its outputs; run_dir: the run it trained, where it still is."""
    cells = {cell.id: cell for cell in code_cells(nb)}
    # part 1 draws the Laplacian as I − P (a = 1, b = −1): its rows sum to 0 (I + P's would sum to 2)
    drawn = "".join(t for out in cells["draw"].outputs for t in texts(out))
    assert "Laplacian I − P" in cells["draw"].source
    rows = re.findall(r"\[([^\[\]]*)\]", drawn.split("one line per head:")[1])  # a head's row sums each
    assert [abs(float(x)) for x in rows[1].split(",")] == [0.0] * 6, drawn
    # part 2's table: laplacian's second head (of 2) is the Laplacian, b = -1
    (table,) = [t for out in cells["table"].outputs for t in texts(out)]
    (row,) = [line.split() for line in table.splitlines() if line.split()[:1] == ["laplacian"]]
    assert row[1:5] == ["[0.0,", "1.0]", "[1.0,", "-1.0]"], table
    # part 6: the operators figure is written into the run's directory, and it is the picture shown
    (shown,) = pictures(cells["ops_on_text"])
    if run_dir:
        with open(os.path.join(run_dir, "operators.png"), "rb") as f:
            assert base64.b64decode(shown.data["image/png"]) == f.read()
    # part 7: the curve is drawn from the seeds 0-7 of the 4x128 settings: attention, fixed γ and learned mix
    with open(os.path.join(ROOT, "docs", "corridor_runs.csv"), newline="") as f:
        table = list(csv.DictReader(f))
    curve = [r for r in table if int(r["seed"]) < 100 and (r["setting"] in ("attention", "mix")
                                                         or r["setting"].startswith("mix_fixed_gamma"))]
    assert any(r["setting"] == "mix" for r in curve)
    said = "".join(t for out in cells["curve"].outputs for t in texts(out))
    assert f"{len(table)} runs in the file; {len(curve)} of them draw the curve" in said
    (shown,) = pictures(cells["curve"])
    png = base64.b64decode(shown.data["image/png"])
    assert struct.unpack(">II", png[16:24])[1] == 950  # pixels: two panels, the learned runs' below (9.5")
    # the winner's curse: a row for every variant run again on seeds 100-107
    confirmed = {r["setting"] for r in table if int(r["seed"]) >= 100 and r["setting"] != "attention"}
    lines = "".join(t for out in cells["table2"].outputs for t in texts(out)).splitlines()
    assert confirmed and {line.split()[0] for line in lines[1:-1]} == confirmed, lines


@pytest.mark.slow
def test_the_lesson_runs_top_to_bottom_in_a_jupyter_kernel(tmp_path, monkeypatch):
    """A copy of what the notebook needs, in a fresh folder (nothing in the repository is written), run by
    nbclient in an ipykernel, with the short run the notebook documents (LESSON_SHORT=1): no cell raises,
    every picture cell draws, and what it shows is what the lesson says (check_lesson). Its training cell
    run a second time starts the run over."""
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
    client = NotebookClient(nb, timeout=600, kernel_name="python3", resources=where)
    with client.setup_kernel():
        for index, cell in enumerate(nb.cells):  # raises CellExecutionError where a cell raises
            client.execute_cell(cell, index)
        first = training_output(nb)
        assert "max_iters=200" in first and "step 200:" in first  # the short run it documents
        assert [cell.id for cell in picture_cells(nb) if not pictures(cell)] == []
        check_lesson(nb, repo / "out" / "lesson")
        (index,) = [i for i, cell in enumerate(nb.cells) if "train.main(args)" in cell.source]
        client.execute_cell(nb.cells[index], index)  # the training cell again, as after changing a setting
    assert "step 200:" in training_output(nb)  # it started over, not refused for the run already there
