"""LangChain's OpenAIEmbeddings against tokenbus; driven by integration/sdk_test.go.

Usage: langchain_embeddings.py BASE_URL
check_embedding_ctx_length=False: by default OpenAIEmbeddings tokenizes the
texts with tiktoken first (downloading its BPE file) to split long ones; off,
it sends the texts as they are, as it must for any non-OpenAI model.
"""
import asyncio
import sys

from langchain_openai import OpenAIEmbeddings


def check(cond, msg):
    if not cond:
        print("FAIL:", msg)
        sys.exit(1)


def main(base):
    emb = OpenAIEmbeddings(model="llama-8b", base_url=base + "/v1", api_key="unused",
                           check_embedding_ctx_length=False, max_retries=0)
    docs = ["The cat sat on the mat.", "A cat sitting on the mat", "Interest rates rose again in March"]
    vs = emb.embed_documents(docs)
    q = emb.embed_query("The cat sat on the mat.")
    check(len(vs) == 3 and all(len(v) == 384 for v in vs), f"embed_documents: {[len(v) for v in vs]}")
    dot = lambda a, b: sum(x * y for x, y in zip(a, b))
    check(abs(dot(q, vs[0]) - 1) < 1e-4, f"query and same document: {dot(q, vs[0])}")
    check(dot(vs[0], vs[1]) > dot(vs[0], vs[2]) + 0.2, "similar not closer than unrelated")
    av = asyncio.run(emb.aembed_documents(docs))
    check(all(abs(dot(a, b) - 1) < 1e-4 for a, b in zip(av, vs)), "async differs from sync")
    print("langchain ok")


if __name__ == "__main__":
    main(sys.argv[1])
