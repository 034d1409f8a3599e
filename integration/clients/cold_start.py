"""The official openai-python SDK, with its default timeouts and retries,
through a cold start: driven by integration/capacity_test.go, which starts
the first worker about 10 s after these requests arrive.

Usage: cold_start.py BASE_URL MODEL
Prints "python cold start ok" when a streamed and a plain chat completion
both succeed.
"""
import sys
import time
from concurrent.futures import ThreadPoolExecutor

from openai import OpenAI


def main(base, model):
    c = OpenAI(base_url=base + "/v1", api_key="unused")  # the SDK's defaults: 600 s timeout, 2 retries
    start = time.monotonic()

    def plain():
        r = c.chat.completions.create(model=model, max_tokens=8, messages=[{"role": "user", "content": "Hello"}])
        assert r.choices[0].message.content and r.usage.completion_tokens == 8, r
        return time.monotonic() - start

    def streamed():
        text = ""
        for ch in c.chat.completions.create(model=model, max_tokens=8, stream=True,
                                            messages=[{"role": "user", "content": "Stream"}]):
            for choice in ch.choices:
                text += choice.delta.content or ""
        assert text, "empty stream"
        return time.monotonic() - start

    with ThreadPoolExecutor(2) as ex:
        a, b = ex.submit(plain), ex.submit(streamed)
        took = (a.result(), b.result())
    print(f"python cold start ok: plain {took[0]:.1f}s, stream {took[1]:.1f}s")


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2])
