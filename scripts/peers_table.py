"""The table of `scripts/bench peers`: one markdown row per scenario and contender.

    python3 scripts/peers_table.py ROWS.tsv CLK_TCK COMMIT VERSIONS MACHINE COMMAND

ROWS.tsv has one line per row, tab-separated: scenario, contender, the path of
the `tokenbus bench --json` report (or "missing"), a status ("ok" or why not),
the CPU clock ticks of the contender's processes over the scenario, and the sum
of their peak RSS (VmHWM, KiB). Every figure is the contender (target) against
the sim-server called directly (baseline) in the same interleaved run.
"""
import datetime
import json
import sys

SCENARIOS = {
    "lat16": "latency-bound, 16 streams",
    "lat256": "latency-bound, 256 streams",
    "zero64": "zero-latency, 64 streams",
}


def side(report, name):
    return next(r for r in report["results"] if r["name"] == name)


def row(scenario, contender, path, status, ticks, hwm_kib, hz):
    label = SCENARIOS.get(scenario, scenario)
    status = status.replace("|", "/")  # a message must not split the markdown row
    if path == "missing":
        return f"| {label} | {contender} | missing: {status} | | | | | | |"
    rep = json.load(open(path))
    t, d = side(rep, "target"), side(rep, "baseline")
    ratio = t["output_tokens_per_s"] / d["output_tokens_per_s"] if d["output_tokens_per_s"] else 0.0
    ttft = lambda q: f"{t['ttft_ms'][q]:.2f} ({t['ttft_ms'][q] - d['ttft_ms'][q]:+.2f})"
    itl = t["itl_ms"]["p50"] - d["itl_ms"]["p50"]
    cpu_us = 1e6 * int(ticks) / hz / max(t["output_tokens"], 1)
    done = f"{t['completed']}/{t['sent']}" + (f", {t['failed']} failed" if t["failed"] else "")
    if d["failed"]:
        done += f" (direct: {d['failed']} failed)"
    if status != "ok":
        done += f"; {status}"
    return (f"| {label} | {contender} | {done} | {ratio:.3f} | {ttft('p50')} | {ttft('p99')} | {itl:+.3f} "
            f"| {cpu_us:.1f} | {int(hwm_kib) / 1024:.0f} |")


def main():
    rows_path, hz, commit, versions, machine, command = sys.argv[1:7]
    hz = int(hz)
    print(f"Peers table: `{command}`, {datetime.datetime.now(datetime.timezone.utc):%Y-%m-%d %H:%M} UTC, "
          f"commit {commit}, {machine}; {versions}.")
    print()
    print("| scenario | contender | completed/sent | tokens/s vs direct | TTFT p50 ms (added) "
          "| TTFT p99 ms (added) | ITL p50 added ms | CPU µs/token | peak RSS MB |")
    print("|---|---|---|---:|---:|---:|---:|---:|---:|")
    for line in open(rows_path):
        if line.strip():
            print(row(*line.rstrip("\n").split("\t"), hz))


if __name__ == "__main__":
    main()
