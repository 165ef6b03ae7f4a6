"""
Training without the POSIX-only modules, as on Windows: tiny runs in subprocesses where importing `fcntl`
and `resource` fails. This simulates, on Linux, what Windows lacks; nothing here runs on Windows or macOS.

    python -m pytest -q tests/test_portability.py
"""
import json
import os
import subprocess
import sys

import pytest

from helpers import QUICK, ROOT

# None in sys.modules makes `import fcntl` raise ImportError, as it does on Windows; so does `import resource`
WITHOUT_POSIX = """
import sys
sys.modules["fcntl"] = sys.modules["resource"] = None
sys.path.insert(0, {here!r})
"""
TRAIN = "import train\ntrain.main(sys.argv[1:])\n"
# holds a run directory's lock, as a live run does, until it is killed
HOLD = """
import time, filelock
from support import rundir
assert not filelock.has_fcntl  # the lock works without flock, as on Windows
rundir.lock_run_dir("out/busy")
print("ready", flush=True)
time.sleep(120)
"""


def without_posix(code, *args, **popen):
    """Start `python -c code args` in a process where importing fcntl or resource fails."""
    return subprocess.Popen([sys.executable, "-c", WITHOUT_POSIX.format(here=ROOT) + code, *args],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            env={**os.environ, "OMP_NUM_THREADS": "1"}, **popen)


def train_without_posix(out, cwd):
    p = without_posix(TRAIN, *QUICK, f"--out_dir={out}", cwd=cwd)
    stdout, stderr = p.communicate(timeout=300)
    return p.returncode, stdout + stderr


@pytest.mark.slow
def test_training_and_its_lock_work_without_fcntl_and_resource(tmp_path):
    """A run trains, checkpoints and finishes; a second writer on a live run is refused with the holder's
    process id; once the holder is killed (kill -9), a run starts there."""
    code, output = train_without_posix("out/done", tmp_path)
    assert code == 0, output
    log = [json.loads(line) for line in open(tmp_path / "out/done/log.jsonl")]
    assert log[-1]["event"] == "done" and (tmp_path / "out/done/ckpt.pt").is_file()

    (tmp_path / "out/busy").mkdir()
    holder = without_posix(HOLD, cwd=tmp_path)
    try:
        assert holder.stdout.readline().strip() == "ready", holder.stderr.read()
        code, output = train_without_posix("out/busy", tmp_path)
        assert code == 1, output
        assert f"error: out/busy is in use by another run (process {holder.pid})" in output, output
    finally:
        holder.kill()
        holder.wait()
    code, output = train_without_posix("out/busy", tmp_path)  # the killed holder's lock went with it
    assert code == 0, output
