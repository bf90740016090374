"""GPU energy during a repeat (runner/energy.py): the meter's arithmetic against readers
whose truth is known, NVML and amdsmi through stand-ins of their Python APIs (no GPU here),
the real nvidia-ml-py on a host without a driver, and the way a reading reaches
summary.json, `attnbench load` and the report."""

from __future__ import annotations

import json
import os
import sys
import threading
import time
import types

import pytest
from click.testing import CliRunner

from attnbench.runner import energy
from attnbench.runner.energy import EnergyMeter, EnergyReading, EnergyUnavailable, GpuReader, server_gpus


class Clock:
    """GPUs that draw ``idle_w`` each until `busy` is set, then ``busy_w``; their energy
    counters integrate exactly that (J), so the truth of every window is known."""

    def __init__(self, gpus=2, idle_w=60.0, busy_w=300.0, counters=True):
        self.gpus, self.idle_w, self.busy_w, self.counters = gpus, idle_w, busy_w, counters
        self.busy = False
        self.joules = 0.0
        self.at = time.perf_counter()
        self.lock = threading.Lock()
        self.stall_once_s = 0.0
        self.fail = False
        self.counter_offset_j = 0.0

    def _advance(self) -> None:
        with self.lock:
            now = time.perf_counter()
            self.joules += (now - self.at) * (self.busy_w if self.busy else self.idle_w)
            self.at = now

    def energy(self):
        self._advance()
        if not self.counters:
            return [None] * self.gpus
        return [self.joules / self.gpus + self.counter_offset_j] * self.gpus

    def power(self):
        if self.fail:
            raise RuntimeError("GPU fell off the bus")
        if self.stall_once_s:
            stall, self.stall_once_s = self.stall_once_s, 0.0
            time.sleep(stall)
        self._advance()
        return [(self.busy_w if self.busy else self.idle_w) / self.gpus] * self.gpus

    def reader(self) -> GpuReader:
        return GpuReader([str(i) for i in range(self.gpus)], self.energy, self.power)


def measure(clock: Clock, seconds: float = 0.4, **meter) -> EnergyReading:
    m = EnergyMeter(clock.reader(), period_s=0.01, idle_s=0.1, **meter)
    with m:
        clock.busy = True
        time.sleep(seconds)
        clock.busy = False
    return m.reading()


def test_the_counter_and_the_integrated_samples_agree_and_idle_is_subtracted():
    clock = Clock()
    r = measure(clock)
    assert r.valid and r.note == "" and r.source == "counter" and r.gpus == ["0", "1"]
    # the counter integrates 300 W over the window (idle at its very end: the load's last sample)
    assert r.energy_j == pytest.approx(300 * r.duration_s, rel=0.05)
    assert abs(r.counter_vs_samples) < 0.05
    assert r.idle_power_w == pytest.approx(60.0)
    assert r.net_energy_j == pytest.approx(r.energy_j - 60.0 * r.duration_s)
    assert r.mean_power_w == pytest.approx(r.energy_j / r.duration_s) and r.peak_power_w == pytest.approx(300.0)
    assert r.samples >= 10 and r.max_gap_s < energy.MAX_GAP_S


def test_without_counters_the_power_samples_are_the_energy():
    r = measure(Clock(counters=False))
    assert r.valid and r.source == "power samples" and r.counter_vs_samples is None
    assert r.energy_j == r.sampled_energy_j == pytest.approx(300 * r.duration_s, rel=0.1)


def test_per_work_divides_by_output_tokens_and_completed_requests():
    r = EnergyReading(valid=True, energy_j=1200.0, net_energy_j=900.0).per_work(output_tokens=600, requests=3)
    assert (r.joules_per_output_token, r.net_joules_per_output_token) == (2.0, 1.5)
    assert (r.joules_per_request, r.net_joules_per_request) == (400.0, 300.0)
    nothing = EnergyReading(valid=True, energy_j=1200.0).per_work(output_tokens=0, requests=0)
    assert nothing.joules_per_output_token is None and nothing.joules_per_request is None


def test_a_gap_in_the_samples_makes_the_reading_not_valid(monkeypatch):
    monkeypatch.setattr(energy, "MAX_GAP_S", 0.08)
    clock = Clock()
    m = EnergyMeter(clock.reader(), period_s=0.01, idle_s=0.02)
    with m:
        clock.stall_once_s = 0.2  # the sampler starves once, mid-load
        time.sleep(0.4)
    r = m.reading()
    assert not r.valid and "a gap of 0.2" in r.note and "between power samples (over 0.08 s)" in r.note
    assert r.energy_j > 0  # the numbers stay for a reader who wants them; the flag says not to trust them


def test_a_counter_running_backwards_is_not_valid():
    clock = Clock()
    m = EnergyMeter(clock.reader(), period_s=0.01, idle_s=0.02)
    with m:
        time.sleep(0.05)
        clock.counter_offset_j = -1000.0  # the counter read after the load is lower than before it
    r = m.reading()
    assert not r.valid and r.note == "an energy counter ran backwards"


def test_a_library_failing_mid_load_is_one_line_and_the_load_goes_on():
    clock = Clock()
    m = EnergyMeter(clock.reader(), period_s=0.01, idle_s=0.02)
    with m:
        time.sleep(0.05)
        clock.fail = True
        time.sleep(0.05)
    r = m.reading()
    assert not r.valid and r.note == "GPU energy reading failed (RuntimeError: GPU fell off the bus)"
    assert r.energy_j is None


def test_no_gpu_says_so_and_measures_nothing():
    m = EnergyMeter.open("none", ["0"])
    with m:
        pass
    assert m.reading() == EnergyReading(valid=False, note="no GPU energy (gpu_vendor none)")
    m.close()


@pytest.mark.parametrize("vendor, env, tp, expected", [
    ("nvidia", {}, 2, ["0", "1"]),
    ("nvidia", {"CUDA_VISIBLE_DEVICES": "3,1"}, 1, ["3"]),
    ("nvidia", {"CUDA_VISIBLE_DEVICES": "GPU-0a1b-2c, GPU-ffff"}, 2, ["GPU-0a1b-2c", "GPU-ffff"]),
    ("amd", {"HIP_VISIBLE_DEVICES": "2,3"}, 2, ["2", "3"]),
    ("amd", {"ROCR_VISIBLE_DEVICES": "5"}, 1, ["5"]),
    ("nvidia", {"HIP_VISIBLE_DEVICES": "5"}, 1, ["0"]),
])
def test_the_servers_gpus_are_the_first_it_sees(monkeypatch, vendor, env, tp, expected):
    for name in ("CUDA_VISIBLE_DEVICES", "HIP_VISIBLE_DEVICES", "ROCR_VISIBLE_DEVICES"):
        monkeypatch.delenv(name, raising=False)
    assert server_gpus(vendor, tp, env) == expected


def test_the_servers_own_environment_wins_over_the_runners(monkeypatch):
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "7")
    assert server_gpus("nvidia", 1, {}) == ["7"]
    assert server_gpus("nvidia", 1, {"CUDA_VISIBLE_DEVICES": "2"}) == ["2"]


def test_provenance_names_the_gpus_the_server_uses(monkeypatch):
    """provenance.json lists the host's GPUs and, apart, the ones this run's server uses:
    on a host whose GPUs serve several runs at once (campaign lanes), the run's own."""
    from attnbench.runner.provenance import collect
    from attnbench.runner.recipe import Recipe

    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "3")
    lane = Recipe.model_validate({"name": "a", "model": {"path": "m"}, "serve": {"gpu_vendor": "nvidia"}})
    assert collect(lane, suite_source="s.yaml", server_version=None)["server_gpus"] == ["3"]
    cpu = Recipe.model_validate({"name": "a", "model": {"path": "m"}, "serve": {"gpu_vendor": "none"}})
    assert collect(cpu, suite_source="s.yaml", server_version=None)["server_gpus"] == []


def test_the_real_nvidia_ml_py_reads_a_driver_or_says_in_one_line_why_not():
    """The real nvidia-ml-py (a dependency): on a host without NVIDIA's driver (this CI) one
    line says NVML is not usable; on an NVIDIA host (make test-gpu) GPU 0 gives a power and a
    counter that advances, and a short window agrees with its integrated samples."""
    if not os.path.exists("/dev/nvidiactl"):
        with pytest.raises(EnergyUnavailable) as e:
            energy.nvml_reader(["0"])
        assert str(e.value).startswith("NVML not usable (NVMLError") and "\n" not in str(e.value)
        m = EnergyMeter.open("nvidia", ["0"])
        assert m.reader is None and m.why.startswith("NVML not usable")
        return
    m = EnergyMeter.open("nvidia", ["0"])
    assert m.reader is not None, m.why
    with m:
        time.sleep(3.0)
    r = m.reading()
    m.close()
    assert r.valid and r.source == "counter" and 20 < r.mean_power_w < 1500 and r.samples >= 20, r
    assert abs(r.counter_vs_samples) < 0.1, r


# --- NVML, as nvidia-ml-py presents it (pynvml) ---------------------------------------------

def fake_pynvml(gpus: int = 2, instant: bool = True, counters: bool = True, start_mj: int = 5_000_000):
    """pynvml's calls the reader makes: mW powers, mJ counters, field values with a return code."""
    nv = types.ModuleType("pynvml")

    class NVMLError(Exception):
        pass

    state = {"mj": [start_mj] * gpus, "shut": False}
    nv.NVMLError, nv.NVML_SUCCESS, nv.NVML_FI_DEV_POWER_INSTANT = NVMLError, 0, 186
    nv.nvmlInit = lambda: None
    nv.nvmlShutdown = lambda: state.update(shut=True)
    nv.nvmlDeviceGetCount = lambda: gpus
    nv.nvmlDeviceGetHandleByIndex = lambda i: i
    uuids = {f"GPU-{i:04x}": i for i in range(gpus)}

    def by_uuid(uuid):
        if uuid not in uuids:
            raise NVMLError("Not Found")
        return uuids[uuid]
    nv.nvmlDeviceGetHandleByUUID = by_uuid
    nv.nvmlDeviceGetPowerUsage = lambda h: 250_000 + h  # a one-second average (mW)

    def fields(h, ids):
        assert ids == [186]
        value = types.SimpleNamespace(nvmlReturn=0 if instant else 3, value=types.SimpleNamespace(uiVal=400_000 + h))
        return [value]
    nv.nvmlDeviceGetFieldValues = fields

    def total(h):
        if not counters:
            raise NVMLError("Not Supported")
        state["mj"][h] += 1_500  # 1.5 J more at every read
        return state["mj"][h]
    nv.nvmlDeviceGetTotalEnergyConsumption = total
    return nv, state


def test_nvml_reads_instant_power_and_the_counter_in_joules(monkeypatch):
    nv, state = fake_pynvml()
    monkeypatch.setitem(sys.modules, "pynvml", nv)
    r = energy.open_reader("nvidia", ["1", "GPU-0000"])
    assert r.gpus == ["1", "GPU-0000"]
    assert r.power_w() == [400.001, 400.0]  # NVML_FI_DEV_POWER_INSTANT, mW -> W
    assert r.energy_j() == [5001.5, 5001.5]  # mJ -> J
    r.close()
    assert state["shut"]


def test_nvml_falls_back_to_average_power_and_to_samples_without_counters(monkeypatch):
    nv, _ = fake_pynvml(instant=False, counters=False)
    monkeypatch.setitem(sys.modules, "pynvml", nv)
    r = energy.nvml_reader(["0"])
    assert r.power_w() == [250.0] and r.energy_j() == [None]


@pytest.mark.parametrize("gpus, message", [
    (["4"], "NVML: no GPU 4 (this host has 2)"),
    (["GPU-beef"], "NVML: GPU 'GPU-beef' not found (NVMLError: Not Found)"),
    ([], "NVML: no GPU to read"),
])
def test_nvml_names_a_gpu_it_cannot_find(monkeypatch, gpus, message):
    nv, state = fake_pynvml()
    monkeypatch.setitem(sys.modules, "pynvml", nv)
    m = EnergyMeter.open("nvidia", gpus)
    assert m.reader is None and m.why.startswith(message) and state["shut"]
    assert m.reading() == EnergyReading(valid=False, note=m.why)


# --- amdsmi, as ROCm's Python bindings present it --------------------------------------------

def fake_amdsmi(gpus: int = 2, old_keys: bool = False, power: dict | None = None):
    """amdsmi's calls the reader makes: energy as accumulator ticks x resolution (uJ), power
    info in W with "N/A" where a field is absent (MI300X: no average_socket_power)."""
    amd = types.ModuleType("amdsmi")
    state = {"ticks": [1_000_000] * gpus, "shut": False, "inited": False}
    amd.amdsmi_init = lambda: state.update(inited=True)
    amd.amdsmi_shut_down = lambda: state.update(shut=True)
    amd.amdsmi_get_processor_handles = lambda: [f"handle{i}" for i in range(gpus)]

    def count(h):
        i = int(h[-1])
        state["ticks"][i] += 65_536  # 65,536 ticks of 15.3 uJ: about 1 J more at every read
        key = "power" if old_keys else "energy_accumulator"
        return {key: state["ticks"][i], "counter_resolution": 15.3, "timestamp": 0}
    amd.amdsmi_get_energy_count = count
    amd.amdsmi_get_power_info = lambda h: dict(power or {"current_socket_power": 550, "average_socket_power": "N/A",
                                                         "gfx_voltage": 800, "power_limit": 750})
    return amd, state


@pytest.mark.parametrize("old_keys", [False, True])
def test_amdsmi_counter_ticks_times_resolution_are_joules(monkeypatch, old_keys):
    amd, state = fake_amdsmi(old_keys=old_keys)
    monkeypatch.setitem(sys.modules, "amdsmi", amd)
    r = energy.open_reader("amd", ["1"])
    assert state["inited"] and r.gpus == ["1"]
    assert r.energy_j() == [pytest.approx((1_000_000 + 65_536) * 15.3e-6)]
    assert r.power_w() == [550.0]  # MI300X: current_socket_power, average is "N/A"
    r.close()
    assert state["shut"]


def test_amdsmi_power_field_of_rocm_7_comes_first_and_none_at_all_is_not_valid(monkeypatch):
    amd, _ = fake_amdsmi(power={"socket_power": 610, "current_socket_power": 600, "average_socket_power": 590})
    monkeypatch.setitem(sys.modules, "amdsmi", amd)
    assert energy.amdsmi_reader(["0"]).power_w() == [610.0]

    amd, _ = fake_amdsmi(power={"current_socket_power": "N/A", "average_socket_power": "N/A"})
    monkeypatch.setitem(sys.modules, "amdsmi", amd)
    m = EnergyMeter(energy.amdsmi_reader(["0"]), period_s=0.01, idle_s=0.02)
    with m:
        pass
    r = m.reading()
    assert not r.valid and r.note.startswith("GPU energy reading failed (EnergyUnavailable: amdsmi reports no "
                                             "socket power")


def test_amdsmi_missing_or_without_the_gpu_is_one_line(monkeypatch):
    monkeypatch.setitem(sys.modules, "amdsmi", None)  # not installed: import fails
    m = EnergyMeter.open("amd", ["0"])
    assert m.reader is None and m.why == ("amdsmi not installed (ROCm's Python bindings: "
                                          "pip install /opt/rocm/share/amd_smi)")
    amd, _ = fake_amdsmi(gpus=1)
    monkeypatch.setitem(sys.modules, "amdsmi", amd)
    assert EnergyMeter.open("amd", ["3"]).why == "amdsmi: no GPU 3 (this host has 1)"


def test_attnbench_load_reads_an_mi300x_through_amdsmi(monkeypatch, tmp_path):
    """`attnbench load --energy amd` against a streaming stub, amdsmi stood in: summary.json
    gets the reading with joules per output token and per request; the line printed names
    joules per output token."""
    from attnbench.cli import main
    from attnbench.runner.calibrate import StubServer
    from attnbench.runner.models import write_tiny_model

    amd, _ = fake_amdsmi(gpus=8)
    monkeypatch.setitem(sys.modules, "amdsmi", amd)
    monkeypatch.setattr(energy, "IDLE_S", 0.2)
    tiny = write_tiny_model(tmp_path / "tiny")
    with StubServer() as url:
        result = CliRunner().invoke(main, [
            "load", "--url", url, "--model", "m", "--tokenizer", str(tiny), "--num-prompts", "8",
            "--output-len", "16", "--energy", "amd", "--energy-gpus", "2,5", "--out", str(tmp_path / "out")])
    assert result.exit_code == 0, result.output
    summary = json.loads((tmp_path / "out" / "summary.json").read_text())
    e = summary["energy"]
    assert e["valid"] and e["source"] == "counter" and e["gpus"] == ["2", "5"] and e["samples"] >= 2
    assert e["energy_j"] > 0 and e["idle_power_w"] == pytest.approx(1100.0)
    assert e["joules_per_output_token"] == pytest.approx(e["energy_j"] / summary["total_output_tokens"])
    assert e["joules_per_request"] == pytest.approx(e["energy_j"] / 8)
    assert json.loads(result.output.strip().splitlines()[-1])["joules_per_output_token"] == e["joules_per_output_token"]


def test_attnbench_load_without_the_gpus_driver_warns_and_measures_the_rest(monkeypatch, tmp_path):
    from attnbench.cli import main
    from attnbench.runner.calibrate import StubServer
    from attnbench.runner.models import write_tiny_model

    nv, _ = fake_pynvml()

    def no_driver():
        raise nv.NVMLError("NVML Shared Library Not Found")
    nv.nvmlInit = no_driver  # as on a host without NVIDIA's driver, on any host
    monkeypatch.setitem(sys.modules, "pynvml", nv)
    tiny = write_tiny_model(tmp_path / "tiny")
    with StubServer() as url:
        result = CliRunner().invoke(main, [
            "load", "--url", url, "--model", "m", "--tokenizer", str(tiny), "--num-prompts", "4",
            "--output-len", "8", "--energy", "nvidia", "--out", str(tmp_path / "out")])
    assert result.exit_code == 0, result.output
    assert "warning: NVML not usable (NVMLError: NVML Shared Library Not Found); every other metric as usual" \
        in result.output
    summary = json.loads((tmp_path / "out" / "summary.json").read_text())
    assert summary["completed"] == 4 and summary["energy"]["valid"] is False
    assert summary["energy"]["note"].startswith("NVML not usable")
