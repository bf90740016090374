"""The results tree: the one place that defines where results live and what they are called.

    <root>/<suite>/<run>/recipe.yaml        the resolved recipe of the run
    <root>/<suite>/<run>/provenance.json    machine, versions, git SHA, recipe hash
    <root>/<suite>/<run>/server.log         the vLLM server's output
    <root>/<suite>/<run>/warmup.jsonl       warm-up requests (not measured)
    <root>/<suite>/<run>/r<k>/requests.jsonl one RequestRecord per line, appended as measured
    <root>/<suite>/<run>/r<k>/summary.json   metrics (vllm bench serve key names) + status

A repeat is complete when its summary.json says ``"status": "ok"``; ``--resume`` skips
those and re-runs the rest. Files other than requests.jsonl are written atomically.
"""

from __future__ import annotations

import gzip
import hashlib
import json
import os
import shutil
import tempfile
from pathlib import Path
from typing import IO, Iterator

import yaml

from .loadgen import RequestRecord
from .names import check_name, inside
from .secrets import redact_recipe
from .summary import RecordsDigest, RepeatSummary

RECIPE_FILE = "recipe.yaml"
PROVENANCE_FILE = "provenance.json"
SERVER_LOG = "server.log"
WARMUP_FILE = "warmup.jsonl"
REQUESTS_FILE = "requests.jsonl"
SUMMARY_FILE = "summary.json"
REPEAT_PREFIX = "r"


def _umask() -> int:
    mask = os.umask(0)
    os.umask(mask)
    return mask


def atomic_write_text(path: Path, text: str) -> None:
    """Write via a temporary file in the same folder and rename: readers never see half a
    file. The file gets the mode of any new file (0666 less the umask), like the records
    appended beside it, not the temporary file's private 0600: a team shares the tree."""
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "w") as fh:
            fh.write(text)
            fh.flush()
            os.fsync(fh.fileno())
        os.chmod(tmp, 0o666 & ~_umask())
        os.replace(tmp, path)
    except OSError as e:  # name the file (a full disk says nothing of where)
        Path(tmp).unlink(missing_ok=True)
        raise OSError(e.errno, e.strerror, str(path)) from None
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def atomic_write_json(path: Path, data) -> None:
    atomic_write_text(path, json.dumps(data, indent=2, sort_keys=True, default=str) + "\n")


class RecordWriter:
    """Appends RequestRecords to a JSONL file, one flushed line per record, and keeps the
    file's record count and sha256 for its summary (`digest`)."""

    def __init__(self, path: Path):
        path.parent.mkdir(parents=True, exist_ok=True)
        self.path = path
        self._fh: IO[bytes] = path.open("wb")
        self._sha = hashlib.sha256()
        self._count = 0

    def __call__(self, record: RequestRecord) -> None:
        line = (record.to_json() + "\n").encode()
        try:
            self._fh.write(line)
            self._fh.flush()
        except OSError as e:  # name the file (a full disk says nothing of where)
            raise OSError(e.errno, e.strerror, str(self.path)) from None
        self._sha.update(line)
        self._count += 1

    def digest(self) -> RecordsDigest:
        return RecordsDigest(records=self._count, records_sha256=self._sha.hexdigest())

    def close(self) -> None:
        self._fh.close()

    def __enter__(self) -> "RecordWriter":
        return self

    def __exit__(self, *exc) -> None:
        self.close()


def requests_path(repeat_dir: Path) -> Path | None:
    """The repeat's request records: requests.jsonl, or requests.jsonl.gz as archived."""
    for name in (REQUESTS_FILE, REQUESTS_FILE + ".gz"):
        if (repeat_dir / name).exists():
            return repeat_dir / name
    return None


def read_records(path: Path) -> list[RequestRecord]:
    """Records of a JSONL file (gzipped if it ends in .gz); a torn last line (interrupted
    write) is ignored."""
    path = Path(path)
    text = gzip.decompress(path.read_bytes()).decode() if path.suffix == ".gz" else path.read_text()
    out = []
    for line in text.splitlines():
        try:
            out.append(RequestRecord.from_dict(json.loads(line)))
        except (json.JSONDecodeError, TypeError):
            continue
    return out


class ResultsStore:
    """Paths and writers of one suite's results under ``root``. Suite and run names are
    checked (`names.check_name`) and every folder it hands out lies inside ``root``."""

    def __init__(self, root: str | Path, suite: str):
        self.root = Path(root)
        self.suite_dir = self.root / check_name(suite, "suite name")
        inside(self.root, self.suite_dir)

    def run_dir(self, run: str) -> Path:
        path = self.suite_dir / check_name(run, "run name")
        inside(self.root, path)
        return path

    def clear_run(self, run: str, keep: str) -> None:
        """Delete what a run's folder holds but ``keep`` (its lock, held by the caller):
        ``--overwrite``, under the run's lock, so no other process is measuring it."""
        folder = self.run_dir(run)
        for entry in folder.iterdir() if folder.exists() else []:
            if entry.name == keep:
                continue
            if entry.is_dir() and not entry.is_symlink():
                shutil.rmtree(inside(folder, entry))  # rmtree never follows links inside it
            else:
                entry.unlink()  # a file, or a link itself (never what it points to)

    def clear_repeat(self, run: str, repeat: int) -> None:
        """Delete repeat ``repeat`` of a run (a knee search's probe that a shorter search
        no longer uses), under the run's lock held by the caller."""
        folder = self.repeat_dir(run, repeat)
        if folder.is_dir() and not folder.is_symlink():
            shutil.rmtree(inside(self.run_dir(run), folder))

    def repeat_dir(self, run: str, repeat: int) -> Path:
        return self.run_dir(run) / f"{REPEAT_PREFIX}{repeat}"

    def summary(self, run: str, repeat: int) -> RepeatSummary | None:
        """The repeat's summary.json; None when it is missing or unreadable."""
        return read_summary(self.repeat_dir(run, repeat) / SUMMARY_FILE)

    def kept(self, run: str, repeat: int) -> tuple[RepeatSummary | None, str]:
        """(summary, "") when the repeat is complete: its summary says ok and its request
        file, where there is one, is the file the summary was computed from; else (None, why
        it is not: one line, "" when nothing was measured)."""
        summary = self.summary(run, repeat)
        if summary is None:
            return None, ""
        if summary.status != "ok":
            return None, f"r{repeat} is {summary.status}"
        problem = records_problem(self.repeat_dir(run, repeat), summary)
        return (None, problem) if problem else (summary, "")

    def is_complete(self, run: str, repeat: int) -> bool:
        return self.kept(run, repeat)[0] is not None

    def write_run_meta(self, run: str, recipe_dump: dict, provenance: dict, session: str = "") -> str:
        """The run's recipe and this session's provenance; returns the provenance file's name.

        A run that already holds kept repeats (``--resume``) keeps its files: this session's
        provenance goes to ``provenance-<session>.json`` beside them, and the recipe is the
        same (checked before the run starts)."""
        d = self.run_dir(run)
        kept = any(self.is_complete(run, repeat) for repeat, _ in repeat_dirs(d))
        name = PROVENANCE_FILE
        if kept and (d / PROVENANCE_FILE).exists():
            stamp = "".join(c for c in session[:19] if c.isalnum()) or "resumed"  # 20261123T110000
            name = f"provenance-{stamp}.json"
        if not (d / RECIPE_FILE).exists() or not kept:
            atomic_write_text(d / RECIPE_FILE, yaml.safe_dump(redact_recipe(recipe_dump), sort_keys=False))
        atomic_write_json(d / name, provenance)
        return name

    def server_log(self, run: str) -> Path:
        return self.run_dir(run) / SERVER_LOG

    def warmup_writer(self, run: str) -> RecordWriter:
        return RecordWriter(self.run_dir(run) / WARMUP_FILE)

    def requests_writer(self, run: str, repeat: int) -> RecordWriter:
        return RecordWriter(self.repeat_dir(run, repeat) / REQUESTS_FILE)

    def write_summary(self, run: str, repeat: int, summary: RepeatSummary | dict) -> None:
        """summary.json of a repeat (a dict is validated as a `RepeatSummary` first)."""
        if isinstance(summary, dict):
            summary = RepeatSummary.model_validate(summary)
        atomic_write_json(self.repeat_dir(run, repeat) / SUMMARY_FILE, summary.as_json())


def read_summary(path: Path) -> RepeatSummary | None:
    """A summary.json as a `RepeatSummary`; None when it is missing or not a summary."""
    try:
        return RepeatSummary.model_validate_json(path.read_bytes())
    except (OSError, ValueError):
        return None


def records_digest(path: Path) -> RecordsDigest:
    """Record count and sha256 of a request file's bytes (uncompressed, for a .gz)."""
    data = path.read_bytes()
    if path.suffix == ".gz":
        data = gzip.decompress(data)
    return RecordsDigest(records=data.count(b"\n"), records_sha256=hashlib.sha256(data).hexdigest())


def records_problem(repeat_dir: Path, summary: RepeatSummary) -> str:
    """One line when the repeat's request file is not the one its summary was computed
    from (fewer records: a cut or torn file; same count, other bytes: an edited one); ""
    when it is, when the file is not there (archived: the summary carries the metrics), or
    when the summary predates the digest."""
    path = requests_path(repeat_dir)
    if path is None or summary.records is None:
        return ""
    found = records_digest(path)
    if found.records != summary.records:
        return f"{path}: {found.records} records, but its summary counted {summary.records}"
    if summary.records_sha256 and found.records_sha256 != summary.records_sha256:
        return f"{path}: its {found.records} records are not the ones its summary was computed from (sha256 differs)"
    return ""


def repeat_dirs(run_dir: Path) -> Iterator[tuple[int, Path]]:
    """(repeat, folder) of every ``r<k>`` folder of a run, in sorted order."""
    for rep in sorted(run_dir.glob(f"{REPEAT_PREFIX}[0-9]*")):
        if rep.is_dir() and rep.name[len(REPEAT_PREFIX):].isdigit():
            yield int(rep.name[len(REPEAT_PREFIX):]), rep


def iter_repeat_dirs(suite_dir: Path) -> Iterator[tuple[str, int, Path]]:
    """(run, repeat, folder) of every repeat folder under a suite folder, in sorted order."""
    for run_dir in sorted(p for p in suite_dir.iterdir() if p.is_dir()):
        for repeat, rep in repeat_dirs(run_dir):
            yield run_dir.name, repeat, rep
