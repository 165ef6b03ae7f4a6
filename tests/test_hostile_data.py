"""
Hostile data: dataset names that are globs, links and FIFOs where files should be, meta.json and loader states
from elsewhere, and arguments that are almost right. Each gets one line that names the problem; nothing
outside the named paths is touched, nothing is lost, nothing hangs or reads until memory runs out.

    python -m pytest -q tests/test_hostile_data.py
"""
import json
import os
import re

import pytest

from support import dataloader as dl
import prepare_data as pd
import train
from support.dataloader import DataError, ShardLoader
from helpers import QUICK, write_shard

BOOK = "a small book of words, read again and again. " * 40


@pytest.fixture
def workdir(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "book.txt").write_text(BOOK, encoding="utf-8")
    return tmp_path


def one_line(excinfo):
    message = str(excinfo.value)
    assert "\n" not in message and message, message
    return message


def train_error(*args):
    """train.py's main must stop with exactly one 'error: ...' line; returns it."""
    with pytest.raises(SystemExit) as e:
        train.main(QUICK + list(args))
    message = str(e.value.code)
    assert message.startswith("error: ") and "\n" not in message, message
    return message


def snapshot(folder):
    """Every file under folder with its bytes: what must come out of a refused command unchanged."""
    files = {}
    for root, _, names in os.walk(folder):
        for name in names:
            path = os.path.join(root, name)
            files[path] = open(path, "rb").read()
    return files


def prepare_text(name, out="data"):
    return pd.prepare("text", input="book.txt", name=name, out_dir=out, shard_size=400)


# --- 1. a dataset name is one plain word, never a pattern ---------------------------------------------------

@pytest.mark.parametrize("name", ["py*", "*", "p?docs", "b[1]", "[p]ydocs", "my book", "a" * 51, "-x",
                                  "pydocs/"])
def test_a_name_that_is_a_pattern_is_refused_and_other_datasets_are_kept(workdir, name):
    prepare_text("pydocs")  # another dataset that a glob of the name would match
    before = snapshot("data")
    with pytest.raises(ValueError) as excinfo:  # the CLI prints it as `error: ...`
        pd.main(["text", "--input=book.txt", f"--name={name}"])
    assert one_line(excinfo).startswith(f"--name={name!r} must be a plain folder name: up to 50 letters, ")
    assert snapshot("data") == before


def test_a_long_name_blames_the_name_not_out_dir(workdir):
    with pytest.raises(ValueError) as excinfo:
        pd.main(["text", "--input=book.txt", "--name=" + "n" * 250])
    assert one_line(excinfo).startswith("--name='nnn") and "--out_dir" not in str(excinfo.value)
    assert os.listdir(workdir) == ["book.txt"]


def test_train_refuses_a_dataset_name_that_is_a_pattern(workdir):
    prepare_text("pydocs")
    os.makedirs("data/py*")  # made by hand, or by an older prepare_data.py that allowed such names
    write_shard("data/py*/x_train_000001.bin", [1] * 50)
    for name in ("py*", "b[1]", "../data/pydocs"):
        message = train_error(f"--dataset={name}")
        assert message.startswith(f"error: --dataset={name!r} must be a plain folder name")
    assert not os.path.exists("out")


def test_shards_are_found_in_the_folder_named_not_in_folders_a_glob_matches(workdir):
    """A folder whose name holds glob characters is that folder: data/py* is not data/pydocs."""
    prepare_text("pydocs")
    os.makedirs("data/py*")
    write_shard("data/py*/x_train_000001.bin", [1] * 50)
    assert dl.find_shards("data/py*", "train") == ["data/py*/x_train_000001.bin"]
    data_dir = prepare_text("b1", out="da[t]a")  # an out_dir with brackets still finds its own shards
    assert [os.path.basename(p) for p in dl.find_shards(data_dir, "val")] == ["b1_val_000000.bin"]
    assert dl.load_meta(data_dir)["name"] == "b1" and pd.ensure_prepared("b1", out_dir="da[t]a") == data_dir
    ShardLoader(data_dir, "val", batch_size=1, block_size=8).next_batch()


def test_a_dataset_that_lost_a_shard_does_not_look_prepared(workdir):
    data_dir = prepare_text("t")
    train_shards = dl.find_shards(data_dir, "train")
    assert len(train_shards) > 1
    os.remove(train_shards[-1])
    with pytest.raises(DataError) as excinfo:
        pd.ensure_prepared("t")
    assert one_line(excinfo).startswith("data/t is damaged: its train shards hold ")
    assert str(excinfo.value).endswith("(a shard is missing, extra or replaced); prepare the dataset again")
    assert not pd.prepared_from(data_dir, None)
    write_shard(train_shards[-1], [1, 2, 3])  # a shard of other tokens under the lost one's name
    with pytest.raises(DataError, match="is damaged"):
        dl.load_meta(data_dir)


def test_a_damaged_default_corpus_is_prepared_again(workdir, monkeypatch, capsys):
    monkeypatch.setattr(pd, "pydocs_documents", lambda: [BOOK, BOOK.upper()])
    data_dir = pd.ensure_prepared("pydocs")
    shard = dl.find_shards(data_dir, "val")[0]
    good = open(shard, "rb").read()
    os.remove(shard)
    capsys.readouterr()
    assert pd.ensure_prepared("pydocs") == data_dir
    assert "is not prepared (or is damaged): preparing the offline default corpus" in capsys.readouterr().out
    assert open(shard, "rb").read() == good


def test_a_dataset_that_is_a_file_is_named_as_such(workdir):
    os.makedirs("data")
    open("data/notes", "w").write("mine")
    with pytest.raises(DataError, match=r"^dataset data/notes is not a folder; prepare it with `python "):
        pd.ensure_prepared("notes")
    assert open("data/notes").read() == "mine"


# --- 2. links, FIFOs and devices where our files should be --------------------------------------------------

def plant(link, target):
    os.makedirs(os.path.dirname(link) or ".", exist_ok=True)
    os.symlink(target, link)


def fifo(path):
    os.mkfifo(path)
    return path


@pytest.mark.parametrize("kind", ["link to /dev/zero", "link to a good meta.json", "FIFO", "folder",
                                  "too large"])
def test_meta_json_must_be_a_small_regular_file(workdir, kind):
    """A link to /dev/zero would be read until memory runs out, a FIFO would block for ever."""
    data_dir = prepare_text("t")
    meta = os.path.join(data_dir, "meta.json")
    os.replace(meta, "good.json")
    if kind == "link to /dev/zero":
        plant(meta, "/dev/zero")
    elif kind == "link to a good meta.json":
        plant(meta, os.path.abspath("good.json"))
    elif kind == "FIFO":
        fifo(meta)
    elif kind == "folder":
        os.mkdir(meta)
    else:
        good = json.load(open("good.json"))
        json.dump({**good, "notes": "x" * 17_000_000}, open(meta, "w"))  # over 16 MiB
    words = {"link to /dev/zero": "is a symbolic link, not a regular file",
             "link to a good meta.json": "is a symbolic link, not a regular file",
             "FIFO": "is a FIFO (named pipe)", "folder": "is a folder, not a regular file",
             "too large": "is larger than 16,777,216 bytes"}[kind]
    with pytest.raises(DataError) as excinfo:
        dl.load_meta(data_dir)
    assert one_line(excinfo).startswith(f"{meta} {words}")
    assert str(excinfo.value).endswith("prepare the dataset again")
    with pytest.raises(DataError, match=re.escape(words)):
        pd.ensure_prepared("t")


@pytest.mark.parametrize("kind", ["link to /dev/zero", "FIFO", "subfolder", "link to a text file"])
def test_every_txt_of_an_input_folder_must_be_a_regular_file(workdir, kind):
    os.makedirs("books")
    open("books/a.txt", "w").write(BOOK)
    bad = "books/b.txt"
    if kind == "link to /dev/zero":
        plant(bad, "/dev/zero")
    elif kind == "FIFO":
        fifo(bad)
    elif kind == "subfolder":
        os.mkdir(bad)  # a folder named like a document: refused, not skipped, so nothing is silently left out
    else:
        plant(bad, os.path.abspath("book.txt"))
    words = {"link to /dev/zero": "a symbolic link", "FIFO": "a FIFO (named pipe)", "subfolder": "a folder",
             "link to a text file": "a symbolic link"}[kind]
    with pytest.raises(ValueError) as excinfo:
        pd.main(["text", "--input=books"])
    assert one_line(excinfo) == (f"{bad} is {words}, not a regular file (only regular files are read or "
                                 "written, never through a link)")
    assert not os.path.exists("data")


@pytest.mark.parametrize("input, words", [("/dev/zero", "/dev/zero is a device, not a regular file"),
                                          ("pipe", "pipe is a FIFO (named pipe), not a regular file")])
def test_input_that_is_not_a_regular_file_says_what_it_is(workdir, input, words):
    if input == "pipe":
        fifo("pipe")
    with pytest.raises(ValueError) as excinfo:
        pd.main(["text", f"--input={input}", "--name=x"])
    assert one_line(excinfo).startswith(words)
    assert "does not exist" not in str(excinfo.value)


def test_links_planted_where_prepare_data_writes_are_never_followed(workdir):
    """The lock, meta.json's temporary and the staging folder are created anew: a link there is not written
    through (which would truncate or overwrite whatever it points to)."""
    os.makedirs("victims/folder")
    for name in ("lock", "meta"):
        open(f"victims/{name}", "w").write("precious")
    open("victims/folder/keep", "w").write("precious")
    data_dir = prepare_text("t")
    os.remove(os.path.join(data_dir, "meta.json"))
    plant("data/t/meta.json.tmp", os.path.abspath("victims/meta"))
    plant("data/.t.staging", os.path.abspath("victims/folder"))
    os.remove("data/.t.lock")
    plant("data/.t.lock", os.path.abspath("victims/lock"))
    with pytest.raises(ValueError) as excinfo:  # the lock is refused: we never hold a lock through a link
        prepare_text("t")
    assert one_line(excinfo).startswith("data/.t.lock is a symbolic link, not a regular file")
    os.remove("data/.t.lock")
    assert prepare_text("t") == data_dir
    assert dl.load_meta(data_dir)["name"] == "t" and not os.path.islink(os.path.join(data_dir, "meta.json"))
    assert snapshot("victims") == {"victims/lock": b"precious", "victims/meta": b"precious",
                                   "victims/folder/keep": b"precious"}


def test_a_lock_that_is_a_fifo_is_refused_not_waited_on(workdir):
    os.makedirs("data")
    fifo("data/.t.lock")
    with pytest.raises(ValueError) as excinfo:
        prepare_text("t")
    assert one_line(excinfo).startswith("data/.t.lock is a FIFO (named pipe), not a regular file")


def test_a_shard_temporary_that_is_a_link_is_replaced_not_written_through(workdir):
    open("victim", "w").write("precious")
    os.makedirs("d")
    plant("d/x_train_000001.bin.tmp", os.path.abspath("victim"))
    write_shard("d/x_train_000001.bin", [1, 2, 3])
    assert open("victim").read() == "precious" and dl.read_shard("d/x_train_000001.bin").tolist() == [1, 2, 3]


@pytest.mark.parametrize("kind", ["link to a good shard", "link to /dev/zero", "FIFO"])
def test_a_shard_must_be_a_regular_file(workdir, kind):
    write_shard("good.bin", [1, 2, 3])
    os.makedirs("d")
    shard = "d/x_train_000001.bin"
    if kind == "FIFO":
        fifo(shard)
    else:
        plant(shard, "/dev/zero" if kind == "link to /dev/zero" else os.path.abspath("good.bin"))
    with pytest.raises(DataError) as excinfo:
        dl.read_shard(shard)
    assert one_line(excinfo).startswith(f"{shard} is a ")
    assert str(excinfo.value).endswith("prepare the dataset again")


# --- 7. a loader state from a checkpoint whose data changed ---------------------------------------------

def counting_loader(tmp_path):
    write_shard(str(tmp_path / "x_train_000001.bin"), list(range(200)))
    return ShardLoader(str(tmp_path), "train", batch_size=2, block_size=10)  # 19 windows


@pytest.mark.parametrize("state, words", [
    ({"epoch": 0, "shard": 0, "pos": 20}, "loader state points at window 20 of "),  # past the data
    ({"epoch": 3, "shard": 0, "pos": 10**12}, "loader state points at window 1000000000000 of ")])
def test_a_loader_state_outside_the_data_is_refused(tmp_path, state, words):
    loader = counting_loader(tmp_path)
    with pytest.raises(DataError) as excinfo:
        loader.load_state_dict(state)
    assert one_line(excinfo).startswith(words)
    loader.load_state_dict({"epoch": 0, "shard": 0, "pos": 19})  # at the end: the next batch starts epoch 1
    loader.next_batch()
    assert loader.state_dict() == {"epoch": 1, "shard": 0, "pos": 2}


# --- 8. almost right: the message says what is meant --------------------------------------------------------

def test_a_setting_with_a_space_instead_of_equals_says_how_to_write_it(workdir):
    message = train_error("--max_iters", "5")
    assert message == ("error: argument '--max_iters' must look like --key=value, with '=' and no space: "
                       "--max_iters=VALUE")


@pytest.mark.parametrize("kind", ["folder", "FIFO", "link"])
def test_a_config_path_that_is_not_a_regular_file_says_what_it_is(workdir, kind):
    if kind == "folder":
        os.mkdir("cfg.py")
    elif kind == "FIFO":
        fifo("cfg.py")
    else:
        open("real.py", "w").write("max_iters = 1\n")
        plant("cfg.py", "real.py")
    words = {"folder": "a folder", "FIFO": "a FIFO (named pipe)", "link": "a symbolic link"}[kind]
    assert train_error("cfg.py") == (f"error: config file cfg.py is {words}, not a regular file (only "
                                     "regular files are read or written, never through a link); pass a file "
                                     "like config/train_demo.py")


def test_a_data_folder_that_is_a_file_names_the_folder_not_a_flag(workdir):
    open("data", "w").write("not a folder")
    message = train_error()  # prepares pydocs into data/: no --out_dir was given
    assert message.startswith("error: the data folder data is a file; move it away")
    assert "--out_dir=data" not in message
    assert open("data").read() == "not a folder" and not os.path.exists("out")
