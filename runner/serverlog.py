"""What attnbench reads from a vLLM server's log: kernel compiles during a measurement,
the CUDA-graph modes the server actually captured, the root cause of a failed start, and
which engine (V0 or V1) it runs.

vLLM (>= 0.2x) activates a JIT monitor once its warm-up is done: every Triton kernel
compiled after that (and every autotuning run) is logged as "... JIT compilation during
inference: <kernel>. This causes a latency spike ...", the first time per kernel. A
compile costs a second or more, so a measured repeat that contains one is not a
measurement of the steady state: `LogWindow` takes the lines a repeat added to the log,
`jit_compiles` picks those events out.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path

from .recipe import V0_LAST_RELEASE

_PREFIX = re.compile(r"^\((?:APIServer|EngineCore[^)]*|Worker[^)]*|VllmWorker[^)]*) pid=\d+\) "
                     r"(?:(?:ERROR|WARNING|INFO) [\d\- :]+\[[^\]]+\] )?")
_EXCEPTION = re.compile(r"^([A-Za-z_][\w.]*(?:Error|Exception|Exit)): (.+)$")
_WRAPPERS = re.compile(r"root cause above|Engine core initialization failed|EngineDeadError|"
                       r"Process .* died|APIServer failed")
_USAGE = re.compile(r"(?:^|: )error: (.+)$")
JIT_EVENT = re.compile(r"(JIT compilation|autotuning) during inference|Triton autotuning for function")
_CAPTURE = re.compile(r"Capturing CUDA graphs \(([^)]*)\)")
_ENGINE = re.compile(r"Initializing a (V[01]) LLM engine \(v([^)]+)\)")
_CONFIGURED = re.compile(r"'cudagraph_mode': <CUDAGraphMode\.([A-Z_]+)")


@dataclass
class LogWindow:
    """The bytes a log file gains between `start` (construction) and `lines`."""

    path: Path
    offset: int = 0

    def __post_init__(self) -> None:
        self.offset = self._size()

    def _size(self) -> int:
        try:
            return self.path.stat().st_size
        except OSError:
            return 0

    def lines(self) -> list[str]:
        """The complete lines added since the window opened."""
        try:
            with open(self.path, "rb") as fh:
                fh.seek(self.offset)
                text = fh.read().decode(errors="replace")
        except OSError:
            return []
        return text.splitlines()


def jit_compiles(lines: list[str]) -> list[str]:
    """The JIT-compile / autotuning events among log lines, trimmed to their message."""
    events = []
    for line in lines:
        if JIT_EVENT.search(line):
            # progress bars share lines with log records: keep the record only
            events.append(line[line.find("WARNING"):] if "WARNING" in line else line.strip()[:300])
    return events


def cuda_graph_modes(log_text: str) -> dict:
    """``configured``: the engine's cudagraph_mode as vLLM resolved it (None if not logged);
    ``captured``: the kinds of graphs it captured, in order (e.g. ["PIECEWISE", "FULL"]);
    empty when it ran eagerly."""
    configured = _CONFIGURED.search(log_text)
    captured = list(dict.fromkeys(m.group(1).split(",")[-1].strip() for m in _CAPTURE.finditer(log_text)))
    return {"configured": configured.group(1) if configured else None, "captured": captured}


def root_cause(log_text: str) -> str | None:
    """The line that says why a server died: the first exception that ends a traceback
    and is not one of vLLM's wrappers ("Engine core initialization failed. See root cause
    above"), else a command-line usage error, else None. Process prefixes and log headers
    ("(EngineCore pid=7) ERROR 11-22 05:59:15 [core.py:1330]") are dropped."""
    lines = [_PREFIX.sub("", line).rstrip() for line in log_text.splitlines()]
    for i, line in enumerate(lines):
        m = _EXCEPTION.match(line)
        ends_traceback = i > 0 and lines[i - 1].startswith((" ", "\t"))
        if m and ends_traceback and not _WRAPPERS.search(line):
            return line[:500]
    for line in lines:
        m = _USAGE.search(line)
        if m and "Traceback" not in line:
            return line.strip()[:500]
    return None


def engine_in_log(log_text: str) -> tuple[str, str] | None:
    """("V0" or "V1", version) from vLLM's "Initializing a V1 LLM engine (v0.26.0)"."""
    m = _ENGINE.search(log_text)
    return (m.group(1), m.group(2)) if m else None


def _release(version: str) -> tuple[int, int]:
    m = re.match(r"v?(\d+)\.(\d+)", version or "")
    return (int(m.group(1)), int(m.group(2))) if m else (0, 0)


def engine_mismatch(engine: str, version: str | None, log_text: str) -> str | None:
    """Why a server does not run the engine a recipe asked for (None if it does).

    ``engine: v0`` needs vLLM <= 0.10 and "Initializing a V0 LLM engine" in its log; the
    other engines run on V1, so a server whose log names V0 cannot serve them."""
    logged = engine_in_log(log_text)
    version = version or (logged[1] if logged else None)
    if engine == "v0":
        if version is None or _release(version) > V0_LAST_RELEASE:
            return (f"engine v0: the server runs vLLM {version or '(version unknown)'}, which has no V0 engine "
                    f"(removed in 0.11); serve V0 runs from an image or venv with vLLM <= 0.10 "
                    f"(VLLM_V0_TAG / ROCM_VLLM_V0_TAG images)")
        if logged is None or logged[0] != "V0":
            what = f"its log says {logged[0]}" if logged else "its log names no engine"
            return f"engine v0: the server runs vLLM {version} but not the V0 engine ({what}; VLLM_USE_V1=0 not honoured)"
        return None
    if logged is not None and logged[0] == "V0":
        return f"engine {engine}: the server runs vLLM {logged[1]}'s V0 engine; this run needs V1"
    return None
