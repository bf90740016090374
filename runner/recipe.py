"""Recipes: what server to start and what load to send, as validated pydantic models.

A suite file (recipes/*.yaml) holds ``defaults`` and named ``runs``; each run is merged
over the defaults (nested keys merge, lists replace) and may expand a ``matrix`` of
alternative values into several runs. Every resolved run is a `Recipe`: a model, serve
settings and benchmark settings. Unknown keys are errors; every error names the file, the
field path and the bad value.
"""

from __future__ import annotations

import copy
import fnmatch
import hashlib
import itertools
import json
import math
import re
from pathlib import Path
from typing import Annotated, Any, Literal

from attnbench.kernels.schema import VARIANT_ENV, VLLM_BACKEND_NAME
from attnbench.kernels.variants import CHOICES as KERNEL_VARIANTS
from attnbench.validation import read_yaml, validation_lines
from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator

from .models import ARCHS
from .names import check_name, slug
from .secrets import redact_recipe
from .slo import Slo

GRAPH_MODES = ("eager", "piecewise", "full", "full_decode_only", "full_and_piecewise")  # server.graph_mode_args

# Scheduler defaults of the engine presets (blog: V0 default vs V1 default). ``v0`` is vLLM's
# real V0 engine (vLLM <= 0.10, started with VLLM_USE_V1=0); ``v0-style`` only V0's
# scheduler settings on the V1 engine; reports call it "V0-style settings on V1".
_V0_SCHEDULER = {"max_num_seqs": 256, "enable_chunked_prefill": False, "max_num_batched_tokens": None}
ENGINE_PRESETS = {
    "v0": _V0_SCHEDULER,
    "v0-style": _V0_SCHEDULER,
    "v1": {"max_num_seqs": 1024, "enable_chunked_prefill": True, "max_num_batched_tokens": 8192},
}
# vLLM flags that server.vllm_args writes from a recipe field (the field); serve.extra_args
# refuses them
FIELD_FLAGS = {"--model": "model.path", "--served-model-name": "model.served_name", "--host": "serve.host",
               "--port": "serve.port", "--tokenizer": "model.tokenizer", "--max-num-seqs": "serve.max_num_seqs",
               "--enable-chunked-prefill": "serve.enable_chunked_prefill",
               "--no-enable-chunked-prefill": "serve.enable_chunked_prefill",
               "--max-num-batched-tokens": "serve.max_num_batched_tokens",
               "--enable-prefix-caching": "serve.enable_prefix_caching",
               "--no-enable-prefix-caching": "serve.enable_prefix_caching",
               "--attention-backend": "serve.attention_backend", "--enforce-eager": "serve.graph_mode",
               "--tensor-parallel-size": "serve.tensor_parallel_size", "-tp": "serve.tensor_parallel_size",
               "--api-server-count": "serve.api_server_count", "-asc": "serve.api_server_count",
               "--dtype": "serve.dtype", "--max-model-len": "serve.max_model_len", "--load-format": "serve.load_format",
               "--gpu-memory-utilization": "serve.gpu_memory_utilization"}
ENGINE_LABELS = {"v0": "V0", "v0-style": "V0-style settings on V1", "v1": "V1"}
V0_LAST_RELEASE = (0, 10)  # V0 was removed in vLLM 0.11


class RecipeError(ValueError):
    """A recipe or suite that does not validate; the message names file, field and value."""


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid")


def one_of(value, choices):
    """``value`` if it is None or one of ``choices``; else the error pydantic reports for the field."""
    if value is not None and value not in choices:
        raise ValueError(f"expected one of {list(choices)}")
    return value


class ModelSpec(_Strict):
    """The model to serve.

    ``path`` is a local folder or a Hugging Face id. ``build`` makes the folder on first use
    when it is missing: ``tiny`` (a small Llama with random weights and a locally trained
    tokenizer) or ``dummy:<arch>`` (a published architecture's config.json and a local
    tokenizer, no weights: serve it with ``load_format: dummy``). ``arch`` names the
    published shape of ``path``, so that ``attnbench run --models dummy`` can serve that
    shape with random weights instead of downloading the checkpoint.
    """

    path: str
    served_name: str | None = None
    tokenizer: str | None = None
    build: str | None = None
    arch: str | None = None  # a key of runner.models.ARCHS: lets `--models dummy` swap in that shape

    @field_validator("arch")
    @classmethod
    def _arch(cls, v):
        return one_of(v, sorted(ARCHS))

    @field_validator("build")
    @classmethod
    def _build(cls, v):
        if v is None or v == "tiny" or re.fullmatch(r"dummy:[a-z0-9.\-]+", v):
            return v
        raise ValueError("expected 'tiny' or 'dummy:<arch>'")

    @property
    def name(self) -> str:
        return self.served_name or Path(self.path).name

    @property
    def tokenizer_path(self) -> str:
        return self.tokenizer or self.path


class ServeSettings(_Strict):
    """vLLM server settings. ``None`` means: the engine preset's value, else vLLM's default.

    ``gpu_vendor`` is the accelerator the server needs: ``nvidia``, ``amd`` or ``none``
    (vLLM's CPU build). `attnbench run` checks for it before starting a ``process``
    server; the ``docker`` launcher also passes that vendor's device flags.

    ``engine: v0`` starts vLLM's V0 engine (``VLLM_USE_V1=0``; vLLM <= 0.10, so an older
    image or venv) with V0's scheduler defaults; the runner checks that the server really
    runs V0 before measuring. V0 has no ``--attention-backend`` flag (the backend goes in
    ``VLLM_ATTENTION_BACKEND``) and no CUDA-graph modes (``graph_mode``: eager or unset).

    ``kernel_variant`` picks which of attnbench's own kernels computes attention (``auto``,
    the paper's steps ``naive``, ``qblock``, ``parallel_tiled``, ``static_grid``, and
    ``qblock_ws`` on Hopper; `attnbench.kernels.variants`); they serve through attnbench's
    vLLM plugin, so it needs ``attention_backend: CUSTOM``. The server gets it as ``ATTNBENCH_VARIANT``. The older
    spelling ``env: {ATTNBENCH_VARIANT: ...}`` is read into this field and checked the same way.
    """

    engine: Literal["v1", "v0", "v0-style"] = "v1"
    max_num_seqs: int | None = Field(None, ge=1)
    enable_chunked_prefill: bool | None = None
    max_num_batched_tokens: int | None = Field(None, ge=1)
    enable_prefix_caching: bool = False
    attention_backend: str | None = None
    kernel_variant: str | None = None
    graph_mode: Literal[GRAPH_MODES] | None = None  # type: ignore[valid-type]
    tensor_parallel_size: int = Field(1, ge=1)
    api_server_count: int | None = Field(None, ge=1)  # `vllm serve --api-server-count`: API-server processes
    dtype: str | None = None
    max_model_len: int | None = Field(None, ge=16)
    load_format: str | None = None
    gpu_memory_utilization: float | None = Field(None, gt=0, le=1)
    host: str = "127.0.0.1"
    port: int | None = Field(None, ge=1, le=65535)
    launcher: Literal["process", "docker"] = "process"
    image: str | None = None
    gpu_vendor: Literal["nvidia", "amd", "none"] = "nvidia"
    startup_timeout_s: float = Field(900, gt=0)
    extra_args: list[str] = []
    env: dict[str, str] = {}

    @field_validator("kernel_variant")
    @classmethod
    def _known_variant(cls, v):
        return one_of(v, KERNEL_VARIANTS)

    @field_validator("extra_args")
    @classmethod
    def _no_flags_with_a_field(cls, v):
        # A flag that has its own field goes there, so that a run's recipe (and the tables
        # grouped by its fields) says what the server ran with.
        for arg in v:
            flag = arg.split("=", 1)[0]
            if flag in FIELD_FLAGS:
                raise ValueError(f"{arg!r}: set {FIELD_FLAGS[flag]} instead of passing {flag} in extra_args")
        return v

    @model_validator(mode="after")
    def _variant_needs_custom_backend(self):
        named = self.env.get(VARIANT_ENV)
        if named is not None:  # the older spelling: into kernel_variant, checked the same way
            if named not in KERNEL_VARIANTS:
                raise ValueError(f"env.{VARIANT_ENV}: expected one of {list(KERNEL_VARIANTS)}, got {named!r}")
            if self.kernel_variant not in (None, named):
                raise ValueError(f"kernel_variant {self.kernel_variant!r} and env.{VARIANT_ENV} {named!r} "
                                 "disagree; keep kernel_variant")
            self.kernel_variant = named
            self.env = {k: v for k, v in self.env.items() if k != VARIANT_ENV}
        if self.kernel_variant is not None and self.attention_backend != VLLM_BACKEND_NAME:
            raise ValueError(f"kernel_variant {self.kernel_variant!r} picks a step of attnbench's kernels, which "
                             f"serve only as attention_backend {VLLM_BACKEND_NAME!r} (got "
                             f"{self.attention_backend!r})")
        return self

    @model_validator(mode="after")
    def _docker_needs_image(self):
        if self.launcher == "docker" and not self.image:
            raise ValueError("launcher 'docker' needs 'image'")
        return self

    @model_validator(mode="after")
    def _v0_has_no_v1_settings(self):
        if self.engine == "v0" and self.graph_mode not in (None, "eager"):
            raise ValueError(f"engine 'v0' has no CUDA-graph modes (graph_mode {self.graph_mode!r} is a V1 "
                             "setting); use 'eager' or leave it unset")
        if self.engine == "v0" and (self.api_server_count or 1) > 1:
            raise ValueError(f"engine 'v0' runs one API server (api_server_count {self.api_server_count} "
                             "needs the V1 engine); leave it unset")
        return self

    def resolved(self, key: str):
        """A scheduler setting after applying the engine preset."""
        value = getattr(self, key)
        return ENGINE_PRESETS[self.engine].get(key) if value is None else value


class DatasetSpec(_Strict):
    """Where prompts come from, and for some kinds how they are timed.

    sharegpt:      ``path`` to ShareGPT JSON (vLLM's filtering: >= 2 turns, prompt >= 4 and
                   output >= 4 tokens, prompt <= 1024, prompt + output <= 2048)
    synthetic:     ShareGPT-shaped lengths drawn from log-normal distributions (see
                   `datasets.SyntheticShape`), random text of those lengths
    random:        fixed ``input_len`` / ``output_len`` for every request
    shared_prefix: ``num_prefixes`` random prefixes of ``prefix_len`` tokens, each request one
                   of them (in turn) plus its own suffix of ``input_len`` tokens, ``output_len``
                   out, in a seeded random order (`vllm bench serve`'s prefix_repetition)
    multiturn:     whole ShareGPT conversations from ``path``, each user turn sent when the
                   answer to the one before has arrived (and ``think_time_s`` passed), with
                   the history (earlier turns and the server's answers) before it; at most
                   ``conversations`` at a time and ``max_turns`` turns each; a conversation
                   ends before a turn whose history would pass ``max_total_len`` tokens
                   (runner/multiturn.py). ``num_prompts`` counts conversations. Without
                   ``path``: synthetic conversations of 2 to ``max_turns`` turns, each turn
                   and answer of the synthetic kind's lengths.
    trace:         a JSONL file at ``path``, one request per line (the Mooncake format:
                   ``timestamp`` ms, ``input_length``, ``output_length``, optional
                   ``hash_ids``: the request's blocks of ``block_size`` tokens, one id per
                   block, equal ids equal text), sent at its timestamps divided by
                   ``speedup`` (runner/trace.py). ``num_prompts`` counts lines from the top.
    """

    kind: Literal["sharegpt", "synthetic", "random", "shared_prefix", "multiturn", "trace"] = "synthetic"
    path: str | None = None
    input_len: int | None = Field(None, ge=1)
    output_len: int | None = Field(None, ge=1)
    # synthetic shape: medians and log-sigma of prompt / output lengths, caps
    prompt_median: float = Field(220, gt=0)
    prompt_sigma: float = Field(1.0, ge=0)
    output_median: float = Field(180, gt=0)
    output_sigma: float = Field(0.9, ge=0)
    max_prompt_len: int = Field(1024, ge=4)
    max_total_len: int = Field(2048, ge=8)
    # shared_prefix
    num_prefixes: int = Field(4, ge=1)
    prefix_len: int | None = Field(None, ge=1)
    # multiturn
    conversations: int = Field(8, ge=1)  # conversations in flight at a time
    think_time_s: float = Field(0.0, ge=0)  # from an answer's end to the next turn (s)
    max_turns: int = Field(8, ge=1)  # user turns per conversation at most
    # trace
    speedup: float = Field(1.0, gt=0)  # replay the timestamps this many times faster
    block_size: int = Field(512, ge=1)  # tokens per hash id (Mooncake's 512)

    @model_validator(mode="after")
    def _needs(self):
        if self.kind in ("sharegpt", "trace") and not self.path:
            what = "the JSONL trace" if self.kind == "trace" else "the ShareGPT JSON file"
            raise ValueError(f"kind '{self.kind}' needs 'path' ({what})")
        if self.kind == "random" and (self.input_len is None or self.output_len is None):
            raise ValueError("kind 'random' needs 'input_len' and 'output_len'")
        if self.kind == "shared_prefix" and (self.prefix_len is None or self.input_len is None
                                             or self.output_len is None):
            raise ValueError("kind 'shared_prefix' needs 'prefix_len' (the shared prefix's tokens), 'input_len' "
                             "(each request's own suffix) and 'output_len'")
        return self

    @property
    def timed_by_itself(self) -> bool:
        """Its own clock sends the requests (a trace's timestamps, a conversation's answers):
        ``request_rate``, ``arrival`` and a knee search do not apply."""
        return self.kind in ("multiturn", "trace")


PROBES_AT_MOST = 32  # knee probes a search may take


class KneeSettings(_Strict):
    """``benchmark.knee``: how far the search may go and how close it must come (runner/knee.py)."""

    max_probes: int = Field(8, ge=2, le=PROBES_AT_MOST)
    tolerance: float = Field(0.05, gt=0, le=0.5)  # stop when hi <= lo x (1 + tolerance)
    probe_s: float = Field(60.0, gt=0, le=3600)  # seconds of arrivals a rated probe sends at least
    keep_up: float = Field(0.9, gt=0, le=1)  # the least `metrics.keep_up` at which a rated probe holds

    def requests_at(self, rate: float, num_prompts: int) -> int:
        """How many requests the probe at ``rate`` (req/s; inf: the burst) sends: the
        benchmark's ``num_prompts``, or more where they would arrive in under ``probe_s``."""
        return num_prompts if math.isinf(rate) else max(num_prompts, math.ceil(rate * self.probe_s))


class BenchmarkSettings(_Strict):
    """The load: which prompts, how fast, how many times.

    ``request_rate`` is requests/s (``inf`` sends all at once); ``arrival`` shapes the gaps:
    constant, poisson (exponential gaps), gamma (``burstiness`` < 1 burstier, > 1 smoother;
    1 is Poisson). ``warmup_requests`` run once per server start and are not measured.
    ``warmup_output_len`` caps the warm-up requests' output length (default: the run's own
    lengths); a batch-1 sweep to 12,800 tokens need not spend minutes warming up.
    ``request_timeout_s`` is the most one request may take; ``idle_timeout_s`` the most the
    server may send nothing at all while requests are in flight, after which the load stops
    (a hung server); either makes the repeat ``degraded`` (runner/summary.py).
    ``per_chunk_usage`` asks vLLM for usage in every streamed chunk (exact tokens per chunk,
    for ``itl_per_token``) at a cost in the server's API process (runner/loadgen.py).
    ``client_processes`` spreads the load over that many client processes (runner/loadpool.py);
    ``auto`` picks one per 128 requests that can be in flight (``max_concurrency``, else
    ``num_prompts``), at most 8 and at most half the host's CPUs (`loadpool.auto_processes`).
    ``goodput_slo_ms`` bounds per request (ms) for ``request_goodput``, as ``vllm bench serve
    --goodput``; ``slo`` objectives at a percentile (``{objectives: ["p90 ttft <= 500 ms",
    "p90 tpot <= 50 ms"], target: 0.9}``), each repeat's attainment reported (runner/slo.py).
    ``knee`` (``{max_probes: 8, tolerance: 0.05}``) makes the run a search for the highest
    rate at which the SLO holds (runner/knee.py): its repeats are the search's probes, at
    rates the search picks (``request_rate`` and ``repeats`` do not apply).
    """

    dataset: DatasetSpec = DatasetSpec()
    num_prompts: int = Field(200, ge=1)
    request_rate: float = Field(math.inf, gt=0)
    arrival: Literal["constant", "poisson", "gamma"] = "poisson"
    burstiness: float = Field(1.0, gt=0)
    max_concurrency: int | None = Field(None, ge=1)
    ignore_eos: bool = True
    warmup_requests: int = Field(2, ge=0)
    warmup_output_len: int | None = Field(None, ge=1)
    repeats: int = Field(3, ge=1)
    seed: int = 0
    request_timeout_s: float = Field(600, gt=0)  # the most one request may take (s)
    idle_timeout_s: float = Field(60, gt=0)  # the most the server may stay silent with requests in flight (s)
    per_chunk_usage: bool = False
    client_processes: Annotated[int, Field(ge=1, le=64)] | Literal["auto"] = "auto"
    goodput_slo_ms: dict[Literal["ttft", "tpot", "e2el"], float] = {}
    slo: Slo | None = None
    knee: KneeSettings | None = None

    @model_validator(mode="after")
    def _knee_needs_an_slo(self):
        if self.knee is not None and self.slo is None:
            raise ValueError("knee: a knee search needs benchmark.slo (the objectives it must meet)")
        if self.dataset.kind == "multiturn" and self.client_processes not in ("auto", 1):
            raise ValueError(f"client_processes: a multi-turn load runs in one client process (its turns wait "
                             f"on each other's answers), got {self.client_processes}")
        if self.dataset.kind == "multiturn" and self.max_concurrency is not None:
            raise ValueError("max_concurrency: a multi-turn load has dataset.conversations at a time instead")
        if self.dataset.timed_by_itself and (self.knee is not None or math.isfinite(self.request_rate)):
            field = "knee" if self.knee is not None else "request_rate"
            raise ValueError(f"{field}: dataset kind '{self.dataset.kind}' times its requests itself "
                             f"({'its timestamps / speedup' if self.dataset.kind == 'trace' else 'each turn after the answer before'}); "
                             f"leave {field} out")
        return self

    def warmup_dataset(self) -> DatasetSpec:
        """The warm-up requests' prompts: the run's, with ``warmup_output_len`` if set (a
        warm-up draws them with another seed, so a prefix cache holds none of the measured
        prompts); for a multi-turn load, synthetic prompts (its conversations' first turns
        would be in the cache when the measured conversations begin)."""
        spec = DatasetSpec(output_len=self.dataset.output_len) if self.dataset.kind == "multiturn" else self.dataset
        if self.warmup_output_len is None:
            return spec
        return spec.model_copy(update={"output_len": self.warmup_output_len})


class Recipe(_Strict):
    """One run: a server and a load. Its name becomes a folder under the results root."""

    name: str
    description: str = ""
    model: ModelSpec
    serve: ServeSettings = ServeSettings()
    benchmark: BenchmarkSettings = BenchmarkSettings()

    @field_validator("name")
    @classmethod
    def _safe_name(cls, v):
        return check_name(v, "run name")

    def digest(self) -> str:
        """sha256 of the resolved recipe (canonical JSON) as it is written out, secret values
        redacted (`secrets`): the provenance 'recipe hash', the same for the recipe.yaml of a
        run as for the suite that made it."""
        blob = json.dumps(redact_recipe(self.model_dump(mode="json")), sort_keys=True).encode()
        return hashlib.sha256(blob).hexdigest()


class Suite(BaseModel):
    """A named list of resolved runs, in file order. Its name becomes the folder of its
    results, a Slurm job name and a Kubernetes object name."""

    name: str
    description: str = ""
    source: str = ""
    runs: list[Recipe]

    @field_validator("name")
    @classmethod
    def _safe_name(cls, v):
        return check_name(v, "suite name")

    def with_dummy_models(self, models_dir: str | Path = ".models") -> "Suite":
        """Every run whose model names an ``arch`` serves that shape with random weights:
        config + local tokenizer under ``models_dir/<arch>``, ``load_format: dummy``."""
        runs = []
        for r in self.runs:
            if r.model.arch:
                model = r.model.model_copy(update={
                    "path": str(Path(models_dir) / r.model.arch), "build": f"dummy:{r.model.arch}",
                    "tokenizer": None, "served_name": r.model.name})
                r = r.model_copy(update={"model": model, "serve": r.serve.model_copy(update={"load_format": "dummy"})})
            runs.append(r)
        return self.model_copy(update={"runs": runs})

    def with_sharegpt(self, path: str | Path) -> "Suite":
        """The runs' prompts from the ShareGPT file at ``path``: first turns (vLLM's
        filtering) where they were synthetic, random or another ShareGPT file, and the
        file's conversations for multi-turn runs; shared prefixes and traces are not
        ShareGPT's and stay as they are."""
        runs = []
        for r in self.runs:
            dataset = r.benchmark.dataset
            if dataset.kind in ("synthetic", "random", "sharegpt"):
                dataset = dataset.model_copy(update={"kind": "sharegpt", "path": str(path)})
            elif dataset.kind == "multiturn":
                dataset = dataset.model_copy(update={"path": str(path)})
            runs.append(r.model_copy(update={"benchmark": r.benchmark.model_copy(update={"dataset": dataset})}))
        return self.model_copy(update={"runs": runs})

    def select(self, only: list[str] | None) -> list[Recipe]:
        """The runs named in ``only`` (a name, or a shell-style pattern such as
        ``fig9-steps-*``), in file order; every run when ``only`` is empty."""
        if not only:
            return list(self.runs)
        names = [r.name for r in self.runs]
        missing = [o for o in only if not any(fnmatch.fnmatchcase(n, o) for n in names)]
        if missing:
            raise RecipeError(f"{self.source}: no run named {missing}; runs are {names}")
        return [r for r in self.runs if any(fnmatch.fnmatchcase(r.name, o) for o in only)]


# ---------------------------------------------------------------------- loading
def deep_merge(base: dict, override: dict) -> dict:
    """``override`` over ``base``: nested dicts merge, everything else replaces."""
    out = copy.deepcopy(base)
    for key, value in override.items():
        if isinstance(value, dict) and isinstance(out.get(key), dict):
            out[key] = deep_merge(out[key], value)
        else:
            out[key] = copy.deepcopy(value)
    return out


def _set_path(data: dict, dotted: str, value: Any) -> None:
    node = data
    parts = dotted.split(".")
    for part in parts[:-1]:
        node = node.setdefault(part, {})
        if not isinstance(node, dict):
            raise RecipeError(f"matrix key {dotted!r}: {part!r} is not a mapping")
    node[parts[-1]] = value


def _expand_matrix(run: dict, where: str) -> list[dict]:
    """``matrix: {serve.max_num_seqs: [256, 1024]}`` -> one run per combination, named
    ``<name>-<value>[-<value>...]``."""
    matrix = run.pop("matrix", None)
    if not matrix:
        return [run]
    if not isinstance(matrix, dict) or not all(isinstance(v, list) and v for v in matrix.values()):
        raise RecipeError(f"{where}.matrix: expected a mapping of field paths to non-empty lists, got {matrix!r}")
    keys = list(matrix)
    out = []
    for values in itertools.product(*(matrix[k] for k in keys)):
        expanded = copy.deepcopy(run)
        for k, v in zip(keys, values):
            _set_path(expanded, k, v)
        suffix = "-".join(slug(v).replace("_", "-") for v in values)
        expanded["name"] = f"{run['name']}-{suffix}"
        out.append(expanded)
    return out


def _format_errors(source: str, run_name: str, err: ValidationError) -> str:
    lines = [f"{source}: run {run_name!r} is invalid:"] + ["  " + line for line in validation_lines(err)]
    return "\n".join(lines)


def _included_runs(parent: Path, inc, platform_defaults: dict, where: str) -> list[tuple]:
    """Runs of an included suite: ``{file, prefix, defaults, only, overrides}``.

    Defaults merge in this order: the including suite's, the included suite's, the include
    entry's (platform overrides for that experiment). Runs are renamed ``<prefix>-<run>``;
    ``only`` keeps the named runs of the included file; ``overrides`` maps a run's name (as
    in the included file) to settings merged over that run alone.
    """
    if not isinstance(inc, dict) or not isinstance(inc.get("file"), str):
        raise RecipeError(f"{where}: expected {{file, prefix, defaults, only, overrides}}, got {inc!r}")
    unknown = set(inc) - {"file", "prefix", "defaults", "only", "overrides"}
    if unknown:
        raise RecipeError(f"{where}: unknown keys {sorted(unknown)}; expected file, prefix, defaults, only, overrides")
    child = (parent.parent / inc["file"]).resolve()
    if not child.exists():
        raise RecipeError(f"{where}.file: no such suite file {child}")
    data = read_yaml(child, "suite file", RecipeError)
    if not isinstance(data, dict) or "include" in data:
        raise RecipeError(f"{where}.file: {child} must be a suite with runs and no includes of its own")
    base = deep_merge(deep_merge(platform_defaults, data.get("defaults") or {}), inc.get("defaults") or {})
    prefix = inc.get("prefix") or data.get("name", child.stem)
    only = inc.get("only")
    overrides = inc.get("overrides") or {}
    names = [run.get("name") for run in data.get("runs") or []]
    if not isinstance(overrides, dict) or any(not isinstance(v, dict) for v in overrides.values()):
        raise RecipeError(f"{where}.overrides: expected a mapping of run names to settings, got {overrides!r}")
    stray = sorted(set(overrides) - set(names))
    if stray:
        raise RecipeError(f"{where}.overrides: no run named {stray} in {child}; runs are {names}")
    out = []
    for i, run in enumerate(data.get("runs") or []):
        if only and run.get("name") not in only:
            continue
        run = deep_merge(run, overrides.get(run.get("name"), {}))
        out.append((str(child), f"runs[{i}]", base, {**run, "name": f"{prefix}-{run.get('name')}"}))
    return out


def load_suite(path: str | Path) -> Suite:
    """Read a suite file; raises `RecipeError` naming file, field and value on any problem."""
    path = Path(path)
    source = str(path)
    data = read_yaml(path, "suite file", RecipeError)
    if not isinstance(data, dict):
        raise RecipeError(f"{source}: expected a mapping with 'name' and 'runs', got {type(data).__name__}")
    unknown = set(data) - {"name", "description", "defaults", "runs", "include"}
    if unknown:
        raise RecipeError(f"{source}: unknown top-level keys {sorted(unknown)}; "
                          "expected name, description, defaults, runs, include")
    if not isinstance(data.get("name"), str):
        raise RecipeError(f"{source}: 'name' must be a string, got {data.get('name')!r}")
    try:
        check_name(data["name"], "name: suite name")
    except ValueError as e:
        raise RecipeError(f"{source}: {e}") from None
    defaults = data.get("defaults") or {}
    if not isinstance(defaults, dict):
        raise RecipeError(f"{source}: 'defaults' must be a mapping, got {defaults!r}")
    runs = [(source, f"runs[{i}]", defaults, run) for i, run in enumerate(data.get("runs") or [])]
    for j, inc in enumerate(data.get("include") or []):
        runs += _included_runs(path, inc, defaults, f"{source}: include[{j}]")
    if not runs:
        raise RecipeError(f"{source}: needs a non-empty 'runs' list or 'include'")
    recipes: list[Recipe] = []
    for where_file, where, base, run in runs:
        if not isinstance(run, dict) or not isinstance(run.get("name"), str):
            raise RecipeError(f"{where_file}: {where} needs a 'name' (string), got {run!r}")
        for expanded in _expand_matrix(deep_merge(base, run), f"{where_file}: {where}"):
            try:
                recipes.append(Recipe.model_validate(expanded))
            except ValidationError as e:
                raise RecipeError(_format_errors(where_file, expanded["name"], e)) from None
    names = [r.name for r in recipes]
    dup = sorted({n for n in names if names.count(n) > 1})
    if dup:
        raise RecipeError(f"{source}: run names must be unique, repeated: {dup}")
    return Suite(name=data["name"], description=data.get("description", ""), source=source, runs=recipes)
