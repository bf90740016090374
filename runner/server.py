"""Start, watch and stop a real `vllm serve` process.

`build_launch` turns a recipe into a `LaunchPlan` (an argv list, never a shell string, and
an environment) for one of two launchers: ``process`` (`vllm serve` in this Python, e.g.
inside the container or a venv) and ``docker`` (``docker run`` of an image, for
version-vs-version runs); both run vLLM's own CLI through `VLLM_SERVE_MODULE`.
`ServerProcess` runs a plan in its own process group with a log file, waits for
``/health``, reports an early exit with the log's last lines, and on stop sends TERM to the
whole group, then KILL after a grace period, and checks that the port is free again.
"""

from __future__ import annotations

import ctypes
import json
import os
import random
import shlex
import signal
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path

from attnbench.kernels.schema import VARIANT_ENV

from .recipe import Recipe
from .secrets import redact_env
from .serverlog import root_cause

# `vllm serve`, run as ``python -m VLLM_SERVE_MODULE serve ...`` so that the server is the
# Python attnbench (and its vLLM plugin) is installed in, on vLLM's CPU wheel too
# (kernels/plugin/vllm_cli.py). The runner names the module; it never imports it.
VLLM_SERVE_MODULE = "attnbench.kernels.plugin.vllm_cli"


INTERRUPT_GRACE_S = 3.0  # Ctrl-C during start-up: TERM, this long, then KILL of the group


class ServerError(RuntimeError):
    """The server could not be started or stopped cleanly."""


class PortInUseError(ServerError):
    pass


@dataclass
class LaunchPlan:
    argv: list[str]
    env: dict[str, str]
    host: str
    port: int
    container: str | None = None  # docker: the container name, for stop

    @property
    def base_url(self) -> str:
        return f"http://{self.host}:{self.port}"

    def shell_line(self, port_label: str | None = None) -> str:
        """For display (`attnbench recipes show`, the first line of server.log), secret
        values redacted; ``port_label`` in place of the port number (a free port that is
        picked only when the server starts)."""
        env = " ".join(f"{k}={shlex.quote(v)}" for k, v in sorted(redact_env(self.env).items()))
        argv = self.argv
        if port_label is not None:
            bound = f"{self.host}:{self.port}:{self.port}"
            argv = [port_label if i and argv[i - 1] == "--port" else
                    f"{self.host}:{port_label}:{port_label}" if a == bound else a for i, a in enumerate(argv)]
        return (env + " " if env else "") + shlex.join(argv)


EPHEMERAL_PORTS_FILE = Path("/proc/sys/net/ipv4/ip_local_port_range")  # Linux: "low high"
LOWEST_CHOSEN_PORT = 10000  # free_port chooses from here up to the ephemeral range


def ephemeral_ports_start() -> int | None:
    """The first port the kernel hands out for bind(0) and outgoing connections, where it says."""
    try:
        return int(EPHEMERAL_PORTS_FILE.read_text().split()[0])
    except (OSError, ValueError, IndexError):
        return None


def free_port(host: str = "127.0.0.1") -> int:
    """A port nothing listens on now, for a server started moments later. Chosen at random
    below the kernel's ephemeral range where that is known: a port the kernel handed out
    (bind to port 0) can be handed out again before the server binds it, to an outgoing
    connection or to another process's bind(0), such as a vLLM server's own ZMQ and
    torch.distributed sockets, and the launch then finds it in use."""
    start = ephemeral_ports_start()
    if start is not None and start > LOWEST_CHOSEN_PORT:
        rng = random.SystemRandom()
        for _ in range(64):
            port = rng.randrange(LOWEST_CHOSEN_PORT, start)
            if port_is_free(host, port):
                return port
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind((host, 0))
        return s.getsockname()[1]


def port_is_free(host: str, port: int) -> bool:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            s.bind((host, port))
        except OSError:
            return False
    return True


def vllm_args(recipe: Recipe, host: str, port: int) -> list[str]:
    """The `vllm serve` arguments of a recipe (after applying its engine preset): the model
    first, as the positional argument every vLLM's `vllm serve` takes (vLLM 0.10, the last
    with the V0 engine, refuses it as ``--model``), then the flags."""
    m, s = recipe.model, recipe.serve
    args = [m.path, "--served-model-name", m.name, "--host", host, "--port", str(port)]
    if m.tokenizer:
        args += ["--tokenizer", m.tokenizer]
    if s.resolved("max_num_seqs") is not None:
        args += ["--max-num-seqs", str(s.resolved("max_num_seqs"))]
    chunked = s.resolved("enable_chunked_prefill")
    if chunked is not None:
        args.append("--enable-chunked-prefill" if chunked else "--no-enable-chunked-prefill")
    if s.resolved("max_num_batched_tokens") is not None:
        args += ["--max-num-batched-tokens", str(s.resolved("max_num_batched_tokens"))]
    args.append("--enable-prefix-caching" if s.enable_prefix_caching else "--no-enable-prefix-caching")
    if s.attention_backend and s.engine != "v0":  # V0 reads VLLM_ATTENTION_BACKEND (server_env)
        args += ["--attention-backend", s.attention_backend]
    args += graph_mode_args(s.graph_mode)
    if s.tensor_parallel_size != 1:
        args += ["--tensor-parallel-size", str(s.tensor_parallel_size)]
    if s.api_server_count is not None:
        args += ["--api-server-count", str(s.api_server_count)]
    for flag, value in (("--dtype", s.dtype), ("--max-model-len", s.max_model_len),
                        ("--load-format", s.load_format),
                        ("--gpu-memory-utilization", s.gpu_memory_utilization)):
        if value is not None:
            args += [flag, str(value)]
    return args + list(s.extra_args)


_CUDAGRAPH_MODE = {"piecewise": "PIECEWISE", "full": "FULL", "full_decode_only": "FULL_DECODE_ONLY",
                   "full_and_piecewise": "FULL_AND_PIECEWISE"}


def graph_mode_args(mode: str | None) -> list[str]:
    """vLLM flags for a recipe's ``graph_mode``: eager -> --enforce-eager, else a compilation
    config naming the CUDA-graph mode (recipe.GRAPH_MODES)."""
    if mode is None:
        return []
    if mode == "eager":
        return ["--enforce-eager"]
    return ["--compilation-config", json.dumps({"cudagraph_mode": _CUDAGRAPH_MODE[mode]})]


def server_env(recipe: Recipe) -> dict[str, str]:
    """The server's environment: the recipe's ``serve.env``, attnbench's kernel step for the
    CUSTOM backend (``kernel_variant`` as ATTNBENCH_VARIANT), and for ``engine: v0`` the
    switches of vLLM's V0 engine (VLLM_USE_V1=0, the backend in VLLM_ATTENTION_BACKEND).
    With prefix caching on, VLLM_SERVER_DEV_MODE=1 opens POST /reset_prefix_cache, so that
    every repeat starts from an empty cache (`ServerProcess.reset_prefix_cache`)."""
    s = recipe.serve
    env = dict(s.env)
    if s.enable_prefix_caching and s.engine != "v0":
        env.setdefault("VLLM_SERVER_DEV_MODE", "1")
    if s.kernel_variant is not None:
        env[VARIANT_ENV] = s.kernel_variant
    if s.engine == "v0":
        env["VLLM_USE_V1"] = "0"
        if s.attention_backend:
            env["VLLM_ATTENTION_BACKEND"] = s.attention_backend
    return env


DOCKER_DEVICE_ARGS = {
    "nvidia": ["--gpus", "all", "--ipc=host"],
    # as vLLM documents for ROCm containers
    "amd": ["--device", "/dev/kfd", "--device", "/dev/dri", "--group-add", "video", "--ipc=host",
            "--security-opt", "seccomp=unconfined", "--cap-add", "SYS_PTRACE"],
    "none": [],
}


def build_launch(recipe: Recipe, port: int | None = None, python: str | None = None) -> LaunchPlan:
    """The argv and environment that start ``recipe``'s server."""
    s = recipe.serve
    port = port or s.port or free_port(s.host)
    if s.launcher == "process":
        argv = [python or sys.executable, "-m", VLLM_SERVE_MODULE, "serve", *vllm_args(recipe, s.host, port)]
        return LaunchPlan(argv, server_env(recipe), s.host, port)
    container = f"attnbench-{recipe.name}-{os.getpid()}-{port}"
    argv = ["docker", "run", "--rm", "--name", container, *DOCKER_DEVICE_ARGS[s.gpu_vendor],
            "-p", f"{s.host}:{port}:{port}"]
    model_dir = Path(recipe.model.path)
    if model_dir.exists():  # a local folder: mount it at the same path, read-only
        argv += ["-v", f"{model_dir.resolve()}:{model_dir.resolve()}:ro"]
    hf_home = os.environ.get("HF_HOME", str(Path.home() / ".cache" / "huggingface"))
    argv += ["-v", f"{hf_home}:/hf-cache", "-e", "HF_HOME=/hf-cache"]
    env = server_env(recipe)
    for key in sorted(env):  # by name only: docker takes each value from its own environment
        argv += ["-e", key]
    inner = vllm_args(recipe, "0.0.0.0", port)
    if model_dir.exists():
        inner[0] = str(model_dir.resolve())
    argv += ["--entrypoint", "python3", s.image, "-m", VLLM_SERVE_MODULE, "serve", *inner]
    return LaunchPlan(argv, env, s.host, port, container=container)


def _die_with_parent() -> None:
    """In the server's process (before exec): SIGTERM it when attnbench dies, even by SIGKILL.

    The server runs in its own session (so that stop() can signal its whole group), which
    also shields it from the signals that end attnbench; without this a killed attnbench
    would leave vLLM holding the GPU and the port. Linux only (prctl PR_SET_PDEATHSIG).
    """
    if sys.platform.startswith("linux"):
        PR_SET_PDEATHSIG = 1
        ctypes.CDLL(None, use_errno=True).prctl(PR_SET_PDEATHSIG, signal.SIGTERM)


def log_tail(path: Path, lines: int = 30) -> str:
    """The last ``lines`` lines of a log file, for error messages."""
    try:
        return "\n".join(path.read_text(errors="replace").splitlines()[-lines:])
    except OSError:
        return "(no log)"


@dataclass
class ServerProcess:
    """A running server: ``with ServerProcess(plan, log) as server: ...`` starts and stops it."""

    plan: LaunchPlan
    log_path: Path
    startup_timeout_s: float = 900.0
    stop_grace_s: float = 30.0
    proc: subprocess.Popen | None = field(default=None, init=False)
    log_offset: int = field(default=0, init=False)  # where this start's lines begin in the log

    def log_text(self) -> str:
        """What this server has written to its log so far (earlier starts' lines excluded)."""
        try:
            with open(self.log_path, "rb") as fh:
                fh.seek(self.log_offset)
                return fh.read().decode(errors="replace")
        except OSError:
            return ""

    def start(self) -> "ServerProcess":
        if not port_is_free(self.plan.host, self.plan.port):
            raise PortInUseError(
                f"port {self.plan.port} on {self.plan.host} is already in use: stop what holds it "
                f"(e.g. `ss -ltnp 'sport = :{self.plan.port}'`) or set serve.port to another port")
        self.log_path.parent.mkdir(parents=True, exist_ok=True)
        self.log_offset = self.log_path.stat().st_size if self.log_path.exists() else 0
        with open(self.log_path, "ab") as log:
            log.write(f"$ {self.plan.shell_line()}\n".encode())
            log.flush()
            self.proc = subprocess.Popen(
                self.plan.argv, stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                env={**os.environ, **self.plan.env}, start_new_session=True,
                preexec_fn=_die_with_parent)
        return self

    def alive(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def exits_within(self, seconds: float) -> bool:
        """Whether the server has exited or does within ``seconds``: a killed server drops
        its connections a moment before its process is gone."""
        if self.proc is None:
            return True
        try:
            self.proc.wait(timeout=seconds)
            return True
        except subprocess.TimeoutExpired:
            return False

    def healthy(self) -> bool:
        try:
            with urllib.request.urlopen(self.plan.base_url + "/health", timeout=2) as r:
                return r.status == 200
        except (urllib.error.URLError, ConnectionError, TimeoutError, OSError):
            return False

    def wait_ready(self) -> None:
        """Block until /health answers 200; raise with the log tail if the server exits or
        the start-up timeout passes (the server is stopped first)."""
        deadline = time.monotonic() + self.startup_timeout_s
        while time.monotonic() < deadline:
            if not self.alive():
                code = self.proc.returncode if self.proc else None
                self.stop()
                cause = root_cause(self.log_text())
                detail = cause if cause else "last lines:\n" + log_tail(self.log_path)
                raise ServerError(f"vLLM server exited with code {code} during start-up: {detail} "
                                  f"(log: {self.log_path})")
            if self.healthy():
                return
            time.sleep(0.5)
        self.stop()
        raise ServerError(f"vLLM server not healthy after {self.startup_timeout_s:.0f} s "
                          f"(log: {self.log_path}); last lines:\n{log_tail(self.log_path)}")

    def version(self) -> str | None:
        """vLLM's self-reported version (GET /version), if it answers."""
        try:
            with urllib.request.urlopen(self.plan.base_url + "/version", timeout=2) as r:
                return json.loads(r.read()).get("version")
        except Exception:  # noqa: BLE001 - provenance only
            return None

    def reset_prefix_cache(self, attempts: int = 10) -> str:
        """Empty the server's prefix cache (POST /reset_prefix_cache, which vLLM opens in its
        dev mode); vLLM refuses while blocks are held, so a refusal is retried for up to
        ``attempts`` half-seconds. "" when it was emptied, else why not (one line)."""
        why = ""
        for _ in range(attempts):
            request = urllib.request.Request(self.plan.base_url + "/reset_prefix_cache", method="POST")
            try:
                with urllib.request.urlopen(request, timeout=10) as r:
                    body = r.read()
            except urllib.error.HTTPError as e:
                return (f"POST /reset_prefix_cache: HTTP {e.code} (vLLM opens it with VLLM_SERVER_DEV_MODE=1)"
                        if e.code == 404 else f"POST /reset_prefix_cache: HTTP {e.code}")
            except (urllib.error.URLError, OSError) as e:
                return f"POST /reset_prefix_cache: {e}"
            try:
                ok = json.loads(body).get("success", True) if body.strip() else True
            except ValueError:
                ok = True  # older vLLM answered 200 with no JSON
            if ok:
                return ""
            why = "the server refused (blocks still held)"
            time.sleep(0.5)
        return f"POST /reset_prefix_cache: {why}"

    def _group_alive(self, pgid: int) -> bool:
        try:
            os.killpg(pgid, 0)
            return True
        except ProcessLookupError:
            return False

    def stop(self, grace_s: float | None = None) -> None:
        """TERM the process group, KILL it after the grace period (``stop_grace_s`` unless
        given), reap, check the port."""
        if self.proc is None:
            return
        grace_s = self.stop_grace_s if grace_s is None else grace_s
        pgid = self.proc.pid  # leader of its own session/group
        if self.plan.container:
            subprocess.run(["docker", "stop", "-t", str(int(grace_s)), self.plan.container],
                           capture_output=True, check=False)
        for sig, wait_s in ((signal.SIGTERM, grace_s), (signal.SIGKILL, 10.0)):
            if not self._group_alive(pgid):
                break
            try:
                os.killpg(pgid, sig)
                os.killpg(pgid, signal.SIGCONT)  # a stopped (hung) server must run to take its TERM
            except ProcessLookupError:
                break
            deadline = time.monotonic() + wait_s
            while time.monotonic() < deadline and self._group_alive(pgid):
                if self.proc.poll() is None:
                    try:
                        self.proc.wait(timeout=0.2)
                    except subprocess.TimeoutExpired:
                        pass
                else:
                    time.sleep(0.2)
        if self.proc.poll() is None:
            self.proc.wait(timeout=5)
        self.proc = None
        deadline = time.monotonic() + 15
        while not port_is_free(self.plan.host, self.plan.port):
            if time.monotonic() > deadline:
                raise ServerError(f"port {self.plan.port} still busy after the server stopped")
            time.sleep(0.2)

    def __enter__(self) -> "ServerProcess":
        self.start()
        try:
            self.wait_ready()
        except KeyboardInterrupt:
            # a server still starting has nothing to finish: say so at once, stop it fast
            print("\nstopping the vLLM server...", file=sys.stderr, flush=True)
            self.stop(grace_s=INTERRUPT_GRACE_S)
            raise
        except BaseException:
            self.stop()
            raise
        return self

    def __exit__(self, *exc) -> None:
        self.stop()
