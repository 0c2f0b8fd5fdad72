"""Render the benchmark results (benchmarks/results/*.jsonl) as Markdown tables for docs/BENCHMARKS.md.

Every benchmark appends JSON lines carrying a ``"bench"`` key; timing lines
have ``op``/``impl``/``seconds``, ratio lines ``ratio``/``value``, and a run's
lines share a ``run_id`` (the header line, ``"kind": "header"``, describes the
machine).  Each bench shows its latest run, so the figures in a table were
measured side by side; figures that run lacks (a rerun that skipped a slow
peer) come from the most recent run that has them, marked with its run id.
Lines without a ``run_id`` count as one run each.

    python benchmarks/readme_table.py            # print the tables
    python benchmarks/readme_table.py --write    # replace the block of docs/BENCHMARKS.md between the markers

The block is delimited by ``<!-- bench:start -->`` and ``<!-- bench:end -->``; ``--doc FILE`` writes
another file's block.  (The tables lived in the README once, hence the script's name; the README now
quotes a short summary and links to docs/BENCHMARKS.md.)
"""

from __future__ import annotations

import argparse
import json
import math
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
START, END = "<!-- bench:start -->", "<!-- bench:end -->"


# ------------------------------------------------------------------ reading
def read_lines(results_dir: Path) -> list[dict]:
    """All JSON objects of all ``*.jsonl`` files, in file order; bad lines are reported and skipped."""
    lines: list[dict] = []
    if not results_dir.is_dir():
        return lines
    for path in sorted(results_dir.glob("*.jsonl")):
        try:
            text = path.read_text()
        except OSError as e:
            print(f"readme_table: cannot read {path}: {e}", file=sys.stderr)
            continue
        for no, raw in enumerate(text.splitlines(), 1):
            raw = raw.strip()
            if not raw:
                continue
            try:
                obj = json.loads(raw)
            except json.JSONDecodeError:
                print(f"readme_table: skipping malformed line {path.name}:{no}", file=sys.stderr)
                continue
            if not isinstance(obj, dict):
                continue
            if not isinstance(obj.get("bench"), str):  # tolerate writers without a "bench" key
                obj = {**obj, "bench": path.stem.removeprefix("bench_")}
            lines.append(obj)
    return lines


# Fields that tell the result lines of one run apart (beyond workload/op/impl/ratio,
# those other benchmarks use).
_EXTRA_IDENT = ("benchmark", "partition", "processes", "backend", "device", "mode", "variant", "case", "action")


def _key(line: dict) -> tuple:
    return tuple(str(line.get(k)) for k in ("workload", "op", "impl", "ratio", *_EXTRA_IDENT))


def latest_runs(lines: list[dict]) -> dict[str, dict]:
    """Per bench: {"header": the latest run's header or None, "lines": result lines}.

    The lines are the latest run's, followed by lines of earlier runs whose
    (workload, op, impl/ratio) the latest run lacks (a partial rerun, e.g. one
    that skipped a slow peer); those carry ``"_older_run"`` so tables mark them.
    """
    by_bench: dict[str, list[dict]] = {}
    for line in lines:
        by_bench.setdefault(line["bench"], []).append(line)
    out = {}
    for bench, items in by_bench.items():
        runs: dict[object, list[tuple[int, dict]]] = {}
        for i, x in enumerate(items):  # no run_id: every line is a run of its own
            runs.setdefault(x.get("run_id", ("line", i)), []).append((i, x))
        order = list(runs)  # first-seen order; the latest run is the one seen last
        latest = order[-1]
        header = next((x for _, x in runs[latest] if x.get("kind") == "header"), None)
        chosen, seen = [], set()
        for run in reversed(order):
            for i, x in reversed(runs[run]):
                if x.get("kind") == "header" or _key(x) in seen:
                    continue
                seen.add(_key(x))
                older = run != latest and isinstance(run, str)
                chosen.append((older, i, {**x, "_older_run": run} if older else x))
        # the latest run's lines first, then the fill-ins from older runs, each in file order
        lines_out = [x for _, _, x in sorted(chosen, key=lambda c: (c[0], c[1]))]
        out[bench] = {"header": header, "lines": lines_out}
    return out


# ------------------------------------------------------------------ formatting
def _num(x) -> float | None:
    return float(x) if isinstance(x, (int, float)) and not isinstance(x, bool) and math.isfinite(x) else None


def fmt_seconds(x) -> str:
    v = _num(x)
    if v is None:
        return ""
    if v >= 100:
        return f"{v:.0f} s"
    if v >= 1:
        return f"{v:.2f} s"
    if v >= 1e-3:
        return f"{v * 1e3:.1f} ms"
    return f"{v * 1e6:.1f} us"


def fmt_rate(x) -> str:
    v = _num(x)
    if v is None:
        return ""
    for scale, unit in ((1e9, "G"), (1e6, "M"), (1e3, "k")):
        if v >= scale:
            return f"{v / scale:.3g} {unit}/s"
    return f"{v:.3g} /s"


def fmt_time(line: dict) -> str:
    """``min`` or, for benches that report a median too, ``min / median``."""
    text = fmt_seconds(line.get("seconds"))
    med = _num(line.get("median_s"))
    return f"{text} / med {fmt_seconds(med)}" if text and med is not None else text


def fmt_ratio(line: dict) -> str:
    v = _num(line.get("value"))
    if v is None:
        return ""
    text = f"{v:.3g}x"
    med = _num(line.get("value_median"))
    if med is not None:
        text = f"{text} (median {med:.3g}x)"
    cpu = _num(line.get("value_cpu_s"))
    if cpu is not None:
        text += f" (CPU-s {cpu:.3g}x)"
    target = _num(line.get("target"))
    if target is not None:
        # The bench knows the direction of its target (a speed-up must reach it,
        # a cost ratio or a dB loss must stay under it): trust its verdict.
        met = line.get("meets_target")
        if met is None:
            met = v >= target
        text += f" (target {target:g}x: {'met' if met else 'NOT met'})"
    return text


def _cell(x) -> str:
    return str(x).replace("|", "\\|").replace("\n", " ") if x is not None else ""


def table(header: list[str], rows: list[list[str]]) -> str:
    out = ["| " + " | ".join(header) + " |", "|" + "|".join("---" for _ in header) + "|"]
    out += ["| " + " | ".join(_cell(c) for c in r) + " |" for r in rows]
    return "\n".join(out)


def _label(line: dict, name: str) -> str:
    """``name``, marked with the run it comes from when that is not the latest run."""
    older = line.get("_older_run")
    return f"{name} (run {older})" if older else name


def _is_ctbench(impl) -> bool:
    return isinstance(impl, str) and impl.startswith("ctbench")


def _groups(lines: list[dict]):
    """(workload, op) groups in first-seen order, each with its timing and ratio lines."""
    groups: dict[tuple, dict] = {}
    for x in lines:
        if x.get("op") is None:
            continue
        g = groups.setdefault((x.get("workload"), x.get("op")), {"timings": [], "ratios": []})
        if "ratio" in x:
            g["ratios"].append(x)
        elif "impl" in x:
            g["timings"].append(x)
    return groups


# ------------------------------------------------------------------ tables
def headline_table(runs: dict[str, dict]) -> str:
    """One row per (bench, workload, op) that has a ctbench timing: its time, the peers', ratios, samples/s."""
    rows = []
    for bench, run in runs.items():
        for (workload, op), g in _groups(run["lines"]).items():
            ours = [t for t in g["timings"] if _is_ctbench(t.get("impl")) and _num(t.get("seconds")) is not None]
            if not ours:
                continue
            peers = "; ".join(f"{_label(t, t['impl'])} {fmt_time(t)}" for t in g["timings"]
                              if not _is_ctbench(t.get("impl")) and _num(t.get("seconds")) is not None)
            ratios = "; ".join(f"{_label(r, r['ratio'])} {fmt_ratio(r)}" for r in g["ratios"])
            for t in ours:
                rows.append([bench, workload or "", op, f"{_label(t, t['impl'])} {fmt_time(t)}", peers,
                             ratios,
                             fmt_rate(t.get("samples_per_s"))])
    if not rows:
        return "_No benchmark results yet (run `make bench`)._"
    return table(["bench", "workload", "op", "ctbench", "peers", "ratios (peer time / ctbench time)",
                  "ctbench samples/s"], rows)


def _first_number(line: dict, keys) -> float | None:
    for k in keys:
        v = _num(line.get(k))
        if v is not None:
            return v
    return None


def _stall_row(x: dict) -> list[str]:
    """A GUI action's longest event-loop stall (bench_gui.py --stalls) against the 250 ms goal."""
    goal = "within 250 ms" if x.get("meets_goal") else "over 250 ms"
    load = x.get("loadavg")
    where = f"load {load[0]:.1f}" if isinstance(load, list) and load else ""
    return [_label(x, str(x.get("action", ""))), "longest GUI-thread stall", x.get("label") or "",
            f"{x['stall_ms']:.0f} ms", goal, where]


def _generic_row(x: dict) -> list[str]:
    """workload, op, what, seconds, value, rate of one result line of any benchmark."""
    if _num(x.get("stall_ms")) is not None:
        return _stall_row(x)
    if "ratio" in x:
        return [x.get("workload") or "", x.get("op") or "", _label(x, f"ratio {x['ratio']}"), "", fmt_ratio(x), ""]
    what = x.get("impl") or ", ".join(f"{k}={x[k]}" for k in _EXTRA_IDENT if x.get(k) is not None)
    if x.get("skipped"):
        value = f"skipped: {x['skipped']}"
    elif _num(x.get("gb_per_s")) is not None:
        value = f"{x['gb_per_s']:.3g} GB/s"
    elif _num(x.get("speedup")) is not None:
        value = f"speedup {x['speedup']:.3g}x"
    else:
        value = ""
    seconds = _first_number(x, ("seconds", "seconds_per_iteration", "wall_s", "time_s"))
    seconds_text = fmt_time(x) if _num(x.get("seconds")) is not None else fmt_seconds(seconds)
    rate = ""
    for key, unit in (("samples_per_s", "samples"), ("rays_per_s", "rays"), ("voxels_per_s", "voxels")):
        if _num(x.get(key)) is not None:
            rate = fmt_rate(x[key]).replace("/s", f" {unit}/s")
            break
    return [x.get("workload") or "", x.get("op") or "", _label(x, str(what)), seconds_text, value, rate]


def bench_table(bench: str, run: dict) -> str:
    """Generic table of one bench: a row per (workload, op, impl) result and a row per ratio line."""
    rows = [_generic_row(x) for x in run["lines"]
            if "ratio" in x or "impl" in x or "op" in x or "stall_ms" in x
            or _first_number(x, ("seconds", "seconds_per_iteration"))]
    title = f"#### {bench}"
    h = run["header"]
    if h:
        m = h.get("machine")
        bits = [f"run {h.get('run_id', '')}"]
        if isinstance(m, dict) and m.get("cpu"):
            bits.append(f"{m['cpu']}, {m.get('nproc', '?')} CPUs, torch threads {m.get('torch_threads', '?')}")
            if m.get("caches"):
                bits.append("caches " + " ".join(f"{k} {v}" for k, v in m["caches"].items()))
            if m.get("loadavg"):
                bits.append(f"load {m['loadavg'][0]:.1f}")
        elif isinstance(m, str):
            bits.append(f"{m}, {h.get('cpu_count', '?')} CPUs")
        title += f" ({'; '.join(bits)})"
    if not rows:
        return title + "\n\n_No result lines._"
    return title + "\n\n" + table(["workload", "op", "impl / ratio", "seconds", "value", "rate"], rows)


def render(results_dir: Path) -> str:
    runs = latest_runs(read_lines(results_dir))
    parts = ["### Headline figures", "", headline_table(runs)]
    for bench in sorted(runs):
        parts += ["", bench_table(bench, runs[bench])]
    return "\n".join(parts) + "\n"


DOC = ROOT / "docs" / "BENCHMARKS.md"


def write_readme(readme: Path, block: str) -> None:
    """Replace the text between the bench markers of ``readme`` (docs/BENCHMARKS.md) with ``block``."""
    if not readme.exists():
        raise SystemExit(f"readme_table: {readme} does not exist; create it with the lines {START} and {END}")
    text = readme.read_text()
    i, j = text.find(START), text.find(END)
    if i < 0 or j < 0 or j < i:
        raise SystemExit(f"readme_table: {readme} lacks the markers {START} ... {END} (in that order)")
    new = text[:i + len(START)] + "\n" + block + text[j:]
    tmp = readme.with_name(readme.name + ".tmp")
    tmp.write_text(new)
    tmp.replace(readme)


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description="Markdown tables of the latest benchmark results.")
    p.add_argument("--results", type=Path, default=ROOT / "benchmarks" / "results",
                   help="folder of *.jsonl result files (default: %(default)s)")
    p.add_argument("--doc", "--readme", dest="doc", type=Path, default=DOC,
                   help="Markdown file whose bench block --write replaces (default: %(default)s)")
    p.add_argument("--write", action="store_true", help="rewrite the file's bench block instead of printing")
    args = p.parse_args(argv)
    block = render(args.results)
    if args.write:
        write_readme(args.doc, block)
        print(f"readme_table: updated {args.doc}")
    else:
        sys.stdout.write(block)
    return 0


if __name__ == "__main__":
    sys.exit(main())
