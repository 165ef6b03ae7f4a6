"""
The one way every script opens a file it parses or writes: support.configurator's open_regular,
read_regular and refuse_unless_regular. Where a file should be, a folder handed to us may hold a link, a FIFO,
a folder or a device, or gigabytes where a few kB belong: each is refused by name, never followed, waited on
or read whole. A link where a file is written anew is replaced, never written through.

    python -m pytest -q tests/test_open_regular.py
"""
import contextlib
import os
import re
import signal

import pytest

from support.configurator import ConfigError, open_regular, read_regular, refuse_unless_regular
from helpers import workdir  # noqa: F401 (a fixture)

# what is planted where a file should be, and how the one line names it
KINDS = {"link": "a symbolic link", "dangling": "a symbolic link", "fifo": "a FIFO (named pipe)",
         "folder": "a folder", "/dev/null": "a device"}


@pytest.fixture
def planted(workdir):
    """'file', a regular file; 'link', a link to it; 'dangling', a link to 'gone', which is not there; 'fifo';
    'folder'. Returns what the file holds."""
    with open("file", "wb") as f:
        f.write(b"text")
    os.symlink("file", "link")
    os.symlink("gone", "dangling")
    os.mkfifo("fifo")
    os.mkdir("folder")
    return b"text"


@contextlib.contextmanager
def refused(path):
    """The one line that names path and what it is; at once (opening a FIFO to read would wait for a writer,
    for ever: after 5 s the wait is cut short and the test fails)."""
    def waited(signum, frame):
        raise TimeoutError(f"waited 5 s on {path}")
    before = signal.signal(signal.SIGALRM, waited)
    signal.alarm(5)
    try:
        line = f"{path} is {KINDS[path]}, not a regular file"
        with pytest.raises(ConfigError, match="^" + re.escape(line)):
            yield
    finally:
        signal.alarm(0)
        signal.signal(signal.SIGALRM, before)


@pytest.mark.parametrize("path", KINDS)
def test_reading_refuses_all_but_a_regular_file(planted, path):
    with open_regular("file") as f:
        assert f.read() == planted
    with refused(path):
        open_regular(path)


@pytest.mark.parametrize("path", KINDS)
def test_appending_refuses_them_too_and_creates_nothing_through_a_link(planted, path):
    """"ab+" (a lock, a log) creates a missing file: never at the end of a link."""
    with open_regular("new", "ab+") as f:
        f.write(b"1")
    assert open("new", "rb").read() == b"1"
    with refused(path):
        open_regular(path, "ab+")
    assert open("file", "rb").read() == planted and not os.path.lexists("gone")


@pytest.mark.parametrize("path", ["link", "dangling", "fifo"])
def test_writing_anew_refuses_what_is_there_never_writes_through_it(planted, path):
    """"wb" (atomic_write's temporary, a fresh name) creates a new file: a link or FIFO under its name is
    refused, and what a link names is kept (a dangling link's target is not created)."""
    with open_regular("new", "wb") as f:
        f.write(b"new")
    assert open("new", "rb").read() == b"new"
    with refused(path):
        open_regular(path, "wb")
    assert open("file", "rb").read() == planted and not os.path.lexists("gone")


def test_writing_anew_refuses_a_folder_and_keeps_it(planted):
    open("folder/keep", "w").close()
    with refused("folder"):
        open_regular("folder", "wb")
    assert os.listdir("folder") == ["keep"]


@pytest.mark.parametrize("path", KINDS)
def test_refuse_unless_regular_refuses_what_is_there_without_following_it(planted, path):
    refuse_unless_regular("file")
    refuse_unless_regular("gone")  # nothing there: nothing to refuse
    with refused(path):
        refuse_unless_regular(path)


def test_read_regular_refuses_a_file_over_its_cap(planted):
    assert read_regular("file", len(planted)) == planted  # the cap itself is allowed
    with pytest.raises(ConfigError, match="^file is larger than 3 bytes, far more than such a file ever"):
        read_regular("file", len(planted) - 1)
    with refused("link"):  # opened as open_regular opens
        read_regular("link", 100)
