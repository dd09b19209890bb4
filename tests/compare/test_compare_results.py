"""The results file: finished runs are kept, a resumed comparison skips them, errors are
carried out again, a torn last line is cut off, and runs of other shapes are not mixed in."""

from __future__ import annotations

import json
import pathlib

import pytest

from idempotent.compare import CompareConfig
from idempotent.compare.results import FILE_NAME, Results

CONFIG = CompareConfig(("memory", "sqlite"), ("none", "lost-ack"), records=100, schedules=2, capacity_records=0)


def _entry(system: str, fault: str, seed: int, status: str = "ok") -> dict[str, object]:
    return {"kind": "fault", "system": system, "fault": fault, "seed": seed, "status": status, "wall_s": 1.0}


def test_a_resumed_file_skips_what_it_holds_and_retries_errors(tmp_path: pathlib.Path) -> None:
    plan = CONFIG.plan()
    results = Results(tmp_path, CONFIG, resume=False)
    results.add(_entry("memory", "none", 1))
    results.add(_entry("sqlite", "none", 1, status="error"))
    results.close()
    again = Results(tmp_path, CONFIG, resume=True)
    assert again.done(plan[0]) is not None
    assert again.done(plan[1]) is None  # the error is carried out again
    assert [e["system"] for e in again.entries(plan)] == ["memory", "sqlite"]
    again.add(_entry("sqlite", "none", 1))
    again.close()
    third = Results(tmp_path, CONFIG, resume=True)
    assert third.done(plan[1]) is not None and third.entries(plan)[1]["status"] == "ok"
    third.close()


def test_without_resume_the_file_starts_afresh(tmp_path: pathlib.Path) -> None:
    first = Results(tmp_path, CONFIG, resume=False)
    first.add(_entry("memory", "none", 1))
    first.close()
    fresh = Results(tmp_path, CONFIG, resume=False)
    assert fresh.entries(CONFIG.plan()) == []
    fresh.close()
    assert len((tmp_path / FILE_NAME).read_text().splitlines()) == 1


def test_a_torn_last_line_is_cut_off(tmp_path: pathlib.Path) -> None:
    results = Results(tmp_path, CONFIG, resume=False)
    results.add(_entry("memory", "none", 1))
    results.close()
    path = tmp_path / FILE_NAME
    with path.open("a") as file:
        file.write('{"kind": "fault", "system": "sqlite", "fau')  # killed while writing
    resumed = Results(tmp_path, CONFIG, resume=True)
    assert [e["system"] for e in resumed.entries(CONFIG.plan())] == ["memory"]
    resumed.add(_entry("sqlite", "none", 1))
    resumed.close()
    lines = path.read_text().splitlines()
    assert len(lines) == 3 and all(json.loads(line) for line in lines)


def test_runs_of_another_shape_are_not_continued(tmp_path: pathlib.Path) -> None:
    first = Results(tmp_path, CONFIG, resume=False)
    first.add(_entry("memory", "none", 1))
    first.close()
    before = (tmp_path / FILE_NAME).read_bytes()
    other = CompareConfig(("memory",), ("none",), records=500, capacity_records=0)
    with pytest.raises(ValueError, match=r"made with --records 100, not --records 500"):
        Results(tmp_path, other, resume=True)
    assert (tmp_path / FILE_NAME).read_bytes() == before
    wider = CompareConfig(("memory", "sqlite", "kafka"), ("none",), records=100, schedules=5, capacity_records=0)
    more = Results(tmp_path, wider, resume=True)  # more systems and schedules: fine
    assert more.done(wider.plan()[0]) is not None
    more.close()


def test_runs_of_another_workload_are_not_continued(tmp_path: pathlib.Path) -> None:
    first = Results(tmp_path, CONFIG, resume=False)
    first.close()
    assert json.loads((tmp_path / FILE_NAME).read_text().splitlines()[0])["workload"] == "produce"
    ctp = CompareConfig(("memory", "sqlite"), ("none",), records=100, capacity_records=0, workload="ctp")
    with pytest.raises(ValueError, match=r"made with --workload produce, not --workload ctp"):
        Results(tmp_path, ctp, resume=True)
    # a file written before the workload was recorded holds produce runs
    (tmp_path / FILE_NAME).write_text('{"results":1,"records":100,"rate":0.0,"value_bytes":100,"capacity_records":0}\n')
    Results(tmp_path, CONFIG, resume=True).close()
    with pytest.raises(ValueError, match="--workload produce"):
        Results(tmp_path, ctp, resume=True)


def test_two_comparisons_never_write_into_one_file(tmp_path: pathlib.Path) -> None:
    first = Results(tmp_path, CONFIG, resume=False)
    with pytest.raises(ValueError, match="another idempotent compare is writing"):
        Results(tmp_path, CONFIG, resume=True)
    first.close()
    Results(tmp_path, CONFIG, resume=True).close()


def test_a_foreign_file_is_refused(tmp_path: pathlib.Path) -> None:
    (tmp_path / FILE_NAME).write_text('{"something": "else"}\n')
    with pytest.raises(ValueError, match="not a results file"):
        Results(tmp_path, CONFIG, resume=True)
