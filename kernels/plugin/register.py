"""vLLM general plugin: registers attnbench's kernels as the ``CUSTOM`` attention backend.

vLLM calls `register` in every process it starts (entry point group
``vllm.general_plugins`` in pyproject.toml), so it only records a class path; the kernels
and torch load when a server picks ``--attention-backend CUSTOM`` (see `backend`).
"""

BACKEND_CLASS = "attnbench.kernels.plugin.backend.AttnbenchBackend"


def register() -> None:
    try:  # lazy: vLLM imports this plugin in every process it starts, before its own modules are ready
        from vllm.v1.attention.backends.registry import AttentionBackendEnum, register_backend
    except ImportError:  # vLLM before 0.26 (e.g. a V0 image): no CUSTOM backend to fill
        return
    register_backend(AttentionBackendEnum.CUSTOM, BACKEND_CLASS)
