"""`make bench`: every benchmark behind docs/benchmarks.md, its gates enforced.

Each benchmark is a script (BENCHMARKS: one entry each, the script follows
scripts/benchmark.py) run in a process of its own. Its section replaces the one of the
same name in docs/benchmarks.md, between `<!-- bench:NAME -->` and `<!-- /bench:NAME -->`,
with the command that reproduces it, the date, the commit and the machine under it. The
run exits 1 when a gate or a check of any benchmark is missed, or a benchmark fails.
`--quick` runs are smoke runs: they write build/benchmarks.md, never the page.

    make bench                                               # everything, about 3 hours
    .venv/bin/python scripts/bench.py --only fleet           # one section of the page
    .venv/bin/python scripts/bench.py --only fleet --soak-minutes 10   # its own flags
    .venv/bin/python scripts/bench.py --quick                # build/benchmarks.md
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import platform
import re
import shlex
import subprocess
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
PAGE = ROOT / "docs/benchmarks.md"
QUICK_REPORT = ROOT / "build/benchmarks.md"


@dataclass(frozen=True)
class Benchmark:
    name: str
    script: str  # in scripts/
    claims: str  # what it backs on the page


# At most six, each backing a claim on the page.
BENCHMARKS = (
    Benchmark(
        "fleet",
        "bench_fleet.py",
        "the budgets beside Prometheus at 1,000 targets (CPU, /metrics p99, memory after an "
        "hour); what tick batching and uvloop save",
    ),
    Benchmark(
        "fastpaths",
        "bench_fastpaths.py",
        "the /metrics writer against prometheus_client; the packed history against plain rows",
    ),
    Benchmark(
        "batching",
        "bench_batching.py",
        "continuous batching's measured gain against the gain static utilisation predicts",
    ),
    Benchmark(
        "advice",
        "bench_advice.py",
        "the advice held against the demo server's truth (KV cache, in-house batcher)",
    ),
    Benchmark(
        "dashboard", "bench_dashboard.py", "the Live page's time and size at 10 and 1,000 targets"
    ),
    Benchmark(
        "replicas",
        "bench_replicas.py",
        "the replica count's truth table: the demo server at k-1, k and k+1 replicas",
    ),
)
BY_NAME = {b.name: b for b in BENCHMARKS}


@dataclass(frozen=True)
class Outcome:
    """One benchmark's run: its section (markers included), results and exit code."""

    name: str
    section: str
    results: dict | None
    returncode: int


def _first_line(path: str, prefix: str) -> str:
    try:
        with open(path, encoding="utf-8") as f:
            for line in f:
                if line.startswith(prefix):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return "unknown"


def machine() -> str:
    """The machine in one line: what a figure only means next to."""
    cpus = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()
    memory = _first_line("/proc/meminfo", "MemTotal:").split()[0]
    gib = f"{int(memory) / 2**20:.1f} GiB" if memory.isdigit() else "unknown memory"
    load = os.getloadavg()[0] if hasattr(os, "getloadavg") else float("nan")
    return (
        f"{cpus} CPUs ({_first_line('/proc/cpuinfo', 'model name')}), {gib}, "
        f"{platform.system()} {platform.release()}, Python {platform.python_version()}; "
        f"load average {load:.2f} at the start"
    )


def commit() -> str:
    done = subprocess.run(
        ["git", "describe", "--always", "--dirty"], cwd=ROOT, capture_output=True, text=True
    )
    return done.stdout.strip() or "unknown"


def footer(name: str, quick: bool, extra: list[str]) -> str:
    flags = ["--quick"] if quick else []
    reproduce = shlex.join([".venv/bin/python", "scripts/bench.py", "--only", name, *flags, *extra])
    now = datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%d %H:%M UTC")
    return f"Command: `{reproduce}`. Measured {now}, commit {commit()}, on {machine()}."


def run_one(benchmark: Benchmark, quick: bool, extra: list[str]) -> Outcome:
    """Run one benchmark's script in its own process; its section and results."""
    print(f"bench: {benchmark.name} (scripts/{benchmark.script})", file=sys.stderr, flush=True)
    stamp = footer(benchmark.name, quick, extra)
    with tempfile.TemporaryDirectory() as tmp:
        report, numbers = Path(tmp) / "section.md", Path(tmp) / "results.json"
        args = [sys.executable, str(ROOT / "scripts" / benchmark.script)]
        args += ["--output", str(report), "--json", str(numbers), *extra]
        args += ["--quick"] if quick else []
        env = {**os.environ, "PYTHONPATH": str(ROOT)}
        # The script's stdout is its report, printed again at the end: its progress is enough.
        done = subprocess.run(args, cwd=ROOT, stdout=subprocess.DEVNULL, env=env, check=False)
        text = report.read_text(encoding="utf-8") if report.exists() else ""
        results = json.loads(numbers.read_text(encoding="utf-8")) if numbers.exists() else None
    code = done.returncode
    if code not in (0, 1) or not text or results is None:
        text = f"## {benchmark.name}\n\n`scripts/{benchmark.script}` failed (exit code {code}).\n"
        code, results = code or 2, None
    body = f"{text.rstrip()}\n\n{stamp}\n"
    return Outcome(benchmark.name, marked(benchmark.name, body), results, code)


def marked(name: str, body: str) -> str:
    return f"<!-- bench:{name} -->\n{body}<!-- /bench:{name} -->\n"


def update_page(page: str, sections: dict[str, str]) -> str:
    """`page` with each named section replaced between its markers (added at the end
    when it has none); the rest of the page as it was."""
    for name, section in sections.items():
        pattern = re.compile(
            rf"<!-- bench:{re.escape(name)} -->\n.*?<!-- /bench:{re.escape(name)} -->\n", re.S
        )
        found = pattern.search(page)
        if found:
            page = page[: found.start()] + section + page[found.end() :]
        else:
            page = page.rstrip("\n") + "\n\n" + section
    return page


def summary(outcomes: list[Outcome]) -> list[str]:
    """One line per gate and check: what the run held, and what it missed."""
    lines = []
    for outcome in outcomes:
        if outcome.results is None:
            lines.append(f"{outcome.name}: FAILED (exit code {outcome.returncode})")
            continue
        for gate, g in outcome.results.get("gates", {}).items():
            verdict = "met" if g["met"] else "MISSED"
            lines.append(f"{outcome.name}: {gate}: {g['value']} (bound {g['bound']}) {verdict}")
        for check, ok in outcome.results.get("checks", {}).items():
            lines.append(f"{outcome.name}: {check}: {'holds' if ok else 'FAILS'}")
    return lines


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--only", choices=list(BY_NAME), help="run one benchmark")
    parser.add_argument(
        "--quick", action="store_true", help="small sizes: a smoke run (build/benchmarks.md)"
    )
    parser.add_argument(
        "--output", type=Path, help="write a report of the sections run here, not the page"
    )
    parser.add_argument("--json", type=Path, help="write every benchmark's results here")
    args, extra = parser.parse_known_args(argv)
    if extra and not args.only:
        parser.error(f"{' '.join(extra)}: a benchmark's own flags need --only")
    selected = [BY_NAME[args.only]] if args.only else list(BENCHMARKS)
    outcomes = [run_one(b, args.quick, extra) for b in selected]
    sections = {o.name: o.section for o in outcomes}
    output = args.output or (QUICK_REPORT if args.quick else None)
    if output is None:
        PAGE.write_text(update_page(PAGE.read_text(encoding="utf-8"), sections), "utf-8")
        output = PAGE
    else:
        output.parent.mkdir(parents=True, exist_ok=True)
        output.write_text("# Benchmarks\n\n" + "\n".join(sections.values()), encoding="utf-8")
    if args.json is not None:
        args.json.write_text(json.dumps({o.name: o.results for o in outcomes}, indent=1) + "\n")
    print("\n".join(summary(outcomes)))
    print(f"wrote {output}")
    failed = [o.name for o in outcomes if o.returncode != 0]
    if failed:
        print("gates or checks missed, or failed: " + ", ".join(failed), file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
