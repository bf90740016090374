"""The tuner: sweep launch configs per case, fit a decision tree, emit it as code.

The paper's workflow (sec. 5.2): tune outside the server with microbenchmarks, then export
the result as simple if/else heuristics that generalize to unseen batches and cost nothing
at launch (and are compatible with CUDA graphs). Here:

1. ``sweep``: for every case of a microbenchmark suite and every config of a search space,
   check the result against the reference and time it (do_bench median, L2 flushed).
2. ``fit``: label each case with its fastest config and fit a shallow
   ``sklearn.tree.DecisionTreeClassifier`` on batch features the launcher knows on the host.
3. ``emit``: print the tree as a Python function ``choose(shape, platform) -> dict``, written
   to ``kernels/dispatch/tuned_<device>.py``; `heuristics.choose_config` uses it for that device.
"""

from __future__ import annotations

import csv
import itertools
import json
from pathlib import Path

from pydantic import BaseModel, ConfigDict, Field

from attnbench.validation import validate_yaml

FEATURES = ("decode_only", "max_seqlen_q", "avg_seqlen_q", "max_seqlen_k", "num_seqs",
            "queries_per_kv", "kv_programs")


class SearchSpace(BaseModel):
    """Per variant, the values to try for each KernelConfig field (cartesian product); a list
    of such products where parts of a variant's space differ in kind (the Gluon kernel of
    the qblock step fixes its own warps and stages)."""

    model_config = ConfigDict(extra="forbid")
    variants: dict[str, dict[str, list] | list[dict[str, list]]] = Field(min_length=1)

    def configs(self):
        from ..config import KernelConfig

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


def features(shape) -> dict:
    """The host-side batch facts a tuned tree may split on."""
    return {
        "decode_only": int(shape.max_seqlen_q == 1),
        "max_seqlen_q": shape.max_seqlen_q,
        "avg_seqlen_q": shape.avg_seqlen_q,
        "max_seqlen_k": shape.max_seqlen_k,
        "num_seqs": shape.num_seqs,
        "queries_per_kv": shape.queries_per_kv,
        "kv_programs": shape.num_seqs * shape.num_kv_heads,
    }


def sweep(suite, space: SearchSpace, out_csv: Path, device: str = "cuda", only=None) -> list[dict]:
    """Time every config of ``space`` on every case; rows go to ``out_csv`` as measured."""
    import torch

    from .microbench import build_batch
    from .implementations import prepare
    from .timing import time_us
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
                        row.update(status="ok", median_us=time_us(prepared.run, 10, 40, dev)[0])
                except Exception as e:  # noqa: BLE001 - an unbuildable config is just not a candidate
                    row.update(status=f"error: {type(e).__name__}")
                writer.writerow(row)
                fh.flush()
                rows.append(row)
            del batch, ref
    return rows


def best_per_case(rows: list[dict]) -> dict[str, dict]:
    """The fastest correct config of every case."""
    best: dict[str, dict] = {}
    for r in rows:
        if r["status"] != "ok":
            continue
        if r["case"] not in best or float(r["median_us"]) < float(best[r["case"]]["median_us"]):
            best[r["case"]] = r
    return best


def fit_tree(rows: list[dict], max_depth: int = 3):
    """Fit a classifier from case features to the label of its fastest config."""
    from sklearn.tree import DecisionTreeClassifier

    best = best_per_case(rows)
    if not best:
        raise ValueError("no case has a correct, timed config: nothing to fit")
    labels = sorted({r["config"] for r in best.values()})
    x = [[float(r[f]) for f in FEATURES] for r in best.values()]
    y = [labels.index(r["config"]) for r in best.values()]
    tree = DecisionTreeClassifier(max_depth=max_depth, random_state=0).fit(x, y)
    return tree, labels


def emit_python(tree, labels: list[str], device_name: str, source: str) -> str:
    """The fitted tree as a small, readable ``choose(shape, platform) -> dict`` function."""
    t = tree.tree_
    lines = [
        f'"""Decision tree tuned by `attnbench tune` on {device_name}.',
        "",
        f"Source measurements: {source}. Regenerate rather than edit by hand.",
        '"""',
        "",
        "from attnbench.kernels.bench.tune import features",
        "",
        "",
        "def choose(shape, platform) -> dict:",
        "    f = features(shape)",
    ]

    def walk(node: int, depth: int):
        pad = "    " * depth
        if t.children_left[node] == -1:
            config = json.loads(labels[int(t.value[node][0].argmax())])
            lines.append(f"{pad}return {config!r}")
            return
        name, thr = FEATURES[t.feature[node]], t.threshold[node]
        lines.append(f"{pad}if f[{name!r}] <= {thr:g}:")
        walk(t.children_left[node], depth + 1)
        lines.append(f"{pad}else:")
        walk(t.children_right[node], depth + 1)

    walk(0, 1)
    return "\n".join(lines) + "\n"
