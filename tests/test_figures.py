"""Tests for figures.py: each function returns a matplotlib Figure, and these read back what it drew
(lines, points, shading, text, limits) against the numbers given to it. No pixels are compared.

    python -m pytest -q tests/test_figures.py
"""
import math

import numpy as np
import pytest

pytest.importorskip("matplotlib")
from support import figures  # noqa: E402
from support.figures import plt  # noqa: E402
from matplotlib.collections import PolyCollection  # noqa: E402
from matplotlib.text import Text  # noqa: E402


@pytest.fixture(autouse=True)
def close_figures():
    yield
    plt.close("all")


def legend_texts(ax):
    return [t.get_text() for t in ax.get_legend().get_texts()]


def corridor_span(patch):
    """The shaded band's extent in data coordinates along the γ axis: (low, high)."""
    box = patch.get_bbox()
    return box.y0, box.y1


def test_head_scalars_one_line_per_head_coloured_by_layer():
    x = [0, 100, 200]
    vals = np.arange(12, dtype=float).reshape(3, 2, 2) / 10 - 0.6  # (time, layer, head)
    fig = figures.head_scalars(x, vals, "γ", "iteration", "run: mix")
    (ax,) = fig.axes
    assert len(ax.lines) == 4
    for line, (layer, head) in zip(ax.lines, np.ndindex(2, 2)):
        assert list(line.get_xdata()) == x and list(line.get_ydata()) == pytest.approx(vals[:, layer, head])
    colours = [line.get_color() for line in ax.lines]
    assert colours[0] == colours[1] != colours[2] == colours[3]  # one colour per layer
    assert [corridor_span(p) for p in ax.patches] == [(-1.0, 0.0)]  # γ: the corridor is shaded
    assert legend_texts(ax) == ["convex corridor (−1, 0)", "layer 1", "layer 2"]
    assert (ax.get_xlabel(), ax.get_ylabel()) == ("iteration", "γ per head")
    assert ax.get_title() == "γ of every head over training\nrun: mix"
    fig = figures.head_scalars(x, vals, "δ", "tokens", "run: mix")
    assert len(fig.axes[0].patches) == 0  # δ: no corridor
    assert legend_texts(fig.axes[0]) == ["layer 1", "layer 2"]


def test_final_gamma_grid_shows_every_head_symmetric_about_zero():
    gamma = np.array([[-0.5, 0.25, 0.0], [-1.5, 0.75, -0.125]])  # (layer, head)
    fig = figures.final_gamma(gamma, "final γ")
    ax = fig.axes[0]
    (image,) = ax.images
    assert np.array_equal(image.get_array(), gamma)
    assert image.get_clim() == (-1.5, 1.5)  # symmetric, so γ = 0 is the middle colour
    assert figures.final_gamma(gamma / 10, "").axes[0].images[0].get_clim() == (-1.0, 1.0)  # at least ±1
    texts = {(t.get_position(), t.get_text()) for t in ax.texts}
    assert texts == {((head, layer), f"{v:.2f}") for (layer, head), v in np.ndenumerate(gamma)}
    assert [t.get_text() for t in ax.get_xticklabels()] == ["1", "2", "3"]  # heads and layers from 1
    assert [t.get_text() for t in ax.get_yticklabels()] == ["1", "2"]
    assert (ax.get_xlabel(), ax.get_ylabel(), ax.get_title()) == ("head", "layer", "final γ")


@pytest.mark.parametrize("n", [3, 12])
def test_val_loss_one_line_each(n):
    lines = [(f"run {i}", {0: 3.0, 100: 2.0 + i / 100}) for i in range(n)]
    fig = figures.val_loss(lines, "tokens", "validation loss")
    ax = fig.axes[0]
    assert [(list(line.get_xdata()), list(line.get_ydata())) for line in ax.lines] == \
        [([0, 100], [3.0, 2.0 + i / 100]) for i in range(n)]
    assert legend_texts(ax) == [f"run {i}" for i in range(n)]
    assert [line.get_linestyle() for line in ax.lines] == ["-"] * min(n, 10) + ["--"] * (n - 10)
    assert (ax.get_xlabel(), ax.get_ylabel(), ax.get_title()) == ("tokens", "val loss (nats)",
                                                                   "validation loss")


CURVE = {"curves": [{"label": "fixed γ, δ = 1, 2–3 seeds per point",  # points: (γ, mean, lo, hi)
                     "points": [(-0.5, 0.01, -0.01, 0.03), (-0.3, -0.02, -0.03, -0.01), (0.0, 0.0, 0.0, 0.0),
                                (0.3, 0.04, math.nan, math.nan)]}],
         "learned": [{"label": "mix (2 seeds)", "layer_gamma": [-0.1, -1.2, -0.3],
                      "layer_std": [0.01, 0.02, math.nan]}]}


def test_corridor_curve_points_band_and_where_learned_layers_end():
    fig = figures.corridor_curve(CURVE)
    ax, low = fig.axes
    (points,) = [c for c in ax.containers if c.lines[0].get_xdata().size == 4]  # the curve's errorbar
    line = points.lines[0]
    assert list(line.get_xdata()) == [-0.5, -0.3, 0.0, 0.3]
    assert list(line.get_ydata()) == pytest.approx([0.01, -0.02, 0.0, 0.04])
    bars = points.lines[2][0].get_segments()  # the vertical error bars: from lo to hi at each γ
    ends = [v for s in bars[:2] for v in (s[0][0], s[0][1], s[1][1])]  # γ, lo, hi of the first two points
    assert ends == pytest.approx([-0.5, -0.01, 0.03, -0.3, -0.03, -0.01])
    star = [l for l in ax.lines if l.get_marker() == "*"]
    assert len(star) == 1 and list(star[0].get_xdata()) == [0] and list(star[0].get_ydata()) == [0]
    for a in (ax, low):  # the corridor is shaded in both panels, at γ from −1 to 0
        (band,) = a.patches
        assert (band.get_bbox().x0, band.get_bbox().x1) == (-1.0, 0.0)
    assert ax.get_xlim() == pytest.approx((-1.2 - 0.08, 0.3 + 0.08))  # every point, learned ones too
    (learned,) = low.containers
    assert list(learned.lines[0].get_xdata()) == [-0.1, -1.2, -0.3]
    assert list(learned.lines[0].get_ydata()) == [1, 2, 3]  # layer i at y = i, layer 1 on top
    bars = learned.lines[2][0].get_segments()  # horizontal: γ ± its std over seeds, at each layer
    assert [v for s in bars[:2] for v in (s[0][0], s[1][0], s[0][1])] == pytest.approx([-0.11, -0.09, 1,
                                                                                        -1.22, -1.18, 2])
    assert low.get_ylim()[0] > low.get_ylim()[1]
    assert [t.get_text() for t in low.get_yticklabels()] == ["layer 1", "layer 2", "layer 3"]
    assert sorted(legend_texts(ax)) == ["95% confidence interval", "attention (γ = 0, δ = 1)",
                                        "convex corridor (−1, 0)", "fixed γ, δ = 1, 2–3 seeds per point"]
    assert legend_texts(low) == ["learned mix (2 seeds)"]


def test_corridor_curve_learned_settings_side_by_side():
    other = {"label": "mix (3 seeds)", "layer_gamma": [-0.2, -0.4, -0.6], "layer_std": [0.0] * 3}
    low = figures.corridor_curve({**CURVE, "learned": CURVE["learned"] + [other]}).axes[1]
    first, second = (list(c.lines[0].get_ydata()) for c in low.containers)
    assert first == pytest.approx([0.9, 1.9, 2.9]) and second == pytest.approx([1.1, 2.1, 3.1])  # each layer


def test_corridor_curve_without_learned_runs_has_one_panel():
    fig = figures.corridor_curve({**CURVE, "learned": []})
    (ax,) = fig.axes
    assert ax.get_xlim() == pytest.approx((-1.0 - 0.08, 0.3 + 0.08))  # the whole corridor stays in view
    assert ax.get_xlabel().startswith("γ ")


# what run names, settings and texts may hold: to mathtext, $…$ is a formula ($name_$ one it cannot parse)
NAME = r"$name_$seed ^2 \alpha $x$"


def drawn_texts(fig):
    """Every text fig draws, once drawn (a formula mathtext cannot parse fails here), each drawn as typed."""
    fig.canvas.draw()
    texts = [t for t in fig.findobj(Text) if t.get_text()]
    assert [t.get_text() for t in texts if t.get_parse_math()] == []  # none of them read as a formula
    return {t.get_text() for t in texts}


def test_names_and_texts_are_drawn_as_typed_in_every_figure():
    """Titles, labels, legends and ticks that show a run's name, its settings or the user's tokens."""
    scalars = figures.head_scalars([0, 1], np.zeros((2, 1, 1)), "γ", NAME, NAME)
    assert {NAME, f"γ of every head over training\n{NAME}"} <= drawn_texts(scalars)
    assert NAME in drawn_texts(figures.final_gamma(np.zeros((1, 1)), NAME))
    assert NAME in drawn_texts(figures.val_loss([(NAME, {0: 1.0})], NAME, NAME))
    curve = {"curves": [{**CURVE["curves"][0], "label": NAME}],
             "learned": [{**CURVE["learned"][0], "label": NAME}]}
    assert {NAME, f"learned {NAME}"} <= drawn_texts(figures.corridor_curve(curve))
    tokens = ["$", "_", "^", "\\\\", "$x$"]  # corridor.py's tick labels: a backslash shows as \\
    assert {NAME, *tokens} <= drawn_texts(figures.operators(np.zeros((1, 1, 5, 5)), tokens, [NAME], NAME))


def test_save_writes_a_png_and_frees_the_figure(tmp_path):
    fig = figures.val_loss([("a", {0: 1.0})], "iteration", "t")
    path = str(tmp_path / "v.png")
    assert figures.save(fig, path) == path
    assert open(path, "rb").read(8) == b"\x89PNG\r\n\x1a\n"
    assert fig.number not in plt.get_fignums()  # closed: many figures in one process do not pile up
    assert sorted(p.name for p in tmp_path.iterdir()) == ["v.png"]  # no temporary left beside it


def band_by_gamma(ax):
    """The confidence band (fill_between's PolyCollection) read back: {γ: (its lowest y, its highest y)}."""
    (band,) = [c for c in ax.collections if isinstance(c, PolyCollection)]
    ends = {}
    for x, y in (v for path in band.get_paths() for v in path.vertices):
        low, high = ends.get(float(x), (math.inf, -math.inf))
        ends[float(x)] = (min(low, float(y)), max(high, float(y)))
    return ends


def test_corridor_curve_band_spans_the_interval_below_and_above_the_mean():
    ax = figures.corridor_curve(CURVE).axes[0]
    ends = band_by_gamma(ax)
    assert sorted(ends) == [-0.5, -0.3, 0.0]  # γ = 0.3 has one seed: no interval, no band there
    assert ends[-0.5] == pytest.approx((-0.01, 0.03)) and ends[-0.3] == pytest.approx((-0.03, -0.01))
    assert ends[0.0] == (0.0, 0.0)  # attention: 0 by definition


def test_corridor_curve_layer_axis_covers_the_deepest_learned_run():
    """Learned runs of 2, 4 and 3 layers on one figure: layers 1 to 4 are labelled, and each run's points sit
    at its own layers (side by side), its γ per layer as given."""
    depths = {"two": [-0.1, -0.2], "four": [-0.3, -0.4, -0.5, -0.6], "three": [-0.7, -0.8, -0.9]}
    learned = [{"label": name, "layer_gamma": g, "layer_std": [0.01] * len(g)}
               for name, g in depths.items()]
    low = figures.corridor_curve({**CURVE, "learned": learned}).axes[1]
    assert [t.get_text() for t in low.get_yticklabels()] == ["layer 1", "layer 2", "layer 3", "layer 4"]
    assert low.get_ylim() == pytest.approx((4.6, 0.4))  # every layer in view, layer 1 on top
    for (name, gamma), points, offset in zip(depths.items(), low.containers, (-0.2, 0.0, 0.2)):
        line = points.lines[0]
        assert list(line.get_xdata()) == gamma, name
        assert list(line.get_ydata()) == pytest.approx([i + 1 + offset for i in range(len(gamma))]), name


@pytest.mark.filterwarnings("ignore:invalid value encountered:RuntimeWarning")  # matplotlib's inf − inf
def test_corridor_curve_of_a_diverged_run_is_drawn_from_the_finite_ones(tmp_path):
    """A learned run whose γ became NaN, one whose γ became inf, a fixed γ whose runs diverged (mean NaN): the
    figure is drawn and written, its γ axis spans the finite points, and the finite run's points are where
    they were."""
    diverged = [{"label": "nan", "layer_gamma": [math.nan, -0.2, -0.3], "layer_std": [math.nan] * 3},
                {"label": "inf", "layer_gamma": [math.inf, -math.inf, -0.4],
                 "layer_std": [math.inf] * 3}]
    points = [(g, math.nan if g == -0.3 else m, lo, hi) for g, m, lo, hi in CURVE["curves"][0]["points"]]
    curve = {"curves": [{**CURVE["curves"][0], "points": points}],
             "learned": CURVE["learned"] + diverged}
    fig = figures.corridor_curve(curve)
    ax, low = fig.axes
    assert ax.get_xlim() == pytest.approx((-1.2 - 0.08, 0.3 + 0.08))  # the finite points only
    assert list(low.containers[0].lines[0].get_xdata()) == [-0.1, -1.2, -0.3]  # the finite run, as before
    path = str(tmp_path / "corridor_curve.png")
    assert figures.save(fig, path) == path  # drawn, laid out and written
    assert open(path, "rb").read(8) == b"\x89PNG\r\n\x1a\n"


def test_operators_colour_scale_is_symmetric_in_the_largest_magnitude():
    """A strongly negative diagonal (−3, weights elsewhere at most 0.5) keeps its shade: the scale spans
    [−3, 3] in every panel, 0 is its middle, and no cell lies beyond it."""
    M = np.tril(np.full((2, 2, 4, 4), 0.5)) - 3.5 * np.eye(4)  # (layer, head, T, T), diagonal −3
    fig = figures.operators(M, list("abcd"), [f"head {i}" for i in range(4)], "t")
    images = [image for ax in fig.axes for image in ax.get_images()]
    assert len(images) == 4 and all(image.get_clim() == (-3.0, 3.0) for image in images)
