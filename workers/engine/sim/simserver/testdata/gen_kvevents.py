"""Writes kv_batch.msgpack, msgspec's encoding of the batch that
TestKVBatchEncoding (kvevents_test.go) has the sim-server encode, to the
schema of vLLM's KV events (array_like=True, as vLLM up to late 2025).
Run: python3 gen_kvevents.py (needs msgspec)."""
from typing import Any, Optional, Union

import msgspec


class Batch(msgspec.Struct, array_like=True, omit_defaults=True, gc=False):
    ts: float
    events: list[Any]
    data_parallel_rank: Optional[int] = None


class Event(msgspec.Struct, array_like=True, omit_defaults=True, gc=False, tag=True):
    pass


class BlockStored(Event):
    block_hashes: list[Union[bytes, int]]
    parent_block_hash: Optional[Union[bytes, int]]
    token_ids: list[int]
    block_size: int
    lora_id: Optional[int]
    medium: Optional[str]
    lora_name: Optional[str]


class BlockRemoved(Event):
    block_hashes: list[Union[bytes, int]]
    medium: Optional[str]


def h(v):
    return v.to_bytes(8, "big")


def lora_id(name):  # the sim-server's stand-in for vLLM's lora_int_id: FNV-1a 32 >> 1 | 1
    x = 0x811C9DC5
    for c in name.encode():
        x = ((x ^ c) * 0x01000193) & 0xFFFFFFFF
    return x >> 1 | 1


batch = Batch(1700000000.25, [
    BlockRemoved([h(7), h(2**64 - 1)], "GPU"),
    BlockStored([h(1), h(2)], None, list(range(100000, 100032)), 16, None, "GPU", None),
    BlockStored([h(3)], h(2), [5] * 16, 16, lora_id("sql-lora"), "GPU", "sql-lora"),
], 0)
with open("kv_batch.msgpack", "wb") as f:
    f.write(msgspec.msgpack.encode(batch))
