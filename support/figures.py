"""
figures.py: the PNG figures corridor.py writes. corridor.py decides what each shows
(val_loss_lines, curve_data) and this file only draws it; corridor.py imports it only to
draw, so matplotlib stays optional.
"""
import matplotlib
matplotlib.use("Agg")  # draw into files only: no window, so it also works on a server or in CI
# every text drawn as typed: a run out/$a_$b is no formula
matplotlib.rcParams["text.parse_math"] = False
import matplotlib.pyplot as plt
import numpy as np

from support.rundir import atomic_write

# large enough to read on a projector
STYLE = {"font.size": 16, "axes.titlesize": 16, "legend.fontsize": 12, "lines.linewidth": 2}
CORRIDOR = dict(color="green", alpha=0.12)  # the shading of γ ∈ (−1, 0)
COLOURS = plt.get_cmap("tab10")  # one colour per layer, or per curve


def head_scalars(x, vals, sym, xlabel, title):
    """γ or δ (sym) of every head over training: vals is (time, layer,
    head), one colour per layer."""
    fig, ax = plt.subplots(figsize=(11, 6.5))
    if sym == "γ":
        ax.axhspan(-1, 0, **CORRIDOR, label="convex corridor (−1, 0)")
    for layer, head in np.ndindex(vals.shape[1:]):
        ax.plot(x, vals[:, layer, head], color=COLOURS(layer % 10), alpha=0.8,
                label=f"layer {layer + 1}" if head == 0 else None)
    ax.set(xlabel=xlabel, ylabel=f"{sym} per head",
           title=f"{sym} of every head over training\n{title}")
    ax.legend(loc="best")
    ax.grid(alpha=0.3)
    return fig


def final_gamma(gamma, title):
    """The final γ of every head as a (layer, head) grid of numbers, red below 0 and blue above."""
    n_layer, n_head = gamma.shape
    lim = max(1.0, float(np.abs(gamma).max()))
    fig, ax = plt.subplots(figsize=(max(6, 1.6 * n_head + 3), max(4, 1.0 * n_layer + 2.5)))
    im = ax.imshow(gamma, cmap="RdBu", vmin=-lim, vmax=lim, aspect="auto")
    for (layer, head), v in np.ndenumerate(gamma):
        ax.text(head, layer, f"{v:.2f}", ha="center", va="center", fontsize=14,
                color="white" if abs(v) > 0.6 * lim else "black")
    ax.set(xticks=range(n_head), xticklabels=range(1, n_head + 1), xlabel="head",
           yticks=range(n_layer), yticklabels=range(1, n_layer + 1), ylabel="layer", title=title)
    fig.colorbar(im, ax=ax, label="γ")
    return fig


def val_loss(lines, xlabel, title):
    """One line per (label, {x: val loss}); beyond 6 lines the legend goes to the right of the
    plot."""
    fig, ax = plt.subplots(figsize=(11, 6.5) if len(lines) <= 6 else (16, 7))
    for i, (label, curve) in enumerate(lines):  # 10 colours, then the next line style
        style = ("-", "--", ":")[i // 10 % 3]
        ax.plot(list(curve), list(curve.values()), marker="o", linestyle=style, label=label)
    ax.set(xlabel=xlabel, ylabel="val loss (nats)", title=title)
    if len(lines) <= 6:
        ax.legend(loc="best")
    else:
        ax.legend(loc="upper left", bbox_to_anchor=(1.01, 1.0), fontsize=10)
    ax.grid(alpha=0.3)
    return fig


def corridor_curve(curve):
    """The classroom figure: val loss against a fixed γ (δ = 1), paired with attention, the
    corridor shaded, and below it, on the same γ axis, where the learned runs' layers end up
    (curve: corridor.curve_data)."""
    learned, low = curve["learned"], None
    if learned:
        n_layer = max(len(g["layer_gamma"]) for g in learned)
        fig, (ax, low) = plt.subplots(2, 1, sharex=True, figsize=(12, 9.5),
                                      gridspec_kw={"height_ratios": [3, 0.6 + 0.45 * n_layer]})
    else:
        fig, ax = plt.subplots(figsize=(12, 7))
    for a in fig.axes:
        a.axvspan(-1, 0, **CORRIDOR, label="convex corridor (−1, 0)" if a is ax else None)
        a.grid(alpha=0.3)
    ax.axhline(0, color="black", linewidth=1)
    for i, c in enumerate(curve["curves"]):
        x, m, lo, hi = np.array(c["points"], dtype=float).T  # (point,) each
        ax.fill_between(x, lo, hi, color=COLOURS(i), alpha=0.2,
                        label="95% confidence interval" if i == 0 else None)
        ax.errorbar(x, m, yerr=[m - lo, hi - m], fmt="o-", markersize=9, capsize=6,
                    color=COLOURS(i), label=c["label"])
    ax.plot([0], [0], marker="*", markersize=24, color="black", linestyle="none", zorder=5,
            label="attention (γ = 0, δ = 1)")
    ax.set(ylabel="val loss − attention's\n(nats, same seed)", title="Fixed γ with δ = 1: val loss minus "
           "attention's\n(mean over seeds, 95% confidence interval)")
    ax.legend(loc="best", fontsize=13)
    if low:
        for j, g in enumerate(learned):
            # side by side
            y = np.arange(1, len(g["layer_gamma"]) + 1) + 0.2 * (j - (len(learned) - 1) / 2)
            low.errorbar(g["layer_gamma"], y, xerr=g["layer_std"], fmt="v^sD"[j % 4], markersize=11,
                         capsize=4, color=COLOURS(len(curve["curves"]) + j), label=f"learned {g['label']}")
        low.set_yticks(range(1, n_layer + 1), [f"layer {i}" for i in range(1, n_layer + 1)])
        low.set_ylim(n_layer + 0.6, 0.4)  # layer 1 on top, read like a table
        low.set_title("where learned runs end: mean final γ per layer (± std over seeds)",
                      fontsize=14)
        low.legend(loc="best", fontsize=12)
    (low or ax).set_xlabel("γ   (each head computes δ(γI + P)·v;  γ = 0: attention,  "
                           "γ = −1: negative Laplacian)")
    # the x range: attention, the Laplacian and every point drawn (a diverged run's γ may be NaN)
    xs = [p[0] for c in curve["curves"] for p in c["points"]]
    xs += [x for g in learned for x in g["layer_gamma"]]
    xs = [x for x in [0.0, -1.0, *xs] if np.isfinite(x)]
    ax.set_xlim(min(xs) - 0.08, max(xs) + 0.08)
    return fig


def operators(M, tokens, titles, title):
    """Every head's T×T operator, M (layer, head, T, T), a panel each: rows are layers,
    columns heads, one colour scale from -max|M| to +max|M|, centred at 0 (red below, blue above:
    a negative diagonal shows at a glance, and however negative, it does not saturate)."""
    n_layer, n_head, T, _ = M.shape
    lim = float(np.abs(M).max())
    side = max(2.5, 0.11 * T)  # inches a panel: 8 points a token label
    fig, axes = plt.subplots(n_layer, n_head, figsize=(side * n_head + 2, side * n_layer + 1.5),
                             squeeze=False, sharex=True, sharey=True, layout="constrained")
    for ax, panel, name in zip(axes.flat, M.reshape(-1, T, T), titles):
        im = ax.imshow(panel, cmap="RdBu", vmin=-lim, vmax=lim)
        ax.set_title(name, fontsize=12)
    for ax in axes[-1]:  # shared axes: only the outer panels label the tokens
        ax.set_xticks(range(T), tokens, fontsize=7, rotation=90)
    for ax in axes[:, 0]:
        ax.set_yticks(range(T), tokens, fontsize=7)
    fig.colorbar(im, ax=axes, shrink=0.6, label="weight of v_j (column) in y_i (row)")
    fig.suptitle(title, fontsize=14)
    return fig


def save(fig, path):
    """Write fig as a PNG at path (never half a file), free it, and return path."""
    if fig.get_layout_engine() is None:  # operators() lays out its own panels and colour bar
        fig.tight_layout()
    atomic_write(path, lambda f: fig.savefig(f, format="png", dpi=100))
    plt.close(fig)
    return path
