"""A batch through the official openai-python SDK, unchanged: files.create,
batches.create / retrieve / list, files.content, files.delete. Driven by
integration/sdk_test.go (TestBatchSDK).

Usage: python_batch.py BASE_URL LINES
Exits non-zero with a message on the first failure; prints "sdk ok" at the end.
"""
import io
import json
import sys
import time

from openai import OpenAI


def check(cond, msg):
    if not cond:
        print("FAIL:", msg)
        sys.exit(1)


def main(base, n):
    c = OpenAI(base_url=base + "/v1", api_key="unused", max_retries=0, timeout=120)
    lines = "".join(
        json.dumps({"custom_id": f"task-{i}", "method": "POST", "url": "/v1/chat/completions",
                    "body": {"model": "llama-8b", "max_tokens": 2,
                             "messages": [{"role": "user", "content": f"question {i}"}]}}) + "\n"
        for i in range(n))
    f = c.files.create(file=("tasks.jsonl", io.BytesIO(lines.encode())), purpose="batch")
    check(f.id and f.purpose == "batch" and f.bytes == len(lines.encode()) and f.filename == "tasks.jsonl", f"file: {f}")
    check(c.files.retrieve(f.id).id == f.id, "files.retrieve")
    check(any(x.id == f.id for x in c.files.list(purpose="batch")), "files.list")

    b = c.batches.create(input_file_id=f.id, endpoint="/v1/chat/completions", completion_window="24h",
                         metadata={"job": "sdk-test"})
    check(b.status == "validating" and b.metadata == {"job": "sdk-test"}, f"created: {b}")
    start, last = time.time(), None
    while b.status not in ("completed", "failed", "expired", "cancelled"):
        check(time.time() - start < 240, f"batch still {b.status} after 240 s: {b.request_counts}")
        time.sleep(0.2)
        b = c.batches.retrieve(b.id)
        last = b.request_counts
    took = time.time() - start
    check(b.status == "completed", f"ended {b.status}: {b.errors}")
    rc = b.request_counts
    check(rc.total == n and rc.completed == n and rc.failed == 0, f"counts {rc}")
    check(b.output_file_id and b.error_file_id is None, f"files {b.output_file_id} {b.error_file_id}")
    check(any(x.id == b.id for x in c.batches.list(limit=10)), "batches.list")

    out = c.files.content(b.output_file_id).text.splitlines()
    check(len(out) == n, f"{len(out)} output lines, want {n}")
    seen = set()
    for line in out:
        r = json.loads(line)
        check(r["id"].startswith("batch_req_") and r["error"] is None, f"line {line[:200]}")
        check(r["response"]["status_code"] == 200, f"status {line[:200]}")
        check(r["response"]["body"]["object"] == "chat.completion", f"body {line[:200]}")
        check(r["custom_id"] not in seen, f"custom_id {r['custom_id']} twice")
        seen.add(r["custom_id"])
    check(seen == {f"task-{i}" for i in range(n)}, "custom_ids")

    d = c.files.delete(f.id)
    check(d.deleted and d.id == f.id, f"delete: {d}")
    print(f"sdk ok: {n} lines in {took:.1f} s ({n / took:.0f} lines/s)")


if __name__ == "__main__":
    main(sys.argv[1], int(sys.argv[2]))
