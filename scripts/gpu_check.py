"""tokenbus in front of a real engine on a GPU: see scripts/gpu-check and docs/gpu.md.

Builds a small Llama-architecture model (random weights) and a BPE tokenizer on the
spot, starts `transformers serve --continuous-batching` with it, starts tokenbus
(`dev --sim-workers 0` + `worker --engine openai`) in front of it, records how each
answers (stream ends, errors), then sends the same streaming requests straight to
the engine and through tokenbus, interleaved, and writes JSON and markdown.

Only the standard library is used for the load (threads + http.client), so the
measuring side runs anywhere; torch, transformers and tokenizers are needed only
to build the model (skipped with --engine-url, for a dry run against another server).
"""

import argparse
import http.client
import json
import os
import random
import re
import signal
import socket
import statistics
import subprocess
import sys
import threading
import time
import urllib.parse

MODEL_NAME = "tb-llama"  # a directory under --workdir; the server is pinned to exactly this name


def log(*a):
    print(time.strftime("%H:%M:%S"), *a, file=sys.stderr, flush=True)


def free_port():
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    p = s.getsockname()[1]
    s.close()
    return p


# ---------------------------------------------------------------- model


def build_model(workdir, params):
    """Random-weight Llama + a BPE tokenizer trained on generated text; no model hub."""
    import torch
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import GenerationConfig, LlamaConfig, LlamaForCausalLM, PreTrainedTokenizerFast

    out = os.path.join(workdir, MODEL_NAME)
    os.makedirs(out, exist_ok=True)
    rng = random.Random(14)
    syll = ["ka", "to", "ri", "su", "ne", "mo", "la", "pi", "du", "xe", "bo", "an", "el", "or", "us", "im"]
    words = ["".join(rng.choice(syll) for _ in range(rng.randint(1, 4))) for _ in range(3000)]
    text = [" ".join(rng.choice(words) for _ in range(rng.randint(5, 40))) + rng.choice([".", "?", "!"]) for _ in range(40000)]
    special = ["<s>", "</s>", "<pad>", "<|user|>", "<|assistant|>", "<|system|>"]
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=8192, special_tokens=special,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    tok.train_from_iterator(text, trainer=trainer)
    fast = PreTrainedTokenizerFast(tokenizer_object=tok, bos_token="<s>", eos_token="</s>", pad_token="<pad>")
    fast.chat_template = (
        "{% for m in messages %}<|{{ m['role'] }}|>{{ m['content'] }}\n{% endfor %}"
        "{% if add_generation_prompt %}<|assistant|>{% endif %}")
    fast.save_pretrained(out)

    cfg = LlamaConfig(vocab_size=len(fast), hidden_size=params["hidden"], intermediate_size=params["intermediate"],
                      num_hidden_layers=params["layers"], num_attention_heads=params["heads"],
                      num_key_value_heads=params["kv_heads"], max_position_embeddings=4096,
                      bos_token_id=fast.bos_token_id, eos_token_id=fast.eos_token_id,
                      pad_token_id=fast.pad_token_id, tie_word_embeddings=False)
    torch.manual_seed(14)
    model = LlamaForCausalLM(cfg).to(torch.bfloat16)
    n = sum(p.numel() for p in model.parameters())
    model.generation_config = GenerationConfig(bos_token_id=fast.bos_token_id, eos_token_id=fast.eos_token_id,
                                               pad_token_id=fast.pad_token_id, do_sample=False)
    model.save_pretrained(out)
    return {"dir": out, "params": n, "vocab": len(fast), "config": params}


# ---------------------------------------------------------------- processes


class Procs:
    def __init__(self, workdir):
        self.workdir, self.procs = workdir, []

    def start(self, name, argv, env=None, cwd=None):
        logf = open(os.path.join(self.workdir, name + ".log"), "wb")
        p = subprocess.Popen(argv, stdout=logf, stderr=subprocess.STDOUT, env=env, cwd=cwd, start_new_session=False)
        self.procs.append((name, p))
        log("started", name, p.pid, " ".join(argv))
        return p

    def alive(self, name):
        return all(p.poll() is None for n, p in self.procs if n == name)

    def stop(self):
        for name, p in reversed(self.procs):
            if p.poll() is None:
                p.send_signal(signal.SIGINT)
        for name, p in reversed(self.procs):
            try:
                p.wait(timeout=10)
            except subprocess.TimeoutExpired:
                p.kill()
                p.wait()

    def tail(self, name, n=4000):
        try:
            with open(os.path.join(self.workdir, name + ".log"), "rb") as f:
                return f.read()[-n:].decode("utf-8", "replace")
        except OSError:
            return ""


def wait_http(url, timeout, proc_ok=lambda: True, ok=(200,)):
    deadline = time.time() + timeout
    last = None
    while time.time() < deadline:
        if not proc_ok():
            raise RuntimeError(f"process died while waiting for {url}")
        try:
            st, _, _ = http_req("GET", url, None, timeout=3)
            last = st
            if st in ok:
                return st
        except OSError as e:
            last = repr(e)
        time.sleep(0.25)
    raise RuntimeError(f"timeout waiting for {url} (last: {last})")


# ---------------------------------------------------------------- HTTP


def http_req(method, url, body, timeout=60, headers=None):
    u = urllib.parse.urlsplit(url)
    c = http.client.HTTPConnection(u.hostname, u.port, timeout=timeout)
    try:
        h = {"Content-Type": "application/json"}
        h.update(headers or {})
        c.request(method, u.path or "/", body=json.dumps(body) if body is not None else None, headers=h)
        r = c.getresponse()
        data = r.read()
        return r.status, dict(r.getheaders()), data.decode("utf-8", "replace")
    finally:
        c.close()


def stream(url, body, timeout=60):
    """One streaming request; returns its record: status, ttft, inter-token gaps, tokens, how it ended."""
    u = urllib.parse.urlsplit(url)
    rec = {"status": None, "ttft_ms": None, "itl_ms": [], "tokens": 0, "done": False, "finish_reason": None,
           "error": None, "end": None}
    t0 = time.perf_counter()
    last = None
    c = http.client.HTTPConnection(u.hostname, u.port, timeout=timeout)
    try:
        c.request("POST", u.path, body=json.dumps(body), headers={"Content-Type": "application/json"})
        r = c.getresponse()
        rec["status"] = r.status
        if r.status != 200:
            rec["error"] = r.read()[:500].decode("utf-8", "replace")
            rec["end"] = "http_error"
            return rec
        while True:
            try:
                line = r.readline()
            except (http.client.IncompleteRead, OSError) as e:
                rec["end"] = "broken: " + repr(e)[:200]
                return rec
            if not line:
                break
            line = line.strip()
            if not line.startswith(b"data:"):
                continue
            payload = line[5:].strip()
            if payload == b"[DONE]":
                rec["done"] = True
                continue
            try:
                ev = json.loads(payload)
            except ValueError:
                rec["error"] = "bad json: " + payload[:200].decode("utf-8", "replace")
                continue
            if "error" in ev:
                rec["error"] = json.dumps(ev["error"])[:500]
                continue
            for ch in ev.get("choices") or []:
                piece = (ch.get("delta") or {}).get("content") or ch.get("text") or ""
                if piece:
                    now = time.perf_counter()
                    if last is None:
                        rec["ttft_ms"] = (now - t0) * 1e3
                    else:
                        rec["itl_ms"].append((now - last) * 1e3)
                    last = now
                    rec["tokens"] += 1
                if ch.get("finish_reason"):
                    rec["finish_reason"] = ch["finish_reason"]
        rec["end"] = "clean" if rec["finish_reason"] and not rec["error"] else ("error_event" if rec["error"] else "no_finish_reason")
        return rec
    except OSError as e:
        rec["end"] = "conn_error: " + repr(e)[:200]
        return rec
    finally:
        rec["wall_s"] = time.perf_counter() - t0
        c.close()


# ---------------------------------------------------------------- probes


def probes(engine, gateway, model):
    """What each side answers today to the cases the issue lists; recorded as found."""
    msg = [{"role": "user", "content": "ka to ri su ne mo la pi"}]
    out = {}
    for side, base in (("engine", engine), ("tokenbus", gateway)):
        p = {}
        try:
            st, _, body = http_req("GET", base + "/v1/models", None, timeout=30)
            p["models"] = {"status": st, "body": body[:400]}
        except OSError as e:
            p["models"] = {"error": repr(e)}
        p["stream_chat"] = stream(base + "/v1/chat/completions",
                                  {"model": model, "messages": msg, "max_tokens": 32, "stream": True})
        p["stream_chat"].pop("itl_ms", None)
        for name, path, body in (
                ("nonstream_chat", "/v1/chat/completions", {"model": model, "messages": msg, "max_tokens": 32}),
                ("nonstream_completion", "/v1/completions", {"model": model, "prompt": "ka to ri", "max_tokens": 32}),
                ("ignore_eos", "/v1/chat/completions", {"model": model, "messages": msg, "max_tokens": 8, "ignore_eos": True}),
                ("wrong_model", "/v1/chat/completions", {"model": "no-such-model", "messages": msg, "max_tokens": 8})):
            try:
                st, _, b = http_req("POST", base + path, body, timeout=120)
                p[name] = {"status": st, "body": b[:600]}
            except OSError as e:
                p[name] = {"error": repr(e)}
        for kind, path, body in (("chat", "/v1/chat/completions", {"messages": msg}),
                                  ("completion", "/v1/completions", {"prompt": "ka to ri"})):
            p["raw_stream_" + kind] = raw_events(base + path, dict(body, model=model, max_tokens=8, stream=True))
        out[side] = p
    return out


def raw_events(url, body, keep=4, timeout=60):
    """The first and last few SSE data lines of a stream, as sent: what a chunk of this server looks like."""
    u = urllib.parse.urlsplit(url)
    c = http.client.HTTPConnection(u.hostname, u.port, timeout=timeout)
    try:
        c.request("POST", u.path, body=json.dumps(body), headers={"Content-Type": "application/json"})
        r = c.getresponse()
        lines = [ln.decode("utf-8", "replace").rstrip("\r\n") for ln in r.read().splitlines() if ln.startswith(b"data:")]
        return {"status": r.status, "events": len(lines), "first": lines[:keep], "last": lines[-keep:]}
    except OSError as e:
        return {"error": repr(e)}
    finally:
        c.close()


def sdk_check(gateway, model):
    """The official OpenAI Python SDK through tokenbus (if the openai package imports)."""
    try:
        import openai
    except ImportError as e:
        return {"skipped": repr(e)}
    res = {"version": openai.__version__}
    cl = openai.OpenAI(base_url=gateway + "/v1", api_key="none", max_retries=0, timeout=120)
    msg = [{"role": "user", "content": "ka to ri su"}]
    try:
        r = cl.chat.completions.create(model=model, messages=msg, max_tokens=32)
        res["nonstream"] = {"ok": True, "finish_reason": r.choices[0].finish_reason, "usage": r.usage.model_dump() if r.usage else None}
    except Exception as e:  # the SDK's errors are what we record
        res["nonstream"] = {"ok": False, "error": f"{type(e).__name__}: {str(e)[:400]}"}
    try:
        n, fin = 0, None
        for ch in cl.chat.completions.create(model=model, messages=msg, max_tokens=64, stream=True):
            for c in ch.choices:
                n += bool(c.delta and c.delta.content)
                fin = c.finish_reason or fin
        res["stream"] = {"ok": fin is not None, "chunks": n, "finish_reason": fin}
    except Exception as e:
        res["stream"] = {"ok": False, "error": f"{type(e).__name__}: {str(e)[:400]}"}
    return res


# ---------------------------------------------------------------- load


def batch(url, model, conc, max_tokens, seed):
    rng = random.Random(seed)
    words = ["ka", "to", "ri", "su", "ne", "mo", "la", "pi", "du", "xe"]
    recs = [None] * conc

    def one(i):
        prompt = " ".join(rng.choice(words) for _ in range(64))
        recs[i] = stream(url + "/v1/chat/completions", {"model": model, "stream": True, "max_tokens": max_tokens,
                                                          "messages": [{"role": "user", "content": prompt}]})

    t0 = time.perf_counter()
    ts = [threading.Thread(target=one, args=(i,)) for i in range(conc)]
    for t in ts:
        t.start()
    for t in ts:
        t.join()
    return recs, time.perf_counter() - t0


def pct(xs, q):
    if not xs:
        return None
    xs = sorted(xs)
    return xs[min(len(xs) - 1, int(round(q / 100 * (len(xs) - 1))))]


def summarize(recs, wall):
    ok = [r for r in recs if r["end"] == "clean"]
    ttft = [r["ttft_ms"] for r in recs if r["ttft_ms"] is not None]
    itl = [x for r in recs for x in r["itl_ms"]]
    ends = {}
    for r in recs:
        k = r["end"] if r["end"] in ("clean", "no_finish_reason", "error_event", "http_error") else (r["end"] or "?").split(":")[0]
        ends[k] = ends.get(k, 0) + 1
    return {
        "requests": len(recs), "clean": len(ok), "failed": len(recs) - len(ok),
        "done_seen": sum(r["done"] for r in recs), "ends": ends,
        "statuses": sorted({r["status"] for r in recs if r["status"] is not None}),
        "errors": sorted({(r["error"] or "")[:300] for r in recs if r["error"]})[:5],
        "tokens": sum(r["tokens"] for r in recs),
        "tokens_per_s": sum(r["tokens"] for r in recs) / wall if wall else None,
        "ttft_p50_ms": pct(ttft, 50), "ttft_p99_ms": pct(ttft, 99),
        "itl_p50_ms": pct(itl, 50), "itl_p99_ms": pct(itl, 99),
        "wall_s": wall,
    }


TTFT_SERIES = ("tokenbus_gateway_time_to_first_token_seconds", "tokenbus_worker_time_to_first_token_seconds")


def scrape(urls):
    """Sum and count of the gateway's and the worker's TTFT histograms (all label sets), from their /metrics."""
    out = {}
    for url in urls:
        try:
            _, _, body = http_req("GET", url, None, timeout=10)
        except OSError:
            continue
        for line in body.splitlines():
            for name in TTFT_SERIES:
                for part in ("_sum", "_count"):
                    if line.startswith(name + part + " ") or line.startswith(name + part + "{"):
                        k = name + part
                        out[k] = out.get(k, 0.0) + float(line.rsplit(" ", 1)[1])
    return out


def split_ttft(before, after):
    """Mean TTFT at the gateway and at the worker over the requests between two scrapes, in ms: the gateway's
    clock runs from its reading of the request to the first chunk it writes, the worker's from its admission to
    the engine's first chunk, so the difference is what the bus path (gateway, dispatcher, NATS, reply) adds."""
    res = {}
    for name, key in zip(TTFT_SERIES, ("gateway_ttft_mean_ms", "worker_ttft_mean_ms")):
        n = after.get(name + "_count", 0) - before.get(name + "_count", 0)
        s = after.get(name + "_sum", 0) - before.get(name + "_sum", 0)
        res[key] = s / n * 1e3 if n else None
        res[key.replace("_mean_ms", "_n")] = int(n)
    if res["gateway_ttft_mean_ms"] is not None and res["worker_ttft_mean_ms"] is not None:
        res["bus_added_mean_ms"] = res["gateway_ttft_mean_ms"] - res["worker_ttft_mean_ms"]
    return res


def load(engine, gateway, model, levels, max_tokens, deadline, metrics_urls=()):
    res = {}
    for conc, rounds in levels:
        if time.time() > deadline:
            log("time budget reached; skipping level", conc)
            break
        # one unmeasured batch per side first: the engine's first batches at a new size are slow (run 3's p99s), and
        # whichever side ran first paid for it
        for base in (engine, gateway):
            batch(base, model, conc, max_tokens, seed=conc * 1000 - 1)
        acc = {"engine": ([], 0.0), "tokenbus": ([], 0.0)}
        paired = []  # per round: tokenbus TTFT p50 minus engine TTFT p50, the same prompts back to back
        before = scrape(metrics_urls)
        for rd in range(rounds):
            if time.time() > deadline:
                log("time budget reached; stopping load at", conc, "round", rd)
                break
            order = [("engine", engine), ("tokenbus", gateway)]
            if rd % 2:
                order.reverse()  # interleave: neither side always goes first
            p50 = {}
            for side, base in order:
                recs, wall = batch(base, model, conc, max_tokens, seed=conc * 1000 + rd)
                a, w = acc[side]
                acc[side] = (a + recs, w + wall)
                p50[side] = pct([r["ttft_ms"] for r in recs if r["ttft_ms"] is not None], 50)
            if p50.get("engine") is not None and p50.get("tokenbus") is not None:
                paired.append(p50["tokenbus"] - p50["engine"])
        after = scrape(metrics_urls)
        res[str(conc)] = {side: summarize(a, w) for side, (a, w) in acc.items() if a}
        res[str(conc)]["paired"] = {"rounds": len(paired), "ttft_p50_diff_ms": paired,
                                    "median_diff_ms": pct(paired, 50)}
        res[str(conc)]["split"] = split_ttft(before, after)
        for side, s in res[str(conc)].items():
            if side in ("engine", "tokenbus"):
                log(f"c={conc} {side}: {s['clean']}/{s['requests']} clean, ttft p50 {fmt(s['ttft_p50_ms'])} p99 "
                    f"{fmt(s['ttft_p99_ms'])} ms, itl p50 {fmt(s['itl_p50_ms'])} ms, {fmt(s['tokens_per_s'])} tok/s, ends {s['ends']}")
        log(f"c={conc} paired TTFT p50 diffs {[round(x, 2) for x in paired]} ms; split {res[str(conc)]['split']}")
    return res


def conformance(binary, engine, model, lacks, timeout_s, log_path=""):
    """The engine conformance suite (workers/engine/openai TestConformanceServer) against the engine: the openai
    engine, as tokenbus's worker runs it, in front of this server. Returns each row's verdict and the output's tail."""
    env = dict(os.environ, TOKENBUS_CONFORMANCE_URL=engine, TOKENBUS_CONFORMANCE_MODEL=model,
               TOKENBUS_CONFORMANCE_LACKS=lacks)
    cmd = [binary, "-test.run", "^TestConformanceServer$", "-test.v", "-test.count", "1",
           "-test.timeout", f"{int(timeout_s)}s"]
    t = time.time()
    try:
        p = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=timeout_s + 30)
        out, rc = p.stdout + p.stderr, p.returncode
    except subprocess.TimeoutExpired as e:
        out, rc = (e.stdout or b"").decode("utf-8", "replace") if isinstance(e.stdout, bytes) else (e.stdout or ""), "timeout"
    if log_path:
        with open(log_path, "w") as f:
            f.write(out)
    rows = {}
    for line in out.splitlines():
        m = re.match(r"^(\s*)--- (PASS|FAIL|SKIP): TestConformanceServer/(\S+)", line)
        if m:
            rows[m.group(3)] = m.group(2)
    return {"cmd": " ".join(cmd), "lacks": lacks, "rc": rc, "wall_s": time.time() - t, "rows": rows,
            "passed": sum(v == "PASS" for v in rows.values()), "failed": sorted(k for k, v in rows.items() if v == "FAIL"),
            "messages": [ln.strip() for ln in out.splitlines() if re.search(r"\.go:\d+: ", ln)
                         and "the engine lacks" not in ln and "only for an engine" not in ln][:80],
            "tail": out[-6000:]}


def fmt(x, d=1):
    return "-" if x is None else f"{x:.{d}f}"


def markdown(report):
    L = [f"# tokenbus gpu-check {report['started']}", "", "```", json.dumps(report["host"], indent=1), "```", ""]
    L += ["| conc | side | requests | clean | [DONE] seen | ends | TTFT p50 ms | TTFT p99 ms | ITL p50 ms | ITL p99 ms | tokens/s |",
          "|---:|---|---:|---:|---:|---|---:|---:|---:|---:|---:|"]
    for conc, sides in report.get("load", {}).items():
        for side, s in sides.items():
            if side not in ("engine", "tokenbus"):
                continue
            L.append(f"| {conc} | {side} | {s['requests']} | {s['clean']} | {s['done_seen']} | {s['ends']} | {fmt(s['ttft_p50_ms'])} | "
                     f"{fmt(s['ttft_p99_ms'])} | {fmt(s['itl_p50_ms'], 2)} | {fmt(s['itl_p99_ms'], 2)} | {fmt(s['tokens_per_s'], 0)} |")
    L += ["", "Where tokenbus's TTFT goes (means over the measured tokenbus batches; paired: median over rounds of the "
          "tokenbus batch's TTFT p50 minus the engine batch's, same prompts back to back):", "",
          "| conc | paired diff ms (median) | rounds | gateway TTFT mean ms | worker TTFT mean ms | bus adds ms |",
          "|---:|---:|---:|---:|---:|---:|"]
    for conc, sides in report.get("load", {}).items():
        p, sp = sides.get("paired", {}), sides.get("split", {})
        L.append(f"| {conc} | {fmt(p.get('median_diff_ms'), 2)} | {p.get('rounds')} | {fmt(sp.get('gateway_ttft_mean_ms'), 2)} | "
                 f"{fmt(sp.get('worker_ttft_mean_ms'), 2)} | {fmt(sp.get('bus_added_mean_ms'), 3)} |")
    c = report.get("conformance")
    if c:
        L += ["", f"Conformance suite against the engine (`{c['cmd']}`, lacks `{c['lacks']}`): rc {c['rc']}, "
              f"{c['passed']} rows passed, failed: {c['failed'] or 'none'}", "", "```", "\n".join(c["messages"]), "```"]
    L += ["", "## Probes", "", "```", json.dumps(report.get("probes"), indent=1), "```", "",
          "## OpenAI SDK through tokenbus", "", "```", json.dumps(report.get("sdk"), indent=1), "```", ""]
    for conc, sides in report.get("load", {}).items():
        for side, s in sides.items():
            if side in ("engine", "tokenbus") and s["errors"]:
                L.append(f"- c={conc} {side} errors: {s['errors']}")
    return "\n".join(L) + "\n"


# ---------------------------------------------------------------- main


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--tokenbus", required=True, help="tokenbus binary")
    ap.add_argument("--out", required=True, help="directory for gpu-check.json/.md and logs")
    ap.add_argument("--workdir", default="/tmp/gpu-check")
    ap.add_argument("--engine-url", default="", help="use this running server instead of building a model and starting transformers serve (dry run)")
    ap.add_argument("--model", default=MODEL_NAME, help="model name to request (with --engine-url)")
    ap.add_argument("--levels", default="1:8,8:4,64:2", help="concurrency:rounds,... (each round: one batch to each side)")
    ap.add_argument("--max-tokens", type=int, default=256)
    ap.add_argument("--budget-s", type=float, default=420, help="stop starting new load rounds after this many seconds")
    ap.add_argument("--no-hf-cache", action="store_true",
                    help="start the engine without an HF cache directory: its GET /v1/models then answers 500, and "
                         "tokenbus's openai engine (health = GET /v1/models) never becomes ready")
    ap.add_argument("--conformance", default="", help="the engine conformance suite's test binary: run against the engine after the load")
    ap.add_argument("--conformance-lacks", default="extensions,choices,context-limit,pooling", help="features the engine lacks (enginetest names)")
    ap.add_argument("--conformance-timeout-s", type=float, default=180)
    ap.add_argument("--size", default="1024,2816,16,16,8", help="hidden,intermediate,layers,heads,kv_heads")
    a = ap.parse_args()
    t_start = time.time()
    os.makedirs(a.out, exist_ok=True)
    os.makedirs(a.workdir, exist_ok=True)
    report = {"started": time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime()), "argv": sys.argv, "host": {}}
    procs = Procs(a.workdir)
    env = dict(os.environ, HF_HUB_OFFLINE="1", TRANSFORMERS_OFFLINE="1", NCCL_NVLS_ENABLE="0",
               TORCH_SYMM_MEM_DISABLE_MULTICAST="1", NVSHMEM_DISABLE_NVLS="1")
    try:
        out = subprocess.run([a.tokenbus, "version"], capture_output=True, text=True)
        report["host"]["tokenbus"] = (out.stdout or out.stderr).strip()[:200]
        model = a.model
        if a.engine_url:
            engine = a.engine_url.rstrip("/")
        else:
            import torch
            import tokenizers
            import transformers
            report["host"].update(python=sys.version.split()[0], torch=torch.__version__, transformers=transformers.__version__,
                                  tokenizers=tokenizers.__version__,
                                  gpu=torch.cuda.get_device_name(0) if torch.cuda.is_available() else None)
            h, i, l, nh, kv = (int(x) for x in a.size.split(","))
            t = time.time()
            report["model"] = build_model(a.workdir, {"hidden": h, "intermediate": i, "layers": l, "heads": nh, "kv_heads": kv})
            report["model"]["build_s"] = time.time() - t
            log("model", report["model"])
            port = free_port()
            engine = f"http://127.0.0.1:{port}"
            serve = ["transformers", "serve", "--continuous-batching", "--host", "127.0.0.1", "--port", str(port),
                     "--device", "cuda:0", "--dtype", "bfloat16", "--log-level", "info", MODEL_NAME]
            report["engine_cmd"] = " ".join(serve)
            eenv = dict(env)
            if not a.no_hf_cache:
                # transformers serve lists /v1/models from the HF cache and answers 500 when that directory is
                # missing (a fresh host); an empty one makes it answer 200 with an empty list
                eenv["HF_HUB_CACHE"] = os.path.join(a.workdir, "hf-hub")
                os.makedirs(eenv["HF_HUB_CACHE"], exist_ok=True)
                report["engine_cmd"] = "HF_HUB_CACHE=" + eenv["HF_HUB_CACHE"] + " " + report["engine_cmd"]
            procs.start("engine", serve, env=eenv, cwd=a.workdir)
            t = time.time()
            wait_http(engine + "/health", 300, lambda: procs.alive("engine"))
            report["engine_ready_s"] = time.time() - t
        # warm the engine (first request compiles/allocates) before anything is measured
        w = stream(engine + "/v1/chat/completions", {"model": model, "stream": True, "max_tokens": 16,
                                                      "messages": [{"role": "user", "content": "warm up"}]})
        report["engine_warmup"] = {k: w[k] for k in ("status", "ttft_ms", "tokens", "done", "finish_reason", "end", "error")}
        log("engine warm-up", report["engine_warmup"])

        hport, nport, mport = free_port(), free_port(), free_port()
        gateway = f"http://127.0.0.1:{hport}"
        # --model/--adapters "": the registry then holds the engine's model alone (no sim model or example adapter)
        dev = [a.tokenbus, "dev", "--sim-workers", "0", "--model", model, "--adapters", "", "--http", f"127.0.0.1:{hport}", "--admin", "",
               "--nats-listen", f"127.0.0.1:{nport}", "--log-level", "info"]
        worker = [a.tokenbus, "worker", "--engine", "openai", "--engine-url", engine, "--engine-models", model,
                  "--nats-url", f"nats://127.0.0.1:{nport}", "--metrics", f"127.0.0.1:{mport}", "--log-level", "info"]
        report["tokenbus_cmd"] = [" ".join(dev), " ".join(worker)]
        procs.start("tokenbus-dev", dev, env=env)
        wait_http(gateway + "/health", 60, lambda: procs.alive("tokenbus-dev"), ok=(200, 503))
        procs.start("tokenbus-worker", worker, env=env)
        try:
            wait_http(gateway + "/ready", 60, lambda: procs.alive("tokenbus-worker") and procs.alive("tokenbus-dev"))
            report["tokenbus_ready"] = True
        except RuntimeError as e:
            report["tokenbus_ready"] = str(e)
            log("tokenbus not ready:", e)
        # /ready may not wait for the worker's models; wait until a request is routed somewhere
        for _ in range(100):
            st, _, b = http_req("POST", gateway + "/v1/chat/completions", {"model": model, "max_tokens": 4,
                                "messages": [{"role": "user", "content": "x"}]}, timeout=60)
            if st not in (404, 503):
                break
            time.sleep(0.2)
        report["tokenbus_first"] = {"status": st, "body": b[:300]}
        log("tokenbus first answer", report["tokenbus_first"])

        report["probes"] = probes(engine, gateway, model)
        log("probes done")
        report["sdk"] = sdk_check(gateway, model)
        log("sdk", report["sdk"])
        levels = [tuple(int(x) for x in lv.split(":")) for lv in a.levels.split(",") if lv]
        report["load"] = load(engine, gateway, model, levels, a.max_tokens, t_start + a.budget_s,
                              metrics_urls=(gateway + "/metrics", f"http://127.0.0.1:{mport}/metrics"))
        if a.conformance:
            report["conformance"] = conformance(a.conformance, engine, model, a.conformance_lacks, a.conformance_timeout_s,
                                                log_path=os.path.join(a.out, "conformance.log"))
            log("conformance", {k: report["conformance"][k] for k in ("rc", "passed", "failed", "wall_s")})
    except Exception as e:  # record how far it got; the logs say why
        report["fatal"] = f"{type(e).__name__}: {e}"
        log("FATAL", report["fatal"])
    finally:
        procs.stop()
        report["wall_s"] = time.time() - t_start
        for name, _ in procs.procs:
            report.setdefault("log_tails", {})[name] = procs.tail(name, 3000)
        with open(os.path.join(a.out, "gpu-check.json"), "w") as f:
            json.dump(report, f, indent=1)
        with open(os.path.join(a.out, "gpu-check.md"), "w") as f:
            f.write(markdown(report))
        log("wrote", a.out)
    return 1 if "fatal" in report else 0


if __name__ == "__main__":
    sys.exit(main())
