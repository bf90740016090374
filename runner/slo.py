"""Service-level objectives as users state them: "p90 ttft <= 500 ms".

An objective bounds a percentile of one per-request latency (TTFT, TPOT or E2EL, ms, as
`metrics` defines them) over a repeat's measured requests. A repeat's SLO **attainment**
is the share of its measured requests that completed and met every objective's bound
(a failed request meets none); the SLO **holds** when attainment reaches the target,
which defaults to the highest percentile the objectives name (p90 -> 0.90). Each
objective's own percentile is reported beside it, with whether it is within its bound.

`request_goodput` (``goodput_slo_ms``) stays as ``vllm bench serve --goodput`` defines
it: completed requests within every bound, per second of the load.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from typing import Literal

import numpy as np
from pydantic import BaseModel, ConfigDict, Field, field_serializer, field_validator

SLO_METRICS = ("ttft", "tpot", "e2el")
SLO_FORM = "'pNN METRIC <= LIMIT ms' with METRIC one of ttft, tpot, e2el (e.g. 'p90 ttft <= 500 ms')"
_SLO_TEXT = re.compile(r"p(?P<p>\d+(?:\.\d+)?)\s+(?P<metric>[a-z0-9]+)\s*<=\s*(?P<limit>\d+(?:\.\d+)?)\s*ms",
                       re.IGNORECASE)


class Objective(BaseModel):
    """One objective: the ``percentile``-th percentile of ``metric`` at most ``limit_ms``."""

    metric: Literal[SLO_METRICS]  # type: ignore[valid-type]
    percentile: float = Field(gt=0, lt=100)
    limit_ms: float = Field(gt=0)

    @classmethod
    def parse(cls, text: str) -> "Objective":
        """``"p90 ttft <= 500 ms"`` -> Objective (`ValueError` naming the expected form)."""
        match = _SLO_TEXT.fullmatch(str(text).strip())
        if not match:
            raise ValueError(f"expected {SLO_FORM}, got {text!r}")
        metric, p, limit = match["metric"].lower(), float(match["p"]), float(match["limit"])
        if metric not in SLO_METRICS:
            raise ValueError(f"{text!r}: metric {metric!r} is not one of {', '.join(SLO_METRICS)}")
        if not 0 < p < 100:
            raise ValueError(f"{text!r}: the percentile must lie between 0 and 100 (exclusive)")
        if limit <= 0:
            raise ValueError(f"{text!r}: the limit must be above 0 ms")
        return cls(metric=metric, percentile=p, limit_ms=limit)

    def __str__(self) -> str:
        return f"p{self.percentile:g} {self.metric} <= {self.limit_ms:g} ms"


def parse_objectives(texts: Sequence[str]) -> list[Objective]:
    """Each of ``texts`` parsed; the first bad one raises `ValueError` naming its position."""
    out = []
    for i, text in enumerate(texts):
        try:
            out.append(Objective.parse(text))
        except ValueError as e:
            raise ValueError(f"[{i}]: {e}") from None
    return out


class Slo(BaseModel):
    """A recipe's ``benchmark.slo``: objectives as stated, and the attainment it asks for
    (``target``, a share; default: the highest percentile / 100)."""

    model_config = ConfigDict(extra="forbid")

    objectives: list[Objective] = Field(min_length=1)
    target: float | None = Field(None, gt=0, le=1)

    @field_validator("objectives", mode="before")
    @classmethod
    def _stated(cls, v):
        if isinstance(v, (list, tuple)) and all(isinstance(x, str) for x in v):
            return parse_objectives(v)
        return v

    @field_validator("objectives")
    @classmethod
    def _one_per_metric(cls, v):
        if len({o.metric for o in v}) < len(v):
            raise ValueError(f"one objective per metric, got {[str(o) for o in v]}")
        return v

    @field_serializer("objectives")
    def _as_stated(self, v):
        return [str(o) for o in v]

    @property
    def attainment_target(self) -> float:
        return self.target if self.target is not None else max(o.percentile for o in self.objectives) / 100

    def evaluate(self, per_request: Sequence[dict], measured: int) -> "SloResult":
        """``per_request``: `metrics.request_latencies` of each completed request;
        ``measured``: every measured request, failed ones included (they count against
        attainment)."""
        met = sum(all(p[o.metric] is not None and p[o.metric] <= o.limit_ms for o in self.objectives)
                  for p in per_request)
        values: dict[str, float | None] = {}
        for o in self.objectives:
            v = [p[o.metric] for p in per_request if p[o.metric] is not None]
            values[str(o)] = float(np.percentile(v, o.percentile)) if v else None
        attainment = met / measured if measured else 0.0
        return SloResult(objectives=[str(o) for o in self.objectives], values_ms=values,
                         within={str(o): values[str(o)] is not None and values[str(o)] <= o.limit_ms
                                 for o in self.objectives},
                         attainment=attainment, target=self.attainment_target,
                         holds=attainment >= self.attainment_target)


class SloResult(BaseModel):
    """A repeat against its SLO (module doc): summary.json's ``slo``."""

    objectives: list[str]  # as stated: "p90 ttft <= 500 ms"
    values_ms: dict[str, float | None]  # each objective's percentile over the completed requests
    within: dict[str, bool]  # each objective's percentile within its limit
    attainment: float  # share of measured requests that completed and met every limit
    target: float
    holds: bool  # attainment >= target

