"""
Tests for --help: every setting of every script is listed with its default and a one-line description, the
comment beside that default in the source (configurator.comments).

    python -m pytest -q tests/test_help.py
"""
import os
import re
import subprocess
import sys

import pytest

import bench
import corridor
from support import kernel_check
import prepare_data
import sample
import train
from helpers import ROOT
from operators import all_controls
from support.configurator import comments

SCRIPTS = {  # script -> (its settings, how it is asked for --help)
    "train": (lambda: {**train.DEFAULTS, **all_controls()},
              lambda: train.parse_config(["--help"])),
    "sample": (lambda: sample.DEFAULTS, lambda: sample.main(["--help"])),
    "corridor": (lambda: corridor.OPTIONS, lambda: corridor.main(["--help"])),
    "bench": (lambda: bench.DEFAULTS, lambda: bench.main(["--help"])),
    "support.kernel_check": (lambda: kernel_check.DEFAULTS, lambda: kernel_check.main(["--help"])),
}


def settings_listed(out):
    """{setting: description} from the lines after 'settings and their defaults:', '  --key=default  text'."""
    lines = out.split("settings and their defaults:\n", 1)[1].splitlines()
    found = {}
    for line in lines:
        m = re.fullmatch(r"  --(\w+)=(.*?)(?: {2,}(\S.*))?", line)
        assert m, line
        found[m.group(1)] = m.group(3) or ""
    return found


def ask_for_help(monkeypatch, capsys, script, ask):
    monkeypatch.setitem(sys.modules, "__main__", sys.modules[script])  # as `python SCRIPT.py --help` runs it
    with pytest.raises(SystemExit) as e:
        ask()
    assert e.value.code == 0
    return capsys.readouterr().out


@pytest.mark.parametrize("script", SCRIPTS)
def test_help_describes_every_setting(monkeypatch, capsys, script):
    settings, ask = SCRIPTS[script]
    out = ask_for_help(monkeypatch, capsys, script, ask)
    assert out.startswith(sys.modules[script].__doc__.strip())  # how to run it, then the settings
    listed = settings_listed(out)
    assert list(listed) == list(settings())
    assert [k for k, text in listed.items() if not text] == []  # each with what it does


def test_op_controls_are_described_by_their_operator(monkeypatch, capsys):
    listed = settings_listed(ask_for_help(monkeypatch, capsys, "train", SCRIPTS["train"][1]))
    assert listed["learn_gamma"] == "(op=mix) False: γ stays at gamma_init"
    assert listed["laplacian_heads"].startswith("(op=laplacian) ")
    # a control that several ops inherit from one class: its comment there, once, for all of them
    said = "(op=mix) (op=mix_alpha) (op=mix_ab) every head's γ at the start (0 with δ = 1: attention)"
    assert listed["gamma_init"] == said


def test_a_setting_is_described_by_the_comment_beside_its_default(monkeypatch, capsys):
    """Not by a comment beside a local variable of the same name earlier in the script (load_csv's text)."""
    listed = settings_listed(ask_for_help(monkeypatch, capsys, "corridor", SCRIPTS["corridor"][1]))
    assert listed["text"].startswith("draw every head's operator on this text")


@pytest.mark.parametrize("corpus", prepare_data.CORPORA)
def test_prepare_data_corpus_help_lists_the_options_it_takes(monkeypatch, capsys, corpus):
    """argparse's help of the corpus (prepare_data.py's table of corpora makes one parser each)."""
    out = ask_for_help(monkeypatch, capsys, "prepare_data", lambda: prepare_data.main([corpus, "--help"]))
    options = prepare_data.CORPORA[corpus][2]
    assert set(re.findall(r"^  (--\w+)", out, re.M)) == {"--out_dir", *[flag for flag, _ in options]}
    assert all(settings["help"].split()[-1] in out for _, settings in options)  # each with what it does


@pytest.mark.slow
def test_help_of_the_real_command_line():
    """`python train.py --help` itself: the settings' comments are read from the script run as __main__."""
    p = subprocess.run([sys.executable, "train.py", "--help"], capture_output=True, text=True, cwd=ROOT)
    assert p.returncode == 0, p.stderr
    listed = settings_listed(p.stdout)
    assert listed["out_dir"] == "the run directory: config.json, log.jsonl, ckpt.pt"
    assert listed["n_layer"] == "transformer blocks" and all(listed.values())


class Example:
    plain = "a # in a string"  # the comment
    annotated: int = 3  # an annotated field's
    values = dict(
        inner=1,  # a dict's entry
        bare=2,
    )
    plain = 4  # a second assignment: the first one is the default


def test_comments_are_read_by_tokens():
    assert comments(Example) == {"plain": "the comment", "annotated": "an annotated field's",
                                 "inner": "a dict's entry"}
    assert comments(type("Made", (), {})) == {}  # made where no source says so: no descriptions, no error
