"""Server argv for both launchers, and the process lifecycle on a real (non-vLLM) process."""

from __future__ import annotations

import socket
import sys
import textwrap
from pathlib import Path

import pytest
import yaml

from attnbench.runner.recipe import load_suite
from attnbench.runner.server import (LaunchPlan, PortInUseError, ServerError, ServerProcess,
                                     build_launch, free_port, port_is_free)


def recipe(tmp_path, serve=None, model_path="/models/m"):
    data = {"name": "t", "runs": [{"name": "r", "model": {"path": model_path, "served_name": "m"},
                                   "serve": serve or {}}]}
    path = tmp_path / "s.yaml"
    path.write_text(yaml.safe_dump(data))
    return load_suite(path).runs[0]


def test_process_argv_v0_style(tmp_path):
    plan = build_launch(recipe(tmp_path, {"engine": "v0-style", "attention_backend": "TRITON_ATTN",
                                          "graph_mode": "full_and_piecewise", "max_model_len": 8192,
                                          "load_format": "dummy", "extra_args": ["--seed", "1"],
                                          "env": {"VLLM_USE_FLASHINFER_SAMPLER": "0"}}), port=8123)
    argv = plan.argv
    assert argv[:4] == [sys.executable, "-m", "attnbench.kernels.plugin.vllm_cli", "serve"]
    expect = ["/models/m", "--served-model-name", "m", "--host", "127.0.0.1", "--port", "8123",
              "--max-num-seqs", "256", "--no-enable-chunked-prefill", "--no-enable-prefix-caching",
              "--attention-backend", "TRITON_ATTN",
              "--compilation-config", '{"cudagraph_mode": "FULL_AND_PIECEWISE"}',
              "--max-model-len", "8192", "--load-format", "dummy", "--seed", "1"]
    assert argv[4:] == expect
    assert plan.env == {"VLLM_USE_FLASHINFER_SAMPLER": "0"}
    assert all(isinstance(a, str) for a in argv)


def test_process_argv_v1_defaults(tmp_path):
    argv = build_launch(recipe(tmp_path, {"engine": "v1"}), port=9000).argv
    i = argv.index("--max-num-seqs")
    assert argv[i + 1] == "1024"
    assert "--enable-chunked-prefill" in argv
    assert argv[argv.index("--max-num-batched-tokens") + 1] == "8192"
    assert "--api-server-count" not in argv  # vLLM's default: one API-server process
    argv = build_launch(recipe(tmp_path, {"engine": "v1", "api_server_count": 2}), port=9000).argv
    assert argv[argv.index("--api-server-count") + 1] == "2"


def test_every_flag_the_recipe_writes_is_refused_in_extra_args(tmp_path):
    """recipe.FIELD_FLAGS (the flags extra_args refuses) covers every flag vllm_args writes
    from a field, so a flag given twice never reaches vLLM. --compilation-config is the one
    left to extra_args: graph_mode writes only its CUDA-graph mode."""
    from attnbench.runner.recipe import FIELD_FLAGS

    plan = build_launch(recipe(tmp_path, {
        "engine": "v1", "attention_backend": "TRITON_ATTN", "graph_mode": "eager", "tensor_parallel_size": 2,
        "api_server_count": 2, "dtype": "bfloat16", "max_model_len": 4096, "load_format": "dummy",
        "gpu_memory_utilization": 0.5, "enable_prefix_caching": True}), port=9000)
    written = {a for a in plan.argv if a.startswith("-") and a != "-m"}
    assert written - set(FIELD_FLAGS) == set(), written - set(FIELD_FLAGS)
    assert "--compilation-config" not in FIELD_FLAGS


def test_docker_argv_nvidia(tmp_path):
    model = tmp_path / "model"
    model.mkdir()
    plan = build_launch(recipe(tmp_path, {"launcher": "docker", "image": "attnbench:cuda",
                                          "env": {"A": "1"}}, str(model)), port=8200)
    argv = plan.argv
    assert argv[:3] == ["docker", "run", "--rm"]
    assert argv[argv.index("--gpus") + 1] == "all"
    assert "-p" in argv and argv[argv.index("-p") + 1] == "127.0.0.1:8200:8200"
    assert f"{model.resolve()}:{model.resolve()}:ro" in argv
    # the environment goes by name only (docker reads each value from its own environment):
    # no value in argv, where `ps` and provenance.json would show it
    assert argv[argv.index("A") - 1] == "-e" and "A=1" not in argv and plan.env["A"] == "1"
    entry = argv.index("--entrypoint")
    assert argv[entry + 1:entry + 6] == ["python3", "attnbench:cuda", "-m", "attnbench.kernels.plugin.vllm_cli", "serve"]
    inner = argv[entry + 6:]
    assert inner[inner.index("--host") + 1] == "0.0.0.0"
    assert inner[0] == str(model.resolve())
    assert plan.container and plan.container in argv


def test_docker_argv_rocm(tmp_path):
    argv = build_launch(recipe(tmp_path, {"launcher": "docker", "image": "attnbench:rocm",
                                          "gpu_vendor": "amd", "attention_backend": "ROCM_ATTN"}), port=8201).argv
    for flag in (["--device", "/dev/kfd"], ["--device", "/dev/dri"], ["--group-add", "video"],
                 ["--security-opt", "seccomp=unconfined"]):
        assert any(argv[i:i + 2] == flag for i in range(len(argv) - 1)), flag
    assert "--ipc=host" in argv and "--gpus" not in argv


# ----------------------------------------------------------------- lifecycle (real processes)
FAKE_SERVER = textwrap.dedent("""
    import http.server, os, signal, subprocess, sys, time
    port = int(sys.argv[1]); mode = sys.argv[2]
    # like vLLM: on TERM, take the whole process group down
    signal.signal(signal.SIGTERM, lambda *a: os.killpg(0, signal.SIGKILL))
    if mode == "crash":
        print("fatal: bad argument --frobnicate", flush=True); sys.exit(2)
    if mode.startswith("replay="):  # print a recorded vLLM log, then die like that server did
        print(open(mode[7:]).read(), flush=True); sys.exit(1)
    if mode == "stubborn":  # ignores TERM while it starts (vLLM busy compiling, say)
        signal.signal(signal.SIGTERM, signal.SIG_IGN); time.sleep(600)
    # a child in the same process group, like vLLM's engine core
    subprocess.Popen([sys.executable, "-c", "import time; time.sleep(600)"])
    class H(http.server.BaseHTTPRequestHandler):
        def do_GET(self):
            self.send_response(200 if self.path == "/health" else 404); self.end_headers()
        def log_message(self, *a): pass
    if mode == "slow":
        time.sleep(600)
    http.server.HTTPServer(("127.0.0.1", port), H).serve_forever()
""")


def fake_plan(tmp_path: Path, mode: str) -> LaunchPlan:
    script = tmp_path / "fake_server.py"
    script.write_text(FAKE_SERVER)
    port = free_port()
    return LaunchPlan([sys.executable, str(script), str(port), mode], {}, "127.0.0.1", port)


def _group_alive(pgid: int) -> bool:
    import os

    try:
        os.killpg(pgid, 0)
        return True
    except ProcessLookupError:
        return False


def test_free_port_is_chosen_below_the_ephemeral_range(tmp_path, monkeypatch):
    """A port the kernel could hand to another process's bind(0) or an outgoing connection
    before the server binds it is not chosen: free_port picks below the ephemeral range
    where the kernel states it, and a port something listens on is never returned."""
    import socket

    from attnbench.runner import server

    start = server.ephemeral_ports_start()
    if start is not None and start > server.LOWEST_CHOSEN_PORT:
        assert all(server.LOWEST_CHOSEN_PORT <= free_port() < start for _ in range(20))
    # a stated range with one port below it, held by a listener: the fallback asks the kernel
    ranges = tmp_path / "ip_local_port_range"
    with socket.socket() as held:
        held.bind(("127.0.0.1", 0))
        held.listen()
        taken = held.getsockname()[1]
        ranges.write_text(f"{taken + 1}\t60999\n")
        monkeypatch.setattr(server, "EPHEMERAL_PORTS_FILE", ranges)
        monkeypatch.setattr(server, "LOWEST_CHOSEN_PORT", taken)
        port = free_port()
        assert port != taken and port_is_free("127.0.0.1", port)
    ranges.write_text("not a range")
    assert server.ephemeral_ports_start() is None


def test_start_health_stop_kills_the_whole_group(tmp_path):
    plan = fake_plan(tmp_path, "ok")
    with ServerProcess(plan, tmp_path / "server.log", startup_timeout_s=30) as server:
        assert server.healthy()
        pgid = server.proc.pid
    assert not _group_alive(pgid), "a process of the server's group survived stop()"
    assert port_is_free(plan.host, plan.port)
    assert "fake_server.py" in (tmp_path / "server.log").read_text()  # argv logged


def test_exits_within_waits_for_a_killed_server(tmp_path):
    """A repeat whose requests failed asks whether the server is dying: a killed one is
    reported as exited, a live one is not (after the timeout)."""
    import os
    import signal
    import threading

    with ServerProcess(fake_plan(tmp_path, "ok"), tmp_path / "server.log", startup_timeout_s=30) as server:
        assert not server.exits_within(0.3)
        threading.Timer(0.3, lambda: os.killpg(server.proc.pid, signal.SIGKILL)).start()
        assert server.exits_within(10.0) and not server.alive()


def test_early_exit_reports_the_log_tail(tmp_path):
    with pytest.raises(ServerError) as info:
        with ServerProcess(fake_plan(tmp_path, "crash"), tmp_path / "server.log", startup_timeout_s=30):
            pass
    assert "exited with code 2" in str(info.value)
    assert "bad argument --frobnicate" in str(info.value)


def test_failed_start_quotes_the_root_cause(tmp_path):
    """vLLM's engine fails with a ValueError and its API server then with "Engine core
    initialization failed. See root cause above": the error names the ValueError."""
    log = Path(__file__).parent / "data" / "vllm-start-failure.log"
    with pytest.raises(ServerError) as info:
        with ServerProcess(fake_plan(tmp_path, f"replay={log}"), tmp_path / "server.log", startup_timeout_s=30):
            pass
    message = str(info.value)
    assert message.startswith("vLLM server exited with code 1 during start-up: ValueError: Free memory on device")
    assert "root cause above" not in message and "Traceback" not in message
    assert message.count("\n") == 0 and str(tmp_path / "server.log") in message


def test_ctrl_c_during_start_stops_the_server_in_seconds(tmp_path):
    """A server that ignores TERM while it starts: Ctrl-C says so at once and KILLs its
    group after the short grace, not the 30 s of a normal stop."""
    import os
    import signal
    import subprocess
    import time

    plan = fake_plan(tmp_path, "stubborn")
    driver = tmp_path / "driver.py"
    driver.write_text(textwrap.dedent(f"""
        from pathlib import Path
        from attnbench.runner.server import LaunchPlan, ServerProcess
        plan = LaunchPlan({plan.argv!r}, {{}}, "127.0.0.1", {plan.port})
        print("starting", flush=True)
        try:
            with ServerProcess(plan, Path({str(tmp_path / "server.log")!r}), startup_timeout_s=600):
                pass
        except KeyboardInterrupt:
            print("interrupted", flush=True)
    """))
    proc = subprocess.Popen([sys.executable, str(driver)], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    assert proc.stdout.readline().strip() == "starting"
    time.sleep(1.0)
    started = time.monotonic()
    os.kill(proc.pid, signal.SIGINT)
    out, err = proc.communicate(timeout=30)
    assert time.monotonic() - started < 10, "Ctrl-C took as long as a normal stop"
    assert "stopping the vLLM server..." in err and "interrupted" in out
    left = subprocess.run(["pgrep", "-f", f"{tmp_path}/fake_server.py"], capture_output=True, text=True).stdout
    assert left.strip() == "", "the stubborn server survived"


def test_startup_timeout_stops_the_server(tmp_path):
    plan = fake_plan(tmp_path, "slow")
    server = ServerProcess(plan, tmp_path / "server.log", startup_timeout_s=2, stop_grace_s=2)
    with pytest.raises(ServerError, match="not healthy after 2 s"):
        with server:
            pass
    assert server.proc is None and port_is_free(plan.host, plan.port)


def test_port_in_use_is_a_clear_error(tmp_path):
    plan = fake_plan(tmp_path, "ok")
    with socket.socket() as s:
        s.bind((plan.host, plan.port))
        s.listen()
        with pytest.raises(PortInUseError, match=f"port {plan.port} .* already in use"):
            ServerProcess(plan, tmp_path / "server.log").start()


def test_server_dies_with_a_killed_attnbench(tmp_path):
    """attnbench killed by SIGKILL (no cleanup runs) must not leave its server behind."""
    import signal
    import subprocess
    import time

    plan = fake_plan(tmp_path, "ok")
    driver = tmp_path / "driver.py"
    driver.write_text(textwrap.dedent(f"""
        import sys, time
        from pathlib import Path
        from attnbench.runner.server import LaunchPlan, ServerProcess
        plan = LaunchPlan({plan.argv!r}, {{}}, "127.0.0.1", {plan.port})
        server = ServerProcess(plan, Path({str(tmp_path / "server.log")!r}), startup_timeout_s=30).start()
        server.wait_ready()
        print(server.proc.pid, flush=True)
        time.sleep(600)
    """))
    proc = subprocess.Popen([sys.executable, str(driver)], stdout=subprocess.PIPE, text=True)
    server_pid = int(proc.stdout.readline())
    assert _group_alive(server_pid)
    proc.send_signal(signal.SIGKILL)
    proc.wait()
    deadline = time.monotonic() + 15
    while _group_alive(server_pid) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert not _group_alive(server_pid), "the server outlived a SIGKILLed attnbench"
    while not port_is_free(plan.host, plan.port) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert port_is_free(plan.host, plan.port)
