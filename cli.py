"""The `attnbench` command, for all three towers. Subcommands load their modules only when
invoked, so `attnbench load` on a client host never imports torch (kernel commands do)."""

from __future__ import annotations

import importlib

import click

# command name -> "module:attribute" (relative to the attnbench package)
COMMANDS = {
    "run": "runner.commands:run_cmd",
    "serve": "runner.commands:serve_cmd",
    "load": "runner.commands:load_cmd",
    "calibrate": "runner.commands:calibrate_cmd",
    "stub-server": "runner.commands:stub_server_cmd",
    "recipes": "runner.commands:recipes_group",
    "model": "runner.commands:model_group",
    "dataset": "runner.commands:dataset_group",
    "tasks": "runner.cluster_cli:tasks_cmd",
    "status": "runner.cluster_cli:status_cmd",
    "submit": "runner.cluster_cli:submit_group",
    "plot": "analysis.cli:plot_cmd",
    "report": "analysis.cli:report_cmd",
    "crosscheck": "analysis.cli:crosscheck_group",
    "microbench": "kernels.bench.cli:microbench",
    "tune": "kernels.bench.cli:tune",
    "kernels": "kernels.bench.cli:kernels_group",
}


class LazyGroup(click.Group):
    def list_commands(self, ctx):
        return sorted(COMMANDS)

    def get_command(self, ctx, name):
        target = COMMANDS.get(name)
        if target is None:
            return None
        module, attr = target.split(":")
        return getattr(importlib.import_module(f"attnbench.{module}"), attr)


@click.group(cls=LazyGroup, context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(package_name="attnbench")
def main():
    """Benchmark Triton paged attention and vLLM serving; draw the paper's figures."""


if __name__ == "__main__":
    main()
