"""
Every bad input a user can give train.py, sample.py, bench.py and model.py gets one line that names the
problem and says what to do: exit status ≠ 0, no traceback, nothing lost or half-written.

    python -m pytest -q test_bad_inputs.py
"""
import errno
import importlib.util
import json
import os
import subprocess
import sys

import pytest
import torch

import bench
import rundir
import sample
import train

HERE = os.path.dirname(os.path.abspath(__file__))
TINY = ["--n_layer=1", "--n_head=2", "--n_embd=32", "--block_size=16", "--batch_size=2", "--eval_iters=1",
        "--eval_interval=2", "--max_iters=2", "--device=cpu"]


@pytest.fixture
def workdir(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    return tmp_path


def one_line_error(main, argv):
    """Run a script's main(argv); it must stop with exactly one 'error: ...' line. Returns that line."""
    with pytest.raises(SystemExit) as e:
        main(argv)
    message = str(e.value.code)
    assert message.startswith("error: ") and "\n" not in message, message
    return message


def train_error(*args):
    return one_line_error(train.main, TINY + list(args))


@pytest.fixture
def finished_run(workdir):
    train.main(TINY + ["--out_dir=out/done"])
    return "out/done"


# --- train.py: settings -------------------------------------------------------------------------------------------


@pytest.mark.parametrize("args, words", [
    (["--eval_interval=0"], "eval_interval=0 is not allowed: it must be ≥ 1"),
    (["--log_interval=0"], "log_interval=0 is not allowed: it must be ≥ 1"),
    (["--eval_iters=0"], "eval_iters=0 is not allowed: it must be ≥ 1"),
    (["--gradient_accumulation_steps=0"], "gradient_accumulation_steps=0 is not allowed"),
    (["--max_iters=-5"], "max_iters=-5 is not allowed: it must be ≥ 1"),
    (["--seed=-1"], "seed=-1 is not allowed: it must be in [0, 4294967296)"),
    (["--seed=1180591620717411303424"], "seed=1180591620717411303424 is not allowed: it must be in [0, 4294967296)"),
    (["--learning_rate=1e400"], "learning_rate=inf is not allowed: it must be a finite number"),
    (["--dataset="], "dataset is empty"),
    (["--beta2=1.0"], "beta2=1.0 is not allowed: it must be in [0.0, 1.0)"),
    (["--device=gpu"], "device='gpu' is not allowed: use auto, cpu, mps, cuda or cuda:N"),
    (["--dtype=float16"], "dtype='float16' is not supported on CPU"),
    (["--dtype=fp8"], "dtype='fp8' is not allowed: choose one of auto, float32"),
    (["--init_from=gpt3"], "init_from='gpt3' is not allowed: use scratch, resume, gpt2"),
    (["--op=softmax"], "op='softmax' is not allowed: choose one of attention, laplacian, mix"),
    (["--op=attention", "--gamma_init=-0.5"], "gamma_init is not a control of op='attention'"),
    (["--op=mix", "--gamma_min=0.0", "--gamma_init=-0.5"], "gamma_init=-0.5 is below gamma_min=0.0"),
    (["--op=laplacian", "--laplacian_heads=3"], "laplacian_heads=3 is not allowed"),
    (["--n_head=3"], "n_embd=32 is not allowed: it must be divisible by n_head=3"),
    (["--n_layer=2.5"], "n_layer=2.5 is not allowed: it must be an integer"),
    (["--n_layer=True"], "n_layer=True is not allowed: it must be an integer"),  # a bool is not a number
    (["--learning_rate=False"], "learning_rate=False is not allowed: it must be a number"),
    (["--learning_rate=fast"], "learning_rate='fast' is not allowed: it must be a number"),
    (["--decay_lr=yes"], "decay_lr='yes' is not allowed: it must be True or False"),
    (["--lr_decay_iters=0"], "lr_decay_iters=0 is not allowed: it must be ≥ 1"),
    (["--out_dir="], "out_dir is empty"),
    (["--out_dir=  "], "out_dir is empty"),  # blanks are no directory name
    (["--learning_rat=1e-3"], "unknown setting 'learning_rat'; did you mean learning_rate"),
    (["--op"], "argument '--op' must look like --key=value"),
    (["config/nope.py"], "config file 'config/nope.py' not found"),
    (["--block_size=100000000000"], "the model cannot be built (RuntimeError: "),
    (["--dataset=nothing_here"], "dataset data/nothing_here does not exist; prepare it with `python prepare_data.py"),
    (["--init_from=resume", "--out_dir=out/none"], "no checkpoint at out/none/ckpt.pt"),
    (["--eval_only=True", "--out_dir=out/none"], "no checkpoint at out/none/ckpt.pt"),
])
def test_bad_settings(workdir, args, words):
    assert words in train_error(*args)
    assert not os.path.exists("out/run")  # nothing written for a run that did not start


def test_bad_config_files(workdir):
    (workdir / "syntax.py").write_text("n_layer = = 2\n")
    (workdir / "boom.py").write_text("n_layer = 1 / 0\n")
    (workdir / "typo.py").write_text("n_layers = 2\n")
    assert "config file syntax.py failed: SyntaxError" in train_error("syntax.py")
    assert "config file boom.py failed: ZeroDivisionError" in train_error("boom.py")
    (workdir / "leave.py").write_text("import sys\nsys.exit('bye')\n")
    assert "config file leave.py failed: SystemExit: bye" in train_error("leave.py")  # exiting is failing
    assert "unknown setting 'n_layers'; did you mean n_layer" in train_error("typo.py")


def test_wandb_missing(workdir):
    if importlib.util.find_spec("wandb") is not None:
        pytest.skip("wandb is installed here")
    assert "wandb_log=True needs the wandb package: pip install wandb" in train_error("--wandb_log=True")


def test_no_cuda_here(workdir):
    if torch.cuda.is_available():
        pytest.skip("this machine has CUDA")
    assert "device='cuda' but this torch has no CUDA" in train_error("--device=cuda")


# --- train.py: the run directory --------------------------------------------------------------------------------


def test_out_dir_that_cannot_hold_a_run(workdir):
    (workdir / "a_file").write_text("not a directory")
    assert "out_dir='a_file' cannot hold a run: File exists" in train_error("--out_dir=a_file")
    assert "out_dir='a_file/run' cannot hold a run: Not a directory" in train_error("--out_dir=a_file/run")
    assert (workdir / "a_file").read_text() == "not a directory"


@pytest.mark.skipif(os.name != "posix" or os.geteuid() == 0, reason="root writes into read-only directories")
def test_read_only_out_dir(workdir):
    os.makedirs("ro")
    os.chmod("ro", 0o555)
    assert "out_dir='ro/run' cannot hold a run: Permission denied" in train_error("--out_dir=ro/run")


def test_a_finished_run_is_never_overwritten(finished_run):
    before = {f: open(f"{finished_run}/{f}", "rb").read() for f in os.listdir(finished_run)}
    assert "already holds a run; continue it with --init_from=resume" in train_error(f"--out_dir={finished_run}")
    assert "the checkpoint is at iter 2 already; raise --max_iters" in train_error(
        f"--out_dir={finished_run}", "--init_from=resume")
    assert {f: open(f"{finished_run}/{f}", "rb").read() for f in os.listdir(finished_run)} == before


def test_a_run_without_its_checkpoint_is_not_overwritten_either(finished_run):
    os.remove(f"{finished_run}/ckpt.pt")  # say, to save disk: its log and config are still the run's record
    log = open(f"{finished_run}/log.jsonl").read()
    assert "already holds a run" in train_error(f"--out_dir={finished_run}")
    assert open(f"{finished_run}/log.jsonl").read() == log
    open(f"{finished_run}/log.jsonl", "wb").write(b"\xff\xfe not a log train.py wrote\n")  # nor is a broken one
    assert "already holds a run" in train_error(f"--out_dir={finished_run}")


def test_a_run_killed_while_starting_can_start_again(finished_run):
    """Killed after its "start" record but before any training: nothing is lost by starting over there."""
    start = open(f"{finished_run}/log.jsonl").readline()
    assert '"event": "start"' in start
    os.remove(f"{finished_run}/ckpt.pt")
    open(f"{finished_run}/log.jsonl", "w").write(start)
    train.main(TINY + [f"--out_dir={finished_run}"])
    log = open(f"{finished_run}/log.jsonl").read()
    assert log.count('"event": "start"') == 1 and '"event": "done"' in log  # a log of this run alone


@pytest.mark.parametrize("line, words", [
    ("\n", None),  # a blank line is harmless
    ('{"event": "note"}\n', "line 3 is not a record train.py wrote"),
    ("[1, 2]\n", "line 3 is not a record train.py wrote"),
    ("not json\n", "line 3 is not a record train.py wrote"),
])
def test_a_hand_edited_log_is_never_cut_short(finished_run, line, words):
    lines = open(f"{finished_run}/log.jsonl").readlines()
    open(f"{finished_run}/log.jsonl", "w").writelines(lines[:2] + [line] + lines[2:])
    if words is None:
        train.main(TINY + [f"--out_dir={finished_run}", "--init_from=resume", "--max_iters=4"])
        assert len([r for r in open(f"{finished_run}/log.jsonl") if '"eval"' in r]) == 3  # iters 0, 2 and 4
    else:
        assert words in train_error(f"--out_dir={finished_run}", "--init_from=resume", "--max_iters=4")
        assert open(f"{finished_run}/log.jsonl").readlines() == lines[:2] + [line] + lines[2:]


def test_resume_on_another_dataset_is_refused(finished_run):
    from dataloader import write_shard
    os.makedirs("data/abc")
    for split, n in (("val", 0), ("train", 1)):
        write_shard(f"data/abc/abc_{split}_00000{n}.bin", [0, 1, 2] * 300)
    json.dump({"name": "abc", "tokenizer": "char", "chars": "abc", "vocab_size": 3}, open("data/abc/meta.json", "w"))
    for extra in (["--init_from=resume", "--max_iters=4"], ["--eval_only=True"]):
        assert "dataset 'abc' is not the one the checkpoint was trained on" in train_error(
            f"--out_dir={finished_run}", "--dataset=abc", *extra)


def test_the_lock_file_names_its_holder(workdir):
    os.makedirs("out/l")
    open("out/l/lock", "w").write("4242")  # left by a process that was killed
    rundir.lock_run_dir("out/l")
    assert open("out/l/lock").read() == str(os.getpid())
    rundir.unlock_run_dir("out/l")
    assert open("out/l/lock").read() == ""


def test_a_second_writer_is_refused_and_a_dead_ones_lock_is_not(workdir, capsys):
    os.makedirs("out/busy")
    holder = subprocess.Popen([sys.executable, "-c", "import fcntl, sys, time; f = open('out/busy/lock', 'a+'); "
                               "fcntl.flock(f, fcntl.LOCK_EX); f.write('4242'); f.flush(); print('ready', flush=True); "
                               "time.sleep(60)"], stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout.readline().strip() == "ready"
        assert "out/busy is in use by another run (process 4242)" in train_error("--out_dir=out/busy")
    finally:
        holder.kill()
        holder.wait()
    train.main(TINY + ["--out_dir=out/busy"])  # the holder died without cleaning up: its lock went with it
    assert "the previous run in out/busy (process 4242) stopped before finishing" in capsys.readouterr().out
    assert open("out/busy/lock").read() == ""  # a run that finishes leaves no process behind in the lock


@pytest.mark.parametrize("error, words", [
    (OSError(errno.ENOSPC, "No space left on device"), "No space left on device"),
    (RuntimeError("[enforce fail at inline_container.cc:672] . unexpected pos 202304 vs 202192"),  # torch.save's
     "RuntimeError: [enforce fail at inline_container.cc:672] . unexpected pos 202304 vs 202192"),
])
def test_disk_full_while_saving_keeps_the_previous_checkpoint(finished_run, monkeypatch, error, words):
    def full_disk(obj, path, *args, **kwargs):
        with open(path, "wb") as f:
            f.write(b"half a checkpoint")
        raise error
    good = open(f"{finished_run}/ckpt.pt", "rb").read()
    monkeypatch.setattr(rundir.torch, "save", full_disk)
    line = train_error(f"--out_dir={finished_run}", "--init_from=resume", "--max_iters=4")
    assert f"{words} while writing {finished_run}/ckpt.pt; the previous one is intact" in line
    assert open(f"{finished_run}/ckpt.pt", "rb").read() == good
    assert not [f for f in os.listdir(finished_run) if f.endswith(".tmp")]


# --- train.py: checkpoints ----------------------------------------------------------------------------------------


class RunsCode:
    """A pickled object whose unpickling would create a file: a checkpoint must never run it."""
    def __reduce__(self):
        return (os.mkdir, ("pwned",))


GOOD = {"model": {}, "optimizer": {}, "model_args": {}, "iter_num": 2, "best_val_loss": 4.0, "tokens": 64, "loader":
        {"epoch": 0, "shard": 0, "pos": 8}, "meta": {}, "config": {"init_from": "scratch"}}


@pytest.mark.parametrize("content, words", [
    (b"not a checkpoint", "cannot be read safely (UnpicklingError)"),
    ({**GOOD, "iter_num": "2"}, "has entries this train.py did not write (iter_num)"),
    ({**GOOD, "iter_num": True}, "has entries this train.py did not write (iter_num)"),  # a bool is no count
    ({**GOOD, "loader": {"epoch": 0}}, "has entries this train.py did not write (loader, config)"),
    ({**GOOD, "model_args": {"n_layer": 1, "bogus": 2}}, "the checkpoint does not fit this code (TypeError"),
    ({**GOOD, "model_args": {"n_layer": 1, "n_head": 2, "n_embd": 32, "block_size": 16, "vocab_size": 103},
      "meta": None}, "has entries this train.py did not write (meta)"),
    ({"model": {}}, "lacks best_val_loss, config, iter_num, loader, meta, model_args, optimizer"),
    ({"model": RunsCode()}, "cannot be read safely (UnpicklingError): it is corrupt, not a nanoCorridor checkpoint, or carries code"),
])
def test_bad_checkpoints(workdir, content, words):
    os.makedirs("out/bad")
    if isinstance(content, bytes):
        open("out/bad/ckpt.pt", "wb").write(content)
    else:
        torch.save(content, "out/bad/ckpt.pt")
    assert words in train_error("--init_from=resume", "--out_dir=out/bad", "--max_iters=4")
    assert not os.path.exists("pwned")


def test_dataset_without_meta_json(workdir):
    from dataloader import write_shard
    os.makedirs("data/half")
    for split, n in (("val", 0), ("train", 1)):
        write_shard(f"data/half/half_{split}_00000{n}.bin", list(range(100)) * 10)
    assert "dataset data/half has no meta.json, so it is not a finished dataset" in train_error("--dataset=half")


# --- sample.py, bench.py, model.py --------------------------------------------------------------------------------


@pytest.mark.parametrize("args, words", [
    (["--temperature=-1"], "temperature=-1.0 is not allowed: it must be ≥ 0.0"),
    (["--top_k=0"], "top_k=0 is not allowed: it must be ≥ 1"),
    (["--device=gpu"], "device='gpu' is not a device to sample on"),
    (["--device=meta"], "device='meta' is not a device to sample on"),
    (["--start=FILE:missing.txt"], "--start=FILE:missing.txt: no such file or directory"),
    (["--start=FILE:."], "--start=FILE:.: is a directory"),
    (["--start=FILE:latin1.txt"], "--start=FILE:latin1.txt: the file is not UTF-8 text"),
    (["--start="], "the prompt encodes to no tokens"),
    (["--out_dir=out/none"], "no checkpoint at out/none/ckpt.pt"),
    (["--num_samples=0"], "num_samples=0 is not allowed"),
    (["config/x.py"], "unexpected argument 'config/x.py': settings look like --key=value"),
])
def test_sample_bad_inputs(finished_run, args, words):
    open("latin1.txt", "wb").write("café".encode("latin-1"))
    assert words in one_line_error(sample.main, [f"--out_dir={finished_run}", *args])


def test_sample_on_a_cpu_only_machine(finished_run):
    if torch.cuda.is_available():
        pytest.skip("this machine has CUDA")
    assert "device='cuda' is not available here" in one_line_error(sample.main, [f"--out_dir={finished_run}", "--device=cuda"])


@pytest.mark.parametrize("args, words", [
    (["--block_sizes=abc"], "block_sizes='abc' is not allowed: give integers like 128,256"),
    (["--repeats=0"], "repeats=0 is not allowed: it must be ≥ 1"),
    (["--what=nanogpt"], "nanogpt='' is not a Python file: give the path of nanoGPT's model.py"),
    (["--what=nanogpt", "--nanogpt=" + __file__], "defines no GPT and GPTConfig"),
    (["--what=speed"], "what='speed' is not allowed: choose one of ops, nanogpt, gpt2_step"),
    (["--ops=softmax"], "softmax/sdpa/T=256 failed: ValueError: op='softmax' is not allowed"),
])
def test_bench_bad_inputs(args, words):
    assert words in one_line_error(bench.main, ["--iters=1", "--repeats=1", *args])


@pytest.mark.parametrize("script, args, words", [
    ("train.py", ["--max_iter=3"], "unknown setting 'max_iter'; did you mean max_iters"),
    ("sample.py", ["--top_k=0"], "top_k=0 is not allowed"),
    ("model.py", ["--op=softmax"], "op='softmax' is not allowed"),
    ("model.py", ["laplacian"], "unexpected argument 'laplacian'"),
])
def test_command_lines_print_one_line(workdir, script, args, words):
    p = subprocess.run([sys.executable, os.path.join(HERE, script), *args], capture_output=True, text=True)
    assert p.returncode == 1 and p.stdout == "" and p.stderr.count("\n") == 1 and words in p.stderr, p.stderr
