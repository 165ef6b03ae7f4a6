""" corridor.py: where the heads' γ ended up in nanoCorridor runs, and how the runs compare with
attention.

    python corridor.py out/mix_s0 [out/attention_s0 ...] [--out=DIR] [--csv=PATH]
    python corridor.py docs/corridor_runs.csv    # every statistic again, from the table --csv wrote
    python corridor.py out/demo --text="for i in range(10):"    # every head's operator on a text

Each head applies δ(γI + P) to its values; the paper claims most heads beyond layer 1 learn γ ∈ (−1,
0), the "convex corridor". For each run: its history (what each resume changed), its losses and its
final γ and δ, all as of its checkpoint (records logged after it are named and left out). Then, for
runs that differ only in seed, paired statistics against attention (variants chosen on seeds below
100 are judged again on seeds 100+). Writes PNG figures (with fixed-γ runs, corridor_curve.png: val
loss against γ, δ = 1), with --csv one row per run, with --text every head's operator on that text,
from the run's checkpoint (operators.png)."""

import csv
import io
import json
import math
import os
import re
import sys
from types import SimpleNamespace

import numpy as np
import torch
from scipy import stats

from support.configurator import ConfigError, configure, nonempty, read_regular, require_torch
from support.dataloader import get_tokenizer
from operators import OPS, all_controls, operator_matrix
from support.rundir import atomic_write, load_checkpoint, load_run

# ops whose (γ, δ) are not learned: at their defaults they have no parameters
FIXED_OPS = tuple(name for name, Op in OPS.items() if not list(Op(1, **Op.controls).parameters()))
# train.py's op controls and their defaults (a label lists the changed ones)
CONTROLS = all_controls()
# config keys that do not change the experiment: runs differing only in these are repeats (seeds)
NOT_EXPERIMENT = ("seed", "out_dir", "device", "compile")
BASELINE_OP = "attention"  # every setting is compared with the runs of this op (γ = 0, δ = 1)
# A variant chosen on some seeds looks better on them than it is (the winner's curse: their noise
# helped it win), so it is judged again on seeds in CONFIRMATION, on which nothing was chosen:
# groups of their own.
CONFIRMATION = range(100, 200)
# what belongs to the op: attention has no scalars, so its runs are the baseline whatever these say
OP_SETTINGS = ("op", "op_lr_scale", *CONTROLS)
# the corridor curve: runs with these settings have γ fixed at their gamma_init and δ at 1 ...
FIXED_GAMMA = {"op": "mix", "learn_gamma": False, "learn_delta": False, "delta_init": 1.0}
# ... and it marks where the runs of this op, every control at its default, end up
LEARNED_OP = "mix"


# -----------------------------------------------------------------------------
# One run: where its heads' γ ended, as of its checkpoint, and the history that got it there


def summarize(run):
    """The numbers of one run (support/rundir.load_run's, with all it holds) at its last eval,
    with the settings that made them: its label (op, changed controls, the seed it is paired
    under) and its story, a line per resume."""
    cfg, starts, last = run["config"], run["starts"], run["evals"][-1]
    gamma = np.array(last["gamma"], dtype=float)  # (layer, head)
    fixed = cfg["op"] in FIXED_OPS
    # the corridor, of heads whose γ could move: open, −1 (Laplacian) and 0 (attention) are its
    # endpoints
    inside = None if fixed else (gamma > -1.0) & (gamma < 0.0)  # (layer, head)
    best = min(
        run["evals"], key=lambda r: r["val_loss"] if math.isfinite(r["val_loss"]) else math.inf
    )
    # paired by the seed its initial weights and first steps came from: the one before any resume
    # changed it
    seeds = [start["changes"]["seed"] for start in starts
             if "seed" in start["changes"] and start["iter"] < run["ckpt_iter"]]
    seed = seeds[0][0] if seeds else cfg.get("seed")
    label = " ".join([cfg["op"], *(f"{k}={v}" for k, v in controls(cfg).items()), f"seed={seed}"])
    if seeds:  # the seeds its saved steps drew their batches from, in turn
        label += f" [seeds {' → '.join(str(x) for x in [seed] + [now for _, now in seeds])}]"
    story = []  # a line per resume (a start after iter 0): what it changed, and whether it saved
    for start in [start for start in starts if start["iter"]]:
        changes = ", ".join(f"{k} {was!r} → {now!r}" for k, (was, now) in start["changes"].items())
        saved = "; it saved nothing" if start["iter"] == run["ckpt_iter"] else ""
        story.append(f"resumed at iter {start['iter']}: {changes or 'no setting changed'}{saved}")
    if run["logged_to"] > run["ckpt_iter"]:
        story.append(
            f"iters {run['ckpt_iter'] + 1}–{run['logged_to']} left out: logged after the last "
            f"checkpoint (iter {run['ckpt_iter']}), so no checkpoint holds them"
        )
    max_iters = cfg.get("max_iters", last["iter"])
    unfinished = last["iter"] < max_iters and not cfg.get("eval_only")
    # its name, path, records and checkpoint's iteration, and its settings under the seed it is
    # paired by
    return SimpleNamespace(
        **{**run, "config": {**cfg, "seed": seed}},
        label=label,
        story=story,
        seed=seed,
        baseline=experiment(cfg, NOT_EXPERIMENT + OP_SETTINGS),
        op=cfg["op"],
        learns_gamma=not fixed and cfg.get("learn_gamma", True),
        unfinished=f"; unfinished, max_iters is {max_iters}" if unfinished else "",
        commit=starts[0].get("commit") if starts else None,
        tokens=max((r["tokens"] for r in run["records"] if "tokens" in r), default=None),
        best_val=best["val_loss"],
        best_iter=best["iter"],
        final_val=last["val_loss"],
        final_iter=last["iter"],
        layer_gamma=gamma.mean(axis=1).tolist(),
        layer_delta=np.mean(last["delta"], axis=1).tolist(),
        inside=inside,  # (layer, head): whether each head's γ ended in the corridor
        # the share beyond layer 1, where there is one
        frac_deep=None if fixed or len(gamma) < 2 else float(inside[1:].mean()),
    )


def controls(config):
    return {k: config[k] for k, default in CONTROLS.items() if k in config and config[k] != default}


# -----------------------------------------------------------------------------
# Comparing runs: seed groups, their attention baselines and the paired statistics
# Runs of one seed share initial weights and data order, so each run is paired with the attention run
# of its seed: d_i = val_i − val_attention_i. The paired t-test asks whether their mean could be 0: with n
# differences, mean m and sample std s, t = m / (s/√n) follows Student's t with n − 1 degrees of
# freedom.


def paired_stats(diffs, level=0.95):
    """Mean paired difference, its t confidence interval, the paired t-test p and the exact sign
    test; None where the data cannot define it: t needs n ≥ 2 and a non-zero spread (else t = m/0, a
    zero-width CI)."""
    d = np.array(diffs, dtype=float)
    out = SimpleNamespace(
        n_pairs=len(d),
        paired_mean=None,
        paired_std=None,
        ci=None,
        t=None,
        p_t=None,
        k_lower=int((d < 0).sum()),
        p_sign=None,
    )
    # a diverged run (val loss NaN) has no meaningful difference
    if len(d) == 0 or not np.isfinite(d).all():
        return out
    # the sign test counts runs below and above attention, and ignores ties
    untied = int((d != 0).sum())
    if untied:
        # two-sided, a fair coin
        out.p_sign = float(stats.binomtest(out.k_lower, untied).pvalue)
    out.paired_mean, out.paired_std = float(d.mean()), sample_std(d)
    # differences of float val losses carry rounding noise of ~1e-16: treat a spread that small as
    # zero
    if out.paired_std is None or out.paired_std <= 1e-12 * max(1.0, float(np.abs(d).max())):
        return out
    test = stats.ttest_1samp(d, 0.0)  # two-sided
    # (low, high)
    out.ci = tuple(float(x) for x in test.confidence_interval(confidence_level=level))
    out.t, out.p_t = float(test.statistic), float(test.pvalue)
    return out


def seeds(n):
    return f"{n} seed{'s' if n != 1 else ''}"


def sample_std(x):
    return float(np.std(x, ddof=1)) if len(x) > 1 else None  # a sample std needs at least two runs


def setting_name(name):
    """Run directories are named <config file name>_s<seed>: mix_fixed_gamma_s3 → mix_fixed_gamma.
    """
    return re.sub(r"_s\d+$", "", name)


def experiment(config, ignore=NOT_EXPERIMENT):
    """The settings a run's result depends on, as a JSON text to group by. What its attention
    baseline must share with it: experiment(config, NOT_EXPERIMENT + OP_SETTINGS), all but the op
    and its controls (so 3600-iteration runs are compared with 3600-iteration attention runs)."""
    return json.dumps(
        {k: v for k, v in config.items() if k not in ignore and not k.startswith("wandb")},
        sort_keys=True,
    )


def differing_keys(configs):
    """The keys whose values differ among these configs (JSON texts), sorted: what tells them apart.
    """
    configs = [json.loads(c) for c in configs]
    return sorted(
        {k for c in configs for k in c if len({json.dumps(d.get(k)) for d in configs}) > 1}
    )


def compare(runs):
    """Every run's summary (runs: as given; rows: by final val loss), and the seed groups (runs
    differing only in seed) with their paired statistics against the attention run of the same
    baseline and seed, ended at the same iteration."""
    sums = [summarize(r) for r in runs]
    # experiment -> its runs; baseline -> its attention runs' final val losses
    groups, attention, seen = {}, {}, {}
    for s in sums:
        exp = experiment(s.config)
        groups.setdefault((exp, s.seed in CONFIRMATION), []).append(s)
        # one config and seed twice would count twice; two attention baselines for one seed,
        # likewise (only exp has an 'op'). seen[baseline, seed] is the attention run of that seed.
        key = (s.baseline if s.op == BASELINE_OP else exp, s.seed)
        if key in seen:
            raise ValueError(
                f"{seen[key].path} and {s.path}: same config and seed {s.seed} "
                "(one run twice, or a rerun); pass only one of them"
            )
        seen[key] = s
        if s.op == BASELINE_OP:
            attention.setdefault(s.baseline, []).append(s.final_val)
    attention_mean = {key: float(np.mean(vals)) for key, vals in attention.items()}
    # diverged (NaN) last
    rows = sorted(sums, key=lambda s: (math.isnan(s.final_val), s.final_val))
    for s in rows:
        base = attention_mean.get(s.baseline)
        s.vs_attention = None if base is None else s.final_val - base
    # label each group by its op plus the config keys that tell the groups apart (controls only when
    # changed)
    varying = differing_keys([key for key, _ in groups])
    out = []
    for (key, confirmation), members in groups.items():
        # members differ only in seed: they share first's baseline
        cfg, first = json.loads(key), members[0]
        val = np.array([m.final_val for m in members])
        deep = [m.frac_deep for m in members if m.frac_deep is not None]
        is_baseline = cfg["op"] == BASELINE_OP
        # each member with the attention run of its seed, where one ended at the same iteration
        base = [seen.get((first.baseline, m.seed)) for m in members]
        pairs = [
            (m, a)
            for m, a in zip(members, base)
            if a and a.final_iter == m.final_iter and not is_baseline
        ]
        paired = [m.final_val - a.final_val for m, a in pairs]
        label = [cfg["op"]] + [
            f"{k}={cfg[k]}"
            for k in varying
            if k in cfg and k != "op" and not (k in CONTROLS and cfg[k] == CONTROLS[k])
        ]
        layer_gamma = np.array([m.layer_gamma for m in members])  # (seed, layer)
        out.append(
            SimpleNamespace(
                label=" ".join(label),
                config=cfg,
                is_baseline=is_baseline,
                experiment=key,
                confirmation=confirmation,
                baseline_key=first.baseline,
                learns_gamma=first.learns_gamma,
                runs=members,
                n=len(members),
                val_mean=float(val.mean()),
                val_std=sample_std(val),
                deep_mean=float(np.mean(deep)) if deep else None,
                deep_std=sample_std(deep),
                layer_gamma=layer_gamma.mean(axis=0).tolist(),
                layer_gamma_std=[sample_std(g) for g in layer_gamma.T],
                paired=paired,
                paired_seeds=[m.seed for m, _ in pairs],
                **vars(paired_stats(paired)),
            )
        )
    # the name to print: the runs' directory name without _s<seed>, if theirs alone; else the label
    names = [({setting_name(m.name) for m in g.runs}, g.confirmation) for g in out]
    for g, (own, confirmation) in zip(out, names):
        unique = len(own) == 1 and sum(own <= other for other, c in names if c == confirmation) == 1
        name = next(iter(own)) if unique else g.label
        g.setting = name + (" (confirmation)" if confirmation else "")
    # settings by val loss, in blocks that share an attention baseline (blocks by that baseline's
    # val loss, those without one last)
    return {
        "runs": sums,
        "rows": rows,
        "groups": sorted(
            out,
            key=lambda g: (
                attention_mean.get(g.baseline_key, math.inf),
                g.baseline_key,
                math.isnan(g.val_mean),
                g.val_mean,
            ),
        ),
    }


def confirmations(groups):
    """Each variant rerun on CONFIRMATION seeds: its paired statistics on the seeds it was chosen on
    (selection), on the new ones (confirmation), and on both (pooled)."""
    chosen = {g.experiment: g for g in groups if not g.confirmation}
    return [
        {
            "setting": chosen[g.experiment].setting,
            "selection": chosen[g.experiment],
            "confirmation": g,
            "pooled": paired_stats(chosen[g.experiment].paired + g.paired),
        }
        for g in groups
        if g.confirmation and not g.is_baseline and g.experiment in chosen
    ]


# -----------------------------------------------------------------------------
# Figures: what each shows is computed here, and support/figures.py draws it

X_LABEL = {"tokens": "tokens", "iter": "iteration"}


def x_axis(sums):
    """The figures' x axis: tokens when every eval record has them (older logs do not), else
    iterations."""
    return "tokens" if all("tokens" in r for s in sums for r in s.evals) else "iter"


def val_loss_lines(c, max_lines=10):
    """val_loss.png's lines (label, {x: val loss}), x key and title: one per run, or beyond
    max_lines runs, one per setting, the mean over its seeds at the evals they all have."""
    step = x_axis(c["runs"])
    curve = {s.path: {r[step]: r["val_loss"] for r in s.evals} for s in c["runs"]}
    if len(c["runs"]) <= max_lines:
        return (
            [(f"{s.name} ({s.label})", curve[s.path]) for s in c["runs"]],
            step,
            "validation loss",
        )
    lines = []
    for g in c["groups"]:
        curves = [curve[m.path] for m in g.runs]
        common = sorted(set.intersection(*map(set, curves)))
        lines.append(
            (
                f"{g.setting} ({seeds(g.n)})",
                {x: float(np.mean([c[x] for c in curves])) for x in common},
            )
        )
    return lines, step, "validation loss, mean over seeds"


def curve_data(groups):
    """What corridor_curve.png shows. curves: per attention baseline, its points (γ, mean paired
    difference, 95% CI low, high) of the fixed-γ settings (NaN where undefined) and attention's
    (0, 0, 0, 0), by γ. learned:
    per LEARNED_OP setting with default controls, its mean final γ per layer (± seed std). Labels
    give the seeds."""
    by_baseline = {}
    for g in groups:  # the fixed-γ settings with attention runs to pair them with
        if g.paired and all(
            g.config.get(k, CONTROLS.get(k)) == v for k, v in FIXED_GAMMA.items()
        ):
            by_baseline.setdefault(g.baseline_key, []).append(g)
    # name each curve by what its baseline config does differently from the others' (nothing, for
    # one curve)
    varying = differing_keys(by_baseline)
    curves = []
    for key, gs in by_baseline.items():
        points = [(0.0, 0.0, 0.0, 0.0)]  # attention: γ = 0 and difference 0 by definition
        points += [
            (
                float(g.config.get("gamma_init", CONTROLS["gamma_init"])),
                math.nan if g.paired_mean is None else g.paired_mean,
                *(g.ci or (math.nan, math.nan)),
            )
            for g in gs
        ]
        differs = " ".join(f"{k}={v}" for k, v in json.loads(key).items() if k in varying)
        label = f"fixed γ, δ = 1 ({differs})" if differs else "fixed γ, δ = 1"
        counts = [g.n_pairs for g in gs]  # seeds per fixed-γ point
        per_point = f"{min(counts)}–{max(counts)}" if min(counts) != max(counts) else counts[0]
        curves.append(
            {
                "label": f"{label}, {seeds(per_point)} per point",
                "points": sorted(points, key=lambda p: p[0]),
            }
        )
    learned = [
        {
            "label": f"{g.setting} ({seeds(g.n)})",
            "layer_gamma": g.layer_gamma,
            "layer_std": [math.nan if s is None else s for s in g.layer_gamma_std],
        }
        for g in groups
        if g.config["op"] == LEARNED_OP and g.learns_gamma and not controls(g.config)
    ]
    return {"curves": curves, "learned": learned}


def plot(c, out_dir):
    """The figures of compare's c into out_dir; their paths."""
    # and with it matplotlib: optional, as the tables and the CSV do not need it
    from support import figures

    os.makedirs(out_dir, exist_ok=True)
    drawn = {}  # file name -> figure
    with figures.plt.rc_context(figures.STYLE):
        # the (γ, δ) figures: of the first learned run
        for s in [s for s in c["runs"] if s.learns_gamma][:1]:
            evals, step, title = s.evals, x_axis([s]), f"{s.name}: {s.label}"
            for key, sym in (("gamma", "γ"), ("delta", "δ")):
                vals = np.array([r[key] for r in evals], dtype=float)  # (time, layer, head)
                drawn[f"{key}_{s.name}.png"] = figures.head_scalars(
                    [r[step] for r in evals], vals, sym, X_LABEL[step], title
                )
            drawn[f"gamma_final_{s.name}.png"] = figures.final_gamma(
                np.array(evals[-1]["gamma"], dtype=float),
                f"final γ (iter {s.final_iter})\n{title}",
            )
        lines, step, title = val_loss_lines(c)
        drawn["val_loss.png"] = figures.val_loss(lines, X_LABEL[step], title)
        curve = curve_data(c["groups"])
        if curve["curves"]:  # fixed-γ runs with attention runs to pair them with
            drawn["corridor_curve.png"] = figures.corridor_curve(curve)
        return [figures.save(fig, os.path.join(out_dir, name)) for name, fig in drawn.items()]


# -----------------------------------------------------------------------------
# The console report

LEGEND = """\
   final val: mean ± sample std over seeds.  paired diff: mean ± std of (run − attention run
   of the same seed), over the seeds both have; 95% CI: its t interval.  p (t-test): two-sided
   paired t-test.  lower: seeds below attention; p (sign): two-sided exact sign test.
   corridor>L1: share of heads beyond layer 1 with final γ ∈ (−1, 0).  n/a: undefined (one seed,
   zero spread, no attention run or a NaN loss)."""


def fmt(v, spec="+.4f"):
    return "n/a" if v is None else format(v, spec)


def fmt_p(p):
    return "n/a" if p is None else f"{p:.4f}" if p >= 1e-4 else f"{p:.1e}"


def print_table(header, rows, left=1):
    """Columns padded to their widest cell: the first `left` left-aligned (names), the rest
    right-aligned."""
    widths = [max(map(len, column)) for column in zip(header, *rows)]
    for r in [header] + rows:
        cells = [c.ljust(w) if i < left else c.rjust(w) for i, (c, w) in enumerate(zip(r, widths))]
        print("   " + " ".join(cells).rstrip())


def group_cells(g):  # one row of the seed-group table (see the legend report prints under it)
    val = f"{g.val_mean:.4f} ± {fmt(g.val_std, '.4f')}"
    deep = (
        "fixed"
        if not g.learns_gamma
        else (
            "n/a"
            if g.deep_mean is None
            else f"{g.deep_mean:.0%} ± {fmt(g.deep_std, '.0%')}"
        )
    )
    cells = [g.setting, str(g.n), val]
    if g.is_baseline:
        return cells + ["baseline", "", "", "", "", deep]
    ci = "n/a" if g.ci is None else f"[{g.ci[0]:+.4f}, {g.ci[1]:+.4f}]"
    diff = (
        "n/a"
        if g.paired_mean is None
        else f"{g.paired_mean:+.4f} ± {fmt(g.paired_std, '.4f')}"
    )
    # unpaired: the rest is None too
    lower = f"{g.k_lower}/{g.n_pairs}" if g.paired else "n/a"
    return cells + [
        diff,
        ci,
        fmt_p(g.p_t),
        lower,
        fmt_p(g.p_sign),
        deep,
    ]


def paired_cell(s):
    if s.paired_mean is None:
        return f"{s.n_pairs}: n/a"
    ci = "n/a" if s.ci is None else f"[{s.ci[0]:+.4f}, {s.ci[1]:+.4f}]"
    return f"{s.n_pairs}: {s.paired_mean:+.4f} {ci} p {fmt_p(s.p_t)}, {s.k_lower}/{s.n_pairs}"


def report(c, each=True):
    """Print each run's story and numbers and the table of runs (if each), then the tables of the
    seed groups."""
    for s in c["runs"] if each else []:
        print(f"== {s.name}  ({s.label})")
        for line in s.story:
            print(f"   {line}")
        print(
            f"   tokens {fmt(s.tokens, ',')}, iter {s.ckpt_iter}; "
            f"val loss best {s.best_val:.4f} (iter {s.best_iter}), "
            f"final {s.final_val:.4f} (iter {s.final_iter}){s.unfinished}"
        )
        if s.inside is None:
            print(f"   {s.op}: γ and δ fixed")
        else:
            deep = "no layers beyond layer 1"
            if s.frac_deep is not None:
                deep = (f"{s.inside[1:].sum()}/{s.inside[1:].size} ({s.frac_deep:.0%}) "
                        "beyond layer 1")
            print(f"   γ ∈ (−1, 0): {s.inside.sum()}/{s.inside.size} heads "
                  f"({s.inside.mean():.0%}) overall, {deep}")
        print("   layer   mean γ   mean δ")
        for layer, (g, d) in enumerate(zip(s.layer_gamma, s.layer_delta), 1):
            print(f"   {layer:5d}  {g:+7.3f}  {d:+7.3f}")
    if len(c["runs"]) < 2 and each:
        return
    if each:
        print(
            "\n== runs by final val loss, in nats per token (vs attn: minus the mean final val loss of the"
            " attention runs of the same config)"
        )
        cells = [
            [
                s.name,
                s.label,
                f"{s.final_val:.4f}",
                f"{s.best_val:.4f}",
                fmt(s.vs_attention),
                "fixed" if not s.learns_gamma else fmt(s.frac_deep, ".0%"),
            ]
            for s in c["rows"]
        ]
        print_table(
            ["run", "label", "final val", "best val", "vs attn", "corridor>L1"], cells, left=2
        )
    groups = c["groups"]
    if not any(g.n > 1 for g in groups):
        print(
            "\n== no seed groups: every setting has one run (seeds "
            f"{CONFIRMATION.start}+ apart); statistics need two seeds or more of one setting"
        )
        return
    print(
        "\n== seed groups: runs that differ only in seed, against the attention runs of the same config"
        " (val losses in nats per token)"
    )
    print_table(
        [
            "setting",
            "n",
            "final val",
            "paired diff",
            "95% CI",
            "p (t-test)",
            "lower",
            "p (sign)",
            "corridor>L1",
        ],
        [group_cells(g) for g in groups],
    )
    print(LEGEND)
    cells = [
        [r["setting"]] + [paired_cell(r[k]) for k in ("selection", "confirmation", "pooled")]
        for r in confirmations(groups)
    ]
    if cells:
        print(
            "\n== chosen on some seeds, judged on others: paired diff against attention on the seeds a "
            "variant was chosen\n   on (selection), on seeds no choice was made on (confirmation, "
            f"{CONFIRMATION.start}+), and on both (pooled)"
        )
        print_table(["setting", "selection", "confirmation", "pooled"], cells, left=4)
        print(
            "   each cell: seeds, mean paired diff [95% CI], paired t-test p, seeds below attention"
        )
    cells = [
        [
            g.setting,
            str(g.n),
            "  ".join(
                f"{m:+.3f} ± {fmt(sd, '.3f')}"
                for m, sd in zip(g.layer_gamma, g.layer_gamma_std)
            ),
        ]
        for g in groups
        if g.learns_gamma
    ]
    if cells:
        print("\n== where learned γ ends: mean final γ per layer, ± its std over seeds")
        print_table(["setting", "n", "layer 1, 2, ..."], cells, left=3)


# -----------------------------------------------------------------------------
# The runs as a table anyone can recompute the statistics from

# the config keys a row keeps: those that tell the project's runs apart (with seed and final
# iteration)
CSV_CONFIG = (
    "op",
    "n_layer",
    "n_head",
    "n_embd",
    "op_lr_scale",
    "gamma_init",
    "learn_gamma",
    "learn_delta",
    "gamma_min",
)
CSV_COLUMNS = (
    "setting",
    "seed",
    *CSV_CONFIG,
    "iters",
    "val_loss",
    "val_bpb",
    "final_gamma",
    "commit",
)
# text cells someone else may have made (a folder's name, a log's commit) that start like a
# spreadsheet formula get a ' first (CWE-1236), as do those starting with ' (load_csv takes exactly
# one off); cells made from numbers are written as they are
CSV_TEXT = ("setting", "commit")
FORMULA_START = ("=", "+", "-", "@", "\t", "\r", "'")
# what to do
CSV_AGAIN = "write the table again: python corridor.py RUN_DIR [RUN_DIR ...] --csv=PATH"


def write_csv(c, path):
    """One row per run of compare's c, sorted by setting, seed and length: as the report has it (the
    seed it is paired under, its final eval's iteration), config values as JSON, the final eval's
    losses at full precision, its γ with heads separated by spaces and layers by ';' (6 significant
    digits), and the commit of the log's first "start" record ('unknown' for older logs or no git).
    """
    rows = []
    for s in c["runs"]:
        cfg, last = s.config, s.evals[-1]
        row = {k: json.dumps(cfg[k]) if k in cfg else "" for k in CSV_CONFIG}
        row.update(
            setting=setting_name(s.name),
            seed=s.seed,
            op=s.op,
            iters=s.final_iter,
            val_loss=repr(s.final_val),
            val_bpb=repr(last["val_bpb"]) if "val_bpb" in last else "",
            final_gamma=";".join(" ".join(f"{g:.6g}" for g in layer) for layer in last["gamma"]),
            commit=s.commit or "unknown",
        )
        for k in CSV_TEXT:
            if row[k].startswith(FORMULA_START):
                row[k] = "'" + row[k]
        rows.append(row)
    rows.sort(key=lambda r: (r["setting"], r["seed"], r["iters"]))
    text = io.StringIO()
    writer = csv.DictWriter(text, CSV_COLUMNS, lineterminator="\n")
    writer.writeheader()
    writer.writerows(rows)
    atomic_write(path, lambda f: f.write(text.getvalue().encode()))
    return path


def load_csv(path):
    """The runs of a table write_csv wrote, as support/rundir.load_run's dicts whose log is the
    final eval: each run's length (iters) is its max_iters, so that runs of different lengths never
    form one group."""
    try:  # utf-8-sig: a spreadsheet may put a byte-order mark first
        reader = csv.DictReader(io.StringIO(read_regular(path, 64 << 20).decode("utf-8-sig")))
    except UnicodeDecodeError as e:
        raise ValueError(f"{path}: not UTF-8 text (byte {e.start}: {e.reason})") from None
    rows = list(reader)
    missing = [c for c in CSV_COLUMNS if c not in (reader.fieldnames or ())]
    if missing:
        raise ValueError(
            f"{path}: not a table that corridor.py --csv writes (no {', '.join(missing)}); "
            f"{CSV_AGAIN}"
        )
    if not rows:
        raise ValueError(f"{path}: a header and no rows, so no runs to compare; {CSV_AGAIN}")
    runs = []
    for lineno, r in enumerate(rows, 2):
        try:
            for k in CSV_TEXT:  # the ' that write_csv put first
                r[k] = r[k].removeprefix("'")
            config = {k: json.loads(r[k]) for k in CSV_CONFIG[1:] if r[k] != ""}
            config.update(op=r["op"], seed=int(r["seed"]), max_iters=int(r["iters"]))
            gamma = [[float(g) for g in layer.split()] for layer in r["final_gamma"].split(";")]
            last = {
                "iter": int(r["iters"]),
                "val_loss": float(r["val_loss"]),
                "gamma": gamma,
                "delta": [[math.nan] * len(layer) for layer in gamma],
            }
            if r["val_bpb"]:
                last["val_bpb"] = float(r["val_bpb"])
        except (ValueError, TypeError, AttributeError) as e:
            raise ValueError(
                f"{path}:{lineno}: not a row that corridor.py --csv writes ({e}); " f"{CSV_AGAIN}"
            ) from None
        start = {"iter": 0, "commit": r["commit"], "changes": {}}
        runs.append(
            {
                "name": f"{r['setting']}_s{r['seed']}",
                "path": f"{path}:{lineno}",
                "config": config,
                "records": [last],
                "evals": [last],
                "starts": [start],
                "warnings": [],
                "ckpt_iter": last["iter"],
                "logged_to": last["iter"],
            }
        )
    return runs


# -----------------------------------------------------------------------------
# One run's heads at work: each head's operator a·I + b·P on a text (corridor.py RUN --text=...)
# Row i of a head's T×T operator says how much of each value v_j (j ≤ i) its output y_i takes:
# b·P_ij from the others, a + b·P_ii from token i itself. A corridor head, γ ∈ (−1, 0), takes a share
# of itself away.

MAX_TOKENS = 48  # about as many tokens as a panel shows readably


@torch.no_grad()
def head_matrices(model, idx):
    """Every head's operator a·I + b·P on the tokens idx (1, T), from each layer's q and k as the
    model's forward computes them: (n_layer, nh, T, T)."""
    x = model.transformer.wte(idx) + model.transformer.wpe(torch.arange(idx.size(1)))  # (1, T, C)
    matrices = []
    for block in model.transformer.h:
        q, k, _ = block.attn.qkv(block.ln_1(x))  # (1, nh, T, hs)
        matrices.append(operator_matrix(q, k, *block.attn.op.coefficients())[0])  # (nh, T, T)
        x = block(x)  # on to the next layer
    return torch.stack(matrices)  # (n_layer, nh, T, T)


def draw_operators(run_dir, text, out_dir):
    """Print what every head of run_dir's model does to a token itself on text, and draw every
    head's operator into out_dir/operators.png; return its path."""
    from model import GPT  # only here: corridor.py's other uses load no model

    ckpt = load_checkpoint(os.path.join(run_dir, "ckpt.pt"))
    model = GPT.from_checkpoint(ckpt, impl="sdpa").eval()
    encode, decode = get_tokenizer(ckpt["meta"])
    ids = encode(text)
    if not ids:
        raise ValueError("the text is empty (it encodes to no tokens); give some text: --text=...")
    # before anything is printed: an --out that is a file stops here
    os.makedirs(out_dir, exist_ok=True)
    T = min(len(ids), model.config.block_size, MAX_TOKENS)
    if T < len(ids):
        print(
            f"the text is {len(ids)} tokens: drawing its first {T} (block_size is "
            f"{model.config.block_size}, and about {MAX_TOKENS} fit in a panel)"
        )
    ids = ids[:T]
    M = head_matrices(model, torch.tensor([ids]))  # (L, nh, T, T)
    # (L, nh)
    a, b = (torch.stack(t) for t in zip(*(op.coefficients() for op in model.head_operators())))
    # (L, nh, T) a + b·P_ii: the weight of each token on itself
    diagonal = M.diagonal(dim1=-2, dim2=-1)
    self_weight = diagonal.mean(-1)  # (L, nh)
    row_sum = M.sum(-1).mean(-1)  # (L, nh) every row sums to a + b = δ(1 + γ), as P's rows sum to 1
    negative = (diagonal < 0).float().mean(-1)  # (L, nh) the share of tokens a head takes away from
    print(f"== {run_dir} on {T} tokens: what each head does to a token itself, against its context")
    print(
        "   per head: mean a + b·P_ii / row sum δ(1 + γ) = a + b (share of the tokens with a + b·P_ii < 0)"
    )
    L, nh = a.shape
    rows = [  # a row per layer
        [str(layer + 1)]
        + [
            f"{self_weight[layer, h]:+.3f}/{row_sum[layer, h]:+.3f} ({negative[layer, h]:.0%})"
            for h in range(nh)
        ]
        for layer in range(L)
    ]
    print_table(["layer"] + [f"head {head + 1}" for head in range(nh)], rows)
    has_gamma = hasattr(model.head_operators()[0], "gamma")
    titles = []
    for layer, head in np.ndindex(L, nh):  # row by row, as the panels
        x, y = a[layer, head], b[layer, head]  # where the op learns a γ (mix): γ = a/b and δ = b
        scalars = f"γ={x / y:+.2f} δ={y:+.2f}" if has_gamma else f"a={x:+.2f} b={y:+.2f}"
        titles.append(f"layer {layer + 1} head {head + 1}\n{scalars}")
    # a space shows as ·, a newline as \n
    tokens = [repr(decode([i]))[1:-1].replace(" ", "·") for i in ids]
    title = f"{os.path.basename(os.path.normpath(run_dir))} (op={model.config.op})\nevery head's a·I + b·P"
    from support import figures  # and with it matplotlib

    with figures.plt.rc_context(figures.STYLE):
        fig = figures.operators(M.numpy(), tokens, titles, title)
        return figures.save(fig, os.path.join(out_dir, "operators.png"))


# -----------------------------------------------------------------------------
# Command line
OPTIONS = dict(
    out="",  # the folder for the figures; default: the first run's directory
    csv="",  # also write one row per run (its settings, final val loss and γ) to this CSV file
    text="",  # draw every head's operator on this text (operators.png), from one run's checkpoint
)


def main(argv):
    usage = "usage: python corridor.py RUN_DIR [RUN_DIR ...] [--out=DIR] [--csv=PATH] | RUN_DIR --text=TEXT"
    paths = [a for a in argv if not a.startswith("-")]
    try:
        require_torch(torch.__version__)
        opts, given = configure(
            OPTIONS,
            [a for a in argv if a.startswith("-")],
            dict(out=nonempty, csv=nonempty),
            files=False,
            help_from=[("", sys.modules[__name__])],
        )
        if not paths:
            raise ConfigError("no run directory given")
        if "text" in given and (len(paths) > 1 or opts.csv):
            raise ConfigError(
                "--text draws the heads of one run: give one run directory and no --csv"
            )
        # os.makedirs would say "File exists"
        if os.path.islink(opts.out) and not os.path.exists(opts.out):
            raise ConfigError(
                f"--out={opts.out} links to {os.readlink(opts.out)}, a folder that does not "
                "exist: make it, or give another --out"
            )
    except ConfigError as e:
        print(f"error: {e} ({usage})", file=sys.stderr)
        return 1
    try:
        if "text" in given:  # one run's heads on a text: a table of them, and operators.png
            print("\nwrote " + draw_operators(paths[0], opts.text, opts.out or paths[0]))
            return 0
        # corridor.py --csv's
        tables = [p for p in paths if p.endswith(".csv") and not os.path.isdir(p)]
        runs = [run for p in paths for run in (load_csv(p) if p in tables else [load_run(p)])]
        for run in runs:
            for w in run["warnings"]:
                print(f"warning: {w}", file=sys.stderr)
        c = compare(runs)
        report(c, each=not tables)
        written = [write_csv(c, opts.csv)] if opts.csv else []
        try:  # the figures need the logs: a table has only each run's end
            written += [] if tables else plot(c, opts.out or runs[0]["path"])
        except ImportError:  # figures are optional: the tables and the CSV do not need matplotlib
            print(
                "warning: matplotlib is not installed (pip install matplotlib), so no figures",
                file=sys.stderr,
            )
    # OSError: e.g. --out names a file, or --csv a folder
    except (ValueError, OSError, ImportError) as e:
        what = (
            f"{e.filename}: {e.strerror}"
            if isinstance(e, OSError) and e.filename and e.strerror
            else e
        )
        print(f"error: {what}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:  # a file being written is left as it was (atomic_write)
        print("interrupted", file=sys.stderr)
        return 1
    if written:
        print("\nwrote " + "\n      ".join(written))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
