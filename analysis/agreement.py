"""How two clients' runs agree: the statistics of the cross-check's verdict (medians,
spreads, the issue's criterion, permutation p over runs, a client against itself, rank
correlation, a common-slope fit). The standard library's only: they run wherever attnbench
does."""

from __future__ import annotations

import itertools
import math
import random
import statistics


def median(values) -> float | None:
    """The median of the values that are not None (None: there are none)."""
    values = [v for v in values if v is not None]
    return statistics.median(values) if values else None


def spread(values) -> float | None:
    """Max - min over the median of the values that are not None, in % (None: none, or a
    median of 0)."""
    values = [v for v in values if v is not None]
    m = median(values)
    return (max(values) - min(values)) / m * 100 if values and m else None


def difference_pct(ours: list[float], theirs: list[float]) -> float | None:
    """The median of ``ours`` over the median of ``theirs``, minus 1, in % (None: a group is
    empty or ``theirs``' median is 0)."""
    a, v = median(ours), median(theirs)
    return (a - v) / v * 100 if a is not None and v else None


def criterion(ours: list[float], theirs: list[float]) -> tuple[bool, float, float, float] | None:
    """The issue's criterion for one metric over two groups of runs: the medians of runs
    within 5% of ``theirs``, and ``ours``' spread (max - min over median, %) no wider than
    ``theirs``' + 2 points. Returns (passes, difference %, our spread, their spread), or None
    when a group is empty or ``theirs``' median is 0."""
    diff, sa, sv = difference_pct(ours, theirs), spread(ours), spread(theirs)
    if diff is None or sa is None or sv is None:
        return None
    return abs(diff) <= 5 and sa <= sv + 2, diff, sa, sv


def permutation_p(a: list[float], b: list[float], draws: int = 20_000) -> float | None:
    """How often the difference of medians of two groups of runs is at least as large as
    ``a``'s against ``b``'s when the runs are dealt to the groups at random (two-sided):
    whether a difference between clients stands out from the run-to-run variation. Every
    split is enumerated when there are at most ``draws`` of them (5 + 5 runs: 252, and no
    difference of medians can reach below p = 12/252 = 0.048), else ``draws`` splits are
    drawn with a fixed seed."""
    if len(a) < 2 or len(b) < 2:
        return None
    runs = a + b
    observed = abs(statistics.median(a) - statistics.median(b)) - 1e-9

    def farther(picked) -> bool:
        rest = [x for i, x in enumerate(runs) if i not in picked]
        return abs(statistics.median([runs[i] for i in picked]) - statistics.median(rest)) >= observed

    if math.comb(len(runs), len(a)) <= draws:
        splits = [set(c) for c in itertools.combinations(range(len(runs)), len(a))]
    else:
        rng = random.Random(0)
        splits = [set(rng.sample(range(len(runs)), len(a))) for _ in range(draws)]
    return sum(map(farther, splits)) / len(splits)


def self_agreement(values: list[float]) -> float | None:
    """How often one client passes the issue's criterion against itself: every choice of
    n // 2 of its n runs against the rest (each half taken once as "ours" when n is even),
    the share of these deals that pass `criterion`. What a
    criterion can tell apart: where a client meets it against itself in only some of the
    deals, the server's run-to-run variation decides a verdict between clients as often.
    None with fewer than 6 runs (halves of 3)."""
    if len(values) < 6:
        return None
    n = len(values)
    deals = []
    for picked in itertools.combinations(range(n), n // 2):
        half = [values[i] for i in picked]
        rest = [values[i] for i in range(n) if i not in picked]
        deals += [(half, rest), (rest, half)] if n % 2 == 0 else [(half, rest)]
    results = [criterion(a, b) for a, b in deals]
    return sum(bool(r and r[0]) for r in results) / len(results)


def _ranks(values: list[float]) -> list[float]:
    """Each value's rank (0-based); tied values share the mean of their ranks."""
    order = sorted(range(len(values)), key=values.__getitem__)
    ranks = [0.0] * len(values)
    start = 0
    while start < len(order):
        end = start
        while end + 1 < len(order) and values[order[end + 1]] == values[order[start]]:
            end += 1
        for i in order[start:end + 1]:
            ranks[i] = (start + end) / 2
        start = end + 1
    return ranks


def spearman(xs: list[float], ys: list[float]) -> float | None:
    """Spearman's rho of two paired lists (tied values share their mean rank); None when
    under 2 pairs or when either list is constant."""
    if len(xs) < 2 or len(set(xs)) < 2 or len(set(ys)) < 2:
        return None
    return statistics.correlation(_ranks(xs), _ranks(ys))


def common_slope_fit(xs: list[list[float]], ys: list[list[float]]) -> tuple[float, list[float], float, float]:
    """Least squares of y over x with one slope for every group and one offset per group
    (analysis of covariance): (slope, each group's offset, the residuals' standard
    deviation, the correlation of x and y over all points). A difference of two offsets is
    the difference of the groups at equal x."""
    centred = [([x - statistics.fmean(gx) for x in gx], [y - statistics.fmean(gy) for y in gy])
               for gx, gy in zip(xs, ys)]
    sxx = sum(x * x for cx, _ in centred for x in cx)
    slope = sum(x * y for cx, cy in centred for x, y in zip(cx, cy)) / sxx if sxx else 0.0
    offsets = [statistics.fmean(gy) - slope * statistics.fmean(gx) for gx, gy in zip(xs, ys)]
    residuals = [y - slope * x for cx, cy in centred for x, y in zip(cx, cy)]
    flat_x, flat_y = [x for g in xs for x in g], [y for g in ys for y in g]
    return slope, offsets, statistics.pstdev(residuals), statistics.correlation(flat_x, flat_y)
