"""The energy the server's GPUs use during a repeat, read on the server's host: NVML on
NVIDIA (nvidia-ml-py), amdsmi on AMD.

Two readings of the same energy, each a check on the other:

* the GPUs' own cumulative energy counters, read at the load's start and end
  (``nvmlDeviceGetTotalEnergyConsumption``, mJ since the driver loaded; amdsmi's energy
  accumulator times its resolution, uJ), where every GPU has one;
* the GPUs' power, sampled every `SAMPLE_EVERY_S` by a thread and integrated over the load
  (trapezoids). NVML's instantaneous power field is read where the driver has it (its
  plain power reading is a one-second average on recent GPUs, which lags the load).

The counters' difference is the reported energy where they exist, the integral otherwise.
Right before the load the GPUs' idle power (the server loaded and waiting) is sampled for
`IDLE_S`, so that energy is also given net of idling: energy - idle power x duration.

A reading whose power samples leave a gap over `MAX_GAP_S` (the sampler starved), whose
counter ran backwards, whose library failed mid-load, or that found no GPU is not valid,
with the reason in one line; the repeat's other metrics stay valid. `EnergyReading` is the
record a summary keeps (``energy`` in summary.json).

Energies are joules, powers watts, times seconds.
"""

from __future__ import annotations

import os
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

from pydantic import BaseModel

SAMPLE_EVERY_S = 0.1
IDLE_S = 2.0
MAX_GAP_S = 1.0
VISIBLE_DEVICES = {"nvidia": ("CUDA_VISIBLE_DEVICES",), "amd": ("HIP_VISIBLE_DEVICES", "ROCR_VISIBLE_DEVICES")}


class EnergyReading(BaseModel):
    """What the server's GPUs used during one repeat's load (module doc). A reading that
    could not be taken has ``valid`` false, a ``note`` and no numbers."""

    valid: bool
    note: str = ""  # why the reading is not valid, in one line
    source: str | None = None  # "counter" (the GPUs' energy counters) or "power samples" (their integral)
    gpus: list[str] = []  # the GPUs read: indices or UUIDs, as the server sees them
    duration_s: float | None = None  # the load's window the energy covers
    energy_j: float | None = None
    sampled_energy_j: float | None = None  # the power samples' integral, whatever the source
    counter_vs_samples: float | None = None  # counter energy / sampled energy - 1, where both exist
    idle_power_w: float | None = None
    net_energy_j: float | None = None  # energy_j - idle_power_w x duration_s
    mean_power_w: float | None = None  # energy_j / duration_s
    peak_power_w: float | None = None  # the highest power sample (all GPUs summed)
    samples: int = 0
    max_gap_s: float | None = None  # the longest time between consecutive power samples
    joules_per_output_token: float | None = None
    net_joules_per_output_token: float | None = None
    joules_per_request: float | None = None  # per completed request
    net_joules_per_request: float | None = None

    @classmethod
    def unavailable(cls, why: str) -> "EnergyReading":
        return cls(valid=False, note=why)

    def per_work(self, output_tokens: int, requests: int) -> "EnergyReading":
        """The same reading with joules per output token and per completed request."""
        def per(energy: float | None, n: int) -> float | None:
            return energy / n if energy is not None and n else None
        return self.model_copy(update={
            "joules_per_output_token": per(self.energy_j, output_tokens),
            "net_joules_per_output_token": per(self.net_energy_j, output_tokens),
            "joules_per_request": per(self.energy_j, requests),
            "net_joules_per_request": per(self.net_energy_j, requests)})


class EnergyUnavailable(RuntimeError):
    """No GPU energy can be read here; the message says why in one line."""

    def __init__(self, message: str):
        super().__init__(" ".join(str(message).split())[:300])


@dataclass
class GpuReader:
    """One vendor's library as the meter sees it: each GPU's cumulative energy (J; None for
    a GPU without a counter) and power (W), in the order of ``gpus``."""

    gpus: list[str]
    energy_j: Callable[[], list[float | None]]
    power_w: Callable[[], list[float]]
    close: Callable[[], None] = lambda: None


def server_gpus(vendor: str, tensor_parallel_size: int, env: dict[str, str] | None = None) -> list[str]:
    """The GPUs a vLLM server uses: the first ``tensor_parallel_size`` of those its
    environment makes visible (``CUDA_VISIBLE_DEVICES``; ``HIP_``/``ROCR_VISIBLE_DEVICES``),
    or of all of them. ``env``: the server's own settings, before this process's."""
    for name in VISIBLE_DEVICES.get(vendor, ()):
        visible = (env or {}).get(name, os.environ.get(name))
        if visible is not None:
            return [d.strip() for d in visible.split(",") if d.strip()][:tensor_parallel_size]
    return [str(i) for i in range(tensor_parallel_size)]


def _pick(gpus: Sequence[str], handles: Callable[[str], object], count: int, library: str) -> list:
    if not gpus:
        raise EnergyUnavailable(f"{library}: no GPU to read (the server's visible devices are empty)")
    out = []
    for gpu in gpus:
        if gpu.isdigit() and int(gpu) >= count:
            raise EnergyUnavailable(f"{library}: no GPU {gpu} (this host has {count})")
        try:
            out.append(handles(gpu))
        except Exception as e:  # noqa: BLE001 - the library's own error types
            raise EnergyUnavailable(f"{library}: GPU {gpu!r} not found ({type(e).__name__}: {e})") from None
    return out


def nvml_reader(gpus: Sequence[str]) -> GpuReader:
    """NVIDIA GPUs through NVML; ``gpus`` are indices or UUIDs (``GPU-...``)."""
    try:
        import pynvml  # lazy: NVML is opened only where a run's GPUs are NVIDIA's
    except ImportError:
        raise EnergyUnavailable("nvidia-ml-py not installed (pip install nvidia-ml-py)") from None
    try:
        pynvml.nvmlInit()
        count = pynvml.nvmlDeviceGetCount()
    except Exception as e:  # noqa: BLE001 - no library, no driver: no energy here
        raise EnergyUnavailable(f"NVML not usable ({type(e).__name__}: {e})") from None

    def handle(gpu: str):
        if gpu.isdigit():
            return pynvml.nvmlDeviceGetHandleByIndex(int(gpu))
        return pynvml.nvmlDeviceGetHandleByUUID(gpu)

    try:
        handles = _pick(gpus, handle, count, "NVML")
    except EnergyUnavailable:
        pynvml.nvmlShutdown()
        raise
    instant = getattr(pynvml, "NVML_FI_DEV_POWER_INSTANT", None)

    def instant_mw(h) -> int | None:
        if instant is None:
            return None
        try:
            value = pynvml.nvmlDeviceGetFieldValues(h, [instant])[0]
        except pynvml.NVMLError:
            return None
        return value.value.uiVal if value.nvmlReturn == pynvml.NVML_SUCCESS else None

    use_instant = all(instant_mw(h) is not None for h in handles)

    def power() -> list[float]:
        if use_instant:
            return [instant_mw(h) / 1e3 for h in handles]
        return [pynvml.nvmlDeviceGetPowerUsage(h) / 1e3 for h in handles]  # mW

    def energy() -> list[float | None]:
        out: list[float | None] = []
        for h in handles:
            try:
                out.append(pynvml.nvmlDeviceGetTotalEnergyConsumption(h) / 1e3)  # mJ
            except pynvml.NVMLError:
                out.append(None)  # before Volta: no counter
        return out

    return GpuReader(list(gpus), energy, power, pynvml.nvmlShutdown)


def amdsmi_reader(gpus: Sequence[str]) -> GpuReader:
    """AMD GPUs through amdsmi (ROCm's Python bindings); ``gpus`` are indices."""
    try:
        import amdsmi  # lazy: amdsmi ships with ROCm, opened only where a run's GPUs are AMD's
    except ImportError:
        raise EnergyUnavailable("amdsmi not installed (ROCm's Python bindings: "
                                "pip install /opt/rocm/share/amd_smi)") from None
    try:
        amdsmi.amdsmi_init()
        all_handles = list(amdsmi.amdsmi_get_processor_handles())
    except Exception as e:  # noqa: BLE001 - no library, no driver: no energy here
        raise EnergyUnavailable(f"amdsmi not usable ({type(e).__name__}: {e})") from None
    try:
        handles = _pick(gpus, lambda gpu: all_handles[int(gpu)], len(all_handles), "amdsmi")
    except EnergyUnavailable:
        amdsmi.amdsmi_shut_down()
        raise

    def energy() -> list[float | None]:
        out: list[float | None] = []
        for h in handles:
            try:
                count = amdsmi.amdsmi_get_energy_count(h)
            except Exception:  # noqa: BLE001 - not supported here (e.g. a virtual function)
                out.append(None)
                continue
            ticks = count.get("energy_accumulator", count.get("power"))  # "power" before ROCm 6.1
            out.append(ticks * count["counter_resolution"] / 1e6)  # resolution: uJ per tick
        return out

    def power() -> list[float]:
        out = []
        for h in handles:
            info = amdsmi.amdsmi_get_power_info(h)
            # ROCm 7's socket_power, MI300's current_socket_power, older GPUs' average; "N/A" where absent
            watts = [info.get(k) for k in ("socket_power", "current_socket_power", "average_socket_power")]
            numbers = [w for w in watts if isinstance(w, (int, float)) and not isinstance(w, bool)]
            if not numbers:
                raise EnergyUnavailable(f"amdsmi reports no socket power ({info})")
            out.append(float(numbers[0]))
        return out

    return GpuReader(list(gpus), energy, power, amdsmi.amdsmi_shut_down)


READERS = {"nvidia": nvml_reader, "amd": amdsmi_reader}


def open_reader(vendor: str, gpus: Sequence[str]) -> GpuReader:
    """The reader of ``vendor``'s ``gpus`` (`EnergyUnavailable`: none here, or vendor none)."""
    if vendor not in READERS:
        raise EnergyUnavailable(f"no GPU energy (gpu_vendor {vendor})")
    return READERS[vendor](gpus)


@dataclass
class EnergyMeter:
    """``with meter:`` around one load: idle power first, then counters and power samples
    until the load ends; `reading` after it. A meter without a reader (``why`` says why)
    reads as not valid."""

    reader: GpuReader | None
    why: str = ""
    period_s: float = SAMPLE_EVERY_S
    idle_s: float = IDLE_S
    samples: list[tuple[float, float]] = field(default_factory=list)  # (perf_counter s, W of all GPUs)
    _failure: str = ""
    _stop: threading.Event = field(default_factory=threading.Event)
    _thread: threading.Thread | None = None
    _start: tuple[float, list[float | None]] | None = None
    _end: tuple[float, list[float | None]] | None = None
    _idle_w: float | None = None

    @classmethod
    def open(cls, vendor: str, gpus: Sequence[str]) -> "EnergyMeter":
        """A meter of ``vendor``'s ``gpus``, or one that says why there is none."""
        try:
            return cls(open_reader(vendor, gpus))
        except EnergyUnavailable as e:
            return cls(None, str(e))

    def close(self) -> None:
        if self.reader is not None:
            self.reader.close()

    def __enter__(self) -> "EnergyMeter":
        self.samples, self._failure, self._stop = [], "", threading.Event()
        self._start = self._end = None
        if self.reader is None:
            return self
        try:
            self._idle_w = self._idle_power()
            self._start = (time.perf_counter(), self.reader.energy_j())
        except Exception as e:  # noqa: BLE001 - the library failed: this reading is not valid
            self._failure = f"{type(e).__name__}: {e}"
            return self
        self._thread = threading.Thread(target=self._sample, name="attnbench-energy", daemon=True)
        self._thread.start()
        return self

    def __exit__(self, *exc) -> None:
        if self._start is None:
            return
        self._stop.set()
        self._thread.join(timeout=5)
        try:
            self._end = (time.perf_counter(), self.reader.energy_j())
            self.samples.append((self._end[0], sum(self.reader.power_w())))
        except Exception as e:  # noqa: BLE001
            self._failure = self._failure or f"{type(e).__name__}: {e}"

    def _idle_power(self) -> float:
        """The GPUs' mean total power over `idle_s` of sampling before the load."""
        values, end = [], time.perf_counter() + self.idle_s
        while True:
            values.append(sum(self.reader.power_w()))
            if time.perf_counter() >= end:
                return sum(values) / len(values)
            time.sleep(self.period_s)

    def _sample(self) -> None:
        try:
            while True:
                self.samples.append((time.perf_counter(), sum(self.reader.power_w())))
                if self._stop.wait(self.period_s):
                    return
        except Exception as e:  # noqa: BLE001 - reported by `reading`, the load goes on
            self._failure = f"{type(e).__name__}: {e}"

    def reading(self) -> EnergyReading:
        """The energy of the last ``with`` window (module doc)."""
        if self.reader is None:
            return EnergyReading.unavailable(self.why)
        if self._failure or self._end is None:
            return EnergyReading.unavailable(f"GPU energy reading failed ({self._failure or 'not measured'})")
        (t0, before), (t1, after) = self._start, self._end
        duration = t1 - t0
        times, watts = [t for t, _ in self.samples], [w for _, w in self.samples]
        sampled = sum((b - a) * (wa + wb) / 2 for a, b, wa, wb in zip(times, times[1:], watts, watts[1:]))
        max_gap = max(b - a for a, b in zip([t0, *times], times))
        notes = []
        counters = all(a is not None and b is not None for a, b in zip(before, after))
        if counters:
            energy, source = sum(b - a for a, b in zip(before, after)), "counter"
            if any(b < a for a, b in zip(before, after)):
                notes.append("an energy counter ran backwards")
        else:
            energy, source = sampled, "power samples"
        if max_gap > MAX_GAP_S:
            notes.append(f"a gap of {max_gap:.2f} s between power samples (over {MAX_GAP_S:g} s)")
        return EnergyReading(
            valid=not notes, note="; ".join(notes), source=source, gpus=self.reader.gpus, duration_s=duration,
            energy_j=energy, sampled_energy_j=sampled,
            counter_vs_samples=energy / sampled - 1 if counters and sampled > 0 else None,
            idle_power_w=self._idle_w, net_energy_j=energy - self._idle_w * duration,
            mean_power_w=energy / duration if duration > 0 else None, peak_power_w=max(watts),
            samples=len(self.samples), max_gap_s=max_gap)
