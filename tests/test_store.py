"""Results tree: atomic writes, resume detection, torn lines."""

from __future__ import annotations

import json

import pytest

from attnbench.runner.loadgen import RequestRecord
from attnbench.runner.store import ResultsStore, atomic_write_json, iter_repeat_dirs, read_records


def test_repeat_completion_and_resume(tmp_path):
    store = ResultsStore(tmp_path, "suite")
    assert not store.is_complete("run", 1)
    store.write_summary("run", 1, {"status": "failed", "error": "x"})
    assert not store.is_complete("run", 1)
    store.write_summary("run", 1, {"status": "ok"})
    assert store.is_complete("run", 1)
    with pytest.raises(ValueError, match="status"):
        store.write_summary("run", 2, {"status": "meh"})
    assert [(r, k) for r, k, _ in iter_repeat_dirs(tmp_path / "suite")] == [("run", 1)]


def test_records_roundtrip_and_torn_last_line(tmp_path):
    store = ResultsStore(tmp_path, "s")
    recs = [RequestRecord(i, "measure", 5, 3, 0.0, chunk_s=[0.1], chunk_tokens=[1]) for i in range(3)]
    with store.requests_writer("r", 1) as w:
        for r in recs:
            w(r)
    path = store.repeat_dir("r", 1) / "requests.jsonl"
    with path.open("a") as fh:
        fh.write('{"index": 9, "pha')  # interrupted mid-write
    assert read_records(path) == recs


def test_atomic_write_leaves_no_temp_files(tmp_path):
    atomic_write_json(tmp_path / "a.json", {"x": 1})
    assert json.loads((tmp_path / "a.json").read_text()) == {"x": 1}
    assert [p.name for p in tmp_path.iterdir()] == ["a.json"]


def test_archived_gzip_records_read_the_same(tmp_path):
    import gzip

    from attnbench.runner.store import requests_path

    store = ResultsStore(tmp_path, "s")
    recs = [RequestRecord(i, "measure", 5, 3, 0.0, chunk_s=[0.1], chunk_tokens=[1]) for i in range(2)]
    with store.requests_writer("r", 1) as w:
        for r in recs:
            w(r)
    plain = store.repeat_dir("r", 1) / "requests.jsonl"
    archived = plain.with_suffix(".jsonl.gz")
    archived.write_bytes(gzip.compress(plain.read_bytes()))
    plain.unlink()
    assert requests_path(store.repeat_dir("r", 1)) == archived
    assert read_records(archived) == recs


def test_a_summary_is_typed_on_the_way_in_and_out(tmp_path):
    """write_summary takes a RepeatSummary (or a dict it validates): a bad status is refused,
    keys of other versions survive, and what was never set is not written."""
    import json

    import pytest
    from pydantic import ValidationError

    from attnbench.runner.summary import RepeatSummary

    store = ResultsStore(tmp_path, "s")
    store.write_summary("run", 1, RepeatSummary(completed=2, failed=0, median_ttft_ms=12.5, run="run"))
    on_disk = json.loads((store.repeat_dir("run", 1) / "summary.json").read_text())
    assert on_disk == {"backend": "vllm", "endpoint_type": "openai", "completed": 2, "failed": 0,
                       "median_ttft_ms": 12.5, "run": "run"}
    store.write_summary("run", 2, {**on_disk, "status": "ok", "from_a_newer_version": [1]})
    assert store.summary("run", 2).from_a_newer_version == [1] and store.is_complete("run", 2)
    with pytest.raises(ValidationError, match="status"):
        store.write_summary("run", 3, {"status": "done"})


def test_resume_keeps_a_repeat_only_if_its_request_file_is_the_one_summarized(tmp_path):
    """summary.json carries the record count and sha256 of requests.jsonl: a cut file (217 of
    400 records after a copy) or an edited one is named, and the repeat is measured again."""
    from attnbench.runner.summary import RepeatHeader, summarize_repeat

    store = ResultsStore(tmp_path, "s")
    records = [RequestRecord(i, "measure", 3, 2, 0.0, sent_s=0.0, chunk_s=[0.1, 0.2], chunk_tokens=[1, 1],
                             end_s=0.2) for i in range(4)]
    with store.requests_writer("run", 1) as w:
        for r in records:
            w(r)
    summary = summarize_repeat(records, RepeatHeader(run="run", repeat=1), digest=w.digest())
    store.write_summary("run", 1, summary)
    assert summary.records == 4 and store.kept("run", 1) == (store.summary("run", 1), "")
    path = store.repeat_dir("run", 1) / "requests.jsonl"
    lines = path.read_text().splitlines(keepends=True)
    path.write_text("".join(lines[:3]))
    assert store.kept("run", 1) == (None, f"{path}: 3 records, but its summary counted 4")
    path.write_text("".join(lines[:3] + [lines[3].replace('"index":3', '"index":9')]))
    assert "not the ones its summary was computed from" in store.kept("run", 1)[1]
    path.unlink()  # archived: the summary carries the metrics
    assert store.is_complete("run", 1)
