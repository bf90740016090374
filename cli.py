"""The `attnbench` command, for all three towers. Subcommands load their modules only when
invoked, so `attnbench load` on a client host never imports torch (kernel commands do).

Every failure a user can cause or meet ends in one line, never a traceback: each command
reports its own bad input (file, field or option, and what was expected), and what the
machine refuses (a full disk, a folder that cannot be written) is caught here."""

from __future__ import annotations

import errno
import importlib
import shutil
from pathlib import Path

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


def os_error_line(e: OSError) -> str:
    """One line for what the machine refused: the file, the reason, and for a full disk
    the folder and the space left in it."""
    where = f"{e.filename}: " if e.filename else ""
    if e.errno == errno.ENOSPC:
        folder = Path(e.filename).parent if e.filename else Path.cwd()
        while not folder.exists() and folder != folder.parent:
            folder = folder.parent
        free = shutil.disk_usage(folder).free / 2**20
        return f"{where}no space left on the device of {folder} ({free:.0f} MiB free); results so far are kept"
    return f"{where}{e.strerror or e}"


class LazyGroup(click.Group):
    def invoke(self, ctx):
        try:
            return super().invoke(ctx)
        except OSError as e:  # click's own errors are ClickExceptions, not OSErrors
            raise click.ClickException(os_error_line(e)) from None

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
