"""The official openai-python SDK against tokenbus; driven by integration/sdk_test.go.

Usage: python_sdk.py BASE_URL   (e.g. http://127.0.0.1:8080)
Exits non-zero with a message on the first failure.
"""
import sys

import openai
from openai import OpenAI


def check(cond, msg):
    if not cond:
        print("FAIL:", msg)
        sys.exit(1)


def main(base):
    for url in (base + "/v1", base + "/predictions/llama-8b/1.0/v1"):
        c = OpenAI(base_url=url, api_key="unused", max_retries=0, timeout=60)
        r = c.chat.completions.create(model="llama-8b", max_tokens=10,
                                      messages=[{"role": "user", "content": "Hello"}])
        check(r.choices[0].message.content and r.usage.completion_tokens == 10, f"chat: {r}")
        check(r.choices[0].message.role == "assistant", f"role: {r}")

        text, usage, ids = "", None, set()
        for ch in c.chat.completions.create(model="llama-8b", max_tokens=12, stream=True,
                                            stream_options={"include_usage": True},
                                            messages=[{"role": "user", "content": "Stream"}]):
            ids.add(ch.id)
            if ch.usage:
                usage = ch.usage
            for choice in ch.choices:
                text += choice.delta.content or ""
        check(text and usage and usage.completion_tokens == 12 and len(ids) == 1, f"chat stream: {text!r} {usage}")

        r = c.completions.create(model="llama-8b", prompt="Once upon a time", max_tokens=6)
        check(r.choices[0].text and r.usage.completion_tokens == 6, f"completion: {r}")
        text = "".join(ch.choices[0].text for ch in
                       c.completions.create(model="llama-8b", prompt="Once", max_tokens=6, stream=True) if ch.choices)
        check(text, "completion stream empty")

        models = c.models.list()
        check(any(m.id == "llama-8b" for m in models.data), f"models: {models}")

        try:
            c.chat.completions.create(model="no-such-model", messages=[{"role": "user", "content": "x"}])
            check(False, "unknown model accepted")
        except openai.NotFoundError as e:
            check("/predictions/" not in url and e.status_code == 404, f"unknown model: {e}")
        except openai.BadRequestError as e:
            # The TorchServe path names the model: a body naming another is refused.
            check("/predictions/" in url and e.code == "model_mismatch", f"unknown model: {e}")
        try:
            c.chat.completions.create(model="llama-8b", messages=[{"role": "user", "content": "x"}], n="two")
            check(False, "bad n accepted")
        except openai.BadRequestError as e:
            check(e.status_code == 400, f"bad n: {e}")
        embeddings(c)
    print("python sdk ok")


def embeddings(c):
    """embeddings.create asks for base64 unless told otherwise, and decodes it."""
    texts = ["The cat sat on the mat.", "A cat sitting on the mat", "Interest rates rose again in March"]
    r = c.embeddings.create(model="llama-8b", input=texts)  # encoding_format base64, decoded by the SDK
    f = c.embeddings.create(model="llama-8b", input=texts, encoding_format="float")
    check(len(r.data) == 3 and [d.index for d in r.data] == [0, 1, 2], f"embeddings: {r}")
    check(r.usage.prompt_tokens > 0 and r.usage.total_tokens == r.usage.prompt_tokens, f"usage: {r.usage}")
    for a, b in zip(r.data, f.data):
        check(isinstance(a.embedding, list) and len(a.embedding) == 384, f"base64 embedding: {type(a.embedding)}")
        check(all(abs(x - y) < 1e-6 for x, y in zip(a.embedding, b.embedding)), "base64 and float differ")
    dot = lambda a, b: sum(x * y for x, y in zip(a, b))
    v = [d.embedding for d in r.data]
    check(abs(dot(v[0], v[0]) - 1) < 1e-4, f"norm² {dot(v[0], v[0])}")
    check(dot(v[0], v[1]) > dot(v[0], v[2]) + 0.2, f"similar {dot(v[0], v[1])}, unrelated {dot(v[0], v[2])}")
    short = c.embeddings.create(model="llama-8b", input="hello", dimensions=16)
    check(len(short.data[0].embedding) == 16, f"dimensions: {len(short.data[0].embedding)}")
    try:
        c.embeddings.create(model="llama-8b", input="x", encoding_format="int8")
        check(False, "bad encoding_format accepted")
    except openai.BadRequestError as e:
        check(e.code == "invalid_value" and e.param == "encoding_format", f"bad encoding_format: {e}")


if __name__ == "__main__":
    main(sys.argv[1])
