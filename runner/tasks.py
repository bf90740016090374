"""A suite as independent tasks, for schedulers that run them side by side.

A task is one server configuration with every run that shares it (consecutive runs with
the same model and serve settings, which `attnbench run` serves from one server anyway).
Tasks share nothing but the results tree, where each writes only its own runs' folders:
`attnbench run SUITE --task i/N` runs tasks i, i + N, i + 2N, ... (with N equal to the
number of tasks: exactly task i), resuming what an earlier attempt left. A run folder is
locked (``.lock``, `fcntl.flock`) while a process measures it, so a task submitted twice
never writes into a run another process is measuring; the lock dies with its process.

``<out>/<suite>/tasks.json`` records the split (the suite file and each task's runs), so
`attnbench status` can say which tasks are done, failed, running or missing without the
scheduler, and a re-submission can ask only for those.
"""

from __future__ import annotations

import fcntl
import json
import os
import re
from dataclasses import dataclass
from pathlib import Path

import yaml

from .knee import KNEE_FILE
from .recipe import PROBES_AT_MOST, Recipe, Suite
from .store import RECIPE_FILE, ResultsStore, atomic_write_json

PLAN_FILE = "tasks.json"
LOCK_FILE = ".lock"


def launch_key(recipe: Recipe) -> str:
    """What decides whether two runs can share a server: the model and serve settings."""
    return recipe.model.model_dump_json() + recipe.serve.model_dump_json()


def split_tasks(runs: list[Recipe]) -> list[list[Recipe]]:
    """Consecutive runs with one launch key form a task, in suite order."""
    tasks: list[list[Recipe]] = []
    for recipe in runs:
        if tasks and launch_key(tasks[-1][-1]) == launch_key(recipe):
            tasks[-1].append(recipe)
        else:
            tasks.append([recipe])
    return tasks


def parse_task(spec: str) -> tuple[int, int]:
    """``i/N`` (0 <= i < N) -> (i, N); a ValueError naming the expected form otherwise."""
    m = re.fullmatch(r"\s*(\d+)\s*/\s*(\d+)\s*", spec or "")
    if not m or not 0 <= int(m.group(1)) < int(m.group(2)):
        raise ValueError(f"expected i/N with 0 <= i < N (e.g. 0/4, the scheduler's array index over the "
                         f"task count), got {spec!r}")
    return int(m.group(1)), int(m.group(2))


def task_runs(tasks: list[list[Recipe]], index: int, count: int) -> list[Recipe]:
    """The runs of tasks index, index + count, ... (every run once over all indices)."""
    return [r for t, task in enumerate(tasks) if t % count == index for r in task]


def write_plan(store: ResultsStore, suite: Suite, tasks: list[list[Recipe]], repeats: int | None = None) -> Path:
    """``tasks.json``: the suite file, each task's run names and the repeats each run needs
    (``repeats`` overrides the recipes', as ``attnbench run --repeats``), written atomically."""
    path = store.suite_dir / PLAN_FILE
    atomic_write_json(path, {"suite": suite.name, "suite_file": str(Path(suite.source).resolve()),
                             "tasks": [[r.name for r in task] for task in tasks],
                             "repeats": {r.name: repeats or r.benchmark.repeats for task in tasks for r in task}})
    return path


def read_plan(suite_dir: Path) -> dict:
    path = suite_dir / PLAN_FILE
    try:
        return json.loads(path.read_text())
    except FileNotFoundError:
        raise FileNotFoundError(f"{path}: no task plan here (written by `attnbench submit` or "
                                f"`attnbench run --task`)") from None


@dataclass
class RunLock:
    """An exclusive, non-blocking lock on one run's folder for the life of this process."""

    run_dir: Path
    _fd: int | None = None

    def acquire(self) -> bool:
        self.run_dir.mkdir(parents=True, exist_ok=True)
        fd = os.open(self.run_dir / LOCK_FILE, os.O_RDWR | os.O_CREAT, 0o666)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            os.close(fd)
            return False
        os.ftruncate(fd, 0)
        os.write(fd, f"{os.getpid()}\n".encode())
        self._fd = fd
        return True

    def release(self) -> None:
        """Unlock; a run folder that holds nothing but its lock (nothing was measured) is
        removed, so an attempt stopped before its first record leaves no trace."""
        if self._fd is not None:
            if [p.name for p in self.run_dir.iterdir()] == [LOCK_FILE]:
                (self.run_dir / LOCK_FILE).unlink()
                self.run_dir.rmdir()
            fcntl.flock(self._fd, fcntl.LOCK_UN)
            os.close(self._fd)
            self._fd = None


def is_locked(run_dir: Path) -> bool:
    """Whether a live process holds the run's lock (a killed task's lock is gone)."""
    lock = run_dir / LOCK_FILE
    if not lock.exists():
        return False
    fd = os.open(lock, os.O_RDONLY)
    try:
        fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
        fcntl.flock(fd, fcntl.LOCK_UN)
        return False
    except BlockingIOError:
        return True
    finally:
        os.close(fd)


def _knee_probes(store: ResultsStore, run: str) -> int | None:
    """A knee run's probe count once its search has ended (knee.json), 0 before; None for
    a run that is not a knee search (runner/knee.py)."""
    run_dir = store.run_dir(run)
    try:
        return len(json.loads((run_dir / KNEE_FILE).read_text())["probes"])
    except (OSError, ValueError, KeyError, TypeError):
        pass
    try:
        recipe = Recipe.model_validate(yaml.safe_load((run_dir / RECIPE_FILE).read_text()))
    except (OSError, ValueError, yaml.YAMLError):
        return None
    return 0 if recipe.benchmark.knee is not None else None


def run_state(store: ResultsStore, run: str, repeats: int) -> str:
    """done (every repeat kept: ok, and its request file the one summarized; for a knee
    search, every probe of its knee.json) | running (locked) | failed (a repeat failed, was
    interrupted or degraded) | partial (some repeats done, or a search not ended) | missing
    (nothing measured)."""
    if is_locked(store.run_dir(run)):
        return "running"
    probes = _knee_probes(store, run)
    if probes == 0:  # a search that has not ended
        return "partial" if any(store.summary(run, r) for r in range(1, PROBES_AT_MOST + 1)) else "missing"
    repeats = probes or repeats
    states = [store.kept(run, r) for r in range(1, repeats + 1)]
    done = sum(kept is not None for kept, _ in states)
    if done == repeats:
        return "done"
    if any(why for _, why in states):
        return "failed"
    return "partial" if done else "missing"


def task_states(store: ResultsStore, plan: dict, repeats_of: dict[str, int]) -> list[tuple[int, str, dict]]:
    """(index, task state, {run: state}) of every task of a plan; a task is done when all
    its runs are, running if one is, failed if one failed, else missing or partial."""
    out = []
    for i, runs in enumerate(plan["tasks"]):
        states = {run: run_state(store, run, repeats_of.get(run, 1)) for run in runs}
        values = set(states.values())
        for state in ("running", "failed", "partial"):
            if state in values:
                task = state
                break
        else:
            task = "done" if values == {"done"} else ("missing" if values == {"missing"} else "partial")
        out.append((i, task, states))
    return out
