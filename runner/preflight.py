"""What `attnbench run` and `attnbench serve` check before they start a server: a failed
check is one line naming the file, field or folder and what to do, not a traceback after
a two-minute server start.

* datasets: every ShareGPT file the runs read exists and holds conversations;
* prompts: every run's prompts can be drawn with its tokenizer (the model folder made
  first where the recipe builds it): a missing tokenizer, or a ShareGPT file with fewer
  conversations passing vLLM's filter than the run asks for, is found here, not after a
  server has started;
* accelerator: the GPU vendor the runs name (``serve.gpu_vendor``) is on this machine,
  for the ``process`` launcher (the ``docker`` launcher's runtime checks its own devices);
* results folder: a run never writes into a folder that already holds results unless
  asked to resume (finish what is missing) or overwrite (start over: `execute.run_suite`
  clears each run under its lock); a run another process is measuring is refused either
  way; a resumed run whose recipe changed since its kept repeats is refused, so no folder
  mixes two recipes.
"""

from __future__ import annotations

from attnbench.validation import validate_yaml

from .datasets import DatasetError, build_requests, check_dataset
from .models import ModelFolderError, ensure_model
from .provenance import gpu_facts
from .recipe import Recipe, Suite
from .store import RECIPE_FILE, ResultsStore
from .tasks import LOCK_FILE, is_locked

VENDOR_NAMES = {"nvidia": "an NVIDIA GPU", "amd": "an AMD GPU"}


class PreflightError(RuntimeError):
    """A check failed; the message is one line (or a few) saying what and where."""


def check_datasets(suite: Suite, runs: list[Recipe]) -> None:
    for recipe in runs:
        try:
            check_dataset(recipe.benchmark.dataset, recipe.benchmark.num_prompts)
        except DatasetError as e:
            raise PreflightError(f"{suite.source}: run {recipe.name!r}: benchmark.dataset.path: {e}") from None


def check_prompts(suite: Suite, runs: list[Recipe]) -> None:
    """Draw each run's prompts once before anything starts (module doc); runs that share a
    dataset, a count, a tokenizer and a seed are checked once."""
    seen = set()
    for recipe in runs:
        b = recipe.benchmark
        key = (b.dataset.model_dump_json(), b.num_prompts, recipe.model.tokenizer_path, b.seed)
        if key in seen:
            continue
        seen.add(key)
        try:
            ensure_model(recipe.model.path, recipe.model.build)
            build_requests(b.dataset, b.num_prompts, recipe.model.tokenizer_path, b.seed)
        except (DatasetError, ModelFolderError) as e:
            raise PreflightError(f"{suite.source}: run {recipe.name!r}: {e}") from None


def check_accelerator(suite: Suite, runs: list[Recipe], facts: dict | None = None) -> None:
    """The vendor the runs need (``serve.gpu_vendor`` of process-launched runs) is here."""
    needed = sorted({r.serve.gpu_vendor for r in runs if r.serve.launcher == "process"} - {"none"})
    if not needed:
        return
    found = (facts or gpu_facts()).get("vendor", "none")
    if found in needed and len(needed) == 1:
        return
    want = " and ".join(VENDOR_NAMES[v] for v in needed)
    have = {"none": "no GPU (neither nvidia-smi nor rocm-smi found one)"}.get(found, VENDOR_NAMES.get(found, found))
    raise PreflightError(
        f"{suite.source}: its runs need {want} (serve.gpu_vendor: {', '.join(needed)}) and this machine has "
        f"{have}; run it on such a host (or in its image with RUNTIME=docker), or pick runs with --only")


def check_results_folder(store: ResultsStore, runs: list[Recipe], *, resume: bool, overwrite: bool) -> None:
    """Refuse to mix sessions or recipes in a run's results folder, or to touch a run
    another process is measuring (module doc). Nothing is deleted here: with ``overwrite``
    each selected run is cleared under its own lock when its turn comes. Runs not selected
    are never touched, so two invocations (say, V0 runs in one image and V1 runs in
    another) can fill one suite's tree."""
    busy = [r.name for r in runs if is_locked(store.run_dir(r.name))]
    if busy:
        raise PreflightError(f"{store.suite_dir}: {', '.join(busy)} being measured by another process right now "
                             f"(its .lock is held); wait for it, or run the others with --only")
    held = [store.run_dir(r.name) for r in runs if store.run_dir(r.name).exists()
            and any(p.name != LOCK_FILE for p in store.run_dir(r.name).iterdir())]
    if overwrite:
        return
    if not held:
        return
    if not resume:
        names = ", ".join(p.name for p in held[:3]) + (f" and {len(held) - 3} more" if len(held) > 3 else "")
        raise PreflightError(
            f"{store.suite_dir} already holds results of {names}; add --resume to finish their missing repeats, "
            "--overwrite to replace them, or --out another folder")
    for recipe in runs:
        stored = store.run_dir(recipe.name) / RECIPE_FILE
        if not stored.exists():
            continue
        before = validate_yaml(Recipe, stored, "stored recipe", PreflightError).digest()
        if before != recipe.digest():
            raise PreflightError(
                f"{stored}: run {recipe.name!r} was measured with another recipe (hash {before[:12]}, now "
                f"{recipe.digest()[:12]}); --resume would mix the two: use --overwrite or another --out")


def preflight(suite: Suite, runs: list[Recipe], store: ResultsStore | None = None, *, resume: bool = False,
              overwrite: bool = False) -> None:
    """Every check of the module doc (the results folder only when ``store`` is given)."""
    check_datasets(suite, runs)
    check_accelerator(suite, runs)
    check_prompts(suite, runs)
    if store is not None:
        check_results_folder(store, runs, resume=resume, overwrite=overwrite)

