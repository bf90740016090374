"""What a repeat sends and on which clock: the one place that turns a recipe's
``benchmark`` into a load.

Three clocks:
  schedule   requests released at ``request_rate`` (``arrival`` gaps, or all at once), as
             `vllm bench serve` releases them: every kind of prompt but the two below;
  trace      a trace's own timestamps, divided by ``speedup`` (dataset kind ``trace``);
  closed     conversations that send each turn when its answer before has arrived
             (dataset kind ``multiturn``; runner/multiturn.py).
`Workload.timing` says which, in one line that goes into the run's provenance and every
repeat's summary (``load_timing``), so a result never hides how its load was timed.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from pathlib import Path

from .datasets import BenchRequest, LocalTokenizer, build_requests, multiturn_conversations, trace_requests, trace_rows
from .loadgen import arrival_offsets
from .multiturn import ConversationLoad
from .recipe import BenchmarkSettings


@dataclass
class Workload:
    requests: list[BenchRequest]  # of a multi-turn load: each conversation's first turn
    trace_offsets: list[float] | None = None  # s from the start, a trace's arrivals / speedup
    conversations: ConversationLoad | None = None

    @classmethod
    def of(cls, b: BenchmarkSettings, tokenizer_dir: str | Path, count: int | None = None) -> "Workload":
        """The load of ``b`` (``count`` requests instead of ``num_prompts``, where the
        schedule's clock allows: a knee probe's); raises DatasetError."""
        spec, count = b.dataset, count or b.num_prompts
        if spec.kind == "trace":
            rows = trace_rows(spec, count)
            requests = trace_requests(rows, LocalTokenizer(tokenizer_dir), b.seed, spec.block_size)
            return cls(requests, trace_offsets=[r.arrival_s / spec.speedup for r in rows])
        if spec.kind == "multiturn":
            conversations = multiturn_conversations(spec, count, LocalTokenizer(tokenizer_dir), b.seed)
            return cls([c.turns[0] for c in conversations],
                       conversations=ConversationLoad(conversations, spec.conversations, spec.think_time_s))
        return cls(build_requests(spec, count, tokenizer_dir, b.seed))

    @property
    def size(self) -> int:
        """Requests it sends (every turn of every conversation)."""
        return self.conversations.turns if self.conversations else len(self.requests)

    def offsets(self, b: BenchmarkSettings, rate: float) -> list[float]:
        """Send times (s after the start): the trace's, or ``rate``'s schedule (unused by a
        multi-turn load)."""
        if self.trace_offsets is not None:
            return self.trace_offsets
        return arrival_offsets(len(self.requests), rate, b.arrival, b.burstiness, b.seed)

    def timing(self, b: BenchmarkSettings, rate: float) -> str:
        """How the load is timed, in one line (module doc)."""
        spec = b.dataset
        if self.conversations is not None:
            c = self.conversations
            return (f"closed loop: {len(c.conversations)} conversations ({c.turns} turns), {c.concurrent} at a time, "
                    f"each turn sent {c.think_time_s:g} s after the answer before it")
        limit = f", at most {b.max_concurrency} in flight" if b.max_concurrency else ""
        if self.trace_offsets is not None:
            return f"trace: the timestamps of {spec.path}, {spec.speedup:g}x as fast{limit}"
        if math.isinf(rate):
            return f"schedule: all {len(self.requests)} requests at once{limit}"
        gaps = {"constant": "constant", "poisson": "Poisson", "gamma": f"gamma (burstiness {b.burstiness:g})"}
        return f"schedule: {gaps[b.arrival]} arrivals at {rate:g} req/s (seed {b.seed}){limit}"
