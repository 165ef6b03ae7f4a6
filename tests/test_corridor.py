"""Tests for corridor.py on synthetic run directories with known values.

    python -m pytest -q tests/test_corridor.py
"""
import copy
import csv
import json
import math
import os
import re
import shutil
import subprocess
import sys
from dataclasses import asdict

import numpy as np
import pytest
import torch

import corridor
import support
import train
from helpers import QUICK, ROOT, char_dataset
from model import GPT, GPTConfig
from operators import OPS

# final γ of a 3-layer × 4-head run: 2 heads per layer strictly inside (−1, 0); −1.0 and 0.0 are
# endpoints, not inside
GAMMA = [[-0.5, -0.2, 0.3, -1.0],
         [-0.5, 0.0, -1.0, -0.99],
         [-0.1, -0.9, 0.5, -1.5]]
DELTA = [[1.0] * 4, [2.0] * 4, [3.0, 3.0, 4.0, 4.0]]


def make_run(tmp_path, name, op="mix", seed=0, val=(3.0, 2.0, 2.5), gamma=GAMMA, delta=DELTA, tail="",
             head=(), **cfg):
    """Write config.json and log.jsonl like train.py does: evals every 100 iters, the last one with
    gamma/delta. head: records written first (train.py's "start" records)."""
    d = tmp_path / name
    d.mkdir()
    config = {"out_dir": f"out/{name}", "dataset": "pydocs", "op": op, "seed": seed, "n_layer": len(gamma),
              "n_head": len(gamma[0]), "gamma_init": 0.0, "delta_init": 1.0, "learn_gamma": True,
              "learn_delta": True, "gamma_min": None, "laplacian_heads": None, **cfg}
    (d / "config.json").write_text(json.dumps(config))
    zeros, ones = [[0.0] * len(g) for g in gamma], [[1.0] * len(g) for g in gamma]
    lines = list(head)
    for i, v in enumerate(val):
        it = 100 * i
        if it:
            lines.append({"event": "train", "iter": it, "tokens": 2048 * it, "loss": v, "lr": 1e-3,
                          "ms_per_iter": 50.0, "tokens_per_s": 40000.0, "mfu": None})
        last = i == len(val) - 1
        lines.append({"event": "eval", "iter": it, "tokens": 2048 * it, "train_loss": v, "val_loss": v,
                      "gamma": gamma if last else zeros, "delta": delta if last else ones})
    (d / "log.jsonl").write_text("".join(json.dumps(r) + "\n" for r in lines) + tail)
    return str(d)


@pytest.fixture
def no_figures(monkeypatch):
    """For tests of the printed tables and the CSV: skip drawing the PNGs (the figure tests draw them)."""
    monkeypatch.setattr(corridor, "plot", lambda c, out_dir: [])


def test_summary_numbers(tmp_path):
    s = corridor.summarize(corridor.load_run(make_run(tmp_path, "mix_s0")))
    assert (s.inside.sum(), s.inside[1:].sum()) == (6, 4)  # heads in the corridor, all and beyond layer 1
    assert s.inside.mean() == pytest.approx(0.5) and s.frac_deep == pytest.approx(0.5)
    assert s.layer_gamma == pytest.approx([-0.35, -0.6225, -0.5])
    assert s.layer_delta == pytest.approx([1.0, 2.0, 3.5])
    assert (s.best_val, s.best_iter, s.final_val, s.final_iter) == (2.0, 100, 2.5, 200)
    assert s.tokens == 2048 * 200


def test_controls_only_non_default(tmp_path):
    run = corridor.load_run(make_run(tmp_path, "fixed", gamma_init=-0.5, learn_gamma=False, seed=3))
    assert corridor.controls(run["config"]) == {"gamma_init": -0.5, "learn_gamma": False}
    assert corridor.summarize(run).label == "mix gamma_init=-0.5 learn_gamma=False seed=3"


def test_attention_and_laplacian_shown_as_fixed(tmp_path, capsys, no_figures):
    zeros, ones = [[0.0] * 4] * 2, [[1.0] * 4] * 2
    attn = make_run(tmp_path, "attn", op="attention", gamma=zeros, delta=ones)
    lap = make_run(tmp_path, "lap", op="laplacian", gamma=[[0.0, 0.0, -1.0, -1.0]] * 2,
                   delta=[[1.0, 1.0, -1.0, -1.0]] * 2)
    assert corridor.main([attn, lap, f"--out={tmp_path / 'figs'}"]) == 0
    out = capsys.readouterr().out
    assert "attention: γ and δ fixed" in out
    assert "laplacian: γ and δ fixed\n   layer   mean γ   mean δ\n       1   -0.500   +0.000\n" in out
    assert "γ ∈ (−1, 0):" not in out  # no corridor statistics for fixed operators
    assert corridor.summarize(corridor.load_run(attn)).frac_deep is None


def test_compare_order_and_difference_to_attention(tmp_path):
    runs = [corridor.load_run(make_run(tmp_path, n, op=op, val=(3.0, v)))
            for n, op, v in [("attn", "attention", 2.0), ("mix", "mix", 1.75), ("lap", "laplacian", 1.875)]]
    c = corridor.compare(runs)
    assert [s.name for s in c["rows"]] == ["mix", "lap", "attn"]
    assert [s.vs_attention for s in c["rows"]] == pytest.approx([-0.25, -0.125, 0.0])


def test_seed_groups_mean_std(tmp_path):
    deep_in = [[-0.5] * 4, [-0.5, -0.5, 0.5, 0.5]]  # 2 layers: beyond layer 1, half the heads inside
    deep_all = [[-0.5] * 4, [-0.5] * 4]
    specs = [("attn_s0", "attention", 0, 2.0, {}), ("attn_s1", "attention", 1, 2.2, {}),
             ("mix_s0", "mix", 0, 1.8, {}), ("mix_s1", "mix", 1, 1.9, {"wandb_run_name": "x"}),
             ("mix_s2", "mix", 2, 2.0, {}), ("mixg_s0", "mix", 0, 1.7, {"gamma_init": -0.5})]
    runs = []
    for name, op, seed, v, extra in specs:
        g = deep_all if name == "mix_s2" else deep_in
        runs.append(corridor.load_run(make_run(tmp_path, name, op=op, seed=seed, val=(3.0, v), gamma=g,
                                               delta=[[1.0] * 4] * 2, **extra)))
    groups = corridor.compare(runs)["groups"]
    assert [(g.label, g.n) for g in groups] == [("mix gamma_init=-0.5", 1), ("mix", 3),
                                                      ("attention", 2)]
    mix, attn = groups[1], groups[2]
    assert [m.name for m in mix.runs] == ["mix_s0", "mix_s1", "mix_s2"]
    assert mix.val_mean == pytest.approx(1.9) and mix.val_std == pytest.approx(0.1)
    assert mix.deep_mean == pytest.approx(2 / 3) and mix.deep_std == pytest.approx(0.288675, abs=1e-6)
    assert attn.val_mean == pytest.approx(2.1) and attn.val_std == pytest.approx(0.141421, abs=1e-6)
    assert attn.deep_mean is None
    # seeds 0 and 1 have an attention run; seed 2 has none
    assert mix.paired == pytest.approx([-0.2, -0.3])
    assert (mix.paired_mean == pytest.approx(-0.25)
            and mix.paired_std == pytest.approx(0.0707107, abs=1e-6))
    assert groups[0].val_std is None  # one run: no sample std


def test_main_prints_table_groups_and_writes_pngs(tmp_path, capsys):
    dirs = [make_run(tmp_path, "attn_s0", op="attention", val=(3.0, 2.0), gamma=[[0.0] * 4] * 3,
                     delta=[[1.0] * 4] * 3),
            make_run(tmp_path, "mix_s0"), make_run(tmp_path, "mix_s1", seed=1, val=(3.0, 2.3))]
    assert corridor.main(dirs) == 0
    out = capsys.readouterr().out
    assert "== mix_s0  (mix seed=0)" in out
    assert "γ ∈ (−1, 0): 6/12 heads (50%) overall, 4/8 (50%) beyond layer 1" in out
    assert "runs by final val loss" in out and "seed groups" in out and "1.9000 ± n/a" not in out
    assert "2.4000 ± 0.1414" in out  # mix seeds: final val 2.5 and 2.3
    names = ["gamma_mix_s0.png", "delta_mix_s0.png", "gamma_final_mix_s0.png", "val_loss.png"]
    for name in names:  # default output directory: the first run's
        path = tmp_path / "attn_s0" / name
        assert f"{path}" in out
        assert path.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and path.stat().st_size > 1000


def test_plot_returns_paths(tmp_path):
    c = corridor.compare([corridor.load_run(make_run(tmp_path, "mix_s0"))])
    paths = corridor.plot(c, str(tmp_path / "figs"))
    assert [p.split("/")[-1] for p in paths] == ["gamma_mix_s0.png", "delta_mix_s0.png",
                                                 "gamma_final_mix_s0.png", "val_loss.png"]


def test_plot_hands_figures_the_run_and_its_axis(tmp_path, monkeypatch):
    """What plot gives figures.py to draw: the first learned run's γ and δ against its tokens, its final γ,
    and every run's val loss, against iterations as one log has no tokens (test_figures checks drawing)."""
    from support import figures
    drawn = {}

    def keep(fig, path):  # instead of writing the PNG
        drawn[os.path.basename(path)] = fig
        return path
    monkeypatch.setattr(figures, "save", keep)
    attn = make_run(tmp_path, "attn_s0", op="attention", **ZEROS)
    edit(tmp_path / "attn_s0" / "log.jsonl", '"iter": 0, "tokens": 0, ', '"iter": 0, ')  # an older log
    mixes = [make_run(tmp_path, "mix_s0"), make_run(tmp_path, "mix_s1", seed=1)]
    runs = [corridor.load_run(d) for d in [attn] + mixes]
    corridor.plot(corridor.compare(runs), str(tmp_path / "figs"))
    assert list(drawn) == ["gamma_mix_s0.png", "delta_mix_s0.png", "gamma_final_mix_s0.png", "val_loss.png"]
    for key, values in (("gamma", GAMMA), ("delta", DELTA)):
        ax = drawn[f"{key}_mix_s0.png"].axes[0]
        assert ax.get_xlabel() == "tokens" and ax.get_title().endswith("\nmix_s0: mix seed=0")
        assert list(ax.lines[-1].get_xdata()) == [0, 204800, 409600]
        assert ax.lines[-1].get_ydata()[-1] == values[-1][-1]  # the last head at the last eval
    grid = drawn["gamma_final_mix_s0.png"].axes[0]
    assert grid.images[0].get_array().tolist() == GAMMA
    assert grid.get_title() == "final γ (iter 200)\nmix_s0: mix seed=0"
    ax = drawn["val_loss.png"].axes[0]
    assert ax.get_xlabel() == "iteration" and list(ax.lines[0].get_xdata()) == [0, 100, 200]
    assert [list(line.get_ydata()) for line in ax.lines] == [[3.0, 2.0, 2.5]] * 3
    figures.plt.close("all")


def error_line(capsys, argv):
    """Run the CLI expecting failure; return its single stderr line."""
    assert corridor.main(argv) == 1
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("error: ")
    return err[0]


def test_nonexistent_path(tmp_path, capsys):
    assert "nope: not a run directory, missing config.json and log.jsonl" in error_line(
        capsys, [str(tmp_path / "nope")])


def test_not_a_run_dir(tmp_path, capsys):
    (tmp_path / "empty").mkdir()
    line = error_line(capsys, [str(tmp_path / "empty")])
    assert ("not a run directory, missing config.json and log.jsonl (train.py writes log.jsonl as it starts, "
            "config.json with its first checkpoint)") in line
    (tmp_path / "half").mkdir()
    (tmp_path / "half" / "config.json").write_text("{}")
    assert "missing log.jsonl (" in error_line(capsys, [str(tmp_path / "half")])


def test_truncated_last_line_is_skipped_with_warning(tmp_path, capsys, no_figures):
    d = make_run(tmp_path, "crashed", tail='{"event": "eval", "iter": 300, "val_lo')
    run = corridor.load_run(d)
    assert len(run["evals"]) == 3 and "log.jsonl: line 6 was cut short (a crash)" in run["warnings"][0]
    assert corridor.main([d]) == 0
    captured = capsys.readouterr()
    assert captured.err.startswith("warning: ") and "final 2.5000 (iter 200)" in captured.out


def test_corrupt_middle_line(tmp_path, capsys):
    d = make_run(tmp_path, "bad")
    log = tmp_path / "bad" / "log.jsonl"
    lines = log.read_text().splitlines()
    lines[2] = lines[2][:20]
    log.write_text("\n".join(lines) + "\n")
    with pytest.raises(ValueError, match=r"log\.jsonl: line 3 is not a record train.py wrote; remove"):
        corridor.load_run(d)
    assert f"{log}: line 3 " in error_line(capsys, [d])


def test_no_eval_record(tmp_path, capsys):
    d = tmp_path / "fresh"
    d.mkdir()
    (d / "config.json").write_text('{"op": "mix"}')
    (d / "log.jsonl").write_text('{"event": "train", "iter": 10, "tokens": 100, "loss": 3.0}\n')
    assert "log.jsonl: no eval record yet" in error_line(capsys, [str(d)])


def test_bad_arguments(tmp_path, capsys):
    assert "no run directory given" in error_line(capsys, [])
    assert "unknown setting 'outdir'; did you mean out" in error_line(capsys, ["--outdir=x", str(tmp_path)])


def test_not_utf8_names_the_file(tmp_path, capsys):
    d = make_run(tmp_path, "latin1")
    cfg = tmp_path / "latin1" / "config.json"
    cfg.write_bytes(cfg.read_bytes().replace(b'"pydocs"', b'"caf\xe9"'))  # é in Latin-1: not UTF-8
    line = error_line(capsys, [d])
    assert f"error: {cfg}: not the JSON train.py writes ('utf-8' codec can't decode" in line
    d = make_run(tmp_path, "badlog")
    log = tmp_path / "badlog" / "log.jsonl"
    lines = log.read_bytes().splitlines(keepends=True)
    lines[1] = lines[1].replace(b'"train"', b'"tr\xffin"')
    log.write_bytes(b"".join(lines))
    assert error_line(capsys, [d]) == (f"error: {log}: line 2 is not a record train.py wrote; "
                                       "remove that line")


# --- the statistics: hand-computed cases, the undefined ones, and the numbers docs/results.md quotes


def test_paired_stats_by_hand():
    # d = −1, −2, −3: mean −2, sample std 1, standard error 1/√3, t = −2√3, 2 degrees of freedom
    s = corridor.paired_stats([-1.0, -2.0, -3.0])
    assert (s.n_pairs, s.paired_mean, s.paired_std) == (3, -2.0, 1.0)
    assert s.t == pytest.approx(-2 * 3 ** 0.5)
    assert s.ci == pytest.approx((-2 - 4.302653 / 3 ** 0.5, -2 + 4.302653 / 3 ** 0.5), abs=1e-6)
    # df = 2: p = 1 − |t|/√(2 + t²) = 0.074180
    assert s.p_t == pytest.approx(1 - 2 * 3 ** 0.5 / 14 ** 0.5)
    assert (s.k_lower, s.p_sign) == (3, 0.25)
    s = corridor.paired_stats([0.0, -1.0, -2.0])  # a tie does not count for the sign test: 2 of 2 lower
    assert (s.k_lower, s.p_sign) == (2, 0.5)
    s = corridor.paired_stats([-1.0, -2.0, 3.0])  # mean 0: t = 0, p = 1
    assert s.paired_mean == 0.0 and s.t == 0.0 and s.p_t == pytest.approx(1.0)
    # exact sign test: P(7 or more of 8, either way) = 2·9/2⁸
    s = corridor.paired_stats([-1.0] * 7 + [1.0])
    assert (s.k_lower, s.p_sign) == (7, 2 * 9 / 2 ** 8)


def test_paired_stats_undefined_cases():
    s = corridor.paired_stats([-0.5])  # one seed: a mean and a sign, no spread
    assert (s.paired_mean, s.k_lower, s.p_sign) == (-0.5, 1, 1.0)
    assert s.paired_std is s.ci is s.t is s.p_t is None
    # "equal" differences: float noise ~1e-16 only
    s = corridor.paired_stats([2.1 - 2.0, 2.2 - 2.1, 2.3 - 2.2])
    assert s.paired_mean == pytest.approx(0.1) and s.ci is s.t is s.p_t is None
    assert s.p_sign == 0.25 and s.k_lower == 0
    s = corridor.paired_stats([])
    assert (s.n_pairs, s.k_lower) == (0, 0) and s.paired_mean is s.p_sign is s.ci is None
    s = corridor.paired_stats([-0.1, float("nan")])  # a diverged run: nothing to conclude
    assert s.paired_mean is s.p_t is s.p_sign is None
    s = corridor.paired_stats([0.0, 0.0])  # only ties: the sign test has nothing to count
    assert s.paired_mean == 0.0 and s.p_sign is None


def test_the_numbers_docs_quote():
    """docs/results.md's paired statistics recomputed from docs/corridor_runs.csv, to the digits it prints."""
    runs = corridor.load_csv(os.path.join(ROOT, "docs", "corridor_runs.csv"))
    val = {r["name"]: r["evals"][-1]["val_loss"] for r in runs}

    def stats(setting, baseline, n=8):
        return corridor.paired_stats([val[f"{setting}_s{k}"] - val[f"{baseline}_s{k}"] for k in range(n)])

    s = stats("mix", "attention")
    assert round(s.paired_mean, 4) == -0.0071 and [round(x, 4) for x in s.ci] == [-0.0120, -0.0023]
    assert round(s.p_t, 3) == 0.010 and (s.k_lower, round(s.p_sign, 3)) == (7, 0.070)
    s = stats("mix_fixed_gamma_m03", "attention")
    assert [round(x, 4) for x in s.ci] == [-0.0254, -0.0126]
    assert (s.k_lower, s.p_sign) == (8, 0.0078125)
    s = stats("mix", "mix_fixed_gamma_m03")
    assert [round(x, 4) for x in s.ci] == [0.0070, 0.0167] and round(s.p_t, 4) == 0.0007
    s = stats("mix_start_m03", "mix_fixed_gamma_m03")
    assert round(s.paired_mean, 4) == 0.0053 and round(s.p_t, 3) == 0.032
    s = stats("mix_lr10_fixed_delta", "mix_lr10", n=4)
    assert round(s.paired_mean, 4) == -0.0350 and round(s.p_t, 3) == 0.004
    s = stats("mix_lr10_fixed_delta", "attention")  # the best learned variant, 8 seeds at two scales
    assert [round(x, 4) for x in s.ci] == [-0.0222, -0.0106] and round(s.p_t, 4) == 0.0003
    s = stats("3x96_mix_lr10_fixed_delta", "3x96_mix_fixed_gamma_m03")
    assert round(s.paired_mean, 4) == -0.0004 and round(s.p_t, 4) == 0.9047
    s = stats("mix_gamma_nonneg", "mix")
    assert [round(x, 4) for x in s.ci] == [0.0070, 0.0153] and s.k_lower == 0
    s = stats("mix_alpha", "mix")
    assert round(s.paired_mean, 4) == -0.0025 and round(s.p_t, 4) == 0.0003
    groups = {g.setting: g for g in corridor.compare(runs)["groups"]}
    assert round(groups["3x96_mix"].paired_mean, 4) == -0.0030 and groups["3x96_mix"].n == 8
    # every head beyond layer 1 that learns γ freely from γ ≤ 0 ends in the corridor; γ ≥ 0 holds it at 0
    free = [g for g in groups.values() if g.learns_gamma and g.config.get("gamma_min") is None
            and g.config.get("gamma_init", 0.0) <= 0]
    assert len(free) > 10 and all(g.deep_mean == 1.0 for g in free)
    assert groups["mix_gamma_nonneg"].deep_mean == groups["mix_start_p05"].deep_mean == 0.0
    # the headline variants judged again on seeds 100-107, on which nothing was chosen (results.md, README)
    quoted = {"mix_lr10_fixed_delta": ((-0.0160, -0.0204, -0.0116), 8, (-0.0162, 16)),
              "mix_fixed_gamma_m03": ((-0.0118, -0.0182, -0.0054), 7, (-0.0154, 15)),
              "mix_start_m03": ((-0.0064, -0.0156, 0.0027), 6, (-0.0100, 14))}
    rows = {r["setting"]: r for r in corridor.confirmations(list(groups.values()))}
    assert set(rows) == set(quoted)
    for setting, ((mean, low, high), lower, (pooled, pooled_lower)) in quoted.items():
        confirmation, both = rows[setting]["confirmation"], rows[setting]["pooled"]
        assert round(confirmation.paired_mean, 4) == mean
        assert confirmation.paired_seeds == [*range(100, 108)]
        assert [round(x, 4) for x in confirmation.ci] == [low, high] and confirmation.k_lower == lower
        assert (round(both.paired_mean, 4), both.k_lower, both.n_pairs) == (pooled, pooled_lower, 16)
    assert [round(rows[s]["confirmation"].p_t, 4) for s in quoted] == [0.0001, 0.0033, 0.1400]
    s = corridor.paired_stats([val[f"mix_lr10_fixed_delta_s{k}"] - val[f"mix_fixed_gamma_m03_s{k}"]
                               for k in range(100, 108)])
    assert round(s.paired_mean, 4) == -0.0042 and round(s.p_t, 4) == 0.2238



def test_a_chosen_variant_is_judged_on_confirmation_seeds(tmp_path, capsys, no_figures):
    """Seeds 100+ form groups of their own: the selection seeds' statistics stay as they were, the new seeds
    get theirs, and the confirmation table pools both; each set pairs with its own seeds' attention runs."""
    specs = [(f"attention_s{k}", "attention", k, 2.0 + k % 100 / 10, {}) for k in (0, 1, 2, 100, 101, 102)]
    specs += [(f"mix_s{k}", "mix", k, 2.0 + k % 100 / 10 + d, {})
              for k, d in ((0, -0.1), (1, -0.1), (2, -0.2), (100, -0.05), (101, 0.01), (102, -0.03))]
    dirs = runs_of(tmp_path, specs)
    c = corridor.compare([corridor.load_run(d) for d in dirs])
    by_setting = {g.setting: g for g in c["groups"]}
    assert set(by_setting) == {"attention", "attention (confirmation)", "mix", "mix (confirmation)"}
    assert by_setting["mix"].paired == pytest.approx([-0.1, -0.1, -0.2])  # seeds 0-2 only
    assert by_setting["mix (confirmation)"].paired == pytest.approx([-0.05, 0.01, -0.03])
    assert by_setting["mix (confirmation)"].paired_seeds == [100, 101, 102]
    (row,) = corridor.confirmations(c["groups"])
    assert row["setting"] == "mix" and row["selection"] is by_setting["mix"]
    pooled = row["selection"].paired + row["confirmation"].paired
    assert pooled == pytest.approx([-0.1, -0.1, -0.2, -0.05, 0.01, -0.03])
    assert row["pooled"] == corridor.paired_stats(pooled) and row["pooled"].n_pairs == 6
    assert corridor.main(dirs) == 0
    out = capsys.readouterr().out
    table = out.split("== chosen on some seeds, judged on others")[1].splitlines()
    cells = table[3].split()
    assert cells[0] == "mix" and cells[1:3] == ["3:", "-0.1333"] and cells[8:10] == ["3:", "-0.0233"]
    assert cells[15:17] == ["6:", "-0.0783"] and cells[-1] == "5/6"

# --- paired comparison with attention: which runs pair, and what the seed-group table prints

# half inside beyond L1
TWO_LAYERS = {"gamma": [[-0.5] * 4, [-0.5, -0.5, 0.5, 0.5]], "delta": [[1.0] * 4] * 2}
ZEROS = {"gamma": [[0.0] * 4] * 2, "delta": [[1.0] * 4] * 2}


def runs_of(tmp_path, specs):
    """specs: (name, op, seed, final val, config overrides); every run logs evals at iters 0 and 100."""
    return [make_run(tmp_path, name, op=op, seed=seed, val=(3.0, v),
                     **(ZEROS if op == "attention" else TWO_LAYERS), **extra)
            for name, op, seed, v, extra in specs]


def group(c, label):
    (g,) = [g for g in c["groups"] if g.label == label]
    return g


def test_paired_statistics_by_hand_and_printed(tmp_path, capsys, no_figures):
    # d = −0.1, −0.1, −0.2: mean −0.1333, s = 0.0577, t = −4 with 2 df → p = 1 − 4/√18;
    # 95% CI ±4.302653·s/√3
    dirs = runs_of(tmp_path, [("attn_s0", "attention", 0, 2.0, {}), ("attn_s1", "attention", 1, 2.1, {}),
                              ("attn_s2", "attention", 2, 2.2, {}), ("mix_s0", "mix", 0, 1.9, {}),
                              ("mix_s1", "mix", 1, 2.0, {}), ("mix_s2", "mix", 2, 2.0, {})])
    mix = group(corridor.compare([corridor.load_run(d) for d in dirs]), "mix")
    assert mix.paired == pytest.approx([-0.1, -0.1, -0.2]) and mix.paired_seeds == [0, 1, 2]
    assert (mix.paired_mean == pytest.approx(-0.4 / 3)
            and mix.paired_std == pytest.approx(0.0577350, abs=1e-7))
    assert mix.t == pytest.approx(-4.0) and mix.p_t == pytest.approx(1 - 4 / 18 ** 0.5)
    assert mix.ci == pytest.approx((-0.4 / 3 - 4.302653 * 0.1 / 3, -0.4 / 3 + 4.302653 * 0.1 / 3),
                                      abs=1e-6)
    assert (mix.k_lower, mix.n_pairs, mix.p_sign) == (3, 3, 0.25)
    assert corridor.main(dirs + [f"--out={tmp_path / 'figs'}"]) == 0
    out = capsys.readouterr().out.splitlines()
    head = next(i for i, line in enumerate(out) if line.startswith("== seed groups"))
    assert out[head + 1].split() == ["setting", "n", "final", "val", "paired", "diff", "95%", "CI", "p",
                                     "(t-test)", "lower", "p", "(sign)", "corridor>L1"]
    assert out[head + 2].split() == ["mix", "3", "1.9667", "±", "0.0577", "-0.1333", "±", "0.0577",
                                     "[-0.2768,", "+0.0101]", "0.0572", "3/3", "0.2500", "50%", "±", "0%"]
    assert out[head + 3].split() == ["attn", "3", "2.1000", "±", "0.1000", "baseline", "fixed"]


def test_baseline_has_the_same_config_apart_from_op_and_controls(tmp_path):
    long = {"max_iters": 3600, "lr_decay_iters": 3600}
    runs = [corridor.load_run(d) for d in runs_of(tmp_path, [
        ("attn_s0", "attention", 0, 2.0, {}), ("attn_s1", "attention", 1, 2.1, {}),
        ("attnL_s0", "attention", 0, 1.5, long), ("attnL_s1", "attention", 1, 1.6, long),
        ("mix_s0", "mix", 0, 1.9, {}), ("mix_s1", "mix", 1, 2.05, {}),
        ("mixL_s0", "mix", 0, 1.45, long), ("mixL_s1", "mix", 1, 1.4, long),
        ("fixed_s1", "mix", 1, 2.0, {"gamma_init": -0.5, "learn_gamma": False, "learn_delta": False}),
        # an experiment key differs: no attention run to pair with
        ("wide_s0", "mix", 0, 1.8, {"n_embd": 256})])]
    c = corridor.compare(runs)
    short_mix, long_mix = group(c, "mix"), group(c, "mix lr_decay_iters=3600 max_iters=3600")
    assert short_mix.paired == pytest.approx([-0.1, -0.05])
    assert long_mix.paired == pytest.approx([-0.05, -0.2])
    fixed = group(c, "mix gamma_init=-0.5 learn_delta=False learn_gamma=False")
    # controls differ: still paired
    assert fixed.paired == pytest.approx([-0.1]) and fixed.paired_seeds == [1]
    wide = group(c, "mix n_embd=256")
    assert wide.paired == [] and wide.paired_mean is None
    assert corridor.group_cells(wide)[3:8] == ["n/a"] * 5
    # by val loss within the blocks of one baseline (blocks by the baseline's val loss); no baseline: last
    assert [g.setting for g in c["groups"]] == ["mixL", "attnL", "mix", "fixed", "attn", "wide"]
    rows = {s.name: s.vs_attention for s in c["rows"]}
    assert rows["mixL_s1"] == pytest.approx(1.4 - 1.55) and rows["mix_s1"] == pytest.approx(2.05 - 2.05)
    assert rows["wide_s0"] is None


def test_one_seed_and_zero_spread_print_na(tmp_path):
    runs = [corridor.load_run(d) for d in runs_of(tmp_path, [
        ("attn_s0", "attention", 0, 2.0, {}), ("attn_s1", "attention", 1, 2.5, {}),
        ("one_s1", "mix", 1, 2.25, {"gamma_init": -0.5}),
        ("flat_s0", "mix", 0, 1.75, {}), ("flat_s1", "mix", 1, 2.25, {})])]  # both seeds exactly −0.25
    c = corridor.compare(runs)
    assert corridor.group_cells(group(c, "mix gamma_init=-0.5")) == [
        "one", "1", "2.2500 ± n/a", "-0.2500 ± n/a", "n/a", "n/a", "1/1", "1.0000", "50% ± n/a"]
    assert corridor.group_cells(group(c, "mix"))[3:8] == ["-0.2500 ± 0.0000", "n/a", "n/a", "2/2", "0.5000"]


def test_unfinished_run_is_not_paired(tmp_path, capsys, no_figures):
    dirs = [make_run(tmp_path, "attn_s0", op="attention", val=(3.0, 2.5, 2.0), max_iters=200, **ZEROS),
            make_run(tmp_path, "attn_s1", op="attention", seed=1, val=(3.0, 2.5, 2.0), max_iters=200,
                     **ZEROS),
            make_run(tmp_path, "mix_s0", val=(3.0, 1.9, 1.8), max_iters=200, **TWO_LAYERS),
            # still running
            make_run(tmp_path, "mix_s1", seed=1, val=(3.0, 1.9), max_iters=200, **TWO_LAYERS)]
    mix = group(corridor.compare([corridor.load_run(d) for d in dirs]), "mix")
    assert mix.n == 2 and mix.paired == pytest.approx([-0.2]) and mix.paired_seeds == [0]
    assert corridor.main(dirs + [f"--out={tmp_path / 'figs'}"]) == 0
    out = capsys.readouterr().out
    assert "final 1.9000 (iter 100); unfinished, max_iters is 200" in out
    assert "final 1.8000 (iter 200)\n" in out


def test_a_seed_changed_on_resume_is_read_from_the_start_records(tmp_path):
    """The start record of a resume names what it changed, with the value before: a run resumed from seed 0
    at seed 1 is paired under seed 0, which its label names with the seed it changed to; its story names
    each change, before → after (an older log: the after is config.json's)."""
    starts = [{"event": "start", "iter": 0, "changed": {}},
              {"event": "start", "iter": 50, "changed": {"seed": 0, "learning_rate": 0.01}}]
    lr = {"learning_rate": 0.02}
    dirs = [make_run(tmp_path, f"attn_s{seed}", op="attention", seed=seed, val=(3.0, v), **lr, **ZEROS)
            for seed, v in ((0, 2.0), (1, 2.2))]
    dirs += [make_run(tmp_path, "mix_s1", seed=1, val=(3.0, 2.0), **lr, **TWO_LAYERS),
             make_run(tmp_path, "mix_r", seed=1, val=(3.0, 1.9), head=starts, **lr, **TWO_LAYERS)]
    c = corridor.compare([corridor.load_run(d) for d in dirs])
    mix = group(c, "mix")
    assert mix.paired_seeds == [1, 0] and mix.paired == pytest.approx([-0.2, -0.1])
    (resumed,) = [s for s in c["runs"] if s.name == "mix_r"]
    assert resumed.label == "mix seed=0 [seeds 0 → 1]"
    assert resumed.story == ["resumed at iter 50: seed 0 → 1, learning_rate 0.01 → 0.02"]


@pytest.mark.slow
def test_a_run_whose_seed_changed_on_resume_is_paired_under_the_seed_before(tmp_path, monkeypatch, capsys,
                                                                           no_figures):
    """Real tiny runs. A mix run from seed 1337, resumed with --seed=7: its initial weights and first steps
    are seed 1337's, so it is paired with the attention run of seed 1337, not 7, and the report names every
    setting its resume changed under the comparison."""
    monkeypatch.chdir(tmp_path)
    for seed in (1337, 7):
        train.main(QUICK + ["--val_tokens=64", f"--out_dir=out/attn_s{seed}", "--op=attention",
                            "--max_iters=4",
                            f"--seed={seed}"])
    train.main(QUICK + ["--val_tokens=64", "--out_dir=out/mix_s7", "--max_iters=4", "--seed=7"])
    train.main(QUICK + ["--val_tokens=64", "--out_dir=out/mix_r"])  # 2 iterations, seed 1337
    train.main(QUICK + ["--val_tokens=64", "--out_dir=out/mix_r", "--init_from=resume", "--max_iters=4",
                        "--seed=7"])
    dirs = ["out/attn_s1337", "out/attn_s7", "out/mix_s7", "out/mix_r"]
    runs = [corridor.load_run(d) for d in dirs]
    mix = group(corridor.compare(runs), "mix")
    assert [m.name for m in mix.runs] == ["mix_s7", "mix_r"] and mix.paired_seeds == [7, 1337]
    attention = {r["config"]["seed"]: r["evals"][-1]["val_loss"] for r in runs[:2]}
    assert mix.paired[1] == runs[3]["evals"][-1]["val_loss"] - attention[1337]
    capsys.readouterr()
    assert corridor.main(dirs) == 0
    out = capsys.readouterr().out
    assert ("== mix_r  (mix seed=1337 [seeds 1337 → 7])\n"
            "   resumed at iter 2: max_iters 2 → 4, seed 1337 → 7\n") in out


# --- a run's true history, from real tiny runs (issue 62): what each resume changed, before → after, and the
# numbers as of the checkpoint, the same in the report, the CSV and the figures

FAST = QUICK + ["--val_tokens=64", "--learning_rate=3e-3", "--warmup_iters=1"]  # a quick evaluation


@pytest.fixture(scope="module")
def history(tmp_path_factory):
    """data/pydocs prepared; out/mix: a mix run of 2 iterations (seed 1337, learning_rate 0.003), and
    out/attn: an attention run trained to 4 iterations at learning_rate 0.001 throughout."""
    d = tmp_path_factory.mktemp("history")
    with pytest.MonkeyPatch.context() as mp:
        mp.chdir(d)
        train.main(FAST + ["--out_dir=out/mix"])
        train.main(FAST + ["--out_dir=out/attn", "--op=attention", "--max_iters=4", "--learning_rate=1e-3"])
    return d


@pytest.fixture
def resume(history, tmp_path, monkeypatch):
    """resume(*args): a copy of out/mix (tmp_path/mix_r) resumed with args; its directory."""
    monkeypatch.chdir(history)
    out = tmp_path / "mix_r"
    shutil.copytree("out/mix", out)

    def resume(*args):
        train.main(FAST + [f"--out_dir={out}", "--init_from=resume", *args])
        return str(out)
    return resume


def report_of(capsys, *argv):
    capsys.readouterr()
    assert corridor.main(list(argv)) == 0
    out = capsys.readouterr().out
    assert "(was " not in out  # never 'x (was x)': a change is before → after
    return out


def test_a_resume_is_named_when_each_setting_has_one_run(resume, capsys, no_figures):
    """A mix run resumed 2 → 4 with a new learning rate, against one attention run trained that way
    throughout: no seed group, and the mix run's block names the change."""
    mix = resume("--max_iters=4", "--learning_rate=1e-3")
    out = report_of(capsys, mix, "out/attn")
    assert ("== mix_r  (mix seed=1337)\n"
            "   resumed at iter 2: learning_rate 0.003 → 0.001, max_iters 2 → 4\n"
            "   tokens 128, iter 4;") in out
    assert "== no seed groups" in out


def test_a_run_alone_names_its_changed_seed(resume, capsys, no_figures):
    """One run resumed with --seed=7: its label gives the seed it is paired under (1337) and the seeds it
    drew batches from; its block names the change."""
    out = report_of(capsys, resume("--max_iters=4", "--seed=7"))
    assert out.startswith("== mix_r  (mix seed=1337 [seeds 1337 → 7])\n"
                          "   resumed at iter 2: max_iters 2 → 4, seed 1337 → 7\n")


@pytest.mark.slow
def test_a_seed_changed_and_changed_back_says_so(resume, capsys, no_figures):
    resume("--max_iters=4", "--seed=7")
    mix = resume("--max_iters=6", "--seed=1337")
    out = report_of(capsys, mix)
    assert out.startswith("== mix_r  (mix seed=1337 [seeds 1337 → 7 → 1337])\n"
                          "   resumed at iter 2: max_iters 2 → 4, seed 1337 → 7\n"
                          "   resumed at iter 4: max_iters 4 → 6, seed 7 → 1337\n")


def agree(capsys, run_dir, tmp_path, written):
    """The report's final numbers of run_dir, its CSV row and the val loss figure's line: one (iter, val)."""
    out = report_of(capsys, run_dir, f"--csv={tmp_path / 'runs.csv'}", f"--out={tmp_path / 'figs'}")
    final = re.search(r"final (\S+) \(iter (\d+)\)", out).groups()
    (row,) = csv.DictReader(open(tmp_path / "runs.csv"))
    (line,) = written["val_loss.png"].axes[0].lines
    gammas = written["gamma_mix_r.png"].axes[0].lines
    assert {len(g.get_xdata()) for g in gammas} == {len(line.get_xdata())}  # the same evals
    assert final == (f"{float(row['val_loss']):.4f}", row["iters"])
    assert f"{line.get_ydata()[-1]:.4f}" == final[0]
    return out, float(row["val_loss"]), int(row["iters"])


def test_a_resume_killed_before_its_checkpoint_is_named_and_left_out(resume, capsys, tmp_path, written,
                                                                     monkeypatch):
    """A resume stopped (as by kill -9) before it saved anything: config.json and ckpt.pt are the iter-2
    ones, and its records (to iter 4) are left out of the report, the CSV and the figures alike."""
    def killed(*args):
        raise KeyboardInterrupt
    monkeypatch.setattr(train.rundir, "save_checkpoint", killed)
    with pytest.raises(SystemExit):
        resume("--max_iters=4", "--learning_rate=1e-3")
    evals = {r["iter"]: r["val_loss"] for r in map(json.loads, open(tmp_path / "mix_r" / "log.jsonl"))
             if r["event"] == "eval"}
    assert list(evals) == [0, 2, 4]  # it trained and evaluated to iter 4
    out, val, iters = agree(capsys, str(tmp_path / "mix_r"), tmp_path, written)
    assert (val, iters) == (evals[2], 2)
    assert out.startswith("== mix_r  (mix seed=1337)\n"
                          "   resumed at iter 2: learning_rate 0.003 → 0.001, max_iters 2 → 4; "
                          "it saved nothing\n"
                          "   iters 3–4 left out: logged after the last checkpoint (iter 2), "
                          "so no checkpoint holds them\n"
                          "   tokens 64, iter 2;")


@pytest.mark.slow
def test_a_resume_whose_loss_worsened_is_reported_as_of_its_checkpoint(resume, capsys, tmp_path, written):
    """--always_save_checkpoint=False --weight_decay=1000: the val loss worsens, so ckpt.pt stays at iter 2
    while the log runs to 4; the numbers are the iter-2 ones, which config.json's settings made."""
    mix = resume("--max_iters=4", "--always_save_checkpoint=False", "--weight_decay=1000")
    evals = {r["iter"]: r["val_loss"] for r in map(json.loads, open(f"{mix}/log.jsonl"))
             if r["event"] == "eval"}
    assert evals[4] > evals[2] and json.load(open(f"{mix}/config.json"))["weight_decay"] == 0.1
    out, val, iters = agree(capsys, mix, tmp_path, written)
    assert (val, iters) == (evals[2], 2)
    assert ("   resumed at iter 2: always_save_checkpoint True → False, max_iters 2 → 4, weight_decay 0.1 → "
            "1000.0; it saved nothing\n   iters 3–4 left out:") in out


def test_a_csv_read_back_keeps_each_runs_length(tmp_path, capsys, no_figures):
    """Runs of 100 and 200 iterations, otherwise alike, form no seed group from their directories, nor
    from the table --csv wrote of them."""
    dirs = [make_run(tmp_path, "mix_s0", val=(3.0, 2.0), max_iters=100, **TWO_LAYERS),
            make_run(tmp_path, "mix_s1", seed=1, val=(3.0, 2.0, 1.5), max_iters=200, **TWO_LAYERS)]
    assert corridor.main(dirs + [f"--csv={tmp_path / 'runs.csv'}"]) == 0
    for runs in ([corridor.load_run(d) for d in dirs], corridor.load_csv(str(tmp_path / "runs.csv"))):
        assert [g.n for g in corridor.compare(runs)["groups"]] == [1, 1]


def test_same_config_and_seed_twice_is_an_error(tmp_path, capsys):
    (tmp_path / "old").mkdir()
    (tmp_path / "new").mkdir()
    a = make_run(tmp_path / "old", "mix_s0")
    b = make_run(tmp_path / "new", "mix_s0", device="cuda")  # device is not part of the experiment
    line = error_line(capsys, [a, b])
    assert line == (f"error: {a} and {b}: same config and seed 0 (one run twice, or a rerun); "
                    "pass only one of them")
    attn = make_run(tmp_path, "attn_s0", op="attention", **ZEROS)
    # two baselines for seed 0
    attn2 = make_run(tmp_path, "attn2_s0", op="attention", gamma_init=-0.5, **ZEROS)
    assert f"error: {attn} and {attn2}: same config and seed 0" in error_line(capsys, [attn, attn2])


def test_csv_one_row_per_run(tmp_path, capsys, no_figures):
    start = {"event": "start", "iter": 0, "commit": "0123abc"}
    dirs = [make_run(tmp_path, "mix_fixed_gamma_s10", seed=10, val=(3.0, 1.4137812345678913), head=[start],
                     # resumed later
                     tail=json.dumps({"event": "start", "iter": 100, "commit": "fffffff"}) + "\n"),
            make_run(tmp_path, "mix_fixed_gamma_s2", seed=2, val=(3.0, 2.5, 1.25), head=[start]),
            # older log: no start record
            make_run(tmp_path, "attention_s0", op="attention", val=(3.0, 2.0), **ZEROS),
            # not a git checkout
            make_run(tmp_path, "demo", seed=1337, val=(3.0,), head=[dict(start, commit=None)]),
            make_run(tmp_path, "mix_s1x", seed=1, val=(3.0, 2.0 / 3),  # not a _s<seed> suffix: kept
                     # trained past its last eval
                     tail=json.dumps({"event": "train", "iter": 150, "loss": 0.5}) + "\n")]
    path = tmp_path / "runs.csv"
    assert corridor.main(dirs + [f"--csv={path}", f"--out={tmp_path / 'figs'}"]) == 0
    lines = path.read_text().splitlines()
    assert lines[0] == ("setting,seed,op,n_layer,n_head,n_embd,op_lr_scale,gamma_init,learn_gamma,"
                        "learn_delta,gamma_min,iters,val_loss,val_bpb,final_gamma,commit")
    rows = list(csv.DictReader(lines))
    assert [(r["setting"], r["seed"], r["iters"], r["val_loss"], r["commit"]) for r in rows] == [
        ("attention", "0", "100", "2.0", "unknown"),
        ("demo", "1337", "0", "3.0", "unknown"),
        ("mix_fixed_gamma", "2", "200", "1.25", "0123abc"),
        ("mix_fixed_gamma", "10", "100", "1.4137812345678913", "0123abc"),
        ("mix_s1x", "1", "100", "0.6666666666666666", "unknown")]
    assert lines[3] == ("mix_fixed_gamma,2,mix,3,4,,,0.0,true,true,null,200,1.25,,"
                        "-0.5 -0.2 0.3 -1;-0.5 0 -1 -0.99;-0.1 -0.9 0.5 -1.5,0123abc")
    assert f"wrote {path}\n" in capsys.readouterr().out


def test_every_statistic_recomputes_from_the_csv(tmp_path, capsys, no_figures):
    """python corridor.py runs.csv prints the seed groups the run directories gave, and writes the same
    CSV."""
    near_zero = {"gamma": [[-0.5] * 4, [-1e-05, 0.25, -0.5, -0.5]], "delta": [[1.0] * 4] * 2}
    dirs = runs_of(tmp_path, [("attn_s0", "attention", 0, 2.0, {}), ("attn_s1", "attention", 1, 2.1, {}),
                              ("mix_s0", "mix", 0, 1.9, {"op_lr_scale": 10.0}),
                              ("mix_s1", "mix", 1, 2.05, {"op_lr_scale": 10.0})])
    dirs.append(make_run(tmp_path, "mix_s2", seed=2, val=(3.0, 2.0), **near_zero))
    first, again = tmp_path / "runs.csv", tmp_path / "again.csv"
    assert corridor.main(dirs + [f"--csv={first}"]) == 0
    from_dirs = capsys.readouterr().out
    assert corridor.main([str(first), f"--csv={again}"]) == 0
    from_csv = capsys.readouterr().out
    assert again.read_text() == first.read_text()
    groups = from_dirs[from_dirs.index("== seed groups"):from_dirs.index("\nwrote")]
    assert groups in from_csv and "== runs by" not in from_csv and "== mix_s0" not in from_csv
    # op_lr_scale belongs to the op: the learned runs pair with attention's (and -1e-05 stays inside)
    c = corridor.compare(corridor.load_csv(str(first)))
    assert group(c, "mix op_lr_scale=10.0").paired == pytest.approx([-0.1, -0.05])
    assert [g.deep_mean for g in c["groups"] if g.n == 1] == [0.75]


def test_a_csv_that_corridor_did_not_write_is_one_line(tmp_path, capsys):
    bad = tmp_path / "runs.csv"
    bad.write_text("setting,seed,iters,val_loss,commit\nmix,0,100,2.0,unknown\n")
    line = error_line(capsys, [str(bad)])
    assert "runs.csv: not a table that corridor.py --csv writes (no op, n_layer" in line
    assert "--csv=PATH" in line
    d = make_run(tmp_path, "mix_s0")
    assert corridor.main([d, f"--csv={bad}"]) == 0
    bad.write_text(bad.read_text().replace(",200,", ",two hundred,"))
    assert f"{bad}:2: not a row that corridor.py --csv writes (" in error_line(capsys, [str(bad)])


def written_table(tmp_path, specs=(("attn_s0", "attention", 0, 2.0, {}), ("mix_s0", "mix", 0, 1.9, {}))):
    """A CSV that corridor.py --csv wrote, of runs_of(specs)."""
    path = tmp_path / "runs.csv"
    dirs = runs_of(tmp_path, list(specs))
    assert corridor.main(dirs + [f"--csv={path}", f"--out={tmp_path / 'figs'}"]) == 0
    return path


def test_a_csv_saved_with_a_byte_order_mark_reads(tmp_path, no_figures):
    """A spreadsheet may save UTF-8 text with a byte-order mark first: the setting column is still there."""
    path = written_table(tmp_path)
    plain = corridor.load_csv(str(path))
    path.write_bytes(b"\xef\xbb\xbf" + path.read_bytes())
    names = [r["name"] for r in corridor.load_csv(str(path))]
    assert names == [r["name"] for r in plain] == ["attn_s0", "mix_s0"]


def test_a_csv_with_a_header_and_no_rows_says_so(tmp_path, capsys):
    """Not "lacks its columns": it has them all, and no row."""
    path = tmp_path / "runs.csv"
    path.write_text(",".join(corridor.CSV_COLUMNS) + "\n")
    line = error_line(capsys, [str(path)])
    assert f"{path}: " in line and "no rows" in line and "--csv=PATH" in line and "(no setting" not in line


def test_one_run_per_setting_says_why_there_are_no_statistics(tmp_path, capsys, no_figures):
    """Run directories or a table of one run per setting, or a table of one run: one line on why there are
    no statistics, not silence. Two seeds of a setting: the seed groups, and not that line."""
    (tmp_path / "dirs").mkdir()
    dirs = runs_of(tmp_path / "dirs", [("attn_s0", "attention", 0, 2.0, {}), ("mix_s0", "mix", 0, 1.9, {})])
    table = written_table(tmp_path)
    one_row = tmp_path / "one.csv"
    one_row.write_text("".join(table.read_text().splitlines(keepends=True)[:2]))
    for argv in (dirs, [str(table)], [str(one_row)]):
        capsys.readouterr()
        assert corridor.main(argv) == 0
        said = [line for line in capsys.readouterr().out.splitlines() if "one run" in line]
        assert len(said) == 1 and "two seeds" in said[0]
    (tmp_path / "two").mkdir()
    specs = [("attn_s0", "attention", 0, 2.0, {}), ("attn_s1", "attention", 1, 2.1, {})]
    assert corridor.main(runs_of(tmp_path / "two", specs)) == 0
    out = capsys.readouterr().out
    assert "== seed groups" in out and "one run" not in out


def test_csv_text_a_spreadsheet_would_evaluate_is_neutralised(tmp_path, capsys, no_figures):
    """Text from folder names and logs that starts like a formula (=, +, -, @) gets a ' first (CWE-1236), as
    does text that starts with ' (so exactly one comes off again); cells made from numbers stay as they are,
    negative ones too. load_csv reads back the names and commits the runs had."""
    negative = {"gamma": [[-0.5] * 4, [-0.0164] * 4], "delta": [[1.0] * 4] * 2, "gamma_init": -0.5}
    evil = {"event": "start", "iter": 0, "commit": "@SUM(1+1)"}
    dirs = [make_run(tmp_path, "=2+5_s0", head=[evil], **negative),
            make_run(tmp_path, "-cmd_s1", seed=1, **negative),
            make_run(tmp_path, "'quoted_s0", op="attention", **ZEROS),
            make_run(tmp_path, "mix_s2", seed=2, val=(3.0, -0.0164), **negative)]
    first, again = tmp_path / "runs.csv", tmp_path / "again.csv"
    assert corridor.main(dirs + [f"--csv={first}"]) == 0
    rows = {r["seed"] + r["op"]: r for r in csv.DictReader(first.read_text().splitlines())}
    assert [rows[k]["setting"] for k in ("0mix", "1mix", "0attention", "2mix")] == [
        "'=2+5", "'-cmd", "''quoted", "mix"]
    assert rows["0mix"]["commit"] == "'@SUM(1+1)" and rows["1mix"]["commit"] == "unknown"
    for r in rows.values():  # numbers as before: a float each, or γ lists of them
        assert r["gamma_init"] in ("-0.5", "0.0") and float(r["val_loss"]) in (2.5, -0.0164)
    assert rows["2mix"]["final_gamma"] == "-0.5 -0.5 -0.5 -0.5;-0.0164 -0.0164 -0.0164 -0.0164"
    assert rows["2mix"]["val_loss"] == "-0.0164"
    runs = corridor.load_csv(str(first))
    assert sorted(r["name"] for r in runs) == ["'quoted_s0", "-cmd_s1", "=2+5_s0", "mix_s2"]
    assert {r["starts"][0]["commit"] for r in runs} == {"@SUM(1+1)", "unknown"}
    assert corridor.main([str(first), f"--csv={again}"]) == 0
    assert again.read_text() == first.read_text()


def test_setting_is_the_directory_name_where_unambiguous(tmp_path):
    (tmp_path / "long").mkdir()
    long = {"max_iters": 3600, "lr_decay_iters": 3600, "gamma_init": -0.5}
    runs = [corridor.load_run(d) for d in runs_of(tmp_path, [
        ("attention_s0", "attention", 0, 2.0, {}),
        ("mix_fixed_gamma_s0", "mix", 0, 1.9, {"gamma_init": -0.5}),
        ("mix_fixed_gamma_s1", "mix", 1, 1.9, {"gamma_init": -0.5}), ("mix_s0", "mix", 0, 1.8, {}),
        ("mix_s1", "mix", 1, 1.8, {}), ("mixA_s0", "mix", 0, 1.7, {"n_embd": 64}),
        ("mixB_s1", "mix", 1, 1.7, {"n_embd": 64})])
        + runs_of(tmp_path / "long", [("mix_fixed_gamma_s0", "mix", 0, 1.5, long)])]
    settings = {g.label: g.setting for g in corridor.compare(runs)["groups"]}
    assert settings == {"attention": "attention", "mix": "mix",
                        "mix n_embd=64": "mix n_embd=64",  # its runs have two names (mixA, mixB): its label
                        # two groups named mix_fixed_gamma: each its label
                        "mix gamma_init=-0.5": "mix gamma_init=-0.5",
                        "mix gamma_init=-0.5 lr_decay_iters=3600 max_iters=3600":
                            "mix gamma_init=-0.5 lr_decay_iters=3600 max_iters=3600"}
    settings = {g.label: g.setting for g in corridor.compare(runs[:5])["groups"]}
    assert settings == {"attention": "attention", "mix": "mix", "mix gamma_init=-0.5": "mix_fixed_gamma"}


# --- the corridor curve

def curve_runs(tmp_path, attention=True):
    fixed = {"learn_gamma": False, "learn_delta": False}
    specs = [("fixed_s0", 0, 1.9, {"gamma_init": -0.5, **fixed}),
             ("fixed_s1", 1, 2.05, {"gamma_init": -0.5, **fixed}),
             ("plus_s0", 0, 2.2, {"gamma_init": 0.3, **fixed}),
             # δ ≠ 1: not on the curve
             ("halfdelta_s0", 0, 1.0, {"gamma_init": -0.9, "delta_init": 0.5, **fixed}),
             # learned from γ = −0.9: not a "learned mix" marker
             ("start_s0", 0, 1.8, {"gamma_init": -0.9}),
             ("alpha_s0", 0, 1.8, {"op": "mix_alpha"})]  # another op: not a marker either
    dirs = [make_run(tmp_path, name, seed=seed, val=(3.0, v), **{"op": "mix", **TWO_LAYERS, **extra})
            for name, seed, v, extra in specs]
    dirs += [make_run(tmp_path, "mix_s0", val=(3.0, 1.8), gamma=[[-0.5] * 4, [0.0] * 4],
                      delta=[[1.0] * 4] * 2),
             make_run(tmp_path, "mix_s1", seed=1, val=(3.0, 1.8), gamma=[[-0.3] * 4, [-0.2] * 4],
                      delta=[[1.0] * 4] * 2)]
    if attention:
        dirs += runs_of(tmp_path, [("attn_s0", "attention", 0, 2.0, {}),
                                   ("attn_s1", "attention", 1, 2.1, {})])
    return dirs


def test_corridor_curve_data(tmp_path):
    runs = [corridor.load_run(d) for d in curve_runs(tmp_path)]
    curve = corridor.curve_data(corridor.compare(runs)["groups"])
    # γ = −0.5: d = −0.1, −0.05; s = 0.0354, s/√2 = 0.025, t_{.975,1}
    nan, half = float("nan"), 12.706205 * 0.025
    (c,) = curve["curves"]
    assert c["label"] == "fixed γ, δ = 1, 1–2 seeds per point"
    gamma, mean, lo, hi = zip(*c["points"])
    assert gamma == (-0.5, 0.0, 0.3)
    assert mean == pytest.approx([-0.075, 0.0, 0.2])
    assert lo == pytest.approx([-0.075 - half, 0.0, nan], nan_ok=True, abs=1e-6)
    assert hi == pytest.approx([-0.075 + half, 0.0, nan], nan_ok=True, abs=1e-6)
    (learned,) = curve["learned"]  # the plain learned mix runs: mean final γ per layer over seeds
    assert learned["label"] == "mix (2 seeds)"
    assert learned["layer_gamma"] == pytest.approx([-0.4, -0.1])
    assert learned["layer_std"] == pytest.approx([0.1414214, 0.1414214], abs=1e-7)


def test_corridor_curve_one_per_baseline(tmp_path):
    """Runs of two widths are two experiments: each fixed γ is paired with attention of its own width and
    drawn on its own curve, named by what differs (never one curve mixing the widths)."""
    fixed = {"learn_gamma": False, "learn_delta": False, "gamma_init": -0.3}
    dirs = runs_of(tmp_path, [(f"{name}{w}_s{s}", op, s, v + s / 100 + w / 1000, {"n_embd": w, **extra})
                              for w in (64, 96) for s in (0, 1)
                              for name, op, v, extra in [("attn", "attention", 2.0, {}),
                                                         ("fixed", "mix", 1.9, fixed)]])
    curves = corridor.curve_data(corridor.compare([corridor.load_run(d) for d in dirs])["groups"])["curves"]
    assert [c["label"] for c in curves] == ["fixed γ, δ = 1 (n_embd=64), 2 seeds per point",
                                            "fixed γ, δ = 1 (n_embd=96), 2 seeds per point"]
    for c in curves:
        gamma, mean, _, _ = zip(*c["points"])
        assert gamma == (-0.3, 0.0) and mean == pytest.approx([-0.1, 0.0])


def test_corridor_curve_png(tmp_path, capsys):
    figs = tmp_path / "figs"
    assert corridor.main(curve_runs(tmp_path) + [f"--out={figs}"]) == 0
    path = figs / "corridor_curve.png"
    assert f"{path}" in capsys.readouterr().out
    assert path.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and path.stat().st_size > 10000
    # without attention runs there is no difference to draw: no curve, no figure
    (tmp_path / "noattn").mkdir()
    runs = [corridor.load_run(d) for d in curve_runs(tmp_path / "noattn", attention=False)]
    assert corridor.curve_data(corridor.compare(runs)["groups"])["curves"] == []


def band_at(ax, gamma):
    """The confidence band drawn at γ (fill_between's polygon read back): (its lowest y, its highest y)."""
    from matplotlib.collections import PolyCollection
    (band,) = [c for c in ax.collections if isinstance(c, PolyCollection)]
    ys = [y for path in band.get_paths() for x, y in path.vertices if x == gamma]
    return min(ys), max(ys)


def test_corridor_curve_band_is_the_ci_printed_for_its_setting(tmp_path, capsys, written):
    """The band at γ = −0.5 spans the 95% CI that the seed-groups table prints for that setting (fixed_s*),
    below the mean and above it; the point is its printed paired difference."""
    assert corridor.main(curve_runs(tmp_path) + [f"--out={tmp_path / 'figs'}"]) == 0
    (row,) = [line for line in capsys.readouterr().out.splitlines() if line.startswith("   fixed ")]
    mean, lo, hi = (float(x) for x in re.search(r"([-+]\d\.\d{4}) ± \S+ \[(\S+), (\S+)\]", row).groups())
    ax = written["corridor_curve.png"].axes[0]
    assert band_at(ax, -0.5) == pytest.approx((lo, hi), abs=5e-5) and lo < mean < hi
    (points,) = [c for c in ax.containers if -0.5 in c.lines[0].get_xdata()]
    assert points.lines[0].get_ydata()[0] == pytest.approx(mean, abs=5e-5)


def test_a_diverged_run_on_the_corridor_curve_leaves_the_finite_ones_drawn(tmp_path, capsys, written):
    """Learned runs whose log's final γ became NaN, or inf (each a setting of its own), and a fixed γ whose
    run diverged: corridor.py still draws and writes every figure, from the finite runs."""
    nan, inf = float("nan"), float("inf")
    diverged = [make_run(tmp_path, name, val=(3.0, nan), learning_rate=lr, gamma=[[g] * 4, [-0.5] * 4],
                         delta=[[1.0] * 4] * 2)
                for name, lr, g in (("hot_s0", 1.0, nan), ("hotter_s0", 2.0, inf))]
    diverged.append(make_run(tmp_path, "far_s0", val=(3.0, nan), gamma_init=-0.7, learn_gamma=False,
                             learn_delta=False, gamma=[[nan] * 4] * 2, delta=[[1.0] * 4] * 2))
    assert corridor.main(curve_runs(tmp_path) + diverged + [f"--out={tmp_path / 'figs'}"]) == 0
    assert "corridor_curve.png" in os.listdir(tmp_path / "figs")
    ax, low = written["corridor_curve.png"].axes
    assert ax.get_xlim() == pytest.approx((-1.0 - 0.08, 0.3 + 0.08))  # the corridor and the finite points
    (mix,) = [c for c in low.containers if c.get_label() == "learned mix (2 seeds)"]
    assert list(mix.lines[0].get_xdata()) == pytest.approx([-0.4, -0.1])  # the finite setting, as before


def test_figures_of_a_run_named_like_a_formula_are_written(tmp_path, capsys):
    """matplotlib would read $name_$ in the titles and the legend as a formula, and fail on it."""
    dirs = [make_run(tmp_path, "$name_$seed_s5", seed=5, **TWO_LAYERS)] + curve_runs(tmp_path)
    assert corridor.main(dirs + [f"--out={tmp_path / 'figs'}"]) == 0
    names = ["gamma_$name_$seed_s5.png", "delta_$name_$seed_s5.png", "gamma_final_$name_$seed_s5.png"]
    assert sorted(os.listdir(tmp_path / "figs")) == sorted(names + ["val_loss.png", "corridor_curve.png"])


def test_val_loss_figure_lines(tmp_path):
    dirs = [make_run(tmp_path, f"attn_s{s}", op="attention", seed=s, val=(3.0, 2.0 + s / 10, 1.0 + s / 10),
                     **ZEROS) for s in range(6)]
    dirs += [make_run(tmp_path, f"mix_s{s}", seed=s, val=(3.0, 2.0, 1.5), **TWO_LAYERS) for s in range(4)]
    runs = [corridor.load_run(d) for d in dirs]
    lines, step, title = corridor.val_loss_lines(corridor.compare(runs))
    # up to 10 runs: one line each
    assert step == "tokens" and title == "validation loss" and len(lines) == 10
    assert lines[0] == ("attn_s0 (attention seed=0)", {0: 3.0, 204800: 2.0, 409600: 1.0})
    # unfinished
    runs.append(corridor.load_run(make_run(tmp_path, "mix_s4", seed=4, val=(3.0, 1.0), **TWO_LAYERS)))
    lines, step, title = corridor.val_loss_lines(corridor.compare(runs))
    # 11 runs: one line per setting, at the evals all seeds have
    assert title == "validation loss, mean over seeds"
    assert lines == [("attn (6 seeds)", {0: 3.0, 204800: pytest.approx(2.25), 409600: pytest.approx(1.25)}),
                     ("mix (5 seeds)", {0: 3.0, 204800: 1.8})]  # the groups' order: by final val loss


# --- every way the CLI can fail prints one line "error: ..." naming what to fix, and exits 1

def edit(path, old, new):
    path.write_text(path.read_text().replace(old, new, 1))


EVAL = '"event": "eval"'
RUN = lambda d: [str(d)]  # noqa: E731  the good run directory alone
ERRORS = {  # name: (how to break the run directory d, the arguments, what the error line must contain)
    "--out= empty": (None, lambda d: [str(d), "--out="], "out is empty"),
    "--csv= empty": (None, lambda d: [str(d), "--csv="], "csv is empty"),
    "--out without =": (None, lambda d: [str(d), "--out"], "argument '--out' must look like --key=value"),
    "a file, not a run": (None, lambda d: [str(d / "config.json")], "config.json: not a run directory"),
    "config not JSON": (lambda d: (d / "config.json").write_text("{op: mix"), RUN,
                        "config.json: not the JSON train.py writes (Expecting"),
    "--out is a file": (None, lambda d: [str(d), f"--out={d / 'config.json'}"], "config.json: File exists"),
    "--csv is a folder": (None, lambda d: [str(d), f"--csv={d}", f"--out={d.parent / 'figs'}"],
                          "run_s0 is a folder, not a regular file"),
}


@pytest.mark.parametrize("case", ERRORS)
def test_cli_errors_are_one_line(tmp_path, capsys, case):
    breaks, args, message = ERRORS[case]
    make_run(tmp_path, "run_s0", gamma=[[0.0] * 4] * 2, delta=[[1.0] * 4] * 2)
    if breaks:
        breaks(tmp_path / "run_s0")
    assert message in error_line(capsys, args(tmp_path / "run_s0"))


def test_diverged_run_is_not_a_crash(tmp_path, capsys, no_figures):
    dirs = runs_of(tmp_path, [("attn_s0", "attention", 0, 2.0, {}), ("attn_s1", "attention", 1, 2.1, {}),
                              ("mix_s0", "mix", 0, float("nan"), {}), ("mix_s1", "mix", 1, 2.0, {})])
    assert corridor.main(dirs) == 0
    out = capsys.readouterr().out.splitlines()
    groups = out.index(next(line for line in out if line.startswith("== seed groups")))
    assert out[groups + 3].split() == ["mix", "2", "nan", "±", "nan", "n/a", "n/a", "n/a", "1/2", "n/a",
                                       "50%", "±", "0%"]
    runs = out.index(next(line for line in out if line.startswith("== runs by")))
    assert out[runs + 5].split()[0] == "mix_s0"  # the NaN run last


def test_a_diverged_run_is_reported_not_hidden(tmp_path, capsys):
    d = make_run(tmp_path, "diverged", val=(3.0, 2.0, float("nan")))
    s = corridor.summarize(corridor.load_run(d))
    assert (s.best_val, s.best_iter) == (2.0, 100) and math.isnan(s.final_val)
    assert corridor.main([d]) == 0
    assert "the val loss became nan at iter 200: the run diverged" in capsys.readouterr().err


# --- the one-run report, and what it leaves out

def test_one_layer_run_has_no_share_beyond_layer_1(tmp_path, capsys, no_figures):
    """A one-layer run has no heads beyond layer 1: that share is undefined (None), not 0 of 0 heads (NaN)."""
    d = make_run(tmp_path, "one_s0", gamma=[[-0.5, 0.5, -0.2, 0.0]], delta=[[1.0] * 4],
                 tail=json.dumps({"event": "train", "iter": 250, "tokens": 512000, "loss": 2.4}) + "\n")
    s = corridor.summarize(corridor.load_run(d))
    assert s.inside.shape == (1, 4) and (s.inside.sum(), s.inside.mean()) == (2, 0.5)
    assert s.frac_deep is None
    assert corridor.main([d]) == 0
    out = capsys.readouterr().out
    assert "   tokens 512,000, iter 250; val loss best 2.0000 (iter 100), final 2.5000 (iter 200)\n" in out
    assert "   γ ∈ (−1, 0): 2/4 heads (50%) overall, no layers beyond layer 1\n" in out
    # two layers: defined
    two = corridor.summarize(corridor.load_run(make_run(tmp_path, "two_s0", **TWO_LAYERS)))
    assert (two.inside[1:].sum(), two.frac_deep) == (2, 0.5)


def test_comparison_tables_only_when_there_is_something_to_compare(tmp_path, capsys, no_figures):
    """One run: its summary only. Several runs, one seed per setting: the table by val loss, no seed
    groups."""
    mix = make_run(tmp_path, "mix_s0")
    assert corridor.main([mix]) == 0
    out = capsys.readouterr().out
    assert "== mix_s0  (mix seed=0)" in out and "== runs by" not in out and "== seed groups" not in out
    attn = make_run(tmp_path, "attn_s0", op="attention", gamma=[[0.0] * 4] * 3, delta=[[1.0] * 4] * 3)
    assert corridor.main([mix, attn]) == 0
    out = capsys.readouterr().out
    assert "== runs by final val loss" in out and "== seed groups" not in out


@pytest.mark.parametrize("extra, unfinished", [
    ({"max_iters": 5000}, True),
    ({"max_iters": 5000, "eval_only": True}, False),  # an evaluation of a checkpoint: not a run still going
    ({"max_iters": 200}, False),  # the last allowed: final eval at max_iters
    ({"max_iters": 201}, True),
    ({}, False),  # an older config without max_iters
])
def test_unfinished_is_said_only_of_runs_short_of_max_iters(tmp_path, capsys, no_figures, extra, unfinished):
    d = make_run(tmp_path, "mix_s0", **extra)
    assert corridor.main([d]) == 0
    out = capsys.readouterr().out
    assert ("final 2.5000 (iter 200); unfinished, max_iters is " in out) == unfinished
    assert ("final 2.5000 (iter 200)\n" in out) != unfinished


def test_p_values_print_fixed_then_scientific():
    """p ≥ 1e-4 prints with 4 decimals, smaller ones in scientific notation (a 0.0000 would hide them)."""
    assert (corridor.fmt_p(1e-4) == "0.0001" and corridor.fmt_p(0.25) == "0.2500"
            and corridor.fmt_p(1.0) == "1.0000")
    assert corridor.fmt_p(9e-5) == "9.0e-05" and corridor.fmt_p(3.2e-9) == "3.2e-09"
    assert corridor.fmt_p(None) == corridor.fmt(None) == "n/a" and corridor.fmt(-0.25) == "-0.2500"


def test_experiment_ignores_only_what_cannot_change_the_result():
    """Seed, output folder, device, torch.compile and wandb settings do not make another experiment."""
    cfg = {"op": "mix", "seed": 3, "out_dir": "out/x", "device": "cuda", "compile": True, "wandb_log": True,
           "wandb_run_name": "r", "n_layer": 2, "max_iters": 100, "gamma_init": -0.5}
    assert json.loads(corridor.experiment(cfg)) == {"op": "mix", "n_layer": 2, "max_iters": 100,
                                                    "gamma_init": -0.5}
    # the attention baseline's: op and its controls go too
    baseline = corridor.experiment(cfg, corridor.NOT_EXPERIMENT + corridor.OP_SETTINGS)
    assert json.loads(baseline) == {"n_layer": 2, "max_iters": 100}


def test_which_runs_learn_gamma(tmp_path):
    """attention and laplacian have nothing to learn; mix learns γ unless learn_gamma=False (absent: the
    default)."""
    assert corridor.FIXED_OPS == ("attention", "laplacian")
    run = corridor.load_run(make_run(tmp_path, "mix_s0"))
    assert corridor.summarize(run).learns_gamma
    del run["config"]["learn_gamma"]  # a config written before the control existed
    assert corridor.summarize(run).learns_gamma
    run["config"]["learn_gamma"] = False
    assert not corridor.summarize(run).learns_gamma
    for op, expected in (("mix_alpha", True), ("mix_ab", True), ("attention", False), ("laplacian", False)):
        run["config"] = {"op": op}
        assert corridor.summarize(run).learns_gamma is expected, op


def test_val_loss_figure_by_iteration_when_a_log_has_no_tokens(tmp_path):
    """The x axis is tokens only when every eval record has them; otherwise iterations."""
    d = make_run(tmp_path, "old_s0", **TWO_LAYERS)
    # the first eval has none
    edit(tmp_path / "old_s0" / "log.jsonl", '"iter": 0, "tokens": 0, ', '"iter": 0, ')
    runs = [corridor.load_run(d), corridor.load_run(make_run(tmp_path, "new_s1", seed=1, **TWO_LAYERS))]
    lines, step, _ = corridor.val_loss_lines(corridor.compare(runs))
    assert step == "iter" and lines[1][1] == {0: 3.0, 100: 2.0, 200: 2.5}


def test_without_matplotlib_tables_and_csv_still_come(tmp_path, capsys, monkeypatch):
    monkeypatch.setitem(sys.modules, "matplotlib", None)  # import matplotlib raises ImportError
    monkeypatch.delitem(sys.modules, "support.figures", raising=False)  # so the next import of figures.py
    monkeypatch.delattr(support, "figures", raising=False)  # tries it (not the package's attribute)
    d, csv = make_run(tmp_path, "mix_s0"), tmp_path / "runs.csv"
    assert corridor.main([d, f"--csv={csv}"]) == 0
    captured = capsys.readouterr()
    assert captured.err == "warning: matplotlib is not installed (pip install matplotlib), so no figures\n"
    assert "== mix_s0" in captured.out and f"wrote {csv}\n" in captured.out and ".png" not in captured.out
    assert csv.read_text().splitlines()[1].startswith("mix,0,mix,3,4,,,0.0,true,true,null,200,2.5,,")


# --- python corridor.py RUN --text=...: every head's operator a·I + b·P on a text, from the run's checkpoint

CHARS = "abcdefghij ()=:\n"  # the tiny run's char vocabulary
TEXT = "if a(b): c = d"  # 14 tokens, all in CHARS


@pytest.fixture(scope="module")
def trained(tmp_path_factory):
    """A tiny run trained for 2 iterations: 2 layers × 2 heads, block_size 16, its heads started at γ = −0.4,
    δ = 1.5 (so that the a·I term, and b ≠ 1, show in every matrix)."""
    d = tmp_path_factory.mktemp("trained")
    with pytest.MonkeyPatch.context() as mp:
        mp.chdir(d)
        char_dataset("tiny", CHARS)
        train.main(QUICK + ["--n_layer=2", "--dataset=tiny", "--gamma_init=-0.4", "--delta_init=1.5",
                            "--val_tokens=64", "--out_dir=run"])  # few val tokens: a quick evaluation
    return str(d / "run")


@pytest.fixture
def drawn(monkeypatch):
    """The figures corridor.py draws, by file name, kept instead of written."""
    from support import figures
    kept = {}

    def keep(fig, path):
        kept[os.path.basename(path)] = fig
        return path
    monkeypatch.setattr(figures, "save", keep)
    yield kept
    figures.plt.close("all")


@pytest.fixture
def written(monkeypatch):
    """The figures corridor.py draws, by file name: kept, and written as it writes them."""
    from support import figures
    kept, save = {}, figures.save

    def keep(fig, path):
        kept[os.path.basename(path)] = fig
        return save(fig, path)
    monkeypatch.setattr(figures, "save", keep)
    return kept

def panels(fig):
    """The heads' panels (the colour bar has no image), row by row, and their matrices: (panels, T, T)."""
    axes = [ax for ax in fig.axes if ax.images]
    return axes, np.array([ax.images[0].get_array() for ax in axes], dtype=np.float64)


def float64_softmax(model, ids):
    """Every head's causal softmax P in float64, from the q and k of the model's own forward (caught at each
    layer's c_attn), the softmax written out here: (n_layer, nh, T, T)."""
    model = copy.deepcopy(model).double()
    caught = []
    for block in model.transformer.h:
        block.attn.c_attn.register_forward_hook(lambda module, inputs, out: caught.append(out[0]))  # (T, 3C)
    with torch.no_grad():
        model(torch.tensor([ids]))
    T, C, nh = len(ids), model.config.n_embd, model.config.n_head
    P = []
    for qkv in caught:
        q, k = (t.reshape(T, nh, C // nh).transpose(0, 1) for t in qkv.split(C, dim=1)[:2])  # (nh, T, hs)
        scores = q @ k.transpose(1, 2) / math.sqrt(C // nh)  # (nh, T, T)
        scores = scores.masked_fill(torch.ones(T, T).triu(1).bool(), -math.inf)  # j > i: the future
        e = (scores - scores.max(-1, keepdim=True).values).exp()
        P.append(e / e.sum(-1, keepdim=True))
    return torch.stack(P)


def expected_operators(run, text):
    """The trained run's a·I + b·P on text in float64, a = δγ and b = δ read from its checkpoint:
    (L, nh, T, T), and γ, δ (L, nh)."""
    ckpt = torch.load(os.path.join(run, "ckpt.pt"), weights_only=True)
    weights = ckpt["model"]
    gamma, delta = (torch.stack([weights[f"transformer.h.{i}.attn.op.{name}"] for i in range(2)]).double()
                    for name in ("gamma", "delta"))  # (L, nh)
    ids = [CHARS.index(c) for c in text]
    P = float64_softmax(GPT.from_checkpoint(ckpt), ids)
    I = torch.eye(len(ids), dtype=torch.float64)
    return (delta * gamma)[..., None, None] * I + delta[..., None, None] * P, gamma, delta


def test_text_draws_operators_png_as_a_user_runs_it(trained, tmp_path):
    p = subprocess.run([sys.executable, os.path.join(ROOT, "corridor.py"), trained, f"--text={TEXT}",
                        f"--out={tmp_path}"], capture_output=True, text=True)
    assert p.returncode == 0 and p.stderr == "", p.stderr  # no warning either
    png = tmp_path / "operators.png"
    assert f"wrote {png}" in p.stdout and png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_each_panel_is_its_heads_operator_in_float64(trained, tmp_path, drawn):
    assert corridor.main([trained, f"--text={TEXT}", f"--out={tmp_path}"]) == 0
    fig = drawn["operators.png"]
    axes, matrices = panels(fig)
    assert len(axes) == 2 * 2 and len(fig.axes) == 2 * 2 + 1  # one panel per head, and the colour bar
    expected, gamma, delta = expected_operators(trained, TEXT)
    assert np.abs(matrices - expected.reshape(4, 14, 14).numpy()).max() < 1e-6
    titles = [f"layer {layer + 1} head {head + 1}\nγ={gamma[layer, head]:+.2f} δ={delta[layer, head]:+.2f}"
              for layer, head in np.ndindex(2, 2)]
    assert [ax.get_title() for ax in axes] == titles
    assert [t.get_text() for t in axes[-1].get_xticklabels()] == list(TEXT.replace(" ", "·"))


def test_console_gives_the_diagonal_and_row_sum_of_those_matrices(trained, tmp_path, drawn, capsys):
    assert corridor.main([trained, f"--text={TEXT}", f"--out={tmp_path}"]) == 0
    out = capsys.readouterr().out.splitlines()
    start = out.index(f"== {trained} on 14 tokens: what each head does to a token itself, against its "
                      "context")
    assert out[start + 2].split() == ["layer", "head", "1", "head", "2"]
    expected = expected_operators(trained, TEXT)[0]
    for layer, line in enumerate(out[start + 3:start + 5]):
        assert line.split()[0] == str(layer + 1)
        cells = re.findall(r"(\S+)/(\S+) \((\d+)%\)", line)  # mean a + b·P_ii / row sum (share below 0)
        assert len(cells) == 2
        for head, (self_weight, row_sum, negative) in enumerate(cells):
            diagonal = expected[layer, head].diagonal()
            assert float(self_weight) == pytest.approx(diagonal.mean().item(), abs=6e-4)
            assert float(row_sum) == pytest.approx(expected[layer, head].sum(-1).mean().item(), abs=6e-4)
            assert int(negative) == round(100 * (diagonal < 0).double().mean().item())


def test_a_long_text_is_cut_to_its_start_and_a_line_says_so(trained, tmp_path, drawn, capsys, monkeypatch):
    assert corridor.main([trained, f"--text={TEXT * 3}", f"--out={tmp_path}"]) == 0  # 42 tokens
    assert "the text is 42 tokens: drawing its first 16 (block_size is 16," in capsys.readouterr().out
    assert panels(drawn["operators.png"])[1].shape == (4, 16, 16)
    monkeypatch.setattr(corridor, "MAX_TOKENS", 5)  # what fits in a panel
    assert corridor.main([trained, f"--text={TEXT}", f"--out={tmp_path}"]) == 0
    assert "the text is 14 tokens: drawing its first 5 (" in capsys.readouterr().out
    assert panels(drawn["operators.png"])[1].shape == (4, 5, 5)


@pytest.fixture
def odd_run(trained, tmp_path):
    """The trained run in a folder named like a formula (to matplotlib, $…$ is one), its alphabet a–i, n, the
    newline and what Python literals and formulas read: " $ _ ^ \\."""
    ckpt = torch.load(os.path.join(trained, "ckpt.pt"), weights_only=True)
    ckpt["meta"]["chars"] = 'abcdefghin"$_^\\\n'
    (tmp_path / "$name_$seed").mkdir()
    torch.save(ckpt, tmp_path / "$name_$seed" / "ckpt.pt")
    return str(tmp_path / "$name_$seed")


def test_a_text_is_drawn_as_typed_quotes_and_backslashes_too(odd_run, tmp_path, drawn):
    """--text="a\\nb" is those 6 characters, not a Python string holding a newline."""
    assert corridor.main([odd_run, '--text="a\\nb"', f"--out={tmp_path}"]) == 0
    axes = panels(drawn["operators.png"])[0]
    assert [t.get_text() for t in axes[-1].get_xticklabels()] == ['"', "a", "\\\\", "n", "b", '"']


def test_a_run_and_a_text_that_look_like_formulas_draw(odd_run, capsys):
    """matplotlib would read $name_$ in the title, or $_$ in the tokens, as a formula, and fail on it."""
    assert corridor.main([odd_run, "--text=$a_$b^\\c"]) == 0
    png = os.path.join(odd_run, "operators.png")
    assert f"wrote {png}" in capsys.readouterr().out and open(png, "rb").read(4) == b"\x89PNG"


# each op's (a, b) per head (2 heads), as README's table has them, for a fresh model started at γ = −0.3
CORRIDOR = ([-0.3, -0.3], [1, 1])
OP_COEFFICIENTS = {"attention": ([0, 0], [1, 1]), "laplacian": ([0, 1], [1, -1]),
                   "mix": CORRIDOR, "mix_alpha": CORRIDOR, "mix_ab": CORRIDOR}


@pytest.mark.parametrize("op", OP_COEFFICIENTS)
def test_every_op_shows_its_own_operator(trained, tmp_path, drawn, op):
    """attention P, laplacian I − P on its Laplacian head; titles: γ and δ for mix, the others' a and b."""
    assert set(OP_COEFFICIENTS) == set(OPS)
    ckpt = torch.load(os.path.join(trained, "ckpt.pt"), weights_only=True)
    controls = {"gamma_init": -0.3} if "gamma_init" in OPS[op].controls else {}
    model = GPT(GPTConfig(**{**ckpt["model_args"], "op": op, "controls": controls}))
    ckpt.update(model=model.state_dict(), model_args=asdict(model.config))
    (tmp_path / "run").mkdir()
    torch.save(ckpt, tmp_path / "run" / "ckpt.pt")
    assert corridor.main([str(tmp_path / "run"), f"--text={TEXT}"]) == 0
    axes, matrices = panels(drawn["operators.png"])
    a, b = (torch.tensor(c, dtype=torch.float64).view(1, 2, 1, 1) for c in OP_COEFFICIENTS[op])
    P = float64_softmax(model, [CHARS.index(c) for c in TEXT])  # (L, nh, T, T)
    expected = a * torch.eye(14, dtype=torch.float64) + b * P
    assert np.abs(matrices - expected.reshape(4, 14, 14).numpy()).max() < 1e-6
    sym = ("γ", "δ") if op == "mix" else ("a", "b")
    scalars = [(-0.3, 1.0)] * 2 if op == "mix" else list(zip(*OP_COEFFICIENTS[op]))
    assert [ax.get_title().split("\n")[1] for ax in axes] == [f"{sym[0]}={x:+.2f} {sym[1]}={y:+.2f}"
                                                              for x, y in scalars * 2]


BAD_TEXT = {  # what is wrong: (the arguments, given the trained run and a fresh folder; what the line says)
    "a run with no checkpoint": (lambda run, d: [str(d), f"--text={TEXT}"], "no checkpoint at"),
    "characters not in the vocabulary": (lambda run, d: [run, "--text=if é(b): ü", f"--out={d}"],
                                         "characters 'éü' are not in this dataset's vocabulary"),
    "an empty text": (lambda run, d: [run, "--text=", f"--out={d}"], "the text is empty"),
    "an --out that cannot be written": (lambda run, d: [run, f"--text={TEXT}", f"--out={d / 'a_file'}"],
                                        "a_file: File exists"),
    "two runs": (lambda run, d: [run, run, f"--text={TEXT}", f"--out={d}"], "draws the heads of one run"),
    "an --out linking to nothing": (lambda run, d: [run, f"--text={TEXT}", f"--out={d / 'a_link'}"],
                                    "a_link links to missing, a folder that does not exist: make it"),
}


@pytest.mark.parametrize("case", BAD_TEXT)
def test_bad_text_input_is_one_line_and_writes_nothing(trained, tmp_path, capsys, case):
    args, message = BAD_TEXT[case]
    (tmp_path / "a_file").write_text("kept")
    os.symlink("missing", tmp_path / "a_link")
    assert corridor.main(args(trained, tmp_path)) == 1
    out, err = capsys.readouterr()
    assert out == "" and err.startswith("error: ") and err.count("\n") == 1 and message in err
    assert sorted(os.listdir(tmp_path)) == ["a_file", "a_link"]
    assert (tmp_path / "a_file").read_text() == "kept"
    assert not os.path.exists(os.path.join(trained, "operators.png"))


def test_without_text_no_checkpoint_is_loaded(trained, tmp_path, monkeypatch, capsys, no_figures):
    monkeypatch.setattr(corridor, "load_checkpoint", lambda path: pytest.fail(f"loaded {path}"))
    assert corridor.main([trained]) == 0
    assert "== run  (mix gamma_init=-0.4 delta_init=1.5" in capsys.readouterr().out
