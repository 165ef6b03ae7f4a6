"""
Every bad input a user can give train.py, sample.py, bench.py and model.py gets one line that names the
problem and says what to do: exit status ≠ 0, no traceback, nothing lost or half-written.

    python -m pytest -q tests/test_bad_inputs.py
"""
import errno
import importlib.util
import json
import os
import shutil
import subprocess
import sys
import types

import pytest
import torch

import bench
from support import hardware
from support import rundir, settings
import sample
import train
from support.configurator import ConfigError, check, configure
from helpers import QUICK, ROOT, finished_run, one_line_error, read_log, train_error, workdir  # noqa: F401

# --- train.py: settings -------------------------------------------------------------------------------------


@pytest.mark.parametrize("args, words", [
    (["--eval_interval=0"], "eval_interval=0 is not allowed: it must be ≥ 1"),
    (["--log_interval=0"], "log_interval=0 is not allowed: it must be ≥ 1"),
    (["--eval_iters=0"], "eval_iters=0 is not allowed: it must be ≥ 1"),
    (["--gradient_accumulation_steps=0"], "gradient_accumulation_steps=0 is not allowed"),
    (["--max_iters=-5"], "max_iters=-5 is not allowed: it must be ≥ 1"),
    (["--seed=-1"], "seed=-1 is not allowed: it must be in [0, 4294967296)"),
    (["--seed=1180591620717411303424"], "seed=1180591620717411303424 is not allowed: it must be in [0, "
                                        "4294967296)"),
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
    (["--op=mix_ab", "--delta_init=0"], "delta_init=0 is not allowed: it silences every head"),
    (["--n_head=3"], "n_embd=32 is not allowed: it must be divisible by n_head=3"),
    (["--block_size=0"], "block_size=0 is not allowed: it must be a positive integer"),
    # a new model's settings are checked before any file is read: here, before the missing dataset
    (["--dataset=nothing_here", "--n_embd=33"], "n_embd=33 is not allowed: it must be divisible by n_head=2"),
    (["--n_layer=2.5"], "n_layer=2.5 is not allowed: it must be an integer"),
    (["--n_layer=True"], "n_layer=True is not allowed: it must be an integer"),  # a bool is not a number
    (["--learning_rate=False"], "learning_rate=False is not allowed: it must be a number"),
    (["--learning_rate=fast"], "learning_rate='fast' is not allowed: it must be a number"),
    (["--decay_lr=yes"], "decay_lr='yes' is not allowed: it must be True or False"),
    # a falsy default is typed too
    (["--eval_only=1"], "eval_only=1 is not allowed: it must be True or False"),
    (["--wandb_log=0"], "wandb_log=0 is not allowed: it must be True or False"),
    (["--dropout=abc"], "dropout='abc' is not allowed: it must be a number"),
    (["--gamma_init=abc"], "gamma_init='abc' is not allowed: it must be a number"),
    (["--n_layer="], "n_layer='' is not allowed: it must be an integer"),
    (["--compile=1"], "compile=1 is not allowed: it must be True or False"),  # None, or a bool
    (["--lr_decay_iters=1.5"], "lr_decay_iters=1.5 is not allowed: it must be an integer"),
    (["--learning_rate=-1e400"], "learning_rate=-inf is not allowed: it must be a finite number"),
    (["--lr_decay_iters=0"], "lr_decay_iters=0 is not allowed: it must be ≥ 1"),
    (["--out_dir="], "out_dir is empty"),
    (["--out_dir=  "], "out_dir is empty"),  # blanks are no directory name
    (["--learning_rat=1e-3"], "unknown setting 'learning_rat'; did you mean learning_rate"),
    (["--op"], "argument '--op' must look like --key=value"),
    (["config/nope.py"], "config file 'config/nope.py' not found"),
    (["--dataset=nothing_here"], "dataset data/nothing_here does not exist; prepare it with `python "
                                 "prepare_data.py"),
    (["--init_from=resume", "--out_dir=out/none"], "no checkpoint at out/none/ckpt.pt"),
    (["--eval_only=True", "--out_dir=out/none"], "no checkpoint at out/none/ckpt.pt"),
    (["--init_from=gpt2", "--n_layer=12", "--n_head=12", "--n_embd=768"],  # GPT-2's: the tokens come next
     "init_from='gpt2' needs GPT-2 tokens but dataset 'pydocs' uses the 'char' tokenizer; "
     "prepare it with --tokenizer=gpt2"),
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
    (workdir / "config.json").write_text('{"n_layer": 2, "compile": null, "eval_only": false}')  # a run's
    line = train_error("config.json")
    assert "config.json is JSON, but config files are Python" in line and "--init_from=resume" in line
    os.makedirs("folder.py")  # a directory is no config file
    assert train_error("folder.py") == ("error: config file folder.py is a folder, not a regular file "
                                        "(only regular files are read or written, never through a link); "
                                        "pass a file like config/train_demo.py")


@pytest.mark.parametrize("code, words", [
    ("assert False\n", "AssertionError: "),  # no message at all: still one line
    ("raise ValueError()\n", "ValueError: "),
    ("import sys\nsys.exit()\n", "SystemExit: "),
    ("raise ValueError('first line\\nsecond line')\n", "ValueError: first line"),  # only its first line
])
def test_config_files_failing_without_a_message_or_with_many_lines(workdir, code, words):
    (workdir / "bad.py").write_text(code)
    assert train_error("bad.py") == "error: config file bad.py failed: " + words


def test_a_config_file_may_define_helpers_and_import(workdir):
    """Functions, classes, modules and _private names in a config file are its tools, not settings."""
    (workdir / "tools.py").write_text("import math\nfrom os.path import join\n_scale = 3\n"
                                      "def layers(k):\n    return k * _scale\n"
                                      "class Plan:\n    pass\n"
                                      "n_layer = layers(2)\nout_dir = join('out', 'x')\nlearning_rate = 1e-3 "
                                      "* math.floor(1.5)\n")
    c, given = train.parse_config(["tools.py"])
    assert (c.n_layer, c.out_dir, c.learning_rate) == (6, "out/x", 1e-3)
    assert given == {"n_layer", "out_dir", "learning_rate"}


@pytest.mark.parametrize("key, value, words", [
    ("count", "x", "count='x' is not allowed: it must be an integer"),
    ("rate", "x", "rate='x' is not allowed: it must be a number"),
    ("flag", 1, "flag=1 is not allowed: it must be True or False"),
    ("name", 5, "name=5 is not allowed: it must be text"),
    ("items", (1,), "items=(1,) is not allowed: it must be list"),  # a kind without a word: its type's name
])
def test_a_falsy_default_still_fixes_the_type(key, value, words):
    """Defaults of 0, 0.0, False, '' or [] fix their setting's type too; only None leaves it open."""
    defaults = {"count": 0, "rate": 0.0, "flag": False, "name": "", "items": [], "anything": None}
    with pytest.raises(ConfigError) as e:
        check(key, value, defaults, {})
    assert str(e.value) == words
    assert check("anything", value, defaults, {}) == value


@pytest.mark.parametrize("key, ok, value, bad, words", [
    ("batch_size", "1", 1, "0", "batch_size=0 is not allowed: it must be ≥ 1"),
    ("eval_interval", "1", 1, "0", "eval_interval=0 is not allowed: it must be ≥ 1"),
    ("log_interval", "1", 1, "0", "log_interval=0 is not allowed: it must be ≥ 1"),
    ("eval_iters", "1", 1, "0", "eval_iters=0 is not allowed: it must be ≥ 1"),
    ("max_iters", "1", 1, "0", "max_iters=0 is not allowed: it must be ≥ 1"),
    ("gradient_accumulation_steps", "1", 1, "0", "gradient_accumulation_steps=0 is not allowed: it must be "
                                                 "≥ 1"),
    ("warmup_iters", "0", 0, "-1", "warmup_iters=-1 is not allowed: it must be ≥ 0"),
    # 0: a float
    ("learning_rate", "0", 0.0, "-1e-09", "learning_rate=-1e-09 is not allowed: it must be ≥ 0.0"),
    ("min_lr", "0", 0.0, "-1e-09", "min_lr=-1e-09 is not allowed: it must be ≥ 0.0"),
    ("weight_decay", "0", 0.0, "-1e-09", "weight_decay=-1e-09 is not allowed: it must be ≥ 0.0"),
    ("grad_clip", "0", 0.0, "-1e-09", "grad_clip=-1e-09 is not allowed: it must be ≥ 0.0"),
    ("op_lr_scale", "0", 0.0, "-1e-09", "op_lr_scale=-1e-09 is not allowed: it must be ≥ 0.0"),
    ("beta1", "0", 0.0, "-0.01", "beta1=-0.01 is not allowed: it must be in [0.0, 1.0)"),
    ("beta1", "0.999", 0.999, "1", "beta1=1.0 is not allowed: it must be in [0.0, 1.0)"),
    ("beta2", "0.0", 0.0, "-0.01", "beta2=-0.01 is not allowed: it must be in [0.0, 1.0)"),
    ("seed", "4294967295", 4294967295, "4294967296", "seed=4294967296 is not allowed: it must be in [0, "
                                                     "4294967296)"),
    ("lr_decay_iters", "1", 1, "0", "lr_decay_iters=0 is not allowed: it must be ≥ 1"),
    ("lr_decay_iters", "None", None, "'10'", "lr_decay_iters='10' is not allowed: it must be an integer"),
    ("compile", "None", None, "'yes'", "compile='yes' is not allowed: it must be True or False"),
    ("device", "cuda:12", "cuda:12", "cuda:", "device='cuda:' is not allowed: use auto, cpu, mps, cuda or "
                                              "cuda:N"),
    ("device", "mps", "mps", "cuda:x", "device='cuda:x' is not allowed: use auto, cpu, mps, cuda or cuda:N"),
    ("device", "cpu", "cpu", "cpu:0", "device='cpu:0' is not allowed: use auto, cpu, mps, cuda or cuda:N"),
    ("dtype", "bfloat16", "bfloat16", "bf16", "dtype='bf16' is not allowed: choose one of auto, float32, "
                                              "bfloat16, float16"),
    ("init_from", "gpt2-xl", "gpt2-xl", "gpt2-xxl", "init_from='gpt2-xxl' is not allowed: use scratch, "
                                                    "resume, gpt2, "
     "gpt2-medium, gpt2-large, gpt2-xl or a local directory saved with transformers' save_pretrained"),
    # a directory
    ("init_from", ROOT, ROOT, "resumed", "init_from='resumed' is not allowed: use scratch, resume, gpt2, "
     "gpt2-medium, gpt2-large, gpt2-xl or a local directory saved with transformers' save_pretrained"),
    # a text setting keeps numbers as text
    ("dataset", "2024", "2024", "", "dataset is empty: give a value"),
])
def test_the_boundaries_of_train_settings(key, ok, value, bad, words):
    """The last allowed value is taken, with its setting's type; the first one past it is refused by name."""
    got = getattr(train.parse_config([f"--{key}={ok}"])[0], key)
    assert got == value and type(got) is type(value)
    with pytest.raises(ValueError) as e:
        train.parse_config([f"--{key}={bad}"])
    assert str(e.value) == words


def test_numbers_of_other_types_are_converted_and_non_finite_ones_refused(workdir):
    """An int for a float and numpy's numbers become the setting's type; NaN, and 2.0 for an int, do not."""
    (workdir / "np.py").write_text("import numpy as np\nn_layer = np.int64(3)\n"
                                   "dropout = np.float32(0.5)\nlearning_rate = 1\n")
    c, _ = train.parse_config(["np.py"])
    assert ([(v, type(v)) for v in (c.n_layer, c.dropout, c.learning_rate)]
            == [(3, int), (0.5, float), (1.0, float)])
    (workdir / "nan.py").write_text("learning_rate = float('nan')\n")
    assert train_error("nan.py") == "error: learning_rate=nan is not allowed: it must be a finite number"
    (workdir / "two.py").write_text("n_layer = 2.0\n")
    assert train_error("two.py") == "error: n_layer=2.0 is not allowed: it must be an integer"


def test_the_command_line_beats_config_files_wherever_it_stands(workdir):
    """Config files in their order, then every --key=value, even one written before the files."""
    (workdir / "a.py").write_text("n_layer = 3\nn_head = 3\nbatch_size = 5\n")
    (workdir / "b.py").write_text("n_head = 4\n")
    c, given = train.parse_config(["--n_layer=5", "a.py", "b.py", "--wandb_run_name=None",
                                   "--lr_decay_iters=None", "--op=laplacian"])
    assert (c.n_layer, c.n_head, c.batch_size) == (5, 4, 5)
    # text stays text; bare words
    assert (c.wandb_run_name, c.lr_decay_iters, c.op) == ("None", None, "laplacian")
    assert given == {"n_layer", "n_head", "batch_size", "wandb_run_name", "lr_decay_iters", "op"}


def test_a_value_python_cannot_evaluate_is_text(workdir):
    """A setting whose default is not text takes a literal; one Python cannot evaluate is text, refused."""
    assert train_error("--lr_decay_iters={[1]: 2}") == ("error: lr_decay_iters='{[1]: 2}' is not allowed: it "
                                                        "must be an integer")  # an unhashable key


def test_a_value_may_hold_an_equals_sign():
    """--key=value splits at the first '=': the rest, '=' included, is the value."""
    c, _ = train.parse_config(["--wandb_run_name=lr=3e-4"])
    assert c.wandb_run_name == "lr=3e-4"


@pytest.mark.parametrize("flag", ["--help", "-h"])
def test_help_lists_every_setting_and_exits_0(monkeypatch, capsys, flag):
    """--help wins over everything else given: the script's docstring, then each setting with its default."""
    monkeypatch.setitem(sys.modules, "__main__", types.ModuleType("script", "Run the script like this.\n"))
    with pytest.raises(SystemExit) as e:
        configure({"n_layer": 12, "out_dir": "out/run"}, ["--n_layer=oops", flag], files=False)
    assert e.value.code == 0
    assert capsys.readouterr().out == ("Run the script like this.\n\nsettings and their defaults:\n"
                                       "  --n_layer=12\n  --out_dir='out/run'\n")


@pytest.mark.parametrize("arg, line", [
    ("--zzzz=1", "error: unknown setting 'zzzz'; python SCRIPT --help lists them all"),
    ("--learnin_rate=1", "error: unknown setting 'learnin_rate'; did you mean learning_rate, learn_gamma, "
                         "learn_delta?"),
])
def test_unknown_settings_suggest_up_to_three_or_point_at_help(workdir, arg, line):
    assert train_error(arg) == line


def test_wandb_missing(workdir):
    if importlib.util.find_spec("wandb") is not None:
        pytest.skip("wandb is installed here")
    assert "wandb_log=True needs the wandb package: pip install wandb" in train_error("--wandb_log=True")


def test_no_cuda_here(workdir):
    if torch.cuda.is_available():
        pytest.skip("this machine has CUDA")
    assert "device='cuda' but this torch has no CUDA" in train_error("--device=cuda")


@pytest.mark.parametrize("dtype, want", [("auto", "float32"), ("float32", "float32"),
                                         ("bfloat16", "bfloat16")])
def test_dtypes_on_cpu(dtype, want):
    """auto is float32 on a CPU; bfloat16 runs there too (only float16 does not)."""
    cfg = types.SimpleNamespace(device="cpu", dtype=dtype)
    assert hardware.pick_device_and_dtype(cfg, None) == ("cpu", want)


def test_no_mps_here(workdir):
    if torch.backends.mps.is_available():
        pytest.skip("this machine has MPS")
    assert train_error("--device=mps") == ("error: device='mps' but this torch has no MPS or sees no such "
                                           "device; use --device=cpu")


def test_ctrl_c_says_how_to_continue(workdir, monkeypatch):
    """Resume where a checkpoint is; before the first one (or while preparing data), the same command again:
    which a run stopped before its first checkpoint accepts. eval_only writes no checkpoint: it says so."""
    def interrupted(*args):  # Ctrl-C while the set-up reads the checkpoint (or anywhere later)
        raise KeyboardInterrupt
    real_work_out = settings.work_out
    monkeypatch.setattr(settings, "work_out", interrupted)
    with pytest.raises(SystemExit) as e:
        train.main(QUICK)
    assert e.value.code == ("interrupted before any checkpoint was written (nothing is lost): run the "
                            "same command again")
    os.makedirs("out/run")
    open("out/run/ckpt.pt", "wb").close()
    with pytest.raises(SystemExit) as e:
        train.main(QUICK)
    assert e.value.code == ("interrupted: continue from the last checkpoint with --init_from=resume "
                            "(same --out_dir)")
    with pytest.raises(SystemExit) as e:  # evaluating a run, which has its checkpoint
        train.main(QUICK + ["--eval_only=True"])
    assert e.value.code == ("interrupted: eval_only writes nothing (nothing is lost): "
                            "run the same command again")
    os.remove("out/run/ckpt.pt")  # a run stopped at iter 1, before its first checkpoint: the same command
    open("out/run/log.jsonl", "w").write('{"event": "start", "iter": 0}\n{"event": "eval", "iter": 0}\n'
                                         '{"event": "train", "iter": 1}\n')
    monkeypatch.setattr(settings, "work_out", real_work_out)
    train.main(QUICK + ["--out_dir=out/run"])
    assert [r["event"] for r in read_log("out/run")][-1] == "done"


def test_ddp_settings_are_checked_and_every_failing_rank_says_why(workdir, monkeypatch):
    """Under torchrun, gradient_accumulation_steps must split among the processes. Each rank that fails
    prints its line, naming its rank: a config that reads RANK may fail on one rank only."""
    for k, v in (("RANK", "0"), ("LOCAL_RANK", "0"), ("WORLD_SIZE", "2")):
        monkeypatch.setenv(k, v)
    assert train_error("--gradient_accumulation_steps=3") == (
        "error: gradient_accumulation_steps=3 must be a multiple of the number of processes (2)")
    def reached(cfg, local_rank):  # stop before any process group is made
        raise ConfigError(f"on to the device, local_rank={local_rank}")
    monkeypatch.setattr(hardware, "pick_device_and_dtype", reached)
    assert train_error("--gradient_accumulation_steps=4") == "error: on to the device, local_rank=0"
    monkeypatch.setenv("RANK", "1")
    monkeypatch.setenv("LOCAL_RANK", "1")
    assert train_error("--gradient_accumulation_steps=3") == (
        "error: rank 1: gradient_accumulation_steps=3 must be a multiple of the number of processes (2)")


@pytest.mark.slow
def test_resume_rechecks_the_checkpoints_settings_and_stays_where_the_run_is(finished_run):
    """A resumed run's settings come from its checkpoint and are checked again (a setting this code no longer
    has is skipped, a bad value refused); out_dir is where the run is now, not where it was trained."""
    ckpt = torch.load(f"{finished_run}/ckpt.pt", weights_only=True)
    warmup = ckpt["config"]["warmup_iters"]
    ckpt["config"].update(warmup_iters=-1, retired_setting=1)
    torch.save(ckpt, f"{finished_run}/ckpt.pt")
    assert train_error(f"--out_dir={finished_run}", "--init_from=resume", "--max_iters=4") == (
        "error: warmup_iters=-1 is not allowed: it must be ≥ 0")
    ckpt["config"]["warmup_iters"] = warmup
    torch.save(ckpt, f"{finished_run}/ckpt.pt")
    os.rename(finished_run, "out/run")  # moved to the default out_dir, so no --out_dir is given
    train.main(QUICK + ["--init_from=resume", "--max_iters=4"])
    assert torch.load("out/run/ckpt.pt", weights_only=True)["iter_num"] == 4
    assert not os.path.exists(finished_run)


# --- train.py: the run directory ----------------------------------------------------------------------------


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


@pytest.mark.slow
def test_a_finished_run_is_never_overwritten(finished_run):
    before = {f: open(f"{finished_run}/{f}", "rb").read() for f in os.listdir(finished_run)}
    assert ("already holds a run; continue it with --init_from=resume"
            in train_error(f"--out_dir={finished_run}"))
    assert "the checkpoint is at iter 2 already; raise --max_iters" in train_error(
        f"--out_dir={finished_run}", "--init_from=resume")
    assert {f: open(f"{finished_run}/{f}", "rb").read() for f in os.listdir(finished_run)} == before


@pytest.mark.slow
def test_a_run_without_its_checkpoint_is_not_overwritten_either(finished_run):
    os.remove(f"{finished_run}/ckpt.pt")  # say, to save disk: its log and config are still the run's record
    log = open(f"{finished_run}/log.jsonl").read()
    assert "already holds a run" in train_error(f"--out_dir={finished_run}")
    assert open(f"{finished_run}/log.jsonl").read() == log
    # nor is a broken one
    open(f"{finished_run}/log.jsonl", "wb").write(b"\xff\xfe not a log train.py wrote\n")
    assert "already holds a run" in train_error(f"--out_dir={finished_run}")


@pytest.mark.slow
def test_a_run_killed_while_starting_can_start_again(finished_run):
    """Killed after its "start" record but before any training: nothing is lost by starting over there."""
    start = open(f"{finished_run}/log.jsonl").readline()
    assert '"event": "start"' in start
    os.remove(f"{finished_run}/ckpt.pt")
    open(f"{finished_run}/log.jsonl", "w").write(start)
    train.main(QUICK + [f"--out_dir={finished_run}"])
    log = open(f"{finished_run}/log.jsonl").read()
    assert log.count('"event": "start"') == 1 and '"event": "done"' in log  # a log of this run alone


@pytest.mark.parametrize("line, words", [
    ("\n", None),  # a blank line is harmless
    ("not json\n", "line 3 is not a record train.py wrote"),
])
@pytest.mark.slow
def test_a_hand_edited_log_is_never_cut_short(finished_run, line, words):
    lines = open(f"{finished_run}/log.jsonl").readlines()
    open(f"{finished_run}/log.jsonl", "w").writelines(lines[:2] + [line] + lines[2:])
    if words is None:
        train.main(QUICK + [f"--out_dir={finished_run}", "--init_from=resume", "--max_iters=4"])
        assert len([r for r in open(f"{finished_run}/log.jsonl") if '"eval"' in r]) == 3  # iters 0, 2 and 4
    else:
        assert words in train_error(f"--out_dir={finished_run}", "--init_from=resume", "--max_iters=4")
        assert open(f"{finished_run}/log.jsonl").readlines() == lines[:2] + [line] + lines[2:]


@pytest.mark.slow
def test_resume_on_another_dataset_is_refused(finished_run):
    from helpers import write_shard
    os.makedirs("data/abc")
    for split, n in (("val", 0), ("train", 1)):
        write_shard(f"data/abc/abc_{split}_00000{n}.bin", [0, 1, 2] * 300)
    json.dump({"name": "abc", "tokenizer": "char", "chars": "abc", "vocab_size": 3},
              open("data/abc/meta.json", "w"))
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


@pytest.mark.slow
def test_a_second_writer_is_refused_and_a_dead_ones_lock_is_not(workdir, capsys):
    os.makedirs("out/busy")
    holder = subprocess.Popen([sys.executable, "-c",
                               "import fcntl, sys, time; f = open('out/busy/lock', 'a+'); "
                               "fcntl.flock(f, fcntl.LOCK_EX); f.write('4242'); f.flush(); "
                               "print('ready', flush=True); "
                               "time.sleep(60)"], stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout.readline().strip() == "ready"
        assert "out/busy is in use by another run (process 4242)" in train_error("--out_dir=out/busy")
    finally:
        holder.kill()
        holder.wait()
    train.main(QUICK + ["--out_dir=out/busy"])  # the holder died without cleaning up: its lock went with it
    assert "the previous run in out/busy (process 4242) stopped before finishing" in capsys.readouterr().out
    assert open("out/busy/lock").read() == ""  # a run that finishes leaves no process behind in the lock


def test_locking_again_in_one_process_and_unlocking_releases(workdir, capsys):
    """A process may lock its own run again; another writer's lock is refused; unlocking lets others in."""
    import fcntl
    os.makedirs("out/l")
    open("out/l/lock", "w").write(str(os.getpid()))  # our own: no note about a run that stopped
    rundir.lock_run_dir("out/l")
    rundir.lock_run_dir("out/./l")  # the same directory by another name: already ours
    assert "note" not in capsys.readouterr().out
    other = open("out/l/lock", "a+")  # another open file: flock sees another writer
    with pytest.raises(BlockingIOError):
        fcntl.flock(other, fcntl.LOCK_EX | fcntl.LOCK_NB)
    rundir.unlock_run_dir("out/l")
    fcntl.flock(other, fcntl.LOCK_EX | fcntl.LOCK_NB)  # released
    with pytest.raises(ConfigError) as e:
        rundir.lock_run_dir("out/l")
    assert str(e.value) == ("out/l is in use by another run (process ?); wait for it to finish or choose "
                            "another --out_dir")
    other.close()
    rundir.lock_run_dir("out/l")  # locked anew: the file names this process again
    assert open("out/l/lock").read() == str(os.getpid())
    rundir.unlock_run_dir("out/l")


@pytest.mark.parametrize("error, reason", [
    (OSError("quota exceeded"), "OSError: quota exceeded"),  # no strerror: its type and text
    (OSError(errno.EDQUOT, "Disk quota exceeded"), "Disk quota exceeded"),
    (RuntimeError("first line\nsecond line"), "RuntimeError: first line"),
    (MemoryError(), "MemoryError: "),  # no message at all
])
def test_a_failed_first_write_leaves_nothing(workdir, error, reason):
    def fail(f):  # atomic_write hands the callback the temporary, opened
        f.write(b"half a file")
        raise error
    with pytest.raises(OSError) as e:
        rundir.atomic_write("new.json", fail)
    assert str(e.value) == f"{reason} while writing new.json; nothing was written"
    assert os.listdir(".") == []


def test_ctrl_c_in_the_middle_of_a_write_leaves_the_old_file_and_no_temporary(workdir):
    open("kept.json", "wb").write(b"the old one")
    def interrupted(f):
        f.write(b"half a file")
        raise KeyboardInterrupt
    with pytest.raises(KeyboardInterrupt):  # still the user's Ctrl-C, which the script turns into one line
        rundir.atomic_write("kept.json", interrupted)
    assert os.listdir(".") == ["kept.json"] and open("kept.json", "rb").read() == b"the old one"


@pytest.mark.parametrize("log, ckpt, holds", [
    (None, False, False),
    ("", False, False),
    ("\n\n", False, False),  # blank lines record nothing
    ('{"event": "start", "iter": 0}\n\n', False, False),
    # stopped before its first checkpoint: nothing to resume, nothing lost by starting there again
    ('{"event": "start", "iter": 0}\n{"event": "eval", "iter": 0}\n{"event": "train", "iter": 1}\n', False,
     False),
    ('{"event": "start", "iter": 0}\n{"event": "train", "iter": 1}\n{"event": "eval", "iter": 2}\n', False,
     True),
    (None, True, True),  # a checkpoint alone is a run
])
def test_what_counts_as_a_run(workdir, log, ckpt, holds):
    os.makedirs("out/r")
    if log is not None:
        open("out/r/log.jsonl", "w").write(log)
    if ckpt:
        open("out/r/ckpt.pt", "wb").write(b"")
    assert rundir.holds_a_run("out/r") is holds



def test_trim_log_keeps_what_the_checkpoint_saw(workdir):
    """Resuming at iter 2 keeps the records up to iter 2 inclusive but a start there (an attempt that resumed
    from this checkpoint and saved nothing); later ones, the 'done' and a last line cut off by a crash go; a
    last line that lost only its newline is kept, with one."""
    records = [{"event": "start", "iter": 0}, {"event": "eval", "iter": 0}, {"event": "train", "iter": 2},
               {"event": "eval", "iter": 2}, {"event": "start", "iter": 2}, {"event": "train", "iter": 3},
               {"event": "done", "iter": 2}]
    open("log.jsonl", "w").write("".join(json.dumps(r) + "\n" for r in records) + '{"event": "tr')
    rundir.trim_log("log.jsonl", 2)
    assert [json.loads(line) for line in open("log.jsonl")] == records[:4]
    open("log.jsonl", "w").write(json.dumps(records[0]) + "\n" + json.dumps(records[2]))
    rundir.trim_log("log.jsonl", 2)
    assert open("log.jsonl").read() == json.dumps(records[0]) + "\n" + json.dumps(records[2]) + "\n"
    # a line in the middle that is not JSON
    open("log.jsonl", "w").write(json.dumps(records[0]) + "\n" + "not json\n" + json.dumps(records[2]))
    with pytest.raises(ConfigError, match=r"^log.jsonl: line 2 is not a record train.py wrote; remove"):
        rundir.trim_log("log.jsonl", 2)


def test_git_commit_names_the_code_that_ran(tmp_path, monkeypatch):
    """The commit, '+' when a tracked file differs from it (untracked files don't count); None outside git."""
    if shutil.which("git") is None:
        pytest.skip("git is not installed here")
    def git(*args):
        return subprocess.run(["git", "-c", "user.name=t", "-c", "user.email=t@t",
                               "-c", "commit.gpgsign=false", *args],
                              cwd=tmp_path, check=True, capture_output=True, text=True).stdout
    monkeypatch.setenv("GIT_CEILING_DIRECTORIES", str(tmp_path.parent))
    monkeypatch.setattr(rundir, "__file__", str(tmp_path / "rundir.py"))
    assert rundir.git_commit() is None
    (tmp_path / "rundir.py").write_text("x = 1\n")
    git("init", "-q")
    git("add", "rundir.py")
    git("commit", "-q", "-m", "c")
    sha = git("log", "-1", "--format=%H").strip()
    assert rundir.git_commit() == sha
    (tmp_path / "notes.txt").write_text("untracked")
    assert rundir.git_commit() == sha
    (tmp_path / "rundir.py").write_text("x = 2\n")
    assert rundir.git_commit() == sha + "+"
    for error in (FileNotFoundError(errno.ENOENT, "No such file or directory: 'git'"),
                  subprocess.TimeoutExpired("git", 10)):
        def no_git(*args, **kwargs):
            raise error
        monkeypatch.setattr(rundir.subprocess, "run", no_git)
        assert rundir.git_commit() is None


def test_run_log_lines_are_on_disk_at_once_and_a_resume_continues_them(workdir, monkeypatch):
    log = rundir.RunLog(".")
    log.write({"event": "start", "iter": 0})
    log.write({"event": "train", "iter": 1})
    # not closed yet
    assert open("log.jsonl").read() == '{"event": "start", "iter": 0}\n{"event": "train", "iter": 1}\n'
    log.write({"event": "train", "iter": 2})
    log.file.close()
    resumed = rundir.RunLog(".", resume_iter=1)
    resumed.write({"event": "start", "iter": 1})
    resumed.file.close()
    assert [json.loads(line)["iter"] for line in open("log.jsonl")] == [0, 1, 1]
    rundir.RunLog(".").file.close()  # a new run starts a new log
    assert open("log.jsonl").read() == ""
    os.remove("log.jsonl")
    resumed = rundir.RunLog(".", resume_iter=1)  # a resumed run whose log was deleted starts a new one
    resumed.write({"event": "start", "iter": 1})
    resumed.file.close()
    assert open("log.jsonl").read() == '{"event": "start", "iter": 1}\n'
    calls = []
    monkeypatch.setitem(sys.modules, "wandb", types.SimpleNamespace(
        init=lambda **kwargs: calls.append(("init", kwargs)),
        log=lambda data, step: calls.append(("log", data, step))))
    log = rundir.RunLog(".", wandb_run={"project": "p", "name": "n"})
    for record in ({"event": "start", "iter": 0, "commit": "abc"}, {"event": "train", "iter": 1, "loss": 2.5},
                   {"event": "eval", "iter": 2, "val_loss": 3.0, "gamma": [[0.0]], "delta": [[1.0]]},
                   {"event": "done", "iter": 2, "best_val_loss": 3.0}):
        log.write(record)
    log.file.close()
    assert calls == [("init", {"project": "p", "name": "n"}), ("log", {"iter": 1, "loss": 2.5}, 1),
                     ("log", {"iter": 2, "val_loss": 3.0, "gamma/L0H0": 0.0, "delta/L0H0": 1.0}, 2)]
    # numbers only, at their iteration; every head's γ and δ by name


@pytest.mark.parametrize("error, words", [
    (OSError(errno.ENOSPC, "No space left on device"), "No space left on device"),
    # torch.save's
    (RuntimeError("[enforce fail at inline_container.cc:672] . unexpected pos 202304 vs 202192"),
     "RuntimeError: [enforce fail at inline_container.cc:672] . unexpected pos 202304 vs 202192"),
])
@pytest.mark.slow
def test_disk_full_while_saving_keeps_the_previous_checkpoint(finished_run, monkeypatch, error, words):
    def full_disk(obj, f, *args, **kwargs):  # f: the temporary, opened by atomic_write
        f.write(b"half a checkpoint")
        raise error
    good = open(f"{finished_run}/ckpt.pt", "rb").read()
    monkeypatch.setattr(rundir.torch, "save", full_disk)
    line = train_error(f"--out_dir={finished_run}", "--init_from=resume", "--max_iters=4")
    assert f"{words} while writing {finished_run}/ckpt.pt; the previous one is intact" in line
    assert open(f"{finished_run}/ckpt.pt", "rb").read() == good
    assert not [f for f in os.listdir(finished_run) if f.endswith(".tmp")]


# --- train.py: checkpoints ----------------------------------------------------------------------------------


class RunsCode:
    """A pickled object whose unpickling would create a file: a checkpoint must never run it."""
    def __reduce__(self):
        return (os.mkdir, ("pwned",))


# QUICK's model, and the sizes its weights (a few of them) hold
SIZES = {"n_layer": 1, "n_head": 2, "n_embd": 32, "block_size": 16, "vocab_size": 256}
WEIGHTS = {"transformer.wte.weight": torch.zeros(256, 32), "transformer.wpe.weight": torch.zeros(16, 32),
           "transformer.h.0.ln_1.weight": torch.ones(32)}
GOOD = {"model": WEIGHTS, "optimizer": {}, "model_args": SIZES, "iter_num": 2, "best_val_loss": 4.0,
        "tokens": 64,
        "loader": {"epoch": 0, "shard": 0, "pos": 8}, "meta": {"tokenizer": "byte", "vocab_size": 256},
        "config": {"init_from": "scratch"}}


@pytest.mark.parametrize("content, words", [
    (b"not a checkpoint", "cannot be read safely (UnpicklingError): it is corrupt, not a nanoCorridor "),
    ({**GOOD, "model_args": {**SIZES, "bogus": 2}}, "the checkpoint does not fit this code (TypeError"),
    ({**GOOD, "model_args": {**SIZES, "n_layer": 100_000}},
     "the checkpoint does not fit this code (model_args give wte, wpe, blocks [(256, 32), (16, 32), "
     "100000], its weights [(256, 32), (16, 32), 1]); it comes from another version or was edited"),
    ({"model": {}}, "lacks best_val_loss, config, iter_num, loader, meta, model_args, optimizer"),
    ({"model": RunsCode()}, "cannot be read safely (UnpicklingError): it is corrupt, not a nanoCorridor "
                            "checkpoint, or carries code"),
])
def test_bad_checkpoints(workdir, content, words):
    os.makedirs("out/bad")
    if isinstance(content, bytes):
        open("out/bad/ckpt.pt", "wb").write(content)
    else:
        torch.save(content, "out/bad/ckpt.pt")
    assert words in train_error("--init_from=resume", "--out_dir=out/bad", "--max_iters=4")
    assert not os.path.exists("pwned")

def test_a_good_checkpoint_loads_and_a_directory_is_refused(workdir):
    torch.save(GOOD, "ckpt.pt")
    assert rundir.load_checkpoint("ckpt.pt").keys() == GOOD.keys()
    os.makedirs("run/ckpt.pt")
    with pytest.raises(ConfigError) as e:
        rundir.load_checkpoint("run/ckpt.pt")
    assert str(e.value).startswith("run/ckpt.pt is a folder, not a regular file")
    with pytest.raises(ConfigError) as e:
        rundir.load_checkpoint("run/none.pt")
    assert str(e.value) == ("no checkpoint at run/none.pt; train a run there first (--init_from=scratch) "
                            "or point --out_dir at an existing run")


def test_dataset_without_meta_json(workdir):
    from helpers import write_shard
    os.makedirs("data/half")
    for split, n in (("val", 0), ("train", 1)):
        write_shard(f"data/half/half_{split}_00000{n}.bin", list(range(100)) * 10)
    assert ("dataset data/half has no meta.json, so it is not a finished dataset"
            in train_error("--dataset=half"))


# --- sample.py, bench.py, model.py --------------------------------------------------------------------------


@pytest.mark.parametrize("args, words", [
    (["--temperature=-1"], "temperature=-1.0 is not allowed: give 0 (greedy) or a temperature ≥ 0.001"),
    (["--top_k=0"], "top_k=0 is not allowed: it must be ≥ 1"),
    (["--device=gpu"], "device='gpu' is not allowed: use auto, cpu, mps, cuda or cuda:N"),
    (["--device=meta"], "device='meta' is not allowed: use auto, cpu, mps, cuda or cuda:N"),
    (["--start=FILE:missing.txt"], "--start=FILE:missing.txt: no such file or directory"),
    (["--start=FILE:."], "--start=FILE:.: is a directory"),
    (["--start=FILE:latin1.txt"], "--start=FILE:latin1.txt: the file is not UTF-8 text"),
    (["--start="], "the prompt encodes to no tokens"),
    (["--start=€"], "characters '€' are not in this dataset's vocabulary"),  # a DataError
    (["--out_dir=out/none"], "no checkpoint at out/none/ckpt.pt"),
    (["--num_samples=0"], "num_samples=0 is not allowed"),
    (["config/x.py"], "unexpected argument 'config/x.py': settings look like --key=value"),
])
@pytest.mark.slow
def test_sample_bad_inputs(finished_run, args, words):
    open("latin1.txt", "wb").write("café".encode("latin-1"))
    assert words in one_line_error(sample.main, [f"--out_dir={finished_run}", *args])


@pytest.mark.slow
def test_sample_top_k_none_samples_from_every_token(finished_run, capsys):
    """--top_k=None, as nanoGPT's generate takes it: no cut, although the default is a number (200)."""
    argv = [f"--out_dir={finished_run}", "--top_k=None", "--max_new_tokens=5", "--num_samples=1"]
    texts = sample.main(argv)
    assert len(texts) == 1 and texts[0].startswith("\n")


@pytest.mark.slow
def test_sample_on_a_cpu_only_machine(finished_run):
    if torch.cuda.is_available():
        pytest.skip("this machine has CUDA")
    line = one_line_error(sample.main, [f"--out_dir={finished_run}", "--device=cuda"])
    assert "device='cuda' but this torch has no CUDA or sees no such device; use --device=cpu" in line
    assert len(sample.main([f"--out_dir={finished_run}", "--device=auto", "--num_samples=1"])) == 1  # the CPU


@pytest.mark.parametrize("args, words", [
    (["--block_sizes=abc"], "block_sizes='abc' is not allowed: give integers like 128,256"),
    (["--repeats=0"], "repeats=0 is not allowed: it must be ≥ 1"),
    (["--what=nanogpt"], "nanogpt='' is not a Python file: give the path of nanoGPT's model.py"),
    (["--what=nanogpt", "--nanogpt=" + __file__], "defines no GPT and GPTConfig"),
    (["--what=speed"], "what='speed' is not allowed: choose one of ops, nanogpt, gpt2_step"),
    (["--ops=softmax"], "softmax/sdpa/T=256 failed: ValueError: op='softmax' is not allowed"),
    (["--batch_size=0"], "batch_size=0 is not allowed: it must be ≥ 1"),
    (["--iters=0"], "iters=0 is not allowed: it must be ≥ 1"),
    (["--block_sizes=128,"], "block_sizes='128,' is not allowed: give integers like 128,256"),
    (["--block_sizes=1.5"], "block_sizes='1.5' is not allowed: give integers like 128,256"),
    # no config files
    (["bench_config.py"], "unexpected argument 'bench_config.py': settings look like --key=value"),
])
@pytest.mark.slow
def test_bench_bad_inputs(args, words):
    assert words in one_line_error(bench.main, ["--iters=1", "--repeats=1", *args])


def test_bench_checks_the_nanogpt_file(workdir):
    where = "give the path of nanoGPT's model.py (github.com/karpathy/nanoGPT)"
    (workdir / "notes.txt").write_text("class GPT: pass\nclass GPTConfig: pass\n")
    (workdir / "boom.py").write_text("1 / 0\n")
    (workdir / "half.py").write_text("class GPT: pass\n")
    os.makedirs("folder.py")
    bad = lambda path: one_line_error(bench.main, ["--what=nanogpt", f"--nanogpt={path}"])
    assert bad("notes.txt") == f"error: nanogpt='notes.txt' is not a Python file: {where}"
    assert bad("folder.py") == f"error: nanogpt='folder.py' is not a Python file: {where}"
    assert bad("boom.py") == f"error: nanogpt='boom.py' failed to load (ZeroDivisionError): {where}"
    assert bad("half.py") == f"error: nanogpt='half.py' defines no GPT and GPTConfig: {where}"
    ours = os.path.join(ROOT, "model.py")
    assert bad(ours) == f"error: nanogpt={ours!r} is this project's own model.py: {where}"
    shutil.copy(ours, "copy.py")  # ours elsewhere: its configure_optimizers takes other arguments
    assert bad("copy.py") == f"error: nanogpt='copy.py' failed to train as nanoGPT's GPT does (TypeError): " \
                             f"{where}"


def test_bench_gpt2_step_needs_cuda():
    if torch.cuda.is_available():
        pytest.skip("this machine has CUDA")
    assert one_line_error(bench.main, ["--what=gpt2_step"]) == "error: what=gpt2_step needs a CUDA GPU"


@pytest.mark.parametrize("script, args, words", [
    ("train.py", ["--max_iter=3"], "unknown setting 'max_iter'; did you mean max_iters"),
    ("sample.py", ["--top_k=0"], "top_k=0 is not allowed"),
    ("model.py", ["--op=softmax"], "op='softmax' is not allowed"),
    ("model.py", ["laplacian"], "unexpected argument 'laplacian'"),
])
@pytest.mark.slow
def test_command_lines_print_one_line(workdir, script, args, words):
    p = subprocess.run([sys.executable, os.path.join(ROOT, script), *args], capture_output=True, text=True)
    assert p.returncode == 1 and p.stdout == "" and p.stderr.count("\n") == 1 and words in p.stderr, p.stderr
