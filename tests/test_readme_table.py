"""benchmarks/readme_table.py renders the GUI stall lines (bench_gui.py --stalls) one row per action, with the
stall and whether it is within the 250 ms goal."""

from __future__ import annotations

import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "benchmarks"))
import readme_table  # noqa: E402


def test_every_actions_stall_is_a_row_of_the_latest_run(tmp_path):
    old = {"bench": "gui", "run_id": "A", "kind": "stall", "action": "compare", "stall_ms": 400.0,
           "meets_goal": False, "loadavg": [1.0]}
    new = [{"bench": "gui", "run_id": "B", "kind": "stall", "action": a, "stall_ms": ms, "meets_goal": ms <= 250,
            "label": "quiet", "loadavg": [0.2]} for a, ms in (("compare", 85.3), ("FDK run", 261.6))]
    (tmp_path / "bench_gui_stalls.jsonl").write_text("".join(json.dumps(x) + "\n" for x in [old, *new]))
    text = readme_table.render(tmp_path)
    rows = [r for r in text.splitlines() if "longest GUI-thread stall" in r]
    assert len(rows) == 2                               # both actions of run B, not run A's compare
    compare = next(r for r in rows if r.startswith("| compare"))
    fdk = next(r for r in rows if r.startswith("| FDK run"))
    assert "85 ms" in compare and "within 250 ms" in compare and "400" not in text
    assert "262 ms" in fdk and "over 250 ms" in fdk and "load 0.2" in fdk


def test_write_replaces_only_the_block_of_the_benchmarks_page(tmp_path):
    """``--write`` goes to docs/BENCHMARKS.md by default (the README links to it); the text around the
    markers stays as it was."""
    assert readme_table.DOC == Path(readme_table.ROOT) / "docs" / "BENCHMARKS.md" and readme_table.DOC.is_file()
    line = {"bench": "gui", "run_id": "B", "kind": "stall", "action": "compare", "stall_ms": 85.3,
            "meets_goal": True, "label": "quiet", "loadavg": [0.2]}
    results = tmp_path / "results"
    results.mkdir()
    (results / "bench_gui_stalls.jsonl").write_text(json.dumps(line) + "\n")
    doc = tmp_path / "BENCHMARKS.md"
    doc.write_text(f"# Benchmarks\n\nintro\n\n{readme_table.START}\nold table\n{readme_table.END}\n\nafter\n")
    assert readme_table.main(["--results", str(results), "--doc", str(doc), "--write"]) == 0
    text = doc.read_text()
    assert text.startswith("# Benchmarks\n\nintro\n\n") and text.endswith(f"{readme_table.END}\n\nafter\n")
    assert "old table" not in text and "85 ms" in text
    (tmp_path / "plain.md").write_text("no markers\n")
    try:
        readme_table.main(["--results", str(results), "--doc", str(tmp_path / "plain.md"), "--write"])
    except SystemExit as e:
        assert "lacks the markers" in str(e)
    else:
        raise AssertionError("a file without the markers was written")
