"""The knee: the highest request rate at which a server still meets its SLO.

A knee run (``benchmark.knee`` with ``benchmark.slo``) measures probes instead of repeats,
all on one server start, each a full measured repeat after its own warm-up (``r<k>`` of
the run is probe k). The search (`next_rate`) is deterministic given what the probes
measured:

1. a burst (every request at once): the heaviest load, and its throughput C (completed
   requests / s). If the SLO holds even then, the knee is at or above C; a degraded probe
   (requests failed or timed out) does not hold. C is where the search starts, not a bound:
   a burst spends its first seconds on prefill and its last on a draining batch, so a server
   may sustain more than C in steady arrivals (FLASH_ATTN on the H100: C = 25 req/s, knee 34);
2. arrivals at C (``benchmark.arrival``, Poisson by default), then C/2, C/4, ... until one
   holds, or 2C, 4C, ... until one does not: the highest rate that held (lo) and the lowest
   that did not (hi) bracket the knee;
3. the geometric middle of the bracket until hi <= lo x (1 + ``tolerance``).

A rated probe holds only where the server kept up with it: its attainment reached the target
and it completed at least ``keep_up`` (0.9) of the requests that arrived in the second half of
its arrivals in that half (`metrics.keep_up`). A server that falls behind builds a queue; a
probe too short for the queue to show would pass an SLO the server cannot keep. So a rated
probe also sends at least ``probe_s`` seconds of arrivals (`KneeSettings.requests_at`):
``num_prompts`` alone would be a transient at high rates (500 requests at 46 req/s arrive in
11 s and fit in the running batch; FLASH_ATTN on the H100 "held" that rate).

The knee is lo, the highest measured rate at which the SLO held: within ``tolerance``
below the true knee. A knee between C/4 and 2C is found in at most 8 probes at the default
5% (burst, C, C/2 or 2C, C/4, then four halvings of a bracket of 2x); the search stops at
``max_probes`` and says when it did not converge. A probe that failed (no request
completed, the server died) ends the search. A rate that held above one that did not (a
noisy server) is kept in the path, and the bracket is the lowest failing rate and the
highest holding rate below it. `KneeResult` (the run's ``knee.json``) keeps every probe:
the search path.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

from pydantic import BaseModel, ConfigDict

from .recipe import KneeSettings
from .summary import RepeatSummary

KNEE_FILE = "knee.json"


class Probe(BaseModel):
    """One measured rate of the search (from its repeat's summary)."""

    model_config = ConfigDict(ser_json_inf_nan="strings")  # the burst's rate reads back as inf

    repeat: int  # r<k> of the run
    rate: float  # offered request rate (req/s); inf: the burst
    status: str
    requests: int | None = None  # requests sent (completed + failed)
    attainment: float | None = None  # share of requests within every objective
    keep_up: float | None = None  # completions per arrival over the second half of the arrivals
    holds: bool = False  # attainment reached the target in a repeat that is ok and kept up
    request_throughput: float | None = None  # completed requests / s
    goodput: float | None = None  # requests within every objective / s
    output_throughput: float | None = None
    output_tokens_per_joule: float | None = None  # where the GPUs' energy reading is valid

    @classmethod
    def of(cls, summary: RepeatSummary, keep_up: float) -> "Probe":
        """The probe its repeat's summary measured; ``keep_up``: the least `metrics.keep_up`
        at which a rated probe holds (`KneeSettings.keep_up`)."""
        slo, energy = summary.slo, summary.energy
        kept_up = summary.keep_up is None or summary.keep_up >= keep_up
        measured = summary.completed + summary.failed
        valid = energy is not None and energy.valid and energy.joules_per_output_token
        return cls(repeat=summary.repeat or 0, rate=summary.request_rate, status=summary.status, requests=measured,
                   attainment=slo.attainment if slo else None, keep_up=summary.keep_up,
                   holds=bool(slo and slo.holds and summary.measured and kept_up),
                   request_throughput=summary.request_throughput,
                   goodput=slo.attainment * measured / summary.duration if slo and summary.duration else None,
                   output_throughput=summary.output_throughput,
                   output_tokens_per_joule=1 / energy.joules_per_output_token if valid else None)


def bracket(probes: Sequence[Probe]) -> tuple[float | None, float | None]:
    """(lo, hi): the highest finite rate that held below the lowest that did not."""
    rated = [p for p in probes if math.isfinite(p.rate)]
    hi = min((p.rate for p in rated if not p.holds), default=None)
    lo = max((p.rate for p in rated if p.holds and (hi is None or p.rate < hi)), default=None)
    return lo, hi


def next_rate(probes: Sequence[Probe], settings: KneeSettings) -> float | None:
    """The rate to measure next (req/s; inf: the burst), None when the search is over."""
    if not probes:
        return math.inf
    burst = probes[0]
    if len(probes) >= settings.max_probes or any(p.status == "failed" for p in probes):
        return None  # out of probes, or a probe measured nothing (the server died)
    if burst.holds or not burst.request_throughput:
        return None  # holds at the heaviest load: the knee is at or above capacity
    lo, hi = bracket(probes)
    if lo is None and hi is None:
        return burst.request_throughput
    if lo is None:
        return hi / 2
    if hi is None:
        return lo * 2  # held at the burst's capacity: above it, a queue grows without bound
    if hi <= lo * (1 + settings.tolerance):
        return None
    return math.sqrt(lo * hi)


class KneeResult(BaseModel):
    """A knee run's ``knee.json``: the SLO, the search path and where it ended."""

    model_config = ConfigDict(ser_json_inf_nan="strings")

    run: str
    slo: list[str]
    target: float
    tolerance: float
    max_probes: int
    probes: list[Probe]
    burst_throughput: float | None = None  # req/s: completed requests / s at the burst, C
    knee_rate: float | None  # req/s: the highest measured rate at which the SLO held
    upper_rate: float | None  # the lowest measured rate at which it did not
    converged: bool  # upper_rate <= knee_rate x (1 + tolerance), or the SLO held at the burst
    verdict: str  # one line

    @classmethod
    def of(cls, run: str, probes: Sequence[Probe], settings: KneeSettings, slo: list[str], target: float) -> "KneeResult":
        lo, hi = bracket(probes)
        failed = next((p for p in probes if p.status == "failed"), None)
        if probes and probes[0].holds:
            converged, verdict = True, (f"the SLO holds even at a burst: the knee is at or above the burst's throughput, "
                                        f"{probes[0].request_throughput:.3g} req/s")
        elif failed is not None:
            converged, verdict = False, f"probe r{failed.repeat} measured nothing ({failed.status}): no knee"
        elif lo is not None and hi is not None and hi <= lo * (1 + settings.tolerance):
            converged, verdict = True, (f"knee {lo:.3g} req/s: the SLO holds there and not at {hi:.3g} req/s "
                                        f"({len(probes)} probes)")
        elif lo is None:
            converged, verdict = False, (f"the SLO held at no rate down to {hi:.3g} req/s in {len(probes)} probes: "
                                         "the knee is lower")
        else:
            converged, verdict = False, (f"between {lo:.3g} and {hi:.3g} req/s after {len(probes)} probes (not within "
                                         f"{settings.tolerance:.0%}: raise benchmark.knee.max_probes)" if hi
                                         else f"the SLO held up to {lo:.3g} req/s and failed at no rate above it")
        for p in probes:  # met the SLO while a queue grew: says why such a rate did not hold
            if p.keep_up is not None and p.keep_up < settings.keep_up and (p.attainment or 0) >= target:
                verdict += (f"; at {p.rate:.3g} req/s (r{p.repeat}) the SLO was met but the server completed "
                            f"only {p.keep_up:.0%} of its arrivals: a queue was growing")
        return cls(run=run, slo=slo, target=target, tolerance=settings.tolerance, max_probes=settings.max_probes,
                   probes=list(probes), burst_throughput=probes[0].request_throughput if probes else None,
                   knee_rate=lo if not (probes and probes[0].holds) else None, upper_rate=hi,
                   converged=converged, verdict=verdict)
