"""
Run directories and checkpoints handed to us by someone else: links and special files in a run directory, a
folder that is not a run's, checkpoints built to crash or exhaust memory, a DDP group that cannot start,
and settings given on resume. Each must give one line and touch nothing outside the run directory.

    python -m pytest -q tests/test_hostile_run.py
"""
import copy
import json
import os
import re
import socket
import subprocess
import sys

import pytest
import torch

import corridor
from model import GPT
from support import hardware
from support import rundir
import sample
import train
from helpers import QUICK, ROOT, finished_run, one_line_error, train_error, workdir  # noqa: F401 (fixtures)

RESUME = ["--init_from=resume", "--max_iters=4"]


def edit_checkpoint(run, edit):
    ckpt = torch.load(f"{run}/ckpt.pt", weights_only=True)
    edit(ckpt)
    torch.save(ckpt, f"{run}/ckpt.pt")


def train_process(*args, env=None, timeout=120):
    """train.py in its own process: a crash (a segfault) or a hang must not take the test process with it."""
    env = {**os.environ, "OMP_NUM_THREADS": "1", **(env or {})}
    return subprocess.run([sys.executable, os.path.join(ROOT, "train.py"), *QUICK, *args],
                          capture_output=True, text=True, timeout=timeout, env=env)


def assert_one_line(p, words):
    assert p.returncode == 1 and p.stderr.count("\n") == 1, p.stderr[-2000:]
    assert p.stderr.startswith("error: ")
    assert words in p.stderr, p.stderr


# --- links and special files in a run directory -------------------------------------------------------------


@pytest.mark.parametrize("name", ["lock", "log.jsonl", "config.json", "ckpt.pt"])  # all that a run writes
@pytest.mark.slow
def test_a_link_in_a_run_directory_is_refused_and_its_target_untouched(finished_run, name):
    os.rename(f"{finished_run}/{name}", f"victim_{name}")
    before = open(f"victim_{name}", "rb").read()
    os.symlink(os.path.abspath(f"victim_{name}"), f"{finished_run}/{name}")
    assert f"{finished_run}/{name} is a symbolic link, not a regular file" in train_error(
        f"--out_dir={finished_run}", *RESUME)
    assert open(f"victim_{name}", "rb").read() == before


def test_a_link_named_lock_in_a_new_run_directory_is_refused(workdir):
    open("victim", "w").write("precious")
    os.makedirs("out/new")
    os.symlink(os.path.abspath("victim"), "out/new/lock")
    assert "out/new/lock is a symbolic link, not a regular file" in train_error("--out_dir=out/new")
    assert open("victim").read() == "precious"


@pytest.mark.parametrize("name", ["ckpt.pt.tmp", "config.json.tmp", "log.jsonl.tmp"])
@pytest.mark.slow
def test_links_planted_where_temporaries_once_were_are_never_written_through(finished_run, name):
    open("victim", "w").write("precious")
    os.symlink(os.path.abspath("victim"), f"{finished_run}/{name}")
    train.main(QUICK + [f"--out_dir={finished_run}", *RESUME])  # temporaries: fresh names, made exclusively
    assert open("victim").read() == "precious" and os.path.islink(f"{finished_run}/{name}")
    assert torch.load(f"{finished_run}/ckpt.pt", weights_only=True)["iter_num"] == 4


@pytest.mark.slow
def test_a_fifo_as_the_log_is_refused_not_waited_on(finished_run):
    os.remove(f"{finished_run}/log.jsonl")
    os.mkfifo(f"{finished_run}/log.jsonl")
    assert_one_line(train_process(f"--out_dir={finished_run}", *RESUME, timeout=60),
                    f"{finished_run}/log.jsonl is a FIFO (named pipe), not a regular file")


@pytest.mark.slow
def test_corridor_never_writes_a_figure_through_a_link(finished_run, capsys):
    open("victim.png", "wb").write(b"precious")
    os.symlink(os.path.abspath("victim.png"), f"{finished_run}/val_loss.png")
    assert corridor.main([finished_run]) == 1
    assert f"{finished_run}/val_loss.png is a symbolic link" in capsys.readouterr().err
    assert open("victim.png", "rb").read() == b"precious"


# --- a folder that is not a run's ---------------------------------------------------------------------------


@pytest.mark.parametrize("files", [
    {"config.json": '{"model_type": "gpt2"}'},  # someone's: a run writes its log before its config
    {"config.json": '{"model_type": "gpt2"}', "model.safetensors": "weights"},  # a Hugging Face model folder
    {"notes.txt": "mine"},
    {"lock": "held by a backup"},  # a run's lock holds a process id, or nothing
])
def test_a_folder_holding_files_no_run_wrote_is_refused_untouched(workdir, files):
    os.makedirs("theirs")
    for name, text in files.items():
        open(f"theirs/{name}", "w").write(text)
    assert "out_dir='theirs' holds files that no run wrote" in train_error("--out_dir=theirs")
    assert {name: open(f"theirs/{name}").read() for name in os.listdir("theirs")} == files


def test_fine_tuning_into_the_pretrained_folder_is_refused(workdir):
    transformers = pytest.importorskip("transformers")
    from helpers import write_shard
    config = transformers.GPT2Config(n_positions=64, n_embd=32, n_layer=1, n_head=2, vocab_size=100)
    hf = transformers.GPT2LMHeadModel(config)
    hf.save_pretrained("tiny-gpt2")
    before = {name: open(f"tiny-gpt2/{name}", "rb").read() for name in os.listdir("tiny-gpt2")}
    os.makedirs("data/tok")
    for split, n in (("val", 0), ("train", 1)):
        write_shard(f"data/tok/tok_{split}_00000{n}.bin", torch.randint(0, 100, (4000,)).numpy())
    json.dump({"name": "tok", "tokenizer": "gpt2", "vocab_size": 100}, open("data/tok/meta.json", "w"))
    assert "out_dir='tiny-gpt2' holds files that no run wrote" in train_error(
        "--init_from=tiny-gpt2", "--dataset=tok", "--out_dir=tiny-gpt2")
    assert {name: open(f"tiny-gpt2/{name}", "rb").read() for name in os.listdir("tiny-gpt2")} == before


@pytest.mark.slow
def test_an_empty_folder_and_a_run_killed_while_starting_are_ours(workdir):
    os.makedirs("out/empty")
    train.main(QUICK + ["--out_dir=out/empty"])
    os.makedirs("out/killed")
    open("out/killed/lock", "w").write("4242")  # killed between taking the lock and writing its log
    open("out/killed/.ckpt.pt.0123abcd.tmp", "w").write("half")  # killed inside a save
    train.main(QUICK + ["--out_dir=out/killed"])
    assert '"event": "done"' in open("out/killed/log.jsonl").read()
    assert not os.path.exists("out/killed/.ckpt.pt.0123abcd.tmp")  # removed under the lock


def test_what_counts_as_a_runs_temporary():
    """A kill -9 mid-write leaves .NAME.HEX.tmp; the next run removes those of run files, and nothing else."""
    assert rundir.is_temporary(".ckpt.pt.0123abcd.tmp")
    assert rundir.is_temporary(".ckpt_000100.pt.0123abcd.tmp")
    assert not rundir.is_temporary("ckpt.pt.tmp") and not rundir.is_temporary(".notes.txt.0123abcd.tmp")


@pytest.mark.slow
def test_a_run_fine_tuned_from_a_folder_since_moved_resumes(finished_run):
    edit_checkpoint(finished_run, lambda ckpt: ckpt["config"].update(init_from="/gone/tiny-gpt2"))
    train.main(QUICK + [f"--out_dir={finished_run}", *RESUME])
    assert json.load(open(f"{finished_run}/config.json"))["init_from"] == "/gone/tiny-gpt2"  # how it began


# --- settings given on resume run ---------------------------------------------------------------------------


@pytest.mark.slow
def test_optimizer_settings_given_on_resume_reach_the_optimizer(finished_run, capsys):
    given = ["--weight_decay=0.0", "--beta2=0.5", "--op_lr_scale=10"]
    train.main(QUICK + [f"--out_dir={finished_run}", *RESUME, *given])
    assert ("resumed with settings changed from the checkpoint's: max_iters=4 (was 2), weight_decay=0.0 "
            "(was 0.1), beta2=0.5 (was 0.95), op_lr_scale=10.0 (was 1.0)") in capsys.readouterr().out
    groups = torch.load(f"{finished_run}/ckpt.pt", weights_only=True)["optimizer"]["param_groups"]
    assert [g["weight_decay"] for g in groups] == [0.0, 0.0, 0.0]
    assert [g["betas"] for g in groups] == [(0.9, 0.5)] * 3 and groups[2]["lr_scale"] == 10.0
    config = json.load(open(f"{finished_run}/config.json"))
    assert (config["weight_decay"], config["beta2"], config["op_lr_scale"]) == (0.0, 0.5, 10.0)


# --- hostile checkpoints ------------------------------------------------------------------------------------


@pytest.mark.slow
def test_adamw_moments_of_the_wrong_shape_are_refused_not_a_crash(finished_run):
    def shrink(ckpt):
        entry = ckpt["optimizer"]["state"][0]
        entry["exp_avg"], entry["exp_avg_sq"] = torch.zeros(3), torch.zeros(3)
    edit_checkpoint(finished_run, shrink)
    assert_one_line(train_process(f"--out_dir={finished_run}", *RESUME),
                    "the checkpoint's optimizer state does not fit this model (the entry of parameter 0 ")


def set_state(key, value):
    def edit(ckpt):
        ckpt["optimizer"]["state"][1][key] = value
    return edit


@pytest.mark.parametrize("edit, words", [
    (set_state("exp_avg", torch.zeros(32, 16)), "the entry of parameter 1 "),  # another order
    (lambda ckpt: ckpt["optimizer"]["param_groups"].pop(), "other parameter groups"),
])
@pytest.mark.slow
def test_optimizer_states_that_do_not_fit_the_parameters_are_refused(finished_run, edit, words):
    edit_checkpoint(finished_run, edit)
    assert "the checkpoint's optimizer state does not fit this model (" + words in train_error(
        f"--out_dir={finished_run}", *RESUME)


def break_weights(ckpt, key, value):
    ckpt["model"][key] = value


WPE = "transformer.wpe.weight"


@pytest.mark.parametrize("edit, words", [
    (lambda c: break_weights(c, WPE, torch.full((16, 32), float("nan"))), "not finite (NaN or inf in " + WPE),
    (lambda c: break_weights(c, WPE, torch.zeros(8, 32)), "its weights [(103, 32), (8, 32), 1]"),
    (lambda c: c["model"].pop(WPE), "its weights [(103, 32), None, 1]"),
    (lambda c: c["model"].pop("lm_head.weight"), 'Missing key(s) in state_dict: "lm_head.weight"'),
    (lambda c: break_weights(c, "extra.weight", torch.zeros(1)),
     'Unexpected key(s) in state_dict: "extra.weight"'),
    (lambda c: c["model_args"].update(bogus=1), "does not fit this code (TypeError"),
    (lambda c: c["model_args"]["controls"].update(bogus=1), "bogus is not a control of op='mix'"),
    (lambda c: c["meta"].update(tokenizer="bpe"), "copy of meta.json does not describe a dataset"),
])
@pytest.mark.slow
def test_sample_refuses_the_checkpoints_train_refuses_with_the_same_line(finished_run, edit, words):
    edit_checkpoint(finished_run, edit)
    line = one_line_error(sample.main, [f"--out_dir={finished_run}"])
    assert words in line
    assert train_error(f"--out_dir={finished_run}", *RESUME) == line  # one check, shared


@pytest.mark.skipif(os.name == "nt", reason="reads the peak memory with the POSIX module resource")
@pytest.mark.parametrize("claim, words", [
    ({"n_embd": 8192}, "give wte, wpe, blocks [(103, 8192), (16, 8192), 1], its weights [(103, 32), "),
    ({"n_layer": 100_000}, "give wte, wpe, blocks [(103, 32), (16, 32), 100000], its weights [(103, "),
])
@pytest.mark.parametrize("script", ["sample.py", pytest.param("train.py", marks=pytest.mark.slow)])
def test_a_checkpoint_claiming_a_far_larger_model_is_refused_before_it_is_built(finished_run, script, claim,
                                                                                words):
    """model_args edited to claim far more than the file's tiny weights (n_embd 8192: 3 GB of weights;
    100,000 blocks: minutes of building and gigabytes): the sizes are compared with the weights' shapes
    before any model is built, so the peak stays that of the run's own tiny model (measured first, in the
    same environment: torch's imports alone vary between installs)."""
    args = [f"--out_dir={finished_run}"] + (["--eval_only=True"] if script == "train.py" else
                                            ["--num_samples=1", "--max_new_tokens=1"])
    path = os.path.join(ROOT, script)
    code = (f"import resource, runpy, sys; sys.path.insert(0, {ROOT!r}); sys.argv = [{path!r}, *{args!r}]\n"
            f"try:\n    runpy.run_path({path!r}, run_name='__main__')\n"
            "finally:\n    print(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss >> 10)")  # KiB -> MiB
    def peak():
        p = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60,
                           env={**os.environ, "OMP_NUM_THREADS": "1"})
        return p, int(p.stdout.split()[-1])
    own = peak()[1]
    edit_checkpoint(finished_run, lambda c: c["model_args"].update(claim))
    p, claimed = peak()
    assert_one_line(p, f"does not fit this code (model_args {words}")
    assert claimed < own + 300, (own, claimed)  # MiB; building either claimed model takes gigabytes more


@pytest.mark.slow
def test_a_weight_vector_not_finite_is_refused_as_a_matrix_is(workdir):
    """One NaN or inf in a vector of the weights (a bias, a LayerNorm's weight, a frozen γ or δ) is refused by
    the line that refuses one in a matrix, in sample.py and in train.py alike."""
    train.main(QUICK + ["--learn_gamma=False", "--learn_delta=False", "--out_dir=out/frozen"])
    saved = torch.load("out/frozen/ckpt.pt", weights_only=True)
    frozen = dict(GPT.from_checkpoint(saved).named_buffers())
    assert {"transformer.h.0.attn.op.gamma", "transformer.h.0.attn.op.delta"} <= set(frozen)
    for key, value in [("transformer.h.0.attn.c_attn.bias", float("nan")),
                       ("transformer.ln_f.weight", float("inf")),  # a LayerNorm's
                       ("transformer.h.0.attn.op.gamma", float("nan")),
                       ("transformer.h.0.attn.op.delta", -float("inf"))]:
        ckpt = copy.deepcopy(saved)
        ckpt["model"][key][0] = value  # one entry of the vector
        torch.save(ckpt, "out/frozen/ckpt.pt")
        line = one_line_error(sample.main, ["--out_dir=out/frozen"])
        assert line == (f"error: the checkpoint's weights are not finite (NaN or inf in {key}); use an "
                        "earlier checkpoint of the run"), key
        assert train_error("--out_dir=out/frozen", *RESUME) == line, key


@pytest.mark.slow
def test_the_optimizer_state_of_every_parameter_is_taken_up_to_the_last(finished_run):
    """AdamW's state is keyed by each parameter's place in the groups: every entry, the last one's
    included, is checked against its parameter and taken. (An entry one past the last, which only a
    hand edit makes, gets Python's own IndexError: issue 61's armour rule.)"""
    ckpt = torch.load(f"{finished_run}/ckpt.pt", weights_only=True)
    last = sum(len(g["params"]) for g in ckpt["optimizer"]["param_groups"]) - 1
    assert sorted(ckpt["optimizer"]["state"]) == list(range(last + 1))  # every parameter has its entry
    train.main(QUICK + [f"--out_dir={finished_run}", *RESUME])  # up to the last parameter's entry: taken
    assert torch.load(f"{finished_run}/ckpt.pt", weights_only=True)["iter_num"] == 4


# --- sample.py's and model.py's settings --------------------------------------------------------------------


@pytest.mark.parametrize("arg, words", [
    ("--temperature=1e-300", "temperature=1e-300 is not allowed: give 0 (greedy) or a temperature ≥ 0.001"),
    ("--seed=18446744073709551616",
     "seed=18446744073709551616 is not allowed: it must be in [0, 4294967296)"),
])
def test_sample_settings_that_would_overflow(finished_run, arg, words):
    assert one_line_error(sample.main, [f"--out_dir={finished_run}", arg]) == f"error: {words}"


@pytest.mark.slow
def test_model_demo_refuses_a_gamma_its_op_lacks_and_has_help(workdir):
    demo = [sys.executable, os.path.join(ROOT, "model.py")]
    p = subprocess.run(demo + ["--op=attention", "--gamma=-0.9"], capture_output=True, text=True)
    assert p.returncode == 1 and p.stdout == ""
    assert p.stderr == "error: gamma is not a control of op='attention'; drop it or choose an op with a γ\n"
    p = subprocess.run(demo + ["--help"], capture_output=True, text=True)
    assert p.returncode == 0 and "Classroom demo" in p.stdout and "--gamma=-0.5" in p.stdout


# --- the torchrun environment -------------------------------------------------------------------------------


def test_a_process_group_that_cannot_start_is_one_line(workdir, monkeypatch):
    env = {"RANK": "0", "LOCAL_RANK": "0", "WORLD_SIZE": "1", "MASTER_ADDR": "127.0.0.1",
           "MASTER_PORT": "29533", "GLOO_SOCKET_IFNAME": "no_such_interface0"}  # no interface of this machine
    for key, value in env.items():
        monkeypatch.setenv(key, value)
    assert train_error().startswith("error: the DDP process group could not start (")


def test_a_failure_of_one_rank_is_said_by_that_rank(workdir, monkeypatch):
    for key, value in (("RANK", "1"), ("LOCAL_RANK", "1"), ("WORLD_SIZE", "2")):
        monkeypatch.setenv(key, value)
    def disk_gone(cfg, local_rank):
        raise OSError(f"rank {local_rank}'s disk is gone")
    monkeypatch.setattr(hardware, "pick_device_and_dtype", disk_gone)
    assert train_error("--gradient_accumulation_steps=2") == "error: rank 1: rank 1's disk is gone"


def test_a_master_port_in_use_is_one_line(workdir, monkeypatch):
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        env = {"RANK": "0", "LOCAL_RANK": "0", "WORLD_SIZE": "2", "MASTER_ADDR": "127.0.0.1",
               "MASTER_PORT": str(taken.getsockname()[1])}
        for key, value in env.items():
            monkeypatch.setenv(key, value)
        line = train_error("--gradient_accumulation_steps=2")
        # torch 2.6 and older raise a RuntimeError there, newer ones its subclass DistNetworkError
        assert re.search(r"could not start \((DistNetworkError|RuntimeError): ", line), line
        assert "choose a free MASTER_PORT" in line


@pytest.mark.slow
def test_a_config_bad_on_one_rank_is_said_by_that_rank(workdir):
    """A config file that reads RANK and is bad on rank 1 only: rank 1 prints its line, with its rank."""
    with open("rank1_bad.py", "w") as f:
        f.write("import os\nbatch_size = 0 if os.environ.get('RANK') == '1' else 2\n")
    p = subprocess.run([sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node=2",
                        os.path.join(ROOT, "train.py"), "rank1_bad.py", "--gradient_accumulation_steps=2",
                        *(arg for arg in QUICK if not arg.startswith("--batch_size"))],
                       capture_output=True, text=True, env={**os.environ, "OMP_NUM_THREADS": "1"},
                       timeout=300)
    assert p.returncode != 0
    assert "error: rank 1: batch_size=0 is not allowed" in p.stderr, p.stderr[-3000:]


def test_a_gpu_this_node_lacks_is_that_ranks_error(monkeypatch):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 2)
    with pytest.raises(hardware.ConfigError, match=r"^device='cuda:2' but this machine has 2 GPU\(s\)"):
        hardware.pick_device_and_dtype(train.parse_config(["--device=cuda", "--dtype=float32"])[0], 2)


# --- Ctrl-C in every script: one line, and no file left half-written ---------------------------------------


def test_ctrl_c_while_sampling_is_one_line(finished_run, monkeypatch):
    from model import GPT
    def interrupted(*args, **kwargs):
        raise KeyboardInterrupt
    monkeypatch.setattr(GPT, "generate", interrupted)
    with pytest.raises(SystemExit) as e:
        sample.main([f"--out_dir={finished_run}"])
    assert e.value.code == "interrupted"


def test_ctrl_c_while_corridor_reads_is_one_line(finished_run, monkeypatch, capsys):
    def interrupted(path):
        raise KeyboardInterrupt
    monkeypatch.setattr(corridor, "load_run", interrupted)
    assert corridor.main([finished_run, "--csv=runs.csv"]) == 1
    assert capsys.readouterr().err == "interrupted\n" and not os.path.exists("runs.csv")
