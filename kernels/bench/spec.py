"""Microbenchmark case lists (recipes/microbench/*.yaml) as pydantic models.

A suite names the attention shape, the implementations to time, and cases: hand-written
batches (``cases``) and generated sweeps (``sweeps``, the paper's Fig. 6-8 grids of batch
size x max sequence length x decode share). Errors name the file and the field.
"""

from __future__ import annotations

import random
from pathlib import Path
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

from attnbench.validation import validate_yaml

from ..schema import COMPARATORS, HOPPER_KERNELS, L2_FLUSHES
from ..variants import AUTO, VARIANTS


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class Heads(_Strict):
    num_q_heads: int = Field(32, ge=1)
    num_kv_heads: int = Field(8, ge=1)
    head_size: int = Field(128, ge=16, le=256)

    @model_validator(mode="after")
    def _divides(self):
        if self.num_q_heads % self.num_kv_heads:
            raise ValueError(f"num_kv_heads ({self.num_kv_heads}) must divide num_q_heads ({self.num_q_heads})")
        return self


class SeqGroup(_Strict):
    """``count`` sequences with the same lengths."""

    count: int = Field(1, ge=1)
    query_len: int = Field(ge=1)
    context_len: int = Field(0, ge=0)


class Case(_Strict):
    name: str
    seqs: list[SeqGroup] = Field(min_length=1)
    heads: Heads | None = None  # overrides the suite's
    block_size: int | None = Field(None, ge=1)  # the KV page size, overriding the suite's
    sliding_window: int | None = Field(None, ge=1)
    softcap: float = Field(0.0, ge=0)
    group: str = ""

    def seq_list(self) -> list[tuple[int, int]]:
        return [(g.query_len, g.context_len) for g in self.seqs for _ in range(g.count)]


class Sweep(_Strict):
    """Grid of batches as in the paper's Fig. 6: lengths drawn in [max/4, max], seeded.

    Decode sequences have one query token after ``len - 1`` cached tokens; the others are
    prefills of the whole length (``prefill_chunk`` set: a chunk of that many tokens after
    the rest as context).
    """

    name: str
    batch_sizes: list[int] = Field(min_length=1)
    max_seq_lens: list[int] = Field(min_length=1)
    decode_shares: list[float] = Field([0.0, 0.5, 1.0], min_length=1)
    prefill_chunk: int | None = Field(None, ge=1)
    seed: int = 0

    @field_validator("decode_shares")
    @classmethod
    def _shares(cls, v):
        if any(not 0.0 <= s <= 1.0 for s in v):
            raise ValueError(f"decode shares must lie in [0, 1], got {v}")
        return v

    def cases(self) -> list[Case]:
        out = []
        for max_len in self.max_seq_lens:
            for share in self.decode_shares:
                for bs in self.batch_sizes:
                    rng = random.Random(f"{self.seed}-{max_len}-{share}-{bs}")
                    lens = [max_len] + [rng.randint(max(2, max_len // 4), max_len) for _ in range(bs - 1)]
                    n_decode = round(share * bs)
                    groups = []
                    for i, n in enumerate(lens):
                        if i < n_decode:
                            groups.append(SeqGroup(query_len=1, context_len=n - 1))
                        elif self.prefill_chunk and n > self.prefill_chunk:
                            groups.append(SeqGroup(query_len=self.prefill_chunk, context_len=n - self.prefill_chunk))
                        else:
                            groups.append(SeqGroup(query_len=n, context_len=0))
                    out.append(Case(name=f"{self.name}-L{max_len}-d{int(share * 100)}-B{bs}",
                                    seqs=groups, group=self.name))
        return out


class Timing(_Strict):
    """How each call is timed (`bench/timing.py`): ``l2_flush`` says how L2 is emptied
    before every timed call: ``zero`` as ``triton.testing.do_bench`` does (zeroing a 256 MiB
    buffer, which leaves L2 full of dirty lines the timed kernel writes back), ``read``
    (reading it: clean lines, as after the weight reads that precede attention in a model),
    ``none`` (no flush: calls back to back, each finding in L2 what the last one read; a
    warm L2 that a model's layers, each with its own KV cache, never give attention).
    ``rounds``: how many times each implementation of a case is timed, the implementations
    taking turns, its row keeping its fastest round (eager and graph apart): a GPU's clock
    moves with its power draw and temperature over a case, and with one round whichever
    implementation ran during a slow spell lost to the others by up to 5% on the H100."""

    warmup_ms: float = Field(25, gt=0)
    rep_ms: float = Field(100, gt=0)
    cuda_graph: bool = True
    l2_flush: Literal[L2_FLUSHES] = L2_FLUSHES[0]
    rounds: int = Field(1, ge=1, le=10)


IMPLEMENTATIONS = (*VARIANTS, AUTO, *HOPPER_KERNELS, *COMPARATORS)


class NamedConfig(_Strict):
    """A fixed launch config timed as its own implementation (e.g. Fig. 7's tile sizes):
    the variant's own config for the case, with these fields replaced."""

    variant: str
    tile_size: int | None = None
    block_m: int | None = None
    num_warps: int | None = None
    num_stages: int | None = None
    num_segments: int | None = None
    programs_per_sm: float | None = None
    reduce_num_warps: int | None = None
    persistent: bool | None = None
    equal_segments: bool | None = None

    @field_validator("variant")
    @classmethod
    def _a_step(cls, v):
        if v not in VARIANTS:
            raise ValueError(f"expected one of {list(VARIANTS)}")
        return v

    def overrides(self) -> dict:
        return {k: v for k, v in self.model_dump().items() if v is not None and k != "variant"}


class MicrobenchSuite(_Strict):
    name: str
    description: str = ""
    heads: Heads = Heads()
    dtype: Literal["bfloat16", "float16"] = "bfloat16"
    block_size: int = Field(16, ge=1)
    implementations: list[str] = Field(list(IMPLEMENTATIONS), min_length=1)
    # extra implementations: name -> a variant with fixed launch parameters
    configs: dict[str, NamedConfig] = {}
    timing: Timing = Timing()
    seed: int = 0
    # skip an implementation on cases whose roofline floor exceeds this (us), e.g. naive
    # on long prefills, where one launch takes seconds
    max_floor_us: dict[str, float] = {}
    cases: list[Case] = []
    sweeps: list[Sweep] = []

    @model_validator(mode="after")
    def _known_implementations(self):
        known = set(IMPLEMENTATIONS) | set(self.configs)
        unknown = [i for i in self.implementations if i not in known]
        if unknown:
            raise ValueError(f"implementations: unknown {unknown}; expected names from "
                             f"{sorted(IMPLEMENTATIONS)} or from 'configs'")
        return self

    @model_validator(mode="after")
    def _has_cases(self):
        if not self.cases and not self.sweeps:
            raise ValueError("a suite needs at least one entry under 'cases' or 'sweeps'")
        names = [c.name for c in self.all_cases()]
        dup = {n for n in names if names.count(n) > 1}
        if dup:
            raise ValueError(f"cases: names must be unique, repeated: {sorted(dup)}")
        return self

    def all_cases(self) -> list[Case]:
        return list(self.cases) + [c for s in self.sweeps for c in s.cases()]


class SpecError(ValueError):
    """A microbenchmark YAML that does not validate; the message names file and field."""


def load_microbench_spec(path: str | Path) -> MicrobenchSuite:
    """A microbenchmark suite file; `SpecError` names the file and every invalid field."""
    return validate_yaml(MicrobenchSuite, path, "microbenchmark suite", SpecError)
