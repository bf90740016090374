"""What every figure shares: matplotlib without a display, the Okabe-Ito colours, the
provenance footnote, and the one way a figure is written (PNG + SVG, with the data it
plots as CSV beside it). A figure whose data is missing is skipped with a `MissingData`
warning."""

from __future__ import annotations

import io
import warnings
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import pandas as pd  # noqa: E402
from PIL import Image  # noqa: E402  (matplotlib's own dependency)

from attnbench.runner.names import inside  # noqa: E402

OKABE_ITO = ["#0072B2", "#E69F00", "#009E73", "#D55E00", "#CC79A7", "#56B4E9", "#F0E442", "#000000"]


class MissingData(UserWarning):
    """A figure was skipped because its data is not there."""


def skip(name: str, why: str) -> list[Path]:
    warnings.warn(f"figure {name} skipped: {why}", MissingData, stacklevel=3)
    return []


def footnote(df: pd.DataFrame) -> str:
    """'GPU | model (weights) | vLLM | date' from the provenance columns of a frame."""
    def values(col):
        return sorted({str(v) for v in df.get(col, pd.Series(dtype=str)).dropna() if str(v)})
    model = ", ".join(values("model")) or "model ?"
    weights = values("weights")
    if any("dummy" in w or "random" in w for w in weights):
        model += " (dummy weights)" if any("dummy" in w for w in weights) else " (random weights)"
    parts = [", ".join(values("gpu")) or "device ?", model,
             "vLLM " + (", ".join(values("vllm_version")) or "?"), ", ".join(values("date"))]
    return " | ".join(p for p in parts if p)


def micro_footnote(mb: pd.DataFrame) -> str:
    """'device | torch | triton | vLLM | heads, dtype' of microbenchmark rows."""
    def values(col):
        return ", ".join(sorted({str(v) for v in mb.get(col, pd.Series(dtype=str)).dropna() if str(v)}))
    heads = ", ".join(sorted({f"{q}/{k}/{d}" for q, k, d in zip(mb["num_q_heads"], mb["num_kv_heads"], mb["head_size"])}))
    return (f"{values('device')} | torch {values('torch')} | triton {values('triton')} | "
            f"{values('vllm') or 'no vLLM'} | q/kv heads/head size {heads}, {values('dtype')}")


def add_footnote(fig, text: str) -> None:
    """``text`` under everything the axes draw (tick labels of any height included)."""
    fig.canvas.draw()
    renderer = fig.canvas.get_renderer()
    to_fig = fig.transFigure.inverted()
    bottom = min(ax.get_tightbbox(renderer).transformed(to_fig).y0 for ax in fig.axes)
    fig.text(0.01, bottom - 0.02, text, fontsize=8, ha="left", va="top")


PNG_DPI = 120
PNG_COLORS = 256  # a palette PNG: a quarter of the RGBA file's size, the same picture for line and bar plots


def save_figure(fig, data: pd.DataFrame, out_dir: Path, name: str) -> list[Path]:
    """``out_dir/name``.png (palette colours, so that figures kept in a repository stay
    small), .svg and .csv (``data``); the figure is closed."""
    out_dir.mkdir(parents=True, exist_ok=True)
    paths = [inside(out_dir, out_dir / f"{name}.{ext}") for ext in ("png", "svg", "csv")]
    buffer = io.BytesIO()
    fig.savefig(buffer, format="png", dpi=PNG_DPI, bbox_inches="tight")
    buffer.seek(0)
    Image.open(buffer).convert("RGB").quantize(PNG_COLORS).save(paths[0], optimize=True)
    fig.savefig(paths[1], bbox_inches="tight")
    plt.close(fig)
    data.to_csv(paths[2], index=False)
    return paths
