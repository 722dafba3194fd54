"""The report's figures, checked on their matplotlib objects: each is drawn from a small
hand-made report.json dict, and what it plots is compared with the dict."""

from __future__ import annotations

import copy
from itertools import combinations

import numpy as np
import pytest
from matplotlib.collections import PolyCollection
from matplotlib.lines import Line2D
from matplotlib.patches import Rectangle
from matplotlib.text import Text
from matplotlib.transforms import Bbox

from dllmbench.analysis import figures


def _interval(value: float, half: float = 0.05) -> dict:
    return {"value": value, "low": max(0.0, value - half), "high": min(1.0, value + half)}


def _method(
    mid: str,
    family: str,
    spec: str,
    budget: int,
    value: float,
    passes: float,
    *,
    ceiling: bool = False,
) -> dict:
    return {
        "id": mid,
        "family": family,
        "spec": spec,
        "ceiling": ceiling,
        "budget": budget,
        "problems": 10,
        "accuracy": _interval(value),
        "passes_per_problem": passes,
        "planned_passes": budget,
        "share_of_budget": passes / budget,
        "run": 0,
    }


def _point(k: int, value: float, *, exact: bool = True) -> dict:
    return {
        "k": k,
        "passes": 4 * k,
        "accuracy": _interval(value),
        "exact": exact,
        "stderr": 0.0 if exact else 0.002,
    }


def _bucket(i: int, auc: float | None = None, n: int = 0) -> dict:
    interval = None if auc is None else _interval(auc)
    return {
        "low": i / 10,
        "high": (i + 1) / 10,
        "n": n,
        "positives": n // 2,
        "auc": auc,
        "interval": interval,
    }


def _buckets(filled: dict[int, tuple[float, int]]) -> list[dict]:
    return [_bucket(i, *filled.get(i, (None, 0))) for i in range(10)]


def _discrimination(scorer: str, states: str, buckets: list[dict]) -> dict:
    return {
        "scorer": scorer,
        "states": states,
        "count": sum(b["n"] for b in buckets),
        "positives": 0,
        "roc_auc_by_mask": buckets,
        "kendall_tau": {"median": None, "mean": None, "problems": 0, "undefined": 0},
    }


def _pool(pool: str, kind: str, methods: list[str], size: int, oracle: float) -> dict:
    return {
        "pool": pool,
        "kind": kind,
        "methods": methods,
        "size": size,
        "problems": 10,
        "oracle": _interval(oracle),
        "unique_answers": {"value": 2.0, "low": 1.5, "high": 2.5},
        "entropy_bits": {"value": 0.5, "low": 0.4, "high": 0.6},
    }


SMC_SPEC = "smc:beta_step=0.05,ess_fraction=0.5,every=4,k={k},resample_fraction=0.75,scorer=prm"


def _smc(k: int, ess: list[tuple[float, float]]) -> dict:
    return {
        "pool": SMC_SPEC.format(k=k),
        "methods": [f"SMC K={k}"],
        "checkpoints": 10 * len(ess),
        "ess_before": 0.0,
        "ess_after": 0.0,
        "resample_rate": 0.5,
        "beta": {"mean": 1.0, "min": 1.0, "max": 1.0},
        "distinct_ancestors": None,
        "ancestor_perplexity": None,
        "by_checkpoint": [
            {"index": i, "ess_before": before, "ess_after": after}
            for i, (before, after) in enumerate(ess)
        ],
    }


METHODS = [
    _method("Vanilla", "vanilla", "independent:n=1+first", 40, 0.5, 4),
    _method("Majority@8", "majority", "independent:n=8+majority", 40, 0.6, 32),
    _method("PRM Guided K=2 b=4", "prm_guided", "prm_guided:k=2,every=4+first", 40, 0.55, 40),
    _method("Oracle@8", "oracle", "independent:n=8+oracle", 40, 0.8, 32, ceiling=True),
    _method("Vanilla", "vanilla", "independent:n=1+first", 80, 0.5, 4),
    _method("Majority@16", "majority", "independent:n=16+majority", 80, 0.65, 64),
    _method("PRM Guided K=4 b=4", "prm_guided", "prm_guided:k=4,every=4+first", 80, 0.45, 80),
    _method("Oracle@16", "oracle", "independent:n=16+oracle", 80, 0.9, 64, ceiling=True),
]
CURVES = [
    {
        "selector": "oracle",
        "pool_size": 4,
        "points": [_point(k, 0.5 + 0.1 * k) for k in (1, 2, 3, 4)],
    },
    {"selector": "random", "pool_size": 4, "points": [_point(k, 0.5) for k in (1, 2, 3, 4)]},
    {
        "selector": "majority",
        "pool_size": 4,
        "points": [
            _point(1, 0.5),
            _point(2, 0.55, exact=False),
            _point(3, 0.6, exact=False),
            _point(4, 0.62),
        ],
    },
    {"selector": "argmax:orm", "pool_size": 4, "points": [_point(k, 0.6) for k in (1, 2, 3, 4)]},
    {"selector": "argmax:prm", "pool_size": 4, "points": [_point(k, 0.4) for k in (1, 2, 3, 4)]},
]
# the PRM's guided states fill buckets 0, 1 and 6 only: the line must break between 1 and 6
GUIDED = _buckets({0: (0.8, 40), 1: (0.75, 30), 6: (0.7, 20)})
FINAL_ORM = _buckets({0: (0.9, 50)})
FINAL_PRM = _buckets({0: (0.85, 50)})


def report() -> dict:
    return {
        "schema_version": 1,
        "task": {"name": "arith", "split": "test", "problems": 10},
        "backbone": "tiny",
        "steps": 24,
        "seed": 0,
        "level": 0.95,
        "resamples": 100,
        "reference": None,
        "runs": [{"path": "run", "budgets": [40, 80]}],
        "budgets": [40, 80],
        "methods": copy.deepcopy(METHODS),
        "pooled": {
            "pool": "independent",
            "run": 0,
            "size": 4,
            "problems": 10,
            "samples": 100,
            "exact_limit": 10,
            "count_limit": 10,
            "curves": copy.deepcopy(CURVES),
            "agreement": [],
        },
        "diagnostics": {
            "discrimination": [
                _discrimination("orm", "final", copy.deepcopy(FINAL_ORM)),
                _discrimination("prm", "guided", copy.deepcopy(GUIDED)),
                _discrimination("prm", "final", copy.deepcopy(FINAL_PRM)),
            ],
            "pools": [
                _pool("independent:n=8", "plain", ["Majority@8", "Oracle@8"], 8, 0.8),
                _pool("independent:n=16", "plain", ["Majority@16", "Oracle@16"], 16, 0.9),
                _pool("prm_guided:k=2,every=4", "guided", ["PRM Guided K=2 b=4"], 2, 0.6),
                _pool("prism:n=9,final=4,scorer=self", "other", [], 4, 0.7),
                _pool("prism:n=19,final=4,scorer=self", "other", [], 4, 0.75),
            ],
            "removal_risk": [],
            "particles": [_smc(2, [(1.8, 2.0), (0.9, 1.7)]), _smc(8, [(6.0, 8.0)])],
            "scorer_swap": None,
        },
        "figures": {},
    }


def _legends(fig) -> list:
    """Every legend of a figure, of its subfigures and of their axes."""
    found = [*fig.legends, *(g for sub in fig.subfigs for g in _legends(sub))]
    return found + [ax.get_legend() for ax in fig.axes if ax.get_legend() is not None]


def _legend_texts(fig) -> list[list[str]]:
    """The entries of each legend of a figure and its subfigures, legend by legend."""
    return [[t.get_text() for t in legend.get_texts()] for legend in _legends(fig)]


def _axes(fig) -> list:
    """Every axes of a figure and of its subfigures, once each."""
    return list(dict.fromkeys([*fig.axes, *(ax for sub in fig.subfigs for ax in _axes(sub))]))


def _marker_lines(ax) -> list[Line2D]:
    """The lines with markers, less an error bar's caps."""
    return [line for line in ax.get_lines() if line.get_marker() not in ("None", "", "_", "|")]


def _drawn(fig) -> None:
    """Lay the figure out and draw it, unless nothing changed since it was last drawn: the
    boxes read after it are those the renderer draws."""
    if fig.stale:
        fig.canvas.draw()


def _inside(fig, ax, legend) -> bool:
    """Whether a legend's box overlaps the axes' data area."""
    _drawn(fig)
    return legend.get_window_extent().overlaps(ax.get_window_extent())


def _drawn_tick_labels(axis) -> list[Text]:
    """The tick labels an axis draws: visible, not empty, at a tick within its view."""
    low, high = sorted(axis.get_view_interval())
    slack = 1e-9 * max(1.0, high - low)
    ticks = [
        *zip(axis.get_major_ticks(), axis.get_majorticklocs(), strict=False),
        *zip(axis.get_minor_ticks(), axis.get_minorticklocs(), strict=False),
    ]
    return [
        tick.label1
        for tick, loc in ticks
        if low - slack <= loc <= high + slack
        and tick.label1.get_visible()
        and tick.label1.get_text().strip()
    ]


def _texts(fig) -> list[Text]:
    """Every text a figure draws, once drawn: titles, axis labels, captions, annotations,
    legend entries, and the tick labels each axis draws."""
    _drawn(fig)
    axes = [axis for ax in _axes(fig) for axis in (ax.xaxis, ax.yaxis)]
    ticks = {
        id(label)
        for axis in axes
        for tick in [*axis.get_major_ticks(), *axis.get_minor_ticks()]
        for label in (tick.label1, tick.label2)
    }
    shown = [
        t
        for t in fig.findobj(Text)
        if id(t) not in ticks and t.get_visible() and t.get_text().strip()
    ]
    return shown + [label for axis in axes for label in _drawn_tick_labels(axis)]


def _overlap(a: Bbox, b: Bbox) -> bool:
    """Whether two boxes share an area (more than an edge)."""
    both = Bbox.intersection(a, b)
    return both is not None and both.width > 0.5 and both.height > 0.5


def _overlapping_texts(fig) -> list[tuple[str, str]]:
    """The pairs of texts of a figure whose boxes, as the renderer lays them out, overlap."""
    texts = _texts(fig)
    boxes = [(t.get_text(), t.get_window_extent()) for t in texts]
    return [(a, b) for (a, box_a), (b, box_b) in combinations(boxes, 2) if _overlap(box_a, box_b)]


def _covered_by_legends(fig) -> list[str]:
    """The texts of a figure outside its legends (titles, labels, ticks, captions, notes)
    that a legend's box covers."""
    texts = _texts(fig)
    covered = []
    for legend in _legends(fig):
        own = {id(t) for t in legend.findobj(Text)}
        box = legend.get_window_extent()
        covered += [
            t.get_text() for t in texts if id(t) not in own and _overlap(box, t.get_window_extent())
        ]
    return covered


def _assert_readable(fig) -> None:
    """No two texts overlap, and no legend covers a text or a panel."""
    assert _overlapping_texts(fig) == []
    assert _covered_by_legends(fig) == []
    assert not [ax for ax in _axes(fig) for g in _legends(fig) if _inside(fig, ax, g)]


def test_pareto_has_a_panel_per_selector_family_and_per_budget_with_short_legends():
    fig = figures.pareto(report())
    top, _, bottom = fig.subfigs  # pooled curves, methods at their spend, methods by budget
    assert [ax.get_title() for ax in top.axes] == [
        "Oracle@k (ceiling)",
        "Majority@k",
        "best score@k (rerank)",
    ]
    # the pooled curves' legend: scorers, the reference, exact and Monte-Carlo points, the band
    (pooled_keys,) = [[t.get_text() for t in g.get_texts()] for g in top.legends]
    assert pooled_keys[:4] == ["no scorer", "ORM", "PRM", "Random@k (reference)"]
    assert pooled_keys[4] == "exact" and pooled_keys[5].startswith("Monte-Carlo estimate")
    assert "s.e. ≤ 0.20 percentage points" in pooled_keys[5]
    assert pooled_keys[6] == "95% CI" and len(pooled_keys) == 7
    (method_keys,) = [[t.get_text() for t in g.get_texts()] for g in bottom.legends]
    assert method_keys == [
        "independent samples",
        "guided search (cuts, particles)",
        "ceiling (oracle)",
    ]
    assert all(len(text) <= 60 for texts in _legend_texts(fig) for text in texts)
    assert not any(ax.get_legend() for ax in _axes(fig))  # every legend outside the panels
    # one band per pooled curve, at 100 × the interval
    majority = top.axes[1]
    (band,) = [c for c in majority.collections if isinstance(c, PolyCollection)]
    ys = band.get_paths()[0].vertices[:, 1]
    assert ys.max() == pytest.approx(100 * 0.67) and ys.min() == pytest.approx(100 * 0.45)
    _assert_readable(fig)


def test_pareto_marks_monte_carlo_points_hollow_and_plots_the_dicts_values():
    fig = figures.pareto(report())
    majority = fig.subfigs[0].axes[1]
    points = [line for line in _marker_lines(majority) if line.get_linestyle() == "None"]
    hollow = [line for line in points if line.get_markerfacecolor() == "white"]
    filled = [line for line in points if line.get_markerfacecolor() != "white"]
    assert len(hollow) == len(filled) == 1
    np.testing.assert_allclose(hollow[0].get_xdata(), [8, 12])  # passes of k = 2, 3
    np.testing.assert_allclose(hollow[0].get_ydata(), [55, 60])  # 100 × value
    np.testing.assert_allclose(filled[0].get_xdata(), [4, 16])
    # the methods: one row per family shared by the budgets, x = 100 × accuracy
    left, right = fig.subfigs[-1].axes
    rows = [t.get_text() for t in left.get_yticklabels()]
    assert rows == ["Vanilla [1]", "Majority [2]", "PRM Guided [3]", "Oracle [4]"]  # ceilings last
    rows = [row.rsplit(" [", 1)[0] for row in rows]
    for ax, budget in ((left, 40), (right, 80)):
        assert ax.get_title(loc="left").startswith(f"budget {budget}")
        got = {(line.get_ydata()[0], line.get_xdata()[0]) for line in _marker_lines(ax)}
        want = {
            (rows.index(figures.method_label(m["id"])[0]), 100 * m["accuracy"]["value"])
            for m in METHODS
            if m["budget"] == budget
        }
        np.testing.assert_allclose(sorted(got), sorted(want))
        ceiling = [line for line in _marker_lines(ax) if line.get_ydata()[0] == 3]
        assert ceiling[0].get_markerfacecolor() == "white"
        notes = {t.get_text() for t in ax.texts}
        assert any(note.endswith(f"{budget}") for note in notes)  # passes at the right


def test_method_label_splits_the_budget_specific_part():
    assert figures.method_label("PRM Guided K=8 b=12") == ("PRM Guided", "K=8 b=12")
    assert figures.method_label("Majority@34") == ("Majority", "@34")
    assert figures.method_label("ReMDM-cap@8 + ORM Rerank") == ("ReMDM-cap + ORM Rerank", "@8")
    assert figures.method_label("Vanilla") == ("Vanilla", "")


def _auc_lines(ax) -> dict[str, Line2D]:
    return {line.get_label(): line for line in ax.get_lines() if line.get_label()[0] != "_"}


def _segments(line: Line2D) -> list[tuple[float, float]]:
    """The (x0, x1) of each drawn segment: consecutive points both finite."""
    xs, ys = np.asarray(line.get_xdata(), float), np.asarray(line.get_ydata(), float)
    finite = np.isfinite(xs) & np.isfinite(ys)
    return [(xs[i], xs[i + 1]) for i in range(len(xs) - 1) if finite[i] and finite[i + 1]]


def _roc_axes(fig) -> tuple[list, list]:
    """The ROC-AUC figure's strips of n (axes that show no x tick label) and its panels, each
    left to right: (fully decoded, mask ratio) or one of them."""
    strips = [ax for ax in fig.axes if not ax.get_xticklabels()]
    return strips, [ax for ax in fig.axes if ax not in strips]


def _points(ax) -> list[tuple[float, float]]:
    """(x, AUC) of every point of a panel, in x order."""
    return sorted(
        (float(x), float(y))
        for line in _marker_lines(ax)
        for x, y in zip(line.get_xdata(), line.get_ydata(), strict=True)
    )


def _counts(strips) -> dict[str, list[tuple[float, str]]]:
    """Series label → the (x, n) of its row of the strips, the panels' x left to right."""
    rows = [t.get_text() for t in strips[0].get_yticklabels()]
    found: dict[str, list[tuple[float, str]]] = {row: [] for row in rows}
    for panel, strip in enumerate(strips):
        for t in strip.texts:
            x, row = t.get_position()
            found[rows[round(row)]].append((panel + x, t.get_text()))
    return {row: sorted(found[row]) for row in rows}


def _legend_keys(fig) -> dict[str, str]:
    """Legend label → its key's colour, over the figure's one legend."""
    (legend,) = _legends(fig)
    handles = legend.legend_handles
    return {t.get_text(): h.get_color() for t, h in zip(legend.get_texts(), handles, strict=True)}


def _controls(slicing: str | None, *scorers: str) -> dict:
    """Scorer controls over a collection whose PRM-like scorers fill buckets 0, 3 and 9 alike
    (n as large as the paper's) and its fully decoded states apart (n = 42208)."""
    rows = []
    for i, scorer in enumerate(scorers):
        filled = {0: (0.93 - i / 100, 126624), 3: (0.7 + i / 100, 126624), 9: (0.55, 16000)}
        rows.append(
            {"scorer": scorer, "buckets": _buckets(filled), "final": _bucket(0, 0.9, 42208)}
        )
    found = {"auc_by_mask": rows}
    if slicing is not None:
        found["slicing"] = slicing
    return found


def test_roc_auc_breaks_lines_at_empty_buckets_and_draws_final_states_apart():
    fig = figures.roc_auc(report())
    _, (final_ax, mask_ax) = _roc_axes(fig)
    lines = _auc_lines(mask_ax)
    assert set(lines) == {"PRM", "chance (0.5)"}  # the ORM has no guided states
    prm = lines["PRM"]
    # buckets 0 and 1 are joined; no segment reaches over the empty buckets 2..5 to bucket 6
    assert _segments(prm) == [pytest.approx((0.05, 0.15))]
    ys = np.asarray(prm.get_ydata(), float)
    np.testing.assert_allclose(ys[np.isfinite(ys)], [0.8, 0.75, 0.7])
    assert np.isnan(ys).sum() == 7  # the seven empty buckets
    # the final candidates: their own panel, one point per scorer
    assert [t.get_text() for t in final_ax.get_xticklabels()] == ["fully\ndecoded"]
    finals = sorted(line.get_ydata()[0] for line in _marker_lines(final_ax))
    assert finals == pytest.approx([0.85, 0.9])
    caption = fig.get_supxlabel()
    assert "95% bootstrap CIs" in caption and "clustered by problem" in caption
    assert mask_ax.get_legend() is not None
    _assert_readable(fig)


def test_roc_auc_puts_a_point_only_where_a_bucket_has_an_auc_and_n_where_it_has_states():
    data = report()
    guided = data["diagnostics"]["discrimination"][1]["roc_auc_by_mask"]
    guided[3].update(n=8, positives=8)  # states of one class only: n, but no AUC
    fig = figures.roc_auc(data)
    strips, (final_ax, mask_ax) = _roc_axes(fig)
    np.testing.assert_allclose(_points(mask_ax), [(0.05, 0.8), (0.15, 0.75), (0.65, 0.7)])
    np.testing.assert_allclose(_points(final_ax), [(-1 / 15, 0.9), (1 / 15, 0.85)])  # dodged
    # n in each series' row: at each bucket holding states, the one-class bucket included
    assert _counts(strips) == {
        "ORM": [(0.0, "50")],
        "PRM": [
            (0.0, "50"),
            (pytest.approx(1.05), "40"),
            (pytest.approx(1.15), "30"),
            (pytest.approx(1.35), "8"),
            (pytest.approx(1.65), "20"),
        ],
    }
    caption = fig.get_supxlabel()
    assert "holds no states or holds states of one class only" in caption


def test_roc_auc_caption_says_what_a_missing_point_means():
    # the fixture's gaps are empty buckets: none holds states of one class only
    caption = figures.roc_auc(report()).get_supxlabel()
    assert "No point where a bucket holds no states: a line breaks there." in caption
    assert "class" not in caption


def test_roc_auc_says_the_guided_runs_fully_decoded_states_are_in_the_lowest_bucket():
    fig = figures.roc_auc(report())
    caption = fig.get_supxlabel()
    assert (
        "mask buckets: scored states of guided runs, their fully decoded ones (mask ratio 0) "
        "in [0, 0.1); fully decoded: final candidates of the independent pools" in caption
    )
    # no guided state is drawn as fully decoded, and no final candidate at a mask ratio
    _, (final_ax, mask_ax) = _roc_axes(fig)
    assert [y for _, y in _points(final_ax)] == pytest.approx([0.9, 0.85])
    assert [y for _, y in _points(mask_ax)] == pytest.approx([0.8, 0.75, 0.7])


def test_roc_auc_draws_a_fully_decoded_panel_only_when_the_controls_keep_them_apart():
    data = report()
    data["controls"] = _controls("paper", "prm", "orm")  # the paper's: in [0, 0.1)
    fig = figures.roc_auc(data)
    strips, (mask_ax,) = _roc_axes(fig)
    assert all(y != pytest.approx(0.9) for _, y in _points(mask_ax))  # no final bucket
    assert "42208" not in [n for row in _counts(strips).values() for _, n in row]
    assert "in [0, 0.1) as the paper slices them" in fig.get_supxlabel()
    for slicing in ("split", None):  # None: controls written before they had a slicing
        data["controls"] = _controls(slicing, "prm", "orm")
        fig = figures.roc_auc(data)
        strips, (final_ax, mask_ax) = _roc_axes(fig)
        np.testing.assert_allclose(_points(final_ax), [(-1 / 15, 0.9), (1 / 15, 0.9)])
        assert _counts(strips)["PRM"][0] == (0.0, "42208")
        assert "fully decoded: their fully decoded states" in fig.get_supxlabel()


def test_roc_auc_with_controls_keeps_the_runs_final_auc_of_a_scorer_they_lack():
    data = report()
    data["controls"] = _controls("paper", "prm")  # the ORM scores no partial state
    fig = figures.roc_auc(data)
    _, (final_ax, mask_ax) = _roc_axes(fig)
    assert _points(final_ax) == [(0.0, 0.9)]  # the ORM's final candidates in the runs
    keys = _legend_keys(fig)
    assert list(keys) == ["PRM", "ORM (runs' final candidates)", "chance (0.5)"]
    assert {line.get_color() for line in _marker_lines(final_ax)} == {
        keys["ORM (runs' final candidates)"]
    }
    assert {line.get_color() for line in _marker_lines(mask_ax)} == {keys["PRM"]}
    assert "runs' final candidates: those of the runs' independent pools" in fig.get_supxlabel()


def test_roc_auc_names_every_drawn_series_and_its_labels_do_not_overlap():
    data = report()
    data["controls"] = _controls("split", "prm", "prm_mean", "prm_last")
    fig = figures.roc_auc(data)
    _, panels = _roc_axes(fig)
    keys = _legend_keys(fig)
    assert list(keys) == [
        "PRM",
        "PRM_MEAN",
        "PRM_LAST",
        "ORM (runs' final candidates)",
        "chance (0.5)",
    ]
    drawn = {line.get_color() for ax in panels for line in _marker_lines(ax)}
    assert drawn == set(keys.values()) - {figures.REFERENCE}
    # three series with n = 126624 in one bucket: their n, side by side, would collide
    _assert_readable(fig)


def test_roc_auc_draws_the_controls_series_when_the_report_has_them_and_extra_series():
    data = report()
    data["controls"] = {
        "auc_by_mask": [
            {"scorer": "prm", "buckets": _buckets({2: (0.6, 12), 4: (0.65, 14)}), "final": None},
            {"scorer": "orm", "buckets": _buckets({9: (0.55, 9)}), "final": _bucket(0, 0.9, 50)},
        ]
    }
    extra = [("ORM (paper)", _buckets({8: (0.7, 5), 9: (0.72, 6)}), None)]
    fig = figures.roc_auc(data, extra=extra)
    _, (final_ax, mask_ax) = _roc_axes(fig)
    lines = _auc_lines(mask_ax)
    assert set(lines) == {"PRM", "ORM", "ORM (paper)", "chance (0.5)"}
    assert _segments(lines["PRM"]) == []  # buckets 2 and 4: two points, no line between
    assert len(_segments(lines["ORM (paper)"])) == 1
    assert [line.get_ydata()[0] for line in _marker_lines(final_ax)] == [0.9]
    assert "collected trajectories" in fig.get_supxlabel()
    _assert_readable(fig)
    # an empty controls list falls back to the discrimination entries
    data["controls"] = {"auc_by_mask": []}
    _, (_, mask_ax) = _roc_axes(figures.roc_auc(data))
    assert set(_auc_lines(mask_ax)) == {"PRM", "chance (0.5)"}


def test_pool_diversity_uses_short_labels_and_states_units_and_intervals():
    data = report()
    fig = figures.pool_diversity(data)
    oracle, unique, entropy = fig.axes
    labels = [t.get_text() for t in oracle.get_yticklabels()]
    assert labels == [
        "independent n=8 (K=8)",
        "independent n=16 (K=16)",
        "prm_guided (K=2)",
        "prism n=9 (K=4)",
        "prism n=19 (K=4)",
    ]
    assert oracle.get_xlabel() == "Oracle@K (%)" and oracle.get_xlim() == (0, 100)
    pools = data["diagnostics"]["pools"]
    bars = [p for p in oracle.patches if isinstance(p, Rectangle)]
    assert [b.get_width() for b in bars] == pytest.approx(
        [100 * p["oracle"]["value"] for p in pools]
    )
    assert [b.get_width() for b in unique.patches] == pytest.approx([2.0] * 5)
    assert [b.get_width() for b in entropy.patches] == pytest.approx([0.5] * 5)
    assert [t for texts in _legend_texts(fig) for t in texts] == [
        "independent samples",
        "guided search (cuts, particles)",
        "other samplers (HEX, ensembles, remasking, …)",
    ]
    assert "95% bootstrap CIs over problems" in fig.get_supxlabel()
    _assert_readable(fig)


def test_short_labels_name_the_options_that_tell_pools_apart():
    labels = figures.short_labels(["smc:k=8,every=12", "smc:k=32,every=12", "hex:n=8"])
    assert labels == {
        "smc:k=8,every=12": "smc k=8",
        "smc:k=32,every=12": "smc k=32",
        "hex:n=8": "hex",
    }


def test_smc_ess_plots_ess_over_k_at_the_reports_checkpoint_indices_with_thresholds():
    data = report()
    fig = figures.smc_ess(data)
    axes = fig.axes
    assert len(axes) == 2  # one panel per SMC run, so K=2 and K=8 do not share an ESS scale
    for ax, entry, k in zip(axes, data["diagnostics"]["particles"], (2, 8), strict=True):
        assert ax.get_title().startswith(f"smc k={k} (K={k})")
        assert ax.get_ylim() == (0, 1.05)
        horizontal = [line for line in ax.get_lines() if line.get_marker() in ("None", "")]
        assert all(line.get_ydata()[0] == line.get_ydata()[1] for line in horizontal)
        thresholds = {line.get_label(): line.get_ydata()[0] for line in horizontal}
        assert thresholds == {"resample below 0.75·K": 0.75, "tempering target 0.5·K": 0.5}
        points = {line.get_label(): line for line in _marker_lines(ax)}
        rows = entry["by_checkpoint"]
        indices = [c["index"] for c in rows]
        for key, label in (("ess_before", "before resampling"), ("ess_after", "after resampling")):
            assert list(points[label].get_xdata()) == indices
            assert list(points[label].get_ydata()) == pytest.approx([c[key] / k for c in rows])
        assert [t for t in ax.get_xticks()] == indices
        # "before" is drawn over "after", smaller, so both show where they are equal
        before, after = points["before resampling"], points["after resampling"]
        assert before.get_zorder() >= after.get_zorder()
        assert before.get_markersize() < after.get_markersize()
    (legend,) = fig.legends
    assert len(legend.get_texts()) == 4
    assert all(len(t.get_text()) <= 30 for t in legend.get_texts())


def test_smc_ess_draws_after_resampling_only_where_particles_resampled():
    data = report()
    # K=8 never resampled (after = before); K=2 resampled at its second checkpoint only
    data["diagnostics"]["particles"] = [
        _smc(8, [(6.0, 6.0), (7.0, 7.0)]),
        _smc(2, [(1.8, 1.8), (0.9, 1.7)]),
    ]
    data["diagnostics"]["particles"][0]["resample_rate"] = 0.0
    fig = figures.smc_ess(data)
    never, once = fig.axes
    labels = {line.get_label() for line in _marker_lines(never)}
    assert labels == {"before resampling"}
    points = {line.get_label(): line for line in _marker_lines(once)}
    assert list(points["after resampling"].get_xdata()) == [1]
    assert list(points["after resampling"].get_ydata()) == pytest.approx([0.85])
    assert list(points["before resampling"].get_xdata()) == [0, 1]
    # every drawn series named in the one legend, though the first panel lacks one
    drawn = {line.get_label() for ax in fig.axes for line in ax.get_lines()}
    (keys,) = _legend_texts(fig)
    assert sorted(keys) == sorted(drawn)
    assert "only at checkpoints where some problem's particles resampled" in fig.get_supxlabel()


def test_smc_ess_legend_covers_no_text_with_one_panel_or_two():
    data = report()
    _assert_readable(figures.smc_ess(data))
    data["diagnostics"]["particles"] = data["diagnostics"]["particles"][1:]  # a narrow figure
    _assert_readable(figures.smc_ess(data))


def test_particle_count_falls_back_to_the_pool_size():
    data = report()
    entry = _smc(2, [(1.0, 1.0)])
    assert figures.particle_count(data, entry) == 2
    entry["pool"] = "smc:every=4"
    entry["methods"] = ["PRM Guided K=2 b=4"]  # a method of the pool of size 2
    assert figures.particle_count(data, entry) == 2
    entry["methods"] = ["nowhere"]
    assert figures.particle_count(data, entry) is None


def test_render_writes_what_the_report_has_and_leaves_the_rest_out(tmp_path):
    data = report()
    data["diagnostics"]["particles"] = []
    for entry in data["diagnostics"]["discrimination"]:
        entry["roc_auc_by_mask"] = _buckets({})
    written = figures.render(data, tmp_path)
    assert written == {"pareto": "pareto.png", "pool_diversity": "pool_diversity.png"}
    assert sorted(p.name for p in tmp_path.iterdir()) == ["pareto.png", "pool_diversity.png"]


def test_pareto_gives_two_methods_of_one_family_at_one_budget_a_row_each():
    data = report()
    data["methods"].append(
        _method("Majority@4", "majority", "independent:n=4+majority", 40, 0.58, 16)
    )
    left, right = figures.pareto(data).subfigs[-1].axes
    rows = [t.get_text() for t in left.get_yticklabels()]
    assert rows == [
        "Vanilla [1]",
        "Majority (Majority@8) [2]",
        "PRM Guided [3]",
        "Majority (Majority@4) [4]",
        "Oracle [5]",
    ]
    got = sorted((line.get_ydata()[0], line.get_xdata()[0]) for line in _marker_lines(left))
    np.testing.assert_allclose(got, [(0, 50), (1, 60), (2, 55), (3, 58), (4, 80)])
    assert len(_marker_lines(right)) == 4


def _spent(m: dict, passes: tuple[float, float, float], flops: float | None) -> None:
    """Give a method entry a measured spend: passes (mean, low, high), and FLOPs per pass."""
    mean, low, high = passes
    m["passes_per_problem"] = mean
    m["flops_per_problem"] = None if flops is None else mean * flops
    interval = {"value": mean, "low": low, "high": high}
    m["spend"] = {
        "passes": interval,
        "flops": None if flops is None else {k: v * flops for k, v in interval.items()},
    }


def _error_bars(ax) -> list[tuple[float, float, float]]:
    """(y, x0, x1) of every horizontal error bar of a panel, sorted."""
    found = []
    for collection in ax.collections:
        for (x0, y0), (x1, y1) in collection.get_segments():
            if y0 == y1 and x0 != x1:
                found.append((y0, x0, x1))
    return sorted(found)


def test_pareto_places_each_method_at_its_measured_spend_with_both_intervals():
    data = report()
    for m in data["methods"]:
        planned = m["passes_per_problem"]
        capped = m["family"] == "prm_guided"  # a cap it stays under, by a varying amount
        m["capped"] = capped
        spent = (0.75 * planned, 0.6 * planned, 0.9 * planned) if capped else (planned,) * 3
        _spent(m, spent, 2e12)
    fig = figures.pareto(data)
    passes_ax, flops_ax = fig.subfigs[1].axes
    assert "passes per problem" in passes_ax.get_xlabel()
    assert "FLOPs per problem" in flops_ax.get_xlabel()
    # one point per method: Vanilla, planned alike at both budgets, is one
    points = {m["id"]: m for m in data["methods"]}
    assert len(points) == 7
    for ax, unit in ((passes_ax, "passes"), (flops_ax, "flops")):
        lines = _marker_lines(ax)
        got = sorted((line.get_xdata()[0], line.get_ydata()[0]) for line in lines)
        want = sorted(
            (m["spend"][unit]["value"], 100 * m["accuracy"]["value"]) for m in points.values()
        )
        np.testing.assert_allclose(got, want)
        # the spend's interval horizontally, where it is one (the capped methods)
        bars = [
            (100 * m["accuracy"]["value"], m["spend"][unit]["low"], m["spend"][unit]["high"])
            for m in points.values()
            if m["capped"]
        ]
        np.testing.assert_allclose(_error_bars(ax), sorted(bars))
        diamonds = [line for line in lines if line.get_marker() == figures.CAPPED_MARKER]
        assert sorted(line.get_xdata()[0] for line in diamonds) == pytest.approx(
            sorted(m["spend"][unit]["value"] for m in points.values() if m["capped"])
        )
    (keys,) = [[t.get_text() for t in g.get_texts()] for g in fig.subfigs[1].legends]
    assert keys[-1].startswith("capped")
    # each point numbered with its row below; Vanilla, one method at both budgets, once
    rows = [t.get_text() for t in fig.subfigs[-1].axes[0].get_yticklabels()]
    numbers = {row.rsplit(" [", 1)[0]: row.rsplit(" [", 1)[1].rstrip("]") for row in rows}
    labels = {(t.xy, t.get_text()) for t in passes_ax.texts}
    assert labels == {
        (
            (m["passes_per_problem"], 100 * m["accuracy"]["value"]),
            numbers[figures.method_label(mid)[0]],
        )
        for mid, m in points.items()
    }


def test_pareto_draws_flops_only_when_every_method_has_them():
    data = report()
    for m in data["methods"]:
        _spent(m, (m["passes_per_problem"],) * 3, 1e12)
    data["methods"][2]["spend"]["flops"] = data["methods"][2]["flops_per_problem"] = None
    (passes_ax,) = figures.pareto(data).subfigs[1].axes
    assert "passes per problem" in passes_ax.get_xlabel()
    # a report of runs written before spend was measured: the passes means, no interval
    (old,) = figures.pareto(report()).subfigs[1].axes
    got = sorted((line.get_xdata()[0], line.get_ydata()[0]) for line in _marker_lines(old))
    want = sorted({(m["passes_per_problem"], 100 * m["accuracy"]["value"]) for m in METHODS})
    np.testing.assert_allclose(got, want)
    assert not _error_bars(old)


def test_budgets_in_flops_are_marked_on_the_flops_axis_only():
    data = report()
    data["budget_unit"] = "flops"
    data["budgets"] = [40 * 10**12, 80 * 10**12]
    for m in data["methods"]:
        m["budget"] *= 10**12
        _spent(m, (m["passes_per_problem"],) * 3, 1e12)
    fig = figures.pareto(data)
    pooled, spend, forest = fig.subfigs

    def dashed(ax) -> list[float]:
        return [line.get_xdata()[0] for line in ax.get_lines() if line.get_linestyle() == "--"]

    assert not any(dashed(ax) for ax in pooled.axes)
    passes_ax, flops_ax = spend.axes
    assert not dashed(passes_ax) and "dashed" not in passes_ax.get_xlabel()
    assert dashed(flops_ax) == data["budgets"] and "dashed" in flops_ax.get_xlabel()
    assert forest.axes[0].get_title(loc="left").startswith("budget 40 TFLOP")


def test_methods_at_one_spot_share_one_label_of_their_rows():
    data = report()
    majority, guided = data["methods"][1], data["methods"][2]  # rows 2 and 3, budget 40
    majority["passes_per_problem"] = guided["passes_per_problem"]
    majority["accuracy"] = dict(guided["accuracy"])
    (passes_ax,) = figures.pareto(data).subfigs[1].axes
    spot = (guided["passes_per_problem"], 100 * guided["accuracy"]["value"])
    assert [t.get_text() for t in passes_ax.texts if t.xy == spot] == ["2,3"]
