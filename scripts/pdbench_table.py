#!/usr/bin/env python3
"""The figures of scripts/pdbench: reads DIR/bench-<config>-<load>-<round>.json
(tokenbus bench --json --json-requests) and prints a markdown table of each
figure beside its target, PASS or MISS (issue 37).

    scripts/pdbench_table.py DIR [--json FILE] [--short]

Requests with at least 2,000 prompt tokens are long prompts, the rest short
chats. Per configuration, the runs of every round are pooled: percentiles over
all their requests (ITL: over every inter-token gap of the short chats),
throughput as output tokens over the runs' summed durations.
"""
import glob, json, os, re, sys


def pct(xs, p):
    if not xs:
        return float("nan")
    xs = sorted(xs)
    k = (len(xs) - 1) * p / 100
    f = int(k)
    c = min(f + 1, len(xs) - 1)
    return xs[f] + (xs[c] - xs[f]) * (k - f)


def load(d):
    runs = {}
    for path in sorted(glob.glob(os.path.join(d, "bench-*.json"))):
        m = re.match(r"bench-(aggregated|disaggregated)-(mixed|short-only)-(\d+)\.json", os.path.basename(path))
        if not m:
            continue
        with open(path) as f:
            runs.setdefault((m.group(1), m.group(2)), []).append(json.load(f))
    return runs


def figures(reports):
    long_ttft, short_ttft, short_itl, errors, tokens, seconds, n = [], [], [], 0, 0, 0.0, 0
    for rep in reports:
        start = end = None
        for r in rep.get("requests", []):
            n += 1
            if r.get("error"):
                errors += 1
                continue
            s, e = r["start_s"], r["start_s"] + r["e2e_ms"] / 1000
            start = s if start is None else min(start, s)
            end = e if end is None else max(end, e)
            tokens += r.get("output_tokens", 0)
            if r.get("prompt_tokens", 0) >= 2000:
                long_ttft.append(r["ttft_ms"])
            else:
                short_ttft.append(r["ttft_ms"])
                short_itl.extend(r.get("itl_ms") or [])
        if start is not None:
            seconds += end - start
    return {
        "requests": n,
        "errors": errors,
        "long_ttft_p50_ms": pct(long_ttft, 50),
        "long_ttft_p99_ms": pct(long_ttft, 99),
        "short_ttft_p50_ms": pct(short_ttft, 50),
        "short_itl_p50_ms": pct(short_itl, 50),
        "short_itl_p99_ms": pct(short_itl, 99),
        "throughput_tok_s": tokens / seconds if seconds else float("nan"),
        "long_requests": len(long_ttft),
        "short_requests": len(short_ttft),
    }


def main():
    args = sys.argv[1:]
    if not args:
        sys.exit(__doc__)
    d, out_json, short = args[0], None, "--short" in args
    if "--json" in args:
        out_json = args[args.index("--json") + 1]
    runs = load(d)
    need = [(c, l) for c in ("aggregated", "disaggregated") for l in ("mixed", "short-only")]
    missing = [f"{c} {l}" for c, l in need if (c, l) not in runs]
    if missing:
        print("pdbench: no runs for " + ", ".join(missing), file=sys.stderr)
        sys.exit(2)
    fig = {f"{c}/{l}": figures(runs[(c, l)]) for c, l in need}
    a, b = fig["aggregated/mixed"], fig["disaggregated/mixed"]
    sa, sb = fig["aggregated/short-only"], fig["disaggregated/short-only"]
    rows = [
        # (figure, aggregated, disaggregated, target, pass)
        ("mixed: short chats' ITL p99 (ms)", a["short_itl_p99_ms"], b["short_itl_p99_ms"], "≥ 2× lower",
         b["short_itl_p99_ms"] * 2 <= a["short_itl_p99_ms"]),
        ("mixed: long prompts' TTFT p50 (ms)", a["long_ttft_p50_ms"], b["long_ttft_p50_ms"], "≤ +10 %",
         b["long_ttft_p50_ms"] <= a["long_ttft_p50_ms"] * 1.10),
        ("mixed: output tokens/s", a["throughput_tok_s"], b["throughput_tok_s"], "within 5 %",
         b["throughput_tok_s"] >= a["throughput_tok_s"] * 0.95),
        ("mixed: failed requests", a["errors"], b["errors"], "0", a["errors"] == 0 and b["errors"] == 0),
        ("short only: ITL p99 (ms)", sa["short_itl_p99_ms"], sb["short_itl_p99_ms"], "no loss (≤ +10 %)",
         sb["short_itl_p99_ms"] <= sa["short_itl_p99_ms"] * 1.10),
        ("short only: TTFT p50 (ms)", sa["short_ttft_p50_ms"], sb["short_ttft_p50_ms"], "no loss (≤ +10 %)",
         sb["short_ttft_p50_ms"] <= sa["short_ttft_p50_ms"] * 1.10),
        ("short only: output tokens/s", sa["throughput_tok_s"], sb["throughput_tok_s"], "within 5 %",
         sb["throughput_tok_s"] >= sa["throughput_tok_s"] * 0.95),
        ("short only: failed requests", sa["errors"], sb["errors"], "0", sa["errors"] == 0 and sb["errors"] == 0),
    ]
    print("| figure | 4 aggregated | 1 prefill + 3 decode | target | |")
    print("|---|---:|---:|---|---|")
    for name, x, y, target, ok in rows:
        fmt = (lambda v: f"{v:.1f}") if isinstance(x, float) else str
        print(f"| {name} | {fmt(x)} | {fmt(y)} | {target} | {'PASS' if ok else 'MISS'} |")
    print()
    print("| run | requests (long / short) | long TTFT p50 / p99 (ms) | short TTFT p50 (ms) | short ITL p50 / p99 (ms) | tokens/s |")
    print("|---|---|---|---|---|---:|")
    for k, v in fig.items():
        print(f"| {k} | {v['long_requests']} / {v['short_requests']} | {v['long_ttft_p50_ms']:.1f} / {v['long_ttft_p99_ms']:.1f} | "
              f"{v['short_ttft_p50_ms']:.1f} | {v['short_itl_p50_ms']:.1f} / {v['short_itl_p99_ms']:.1f} | {v['throughput_tok_s']:.0f} |")
    if out_json:
        with open(out_json, "w") as f:
            json.dump({"figures": fig, "rows": [{"figure": r[0], "aggregated": r[1], "disaggregated": r[2], "target": r[3],
                                                 "pass": r[4]} for r in rows]}, f, indent=2, default=str)
    if short:
        sys.exit(0)
    sys.exit(0 if all(r[4] for r in rows) else 1)


if __name__ == "__main__":
    main()
