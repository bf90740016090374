"""Request traces to replay on their own clock: one JSON object per line, the Mooncake
format (FAST'25 "Mooncake" traces; AIPerf reads the same)::

    {"timestamp": 0, "input_length": 6955, "output_length": 52, "hash_ids": [46, 47, 48]}

``timestamp`` is the arrival in milliseconds, ``input_length`` / ``output_length`` tokens,
``hash_ids`` (optional) the prompt's blocks of ``block_size`` tokens, one id per block:
requests with the same leading ids share that prefix (a prefix cache can reuse it). This
module only reads and checks the file; `datasets.trace_requests` makes the prompts.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path


class TraceError(ValueError):
    pass


@dataclass(frozen=True)
class TraceRow:
    arrival_s: float  # from the trace's first arrival
    input_len: int  # tokens
    output_len: int  # tokens
    hash_ids: tuple[int, ...] = ()


def _field(obj: dict, key: str, where: str, *, minimum: float) -> float:
    value = obj.get(key)
    if isinstance(value, bool) or not isinstance(value, (int, float)) or value < minimum:
        raise TraceError(f"{where}: '{key}' must be a number >= {minimum:g}, got {value!r}")
    return value


def read_trace(path: str | Path, count: int) -> list[TraceRow]:
    """The first ``count`` lines of the trace at ``path``, arrivals in seconds from the
    first line's and in file order (which must be time order); a `TraceError` in one line
    naming the file, the line and the field for anything else."""
    path = Path(path)
    rows: list[TraceRow] = []
    first_ms: float | None = None
    try:
        with path.open() as f:
            for number, line in enumerate(f, start=1):
                if len(rows) == count:
                    break
                if not line.strip():
                    continue
                where = f"{path}:{number}"
                try:
                    obj = json.loads(line)
                except json.JSONDecodeError as e:
                    raise TraceError(f"{where}: not JSON ({e.msg}); expected one object per line like "
                                     '{"timestamp": 0, "input_length": 512, "output_length": 64, "hash_ids": [0]}') \
                        from None
                if not isinstance(obj, dict):
                    raise TraceError(f"{where}: expected a JSON object, got a JSON {type(obj).__name__}")
                stamp = _field(obj, "timestamp", where, minimum=0)
                first_ms = stamp if first_ms is None else first_ms
                if rows and stamp < first_ms + rows[-1].arrival_s * 1e3:
                    raise TraceError(f"{where}: 'timestamp' {stamp:g} is before the line above's; "
                                     "a trace is in arrival order")
                hash_ids = obj.get("hash_ids", [])
                if not isinstance(hash_ids, list) or not all(isinstance(h, int) and not isinstance(h, bool)
                                                             for h in hash_ids):
                    raise TraceError(f"{where}: 'hash_ids' must be a list of integers, got {hash_ids!r}")
                rows.append(TraceRow((stamp - first_ms) / 1e3, int(_field(obj, "input_length", where, minimum=1)),
                                     int(_field(obj, "output_length", where, minimum=1)), tuple(hash_ids)))
    except FileNotFoundError:
        raise TraceError(f"{path}: trace file not found (benchmark.dataset.path)") from None
    except IsADirectoryError:
        raise TraceError(f"{path}: is a folder; expected a JSONL trace file") from None
    except UnicodeDecodeError:
        raise TraceError(f"{path}: not text; expected a JSONL trace file") from None
    if len(rows) < count:
        raise TraceError(f"{path}: {len(rows)} requests, num_prompts asks for {count}")
    return rows
