#!/usr/bin/env python3
"""The figures of a scripts/flowbench run, each beside its target.

    scripts/flowbench_table.py DIR [--json FILE] [--smoke]

DIR is the run's output directory: runs.jsonl (one line per bench run:
topology, scenario, phase, tenant, file), meta.json, and the benches' --json
files (with --json-requests). Prints a markdown table; --json writes the same
figures as JSON. Exit status: 0 when every figure with a target passed, 1 on
a MISS (with --smoke: 0 all the same), 2 when a run's data is missing or a
tenant got no answer at all (the harness failed, not the product).

Service time S: the mean end-to-end latency of the calibration run, 64-token
requests with exactly as many in flight as the worker has slots (nothing
queued): one request's time in a slot.
"""
import argparse
import json
import math
import os
import sys


# The dispatcher's default --prompt-token-cost: a prompt token's cost in output
# tokens (docs/scheduling.md); flowbench runs every dispatcher with it.
PROMPT_TOKEN_COST = 1 / 32


class HarnessError(Exception):
    pass


def pct(xs, p):
    """numpy.percentile's default (linear), as bench computes it; nan when empty."""
    xs = sorted(xs)
    if not xs:
        return math.nan
    r = p / 100 * (len(xs) - 1)
    lo = int(r)
    if lo + 1 >= len(xs):
        return xs[-1]
    return xs[lo] + (r - lo) * (xs[lo + 1] - xs[lo])


class Run:
    """One bench run: its summary and per-request records, on absolute time."""

    def __init__(self, d, spec):
        path = os.path.join(d, spec["file"])
        try:
            data = json.load(open(path))
        except (OSError, ValueError) as e:
            raise HarnessError(f"{spec['file']}: {e}")
        self.spec = spec
        self.s = data["results"][0]
        self.config = data.get("config") or {}
        self.reqs = data.get("requests") or []
        self.t0 = self.s.get("load_start_unix_s") or 0.0
        if not self.t0:
            raise HarnessError(f"{spec['file']}: no load_start_unix_s (a bench older than flowbench's)")
        self.end = self.t0 + self.s["duration_s"]

    def started(self):
        """Records of requests that got a first token."""
        return [q for q in self.reqs if q.get("chunks", 0) > 0]

    def ttfts(self):
        """TTFT (ms) of the completed requests, as bench's summary counts them."""
        return [q["ttft_ms"] for q in self.reqs if not q.get("error") and not q.get("cancelled")]

    def chunk_times(self, q):
        """(absolute time, tokens) of each content chunk of a record."""
        n = q.get("chunks", 0)
        if n == 0:
            return []
        per = q["output_tokens"] / n if q.get("output_tokens", 0) > 0 else 1.0
        t = self.t0 + q["start_s"] + q["ttft_ms"] / 1000
        out = [(t, per)]
        for itl in q.get("itl_ms") or []:
            t += itl / 1000
            out.append((t, per))
        return out

    def output_in(self, a, b):
        """Output tokens streamed in [a, b) (absolute seconds)."""
        return sum(k for q in self.reqs for t, k in self.chunk_times(q) if a <= t < b)

    def prompts_in(self, a, b):
        """Prompt tokens of the requests whose first token came in [a, b): prefilled then."""
        return sum(q.get("prompt_tokens", 0) for q in self.started()
                   if a <= self.t0 + q["start_s"] + q["ttft_ms"] / 1000 < b)


class Table:
    def __init__(self):
        self.rows = []

    def add(self, topo, scen, figure, value, unit="", target="", ok=None):
        self.rows.append({"topology": topo, "scenario": scen, "figure": figure, "value": value, "unit": unit,
                          "target": target, "pass": ok})

    def markdown(self):
        out = ["| topology | scenario | figure | value | target | result |", "|---|---|---|---:|---|---|"]
        for r in self.rows:
            v = r["value"]
            if isinstance(v, float):
                v = "n/a" if math.isnan(v) else (f"{v:.1f}" if abs(v) >= 10 else f"{v:.2f}")
            res = "" if r["pass"] is None else ("PASS" if r["pass"] else "**MISS**")
            unit = f" {r['unit']}" if r["unit"] else ""
            out.append(f"| {r['topology']} | {r['scenario']} | {r['figure']} | {v}{unit} | {r['target']} | {res} |")
        return "\n".join(out)


def ms(x):
    return "n/a" if x is None or (isinstance(x, float) and math.isnan(x)) else f"{x:.0f} ms"


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("dir")
    ap.add_argument("--json")
    ap.add_argument("--smoke", action="store_true", help="a MISS does not fail (exit 0)")
    args = ap.parse_args()
    d = args.dir
    meta = json.load(open(os.path.join(d, "meta.json")))
    specs = [json.loads(line) for line in open(os.path.join(d, "runs.jsonl")) if line.strip()]
    runs, server = {}, {}
    for sp in specs:
        if sp.get("phase") == "server":
            server[(sp["topology"], sp["scenario"])] = sp
            continue
        runs[(sp["topology"], sp["scenario"], sp["phase"], sp["tenant"])] = Run(d, sp)

    t = Table()
    problems = []

    def need(topo, scen, phase, tenant):
        """The run, and a harness problem noted if it sent nothing or failed in a
        way no scenario causes (only 503s are the product's answer to load)."""
        r = runs.get((topo, scen, phase, tenant))
        if r is None:
            raise HarnessError(f"no run {topo}/{scen}/{phase}/{tenant}")
        odd = {k: v for k, v in (r.s.get("errors") or {}).items() if k != "http_503"}
        if r.s["sent"] == 0 or odd:
            problems.append(f"{topo}/{scen}/{phase}/{tenant}: {r.s['sent']} sent; errors {odd} "
                            f"(e.g. {r.s.get('error_samples')})")
        return r

    topos = [x for x in ("dev", "two-gateways") if any(k[0] == x for k in runs)]
    S = {}
    for topo in topos:
        cal = need(topo, "calibrate", "service", "calibrate")
        if cal.s["completed"] != cal.s["sent"]:
            problems.append(f"{topo}: the calibration completed {cal.s['completed']} of {cal.s['sent']} requests")
        S[topo] = cal.s["e2e_ms"]["mean"]
        t.add(topo, "calibrate", "service time S: mean latency, 64-token requests 8 at a time (nothing queued)",
              S[topo], "ms")
        t.add(topo, "calibrate", "capacity (those requests)", cal.s["requests_per_s"], "req/s")
        t.add(topo, "calibrate", "TTFT p99 with nothing queued", cal.s["ttft_ms"]["p99"], "ms")

    for topo in topos:
        if (topo, "noisy", "alone", "quiet") in runs:
            noisy(t, need, topo, S[topo], meta, runs)
        if (topo, "weights", "equal", "w3") in runs:
            for run in ("equal", "long", "pinned"):
                if (topo, "weights", run, "w3") in runs:
                    weights(t, need, topo, run, meta)
        if (topo, "priority", "critical", "flood") in runs:
            priority(t, need, topo, S[topo])
        if (topo, "deadlines", "overload", "a") in runs:
            deadlines(t, need, topo, runs[(topo, "calibrate", "service", "calibrate")], server.get((topo, "deadlines")))

    head = [f"flowbench {meta['date']} at {meta['commit']}{' (with uncommitted changes)' if meta['dirty'] else ''}"
            f"{', -short (smoke)' if meta['short'] else ''}; scenarios {meta['scenarios']}; 1 worker of {meta['slots']} slots"]
    if meta["flow_fields"] == "no":
        head.append("NOTE: this build's admin API has no band/weight/max_queue_ms on keys: every tenant was FCFS in "
                    "one band, so the fairness, priority and deadline targets test nothing of flow control.")
    print("\n".join(head) + "\n")
    print(t.markdown())
    misses = [r for r in t.rows if r["pass"] is False]
    print(f"\n{len([r for r in t.rows if r['pass'] is not None]) - len(misses)} PASS, {len(misses)} MISS")
    for p in problems:
        print(f"harness: {p}", file=sys.stderr)
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"meta": meta, "service_time_ms": S, "figures": t.rows, "misses": len(misses),
                       "problems": problems}, f, indent=2, allow_nan=False, default=str)
            f.write("\n")
    if problems:
        return 2
    return 0 if args.smoke or not misses else 1


def noisy(t, need, topo, S, meta, runs):
    sc = "noisy"
    idle = need(topo, sc, "alone", "quiet")
    alone = need(topo, sc, "alone", "flood")
    i50, i99 = pct(idle.ttfts(), 50), pct(idle.ttfts(), 99)
    t.add(topo, sc, "(a) quiet alone: TTFT p50", i50, "ms")
    t.add(topo, sc, "(a) quiet alone: TTFT p99", i99, "ms")
    # The flood's steady window: its whole run but the first and last second.
    d = meta["flood_s"]
    cut = 1.0 if d >= 4 else 0.5
    tp_alone = alone.output_in(alone.t0 + cut, alone.t0 + d - cut) / (d - 2 * cut)
    t.add(topo, sc, f"(b) flood alone: output tokens/s (seconds {cut:g} to {d - cut:g} of {d})", tp_alone, "tok/s")
    noisy_both(t, need, topo, S, "both", i50, i99, tp_alone, d, cut)
    if (topo, sc, "pinned", "quiet") in runs:
        noisy_both(t, need, topo, S, "pinned", i50, i99, tp_alone, d, cut)


def noisy_both(t, need, topo, S, phase, i50, i99, tp_alone, d, cut):
    """(c): the flood and the quiet tenant together; pinned: each through a gateway of its own."""
    quiet = need(topo, "noisy", phase, "quiet")
    flood = need(topo, "noisy", phase, "flood")
    sc, c = "noisy", "(c)"
    if phase == "pinned":
        sc = "noisy (pinned: flood via gateway 1, quiet via gateway 2)"
    q50, q99 = pct(quiet.ttfts(), 50), pct(quiet.ttfts(), 99)
    tp_both = flood.output_in(flood.t0 + cut, flood.t0 + d - cut) / (d - 2 * cut)
    t.add(topo, sc, f"{c} quiet beside the flood: TTFT p50 (n={len(quiet.ttfts())})", q50, "ms",
          f"< 3 x idle p50 = {ms(3 * i50)}", q50 < 3 * i50)
    t.add(topo, sc, f"{c} quiet beside the flood: TTFT p99", q99, "ms",
          f"<= 2 x idle p99 + S = {ms(2 * i99 + S)}", q99 <= 2 * i99 + S)
    if quiet.s["failed"] or quiet.s["cancelled"]:
        t.add(topo, sc, f"{c} quiet requests failed or cut", quiet.s["failed"] + quiet.s["cancelled"], "",
              "0", False)
    drop = 100 * (1 - tp_both / tp_alone) if tp_alone else math.nan
    t.add(topo, sc, f"{c} flood beside the quiet tenant: output tokens/s (same seconds)", tp_both, "tok/s")
    t.add(topo, sc, f"{c} flood throughput drop against alone", drop, "%", "<= 5 %", drop <= 5)
    both = tp_both + quiet.output_in(flood.t0 + cut, flood.t0 + d - cut) / (d - 2 * cut)
    t.add(topo, sc, f"{c} flood + quiet output tokens/s, same seconds (info: the worker's total)", both, "tok/s",
          f"alone: {tp_alone:.0f}")
    # Information: the flood while the quiet tenant's requests were open.
    qs = [(quiet.t0 + q["start_s"], quiet.t0 + q["start_s"] + q["e2e_ms"] / 1000) for q in quiet.reqs]
    if qs:
        a, b = min(x[0] for x in qs), min(max(x[1] for x in qs), flood.end - cut)
        if b - a > 0.2:
            during = flood.output_in(a, b) / (b - a)
            t.add(topo, sc, f"{c} flood output tokens/s while the quiet requests ran ({b - a:.1f} s; info)", during,
                  "tok/s", f"alone: {tp_alone:.0f}")


def weights(t, need, topo, run, meta):
    sc = {"equal": "weights (equal prompts)", "long": "weights (w1's prompts 2048, w3's 64)",
          "pinned": "weights (pinned: w3 via gateway 1, w1 via gateway 2)"}[run]
    w3 = need(topo, "weights", run, "w3")
    w1 = need(topo, "weights", run, "w1")
    d = meta["weights_s"]
    warm, tail = min(2.0, d / 4), min(1.0, d / 4)
    a, b = max(w3.t0, w1.t0) + warm, min(w3.end, w1.end) - tail
    if b - a < 0.5:
        raise HarnessError(f"{topo} weights {run}: the two tenants' runs overlap too little ({b - a:.2f} s)")
    o3, o1 = w3.output_in(a, b), w1.output_in(a, b)
    p3, p1 = w3.prompts_in(a, b), w1.prompts_in(a, b)
    share = 100 * o3 / (o3 + o1) if o3 + o1 else math.nan
    t.add(topo, sc, f"output tokens/s, weight 3 / weight 1 (window {b - a:.1f} s)", f"{o3 / (b - a):.0f} / {o1 / (b - a):.0f}",
          "tok/s")
    t.add(topo, sc, "weight 3's share of output tokens", share, "%", "75 +- 5", abs(share - 75) <= 5)
    tot = o3 + o1 + p3 + p1
    t.add(topo, sc, "weight 3's share of prompt + output tokens (info)", 100 * (o3 + p3) / tot if tot else math.nan,
          "%")
    # The scheduler's estimate before a request runs (docs/scheduling.md):
    # prompt tokens x --prompt-token-cost (1/32) + output tokens. What it
    # settles with is the engine time each request held, which the bench
    # cannot see; on the sim a 2048-token prompt adds little of it, so the
    # output tokens' share is the one to hold to 75 %.
    c3, c1 = o3 + p3 * PROMPT_TOKEN_COST, o1 + p1 * PROMPT_TOKEN_COST
    share_c = 100 * c3 / (c3 + c1) if c3 + c1 else math.nan
    t.add(topo, sc, "weight 3's share of prompt/32 + output tokens (the estimate's unit, info)", share_c, "%")


def priority(t, need, topo, S):
    for phase, who, under in (("critical", "critical key", "64 interactive streams"),
                              ("batch", "interactive key", "64 batch-band streams")):
        sc = f"priority ({phase})"
        flood = need(topo, "priority", phase, "flood")
        tr = need(topo, "priority", phase, "trickle")
        x = tr.ttfts()
        t.add(topo, sc, f"{who}'s trickle under {under}: TTFT p50 (n={len(x)})", pct(x, 50), "ms",
              f"info (S = {ms(S)})")
        t.add(topo, sc, f"{who}'s trickle under {under}: TTFT p99", pct(x, 99), "ms", f"<= S = {ms(S)}",
              pct(x, 99) <= S)
        if tr.s["failed"] or tr.s["cancelled"]:
            t.add(topo, sc, "trickle requests failed or cut", tr.s["failed"] + tr.s["cancelled"], "", "0", False)
        t.add(topo, sc, "the flood's output tokens/s (info)", flood.s["output_tokens_per_s"], "tok/s")


def deadlines(t, need, topo, cal, server):
    sc = "deadlines (max_queue_ms 2000)"
    rs = [need(topo, "deadlines", "overload", x) for x in ("a", "b")]
    reqs = [q for r in rs for q in r.reqs]
    allow = cal.s["ttft_ms"]["p99"]
    limit = 2000 + allow
    cats = {k: 0 for k in ("started", "late", "refused", "refused_slow", "timed_out", "full_at_once", "cut", "other")}
    refusal_ms, no_retry_after, other = [], 0, {}
    for q in reqs:
        err, code = q.get("error", ""), q.get("error_code", "")
        if q.get("chunks", 0) > 0:
            cats["started" if q["ttft_ms"] <= limit else "late"] += 1
        elif q.get("cancelled"):
            cats["cut"] += 1
        elif err == "http_503" and code == "queue_wait_too_long":
            refusal_ms.append(q["e2e_ms"])
            cats["refused" if q["e2e_ms"] <= 50 else "refused_slow"] += 1
            no_retry_after += not q.get("retry_after")
        elif err == "http_503" and code == "queue_full":
            # the queue's own timeout (waited, then refused), or a full queue (at once)
            cats["timed_out" if q["e2e_ms"] >= 1000 else "full_at_once"] += 1
        else:
            cats["other"] += 1
            other[f"{err} {code}".strip()] = other.get(f"{err} {code}".strip(), 0) + 1
    n = len(reqs)
    offered = sum(float(r.config.get("request_rate", 0)) for r in rs)
    t.add(topo, sc, "offered (2 tenants, Poisson) against capacity", f"{offered:.1f} / {cal.s['requests_per_s']:.1f}",
          "req/s", "4x")
    t.add(topo, sc, f"requests sent", n)
    t.add(topo, sc, f"started within 2 s (TTFT <= 2 s + {allow:.0f} ms, the TTFT p99 with nothing queued)",
          cats["started"], "", f"info ({100 * cats['started'] / max(n, 1):.0f} % of sent; ~25 % fits)")
    t.add(topo, sc, "refused (503 queue_wait_too_long) within 50 ms", cats["refused"], "",
          f"info ({100 * cats['refused'] / max(n, 1):.0f} % of sent)")
    t.add(topo, sc, "refused after more than 50 ms", cats["refused_slow"], "", "0", cats["refused_slow"] == 0)
    if refusal_ms:
        t.add(topo, sc, "refusal latency p50 / p99", f"{pct(refusal_ms, 50):.1f} / {pct(refusal_ms, 99):.1f}", "ms",
              "info")
    t.add(topo, sc, "refusals without Retry-After", no_retry_after, "", "0", no_retry_after == 0)
    t.add(topo, sc, "started after 2 s, or still queued when the bench stopped", cats["late"] + cats["cut"], "", "0",
          cats["late"] + cats["cut"] == 0)
    if cats["late"]:
        late = [q["ttft_ms"] for q in reqs if q.get("chunks", 0) > 0 and q["ttft_ms"] > limit]
        t.add(topo, sc, "of the late starts, first token after 2.1 s (info: the rest most likely left the queue in "
              "time, their first token slower than with nothing queued)", len([x for x in late if x > 2100]), "",
              f"latest: {max(late):.0f} ms")
    t.add(topo, sc, "timed out in the queue (503 queue_full after >= 1 s)", cats["timed_out"], "", "0",
          cats["timed_out"] == 0)
    if server is not None:
        t.add(topo, sc, "dispatcher queue timeouts (tokenbus_dispatcher_rejected_total{reason=queue_timeout})",
              server["queue_timeouts"], "", "0", server["queue_timeouts"] == 0)
        if "busy_retries" in server:
            t.add(topo, sc, "requests a full worker handed back, sent again by the gateway "
                  "(tokenbus_client_retries_total{reason=worker_busy}; info)", server["busy_retries"])
    if cats["full_at_once"]:
        t.add(topo, sc, "refused at once as queue_full (the queue full)", cats["full_at_once"], "", "0", False)
    if cats["other"]:
        t.add(topo, sc, f"other outcomes {other}", cats["other"], "", "0", False)


if __name__ == "__main__":
    try:
        sys.exit(main())
    except HarnessError as e:
        print(f"flowbench_table: {e}", file=sys.stderr)
        sys.exit(2)
