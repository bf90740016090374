"""The tuner: sweep launch configs per case, fit a decision tree, emit it as code.

The paper's workflow (sec. 5.2): tune outside the server with microbenchmarks, then export
the result as simple if/else heuristics that generalize to unseen batches and cost nothing
at launch (and are compatible with CUDA graphs). Here:

1. ``sweep``: for every case of a microbenchmark suite and every config of a search space,
   check the result against the reference and time it (do_bench median, L2 zeroed; on a
   GPU the best of eager launches and CUDA-graph replays, as the microbenchmark reports).
2. ``fit``: fit a shallow ``sklearn.tree.DecisionTreeRegressor`` from batch features the
   launcher knows on the host to each config's slowdown on the case; every leaf runs the
   config of least mean slowdown there, and `regret` says what the picks cost per case.
3. ``emit``: print the tree as a Python function ``choose(shape, platform) -> dict``, written
   to ``kernels/dispatch/tuned_<device>.py``; `heuristics.choose_config` uses it for that device.
"""

from __future__ import annotations

import csv
import dataclasses
import itertools
import json
from pathlib import Path

from pydantic import BaseModel, ConfigDict, Field

from attnbench.validation import validate_yaml

from ..config import BatchShape, KernelConfig
from ..dispatch.features import FEATURES, features

# the configs a fitted tree may pick: within 2% of some case's fastest (closer than the
# run-to-run spread of one config); and the most a wrong pick counts in the fit (x its best)
NEAR_BEST = 0.02
SLOWDOWN_CAP = 3.0


class SearchSpace(BaseModel):
    """Per variant, the values to try for each KernelConfig field (cartesian product); a list
    of such products where parts of a variant's space differ in kind (tiles that need
    other warps, say)."""

    model_config = ConfigDict(extra="forbid")
    variants: dict[str, dict[str, list] | list[dict[str, list]]] = Field(min_length=1)

    def configs(self):
        for variant, spaces in self.variants.items():
            for axes in spaces if isinstance(spaces, list) else [spaces]:
                names = sorted(axes)
                for values in itertools.product(*(axes[n] for n in names)):
                    try:
                        yield KernelConfig(variant=variant, **dict(zip(names, values)))
                    except ValueError:
                        continue  # e.g. a tile too small for tl.dot


def load_space(path: str | Path) -> SearchSpace:
    """A tuner search space (recipes/microbench/tune-space.yaml); ValueError names the file
    and every invalid field."""
    return validate_yaml(SearchSpace, path, "tuner search space")


def sweep(suite, space: SearchSpace, out_csv: Path, device: str = "cuda", only=None) -> list[dict]:
    """Time every config of ``space`` on every case; rows go to ``out_csv`` as measured."""
    import torch  # lazy: fitting from a CSV (`tune --no-sweep`) needs no torch

    from .microbench import build_batch
    from .implementations import prepare
    from .reference import within_tolerance

    dev = torch.device(device)
    configs = list(space.configs())
    cases = [c for c in suite.all_cases() if not only or c.name in only or c.group in only]
    out_csv = Path(out_csv)
    out_csv.parent.mkdir(parents=True, exist_ok=True)
    fields = ["case", "config", "status", "median_us", *FEATURES]
    rows = []
    with out_csv.open("w", newline="") as fh:
        writer = csv.DictWriter(fh, fieldnames=fields)
        writer.writeheader()
        for i, case in enumerate(cases):
            batch = build_batch(suite, case, dev, seed=suite.seed + i)
            ref = batch.reference()
            for config in configs:
                row = {"case": case.name, "config": json.dumps(config.as_dict(), sort_keys=True),
                       **features(batch.shape)}
                try:
                    prepared = prepare(config.variant, batch, config)
                    _, ok = within_tolerance(prepared.run()[: batch.num_tokens], ref, batch.dtype)
                    if not ok:
                        row.update(status="mismatch")
                    else:
                        row.update(status="ok", median_us=best_time_us(prepared.run, dev))
                except Exception as e:  # noqa: BLE001 - an unbuildable config is just not a candidate
                    row.update(status=f"error: {type(e).__name__}")
                writer.writerow(row)
                fh.flush()
                rows.append(row)
            del batch, ref
    return rows


def best_time_us(run, device) -> float:
    """Median time of one call of ``run``, microseconds: on a GPU the better of eager
    launches and CUDA-graph replays (a short kernel's eager time is the host's launch cost,
    which a server's graphs do not pay), under the interpreter the wall clock."""
    from .timing import time_graph_us, time_us  # lazy: torch, as in `sweep`

    eager = time_us(run, 10, 40, device)[0]
    if device.type != "cuda":
        return eager
    return min(eager, time_graph_us(run, 10, 40)[0])


def best_per_case(rows: list[dict]) -> dict[str, dict]:
    """The fastest correct config of every case."""
    best: dict[str, dict] = {}
    for r in rows:
        if r["status"] != "ok":
            continue
        if r["case"] not in best or float(r["median_us"]) < float(best[r["case"]]["median_us"]):
            best[r["case"]] = r
    return best


def _times(rows: list[dict]) -> dict[tuple[str, str], float]:
    """(case, config) -> median microseconds of every correct, timed row."""
    return {(r["case"], r["config"]): float(r["median_us"]) for r in rows if r["status"] == "ok"}


def fit_tree(rows: list[dict], max_depth: int = 3):
    """Fit a regression tree from a case's features to the slowdown of every candidate
    config on it (its time over the case's fastest, at most `SLOWDOWN_CAP`; where it did
    not run correctly, the cap). Each leaf runs the config of least mean slowdown over its
    cases (`leaf_config`), so the splits follow what a wrong pick costs, not which of two
    near-equal configs happened to win; `pick` and the emitted code keep only the splits
    that pay (`_split_pays`). Candidates: the configs within `NEAR_BEST` of some case's
    fastest. Returns the tree and the candidates (its outputs, in order)."""
    from sklearn.tree import DecisionTreeRegressor  # lazy: scikit-learn is the `kernels` extra's

    best = {case: float(r["median_us"]) for case, r in best_per_case(rows).items()}
    if not best:
        raise ValueError("no case has a correct, timed config: nothing to fit")
    times = _times(rows)
    labels = sorted({c for (case, c), t in times.items() if t <= (1 + NEAR_BEST) * best[case]})
    facts = {r["case"]: r for r in rows}
    x = [[float(facts[case][f]) for f in FEATURES] for case in best]
    y = [[min(times.get((case, c), float("inf")) / b, SLOWDOWN_CAP) for c in labels] for case, b in best.items()]
    tree = DecisionTreeRegressor(max_depth=max_depth, random_state=0).fit(x, y)
    return tree, labels


def leaf_config(tree, labels: list[str], node: int) -> str:
    """The config a node of `fit_tree`'s tree runs: least mean slowdown over its cases."""
    return labels[int(tree.tree_.value[node][:, 0].argmin())]


def _merged_cost(t, node: int, column: int | None = None) -> float:
    """Mean slowdown over a node's cases if they all ran one config: candidate ``column``,
    or (None) the one that suits them best."""
    costs = t.value[node][:, 0]
    return float(costs.min() if column is None else costs[column])


def _cost(t, node: int) -> float:
    """Mean slowdown over a node's cases of the configs the pruned tree runs for them."""
    if not _split_pays(t, node):
        return _merged_cost(t, node)
    left, right = t.children_left[node], t.children_right[node]
    n = t.weighted_n_node_samples
    return (n[left] * _cost(t, left) + n[right] * _cost(t, right)) / n[node]


def _split_pays(t, node: int) -> bool:
    """Whether a split saves the cases of one side more than `NEAR_BEST` of mean slowdown
    over running the node's one best config for them too. The fit splits on any
    difference, timing noise included; a side of few cases that the node's config suits
    badly is worth its split."""
    if t.children_left[node] == -1:
        return False
    merged = int(t.value[node][:, 0].argmin())
    return any(_merged_cost(t, side, merged) - _cost(t, side) > NEAR_BEST
               for side in (t.children_left[node], t.children_right[node]))


def pick(tree, labels: list[str], x: list[float]) -> str:
    """The config the pruned tree runs for a case with features ``x`` (`FEATURES` order)."""
    t, node = tree.tree_, 0
    while _split_pays(t, node):
        node = t.children_left[node] if x[t.feature[node]] <= t.threshold[node] else t.children_right[node]
    return leaf_config(tree, labels, node)


def regret(tree, labels: list[str], rows: list[dict]) -> list[dict]:
    """Per case: its fastest time, the config the fitted tree picks for it and that
    config's time (None where it did not run correctly), in microseconds."""
    times = _times(rows)
    out = []
    for case, b in best_per_case(rows).items():
        picked = pick(tree, labels, [float(b[f]) for f in FEATURES])
        out.append({"case": case, "best_us": float(b["median_us"]), "picked": picked,
                    "picked_us": times.get((case, picked))})
    return out


def shape_of(row: dict):
    """A `BatchShape` whose `features` are those of a sweep row (the sweep stores features,
    not shapes): what an emitted tree's ``choose`` reads. The head size is no feature: 0."""
    num_seqs = int(float(row["num_seqs"]))
    kv_heads = int(float(row["kv_programs"])) // num_seqs
    return BatchShape(num_seqs=num_seqs, num_tokens=round(float(row["avg_seqlen_q"]) * num_seqs),
                      max_seqlen_q=int(float(row["max_seqlen_q"])), max_seqlen_k=int(float(row["max_seqlen_k"])),
                      num_q_heads=int(float(row["queries_per_kv"])) * kv_heads, num_kv_heads=kv_heads, head_size=0)


def module_picks(choose, rows: list[dict]) -> list[dict]:
    """`regret`'s rows for an emitted tree's ``choose(shape, platform)`` (the checked-in
    `tuned_<device>.py`, say) read on a sweep: per case its fastest time, the config
    ``choose`` returns for it (`KernelConfig`'s defaults for the fields it leaves out, as
    ``auto`` runs it) and that config's time in the sweep (None where it did not run correctly or was not
    swept), in microseconds."""
    def key(config: dict) -> str:  # the same config however many of its defaults are spelt out
        return json.dumps(compact_config(json.dumps(config)), sort_keys=True)

    times = {(case, key(json.loads(config))): t for (case, config), t in _times(rows).items()}
    out = []
    for case, b in best_per_case(rows).items():
        picked = choose(shape_of(b), None)
        out.append({"case": case, "best_us": float(b["median_us"]), "picked": json.dumps(picked, sort_keys=True),
                    "picked_us": times.get((case, key(picked)))})
    return out


def describe_total(picks: list[dict]) -> str:
    """One line over `regret` or `module_picks` rows: the picks' times summed against the
    fastest per case, and the worst pick."""
    timed = [p for p in picks if p["picked_us"] is not None]
    line = (f"picks summed over {len(timed)} cases: {sum(p['picked_us'] for p in timed):,.1f} us "
            f"(fastest per case: {sum(p['best_us'] for p in timed):,.1f} us)")
    if timed:
        worst = max(timed, key=lambda p: p["picked_us"] / p["best_us"])
        line += f"; worst {worst['picked_us'] / worst['best_us'] - 1:+.1%} ({worst['case']})"
    missing = [p["case"] for p in picks if p["picked_us"] is None]
    return line + (f"; not timed correctly in the sweep: {', '.join(missing)}" if missing else "")


def compact_config(config_json: str) -> dict:
    """A config's variant and the fields that differ from `KernelConfig`'s defaults (what
    ``KernelConfig(**...)`` needs to rebuild it)."""
    config = KernelConfig.of(json.loads(config_json)).as_dict()
    defaults = {f.name: f.default for f in dataclasses.fields(KernelConfig)}
    return {k: v for k, v in config.items() if k == "variant" or v != defaults[k]}


def describe_pick(p: dict) -> str:
    """One line of `regret`: the case, its fastest time, the tree's pick and what it costs."""
    if p["picked_us"] is None:
        cost = "did not run correctly"
    else:
        cost = f"{p['picked_us']:.1f} us ({p['picked_us'] / p['best_us'] - 1:+.1%})"
    return f"{p['case']}: fastest {p['best_us']:.1f} us; the tree's pick {cost}: {compact_config(p['picked'])}"


def emit_python(tree, labels: list[str], device_name: str, source: str, picks: list[dict] | None = None) -> str:
    """The fitted tree as a small, readable ``choose(shape, platform) -> dict`` function;
    ``picks`` (`regret`) are listed in its docstring."""
    t = tree.tree_
    lines = [
        f'"""Decision tree tuned by `attnbench tune` on {device_name}.',
        "",
        f"Source measurements: {source}. Regenerate rather than edit by hand.",
    ]
    if picks:
        lines += ["", "Per case of the sweep (its median times):", ""]
        lines += [f"* {describe_pick(p)}" for p in picks]
    lines += [
        '"""',
        "",
        "from attnbench.kernels.dispatch.features import features",
        "",
        "",
        "def choose(shape, platform) -> dict:",
        "    f = features(shape)",
    ]

    def walk(node: int, depth: int):
        pad = "    " * depth
        if not _split_pays(t, node):
            lines.append(f"{pad}return {compact_config(leaf_config(tree, labels, node))!r}")
            return
        name, thr = FEATURES[t.feature[node]], t.threshold[node]
        lines.append(f"{pad}if f[{name!r}] <= {thr:g}:")
        walk(t.children_left[node], depth + 1)
        lines.append(f"{pad}else:")
        walk(t.children_right[node], depth + 1)

    walk(0, 1)
    return "\n".join(lines) + "\n"
