"""`make bench`: every benchmark of bench/, each bounded in time, and one results table.

Each script runs as a child process with options that keep it short and `--json PATH`, under a
time limit of its own and within one budget for the whole run (BUDGET_S; on 2 cores the run
takes 6-7 minutes, a private real cluster's ~100 s included). The figures they write replace
the table between the markers in bench/README.md: figure | goal | value | baseline measured in
the same run | date. A script that fails or runs out of time leaves the figures it did write and
a row saying what happened; a figure nobody measured is never made up. A `bench_*.py` not
listed in BENCHMARKS is not run (its options for a bounded run are unknown) and gets a row
saying so.

Exits 1 when a listed benchmark failed, timed out or was left out for want of time; the table
is rewritten either way.
Run from the repository root: `.venv/bin/python bench/run_all.py`.
"""

from __future__ import annotations

import contextlib
import json
import os
import platform
import signal
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path

from figures import Figure

BENCH = Path(__file__).resolve().parent
ROOT = BENCH.parent
README = BENCH / "README.md"
START_MARKER = "<!-- bench-results:start -->"
END_MARKER = "<!-- bench-results:end -->"
BUDGET_S = 420.0  # the whole run stays under 7 minutes, bench_cluster.py's real cluster included
MIN_TIMEOUT_S = 10.0  # less than this left: a benchmark is not started


@dataclass(frozen=True)
class Benchmark:
    script: str
    args: tuple[str, ...]
    timeout_s: float


# Quick ones first, so the longest one takes what is left of the budget.
BENCHMARKS = (
    Benchmark("bench_plan.py", (), 60),
    Benchmark("bench_allocate.py", ("--rounds", "1000"), 60),
    # 50 edits on a real kube-apiserver too (~4 s to start it): the API goal's figure.
    Benchmark(
        "bench_reload.py", ("--rounds", "50", "--idle-s", "2", "--real-api-rounds", "50"), 90
    ),
    Benchmark("bench_fleet.py", (), 60),
    # 50 fresh scrapes, 3 over HTTP a second apart, a 30 s idle window after 16 s; ~75 s.
    Benchmark("bench_usage.py", ("--rounds", "50", "--http-rounds", "3", "--idle-s", "30"), 150),
    # 200 prepares of a dynamic-MIG claim, then run-dra against the real 1.36 allocator: ~6 s.
    Benchmark("bench_dra_mig.py", ("--rounds", "200"), 60),
    # 60 s idle window, as issue 17 measures it; ~100 s in all on 2 cores.
    Benchmark("bench_daemon.py", ("--rounds", "50", "--runs", "5", "--idle-s", "60"), 240),
    # Five fresh realdra136 + run-dra starts and 33 allocations: ~5 s.
    Benchmark("bench_dra.py", ("--rounds", "5"), 60),
    Benchmark("bench_fanout.py", ("--rounds", "50"), 60),
    # RSS after a warm-up of 1,000 reloads: before it the allocator is still filling up (the
    # slope over reloads 200-800 is two to three times the one after 1,000). ~80 s here.
    Benchmark(
        "bench_soak.py",
        (
            "--reloads",
            "3000",
            "--warmup",
            "1000",
            "--max-s",
            "100",
            "--kubelet-restart-every",
            "150",
        ),
        140,
    ),
    # A private real cluster (~10 s to start), two ConfigMap edits per mode (a device-plugin
    # edit waits up to the kubelet's 10 s node-status period) and three claim pods per kind:
    # ~100 s on 2 cores.
    Benchmark("bench_cluster.py", ("--edits", "2", "--claims", "3"), 180),
)

# Figures the quality bars ask for that no code exists to measure yet: a row each, saying so.
NOT_BUILT: tuple[Figure, ...] = ()


@dataclass(frozen=True)
class Row:
    figure: Figure
    date: str


def now() -> str:
    return datetime.now(UTC).strftime("%Y-%m-%d %H:%M UTC")


def run_one(bench: Benchmark, timeout_s: float, work: Path) -> list[Figure]:
    """Run one benchmark; its figures, plus a row saying so when it did not end well."""
    out = work / (bench.script + ".json")
    command = [sys.executable, str(BENCH / bench.script), *bench.args, "--json", str(out)]
    print(f"\n== {' '.join([bench.script, *bench.args])} (limit {timeout_s:.0f} s)", flush=True)
    started = time.perf_counter()
    # Its own session: on a timeout the whole group goes, plugin processes it spawned included.
    child = subprocess.Popen(command, cwd=ROOT, start_new_session=True, stderr=subprocess.PIPE)
    last_error: list[str] = []  # its last non-empty stderr line, for the table
    relay = threading.Thread(target=_relay, args=(child, last_error), daemon=True)
    relay.start()
    problem = None
    try:
        code = child.wait(timeout=timeout_s)
        if code != 0:
            problem = f"failed: exit {code} after {time.perf_counter() - started:.0f} s"
    except subprocess.TimeoutExpired:
        _end_group(child)
        problem = f"timed out after {timeout_s:.0f} s"
    relay.join(5.0)
    if problem is not None and problem.startswith("failed") and last_error:
        problem += f" ({last_error[-1][:160]})"
    figures = _read_figures(out)
    if problem is None and isinstance(figures, str):
        problem = figures
    elif problem is None and not figures:
        problem = "wrote no figures"
    found = figures if isinstance(figures, list) else []
    if problem is not None:
        print(f"== {bench.script}: {problem}", file=sys.stderr, flush=True)
        rest = " (the rows above are what it measured before)" if found else ""
        found.append(Figure(bench.script, "", f"{problem}; see the output of make bench{rest}"))
    return found


def _relay(child: subprocess.Popen[bytes], last: list[str]) -> None:
    """Copy the child's stderr to ours as it comes, keeping its last non-empty line."""
    assert child.stderr is not None
    for raw in child.stderr:
        sys.stderr.buffer.write(raw)
        sys.stderr.buffer.flush()
        line = raw.decode("utf-8", "replace").strip()
        if line:
            last[:] = [line]


def _end_group(child: subprocess.Popen[bytes]) -> None:
    for sig, wait_s in ((signal.SIGTERM, 5.0), (signal.SIGKILL, 5.0)):
        with contextlib.suppress(ProcessLookupError):
            os.killpg(child.pid, sig)
        try:
            child.wait(timeout=wait_s)
            return
        except subprocess.TimeoutExpired:
            continue


def _read_figures(path: Path) -> list[Figure] | str:
    try:
        rows = json.loads(path.read_text())
        return [Figure(**row) for row in rows]
    except FileNotFoundError:
        return []
    except (ValueError, TypeError) as exc:
        return f"its figures could not be read ({exc})"


def table(rows: list[Row], header: str) -> str:
    lines = [
        header,
        "",
        "| figure | goal | value | baseline in the same run | date |",
        "|---|---|---|---|---|",
    ]
    for row in rows:
        f = row.figure
        cells = (f.figure, f.goal or "-", f.value, f.baseline or "-", row.date)
        lines.append("| " + " | ".join(_cell(c) for c in cells) + " |")
    return "\n".join(lines)


def _cell(text: str) -> str:
    return text.replace("|", "\\|").replace("\n", " ")


def rewrite_readme(block: str) -> None:
    """Replace what is between the markers; read just before writing, so edits others made to
    the rest of the file stay. Without the markers, a section is added before the first `##`."""
    text = README.read_text()
    section = f"{START_MARKER}\n{block}\n{END_MARKER}"
    if START_MARKER in text and END_MARKER in text:
        head, _, rest = text.partition(START_MARKER)
        _, _, tail = rest.partition(END_MARKER)
        text = head + section + tail
    else:
        at = text.find("\n## ")
        at = len(text) if at < 0 else at + 1
        text = text[:at] + f"## Results of the last `make bench`\n\n{section}\n\n" + text[at:]
    README.write_text(text)


def main() -> int:
    began = time.perf_counter()
    load_before = os.getloadavg()
    rows: list[Row] = []
    listed = {b.script for b in BENCHMARKS}
    ok = True
    with tempfile.TemporaryDirectory(prefix="bench-run-") as tmp:
        for bench in BENCHMARKS:
            left = BUDGET_S - (time.perf_counter() - began)
            if left < MIN_TIMEOUT_S:
                figures = [Figure(bench.script, "", "not run: make bench's time budget ran out")]
            else:
                figures = run_one(bench, min(bench.timeout_s, left), Path(tmp))
            stamp = now()
            rows.extend(Row(f, stamp) for f in figures)
            ok = ok and not any(f.figure == bench.script for f in figures)
    for script in sorted(p.name for p in BENCH.glob("bench_*.py")):
        if script not in listed:
            print(f"make bench: {script} is not in BENCHMARKS: not run", file=sys.stderr)
            rows.append(
                Row(
                    Figure(
                        script,
                        "",
                        "not run: no bounded options for it in bench/run_all.py (BENCHMARKS)",
                    ),
                    now(),
                )
            )
    rows.extend(Row(f, now()) for f in NOT_BUILT)
    wall = time.perf_counter() - began
    load = ", ".join(f"{x:.2f}" for x in load_before)
    header = (
        f"Written by `make bench` ({now()}, {wall:.0f} s wall; {os.cpu_count()} CPUs, "
        f"load average {load} at the start; Python {platform.python_version()}). On a shared "
        "machine the absolute figures move from run to run: compare a figure with its baseline "
        "from the same run."
    )
    rewrite_readme(table(rows, header))
    print(f"\nmake bench: {wall:.0f} s; table rewritten in {README.relative_to(ROOT)}")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
