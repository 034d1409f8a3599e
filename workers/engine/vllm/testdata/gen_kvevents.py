"""Writes the msgpack fixtures of kvwire_test.go with msgspec, to the schema
of vLLM's KV events (vllm/distributed/kv_events.py): the array_like form of
vLLM up to late 2025 (kv_array_*.msgpack; kv_array_v09 the first, five
fields to a BlockStored), the map form of later versions (kv_map_*.msgpack;
kv_map_latest with every field vLLM has added since: kv_cache_spec_*,
locality, ownership, session_id, and the placeholders of its offloading
connector), a batch array of map events (kv_mixed.msgpack); and the
sim-server's kv_batch.msgpack
(../../sim/simserver/testdata), the batch its TestKVBatchEncoding encodes,
in the array form with lora_name. Run here: python3 gen_kvevents.py (needs
msgspec)."""
from typing import Any, Optional, Union

import msgspec

# --- array_like=True (older vLLM) ---------------------------------------


class ABatch(msgspec.Struct, array_like=True, omit_defaults=True, gc=False):
    ts: float
    events: list[Any]
    data_parallel_rank: Optional[int] = None


class AEvent(msgspec.Struct, array_like=True, omit_defaults=True, gc=False, tag=True):
    pass


class BlockStored(AEvent):
    block_hashes: list[Union[bytes, int]]
    parent_block_hash: Optional[Union[bytes, int]]
    token_ids: list[int]
    block_size: int
    lora_id: Optional[int]
    medium: Optional[str]


class BlockStoredNamed(AEvent, tag="BlockStored"):  # the array form with lora_name, as the sim-server sends
    block_hashes: list[Union[bytes, int]]
    parent_block_hash: Optional[Union[bytes, int]]
    token_ids: list[int]
    block_size: int
    lora_id: Optional[int]
    medium: Optional[str]
    lora_name: Optional[str]


class BlockRemoved(AEvent):
    block_hashes: list[Union[bytes, int]]
    medium: Optional[str]


class AllBlocksCleared(AEvent):
    pass


class Future(AEvent):  # a tag this reader does not know
    x: int


# --- maps (later vLLM: no array_like; lora_name, extra_keys, group_idx) ---


class MBatch(msgspec.Struct, omit_defaults=True, gc=False):
    ts: float
    events: list[Any]
    data_parallel_rank: Optional[int] = None


class MEvent(msgspec.Struct, omit_defaults=True, gc=False, tag=True):
    pass


class MBlockStored(MEvent, tag="BlockStored"):
    block_hashes: list[Union[bytes, int]]
    parent_block_hash: Optional[Union[bytes, int]]
    token_ids: list[int]
    block_size: int
    lora_id: Optional[int]
    medium: Optional[str]
    lora_name: Optional[str]
    extra_keys: Optional[list[Optional[tuple[Any, ...]]]] = None
    group_idx: Optional[int] = None


class MBlockRemoved(MEvent, tag="BlockRemoved"):
    block_hashes: list[Union[bytes, int]]
    medium: Optional[str]
    group_idx: Optional[int] = None


class MAllBlocksCleared(MEvent, tag="AllBlocksCleared"):
    pass


class MFuture(MEvent, tag="Future"):
    block_hashes: str  # a field of a known name but another type


# --- vLLM 0.9: the first events, array_like, no medium -------------------


class V09Batch(msgspec.Struct, array_like=True, omit_defaults=True, gc=False):
    ts: float
    events: list[Any]


class V09BlockStored(AEvent, tag="BlockStored"):
    block_hashes: list[int]
    parent_block_hash: Optional[int]
    token_ids: list[int]
    block_size: int
    lora_id: Optional[int]


class V09BlockRemoved(AEvent, tag="BlockRemoved"):
    block_hashes: list[int]


# --- the latest fields, as maps and (should a vLLM send them so) arrays ----


def latest_structs(array_like):
    class Event(msgspec.Struct, array_like=array_like, omit_defaults=True, gc=False, tag=True):
        pass

    class Stored(Event, tag="BlockStored"):
        block_hashes: list[Union[bytes, int]]
        parent_block_hash: Optional[Union[bytes, int]]
        token_ids: list[int]
        block_size: int
        lora_id: Optional[int]
        medium: Optional[str]
        lora_name: Optional[str]
        extra_keys: Optional[list[Optional[tuple[Any, ...]]]] = None
        group_idx: Optional[int] = None
        kv_cache_spec_kind: Optional[str] = None
        kv_cache_spec_sliding_window: Optional[int] = None
        locality: Optional[str] = None
        ownership: Optional[str] = None
        session_id: Optional[str] = None

    class Removed(Event, tag="BlockRemoved"):
        block_hashes: list[Union[bytes, int]]
        medium: Optional[str]
        group_idx: Optional[int] = None
        locality: Optional[str] = None
        ownership: Optional[str] = None

    class Cleared(Event, tag="AllBlocksCleared"):
        pass

    return Stored, Removed, Cleared


LStored, LRemoved, LCleared = latest_structs(False)
LAStored, LARemoved, LACleared = latest_structs(True)

enc = msgspec.msgpack.Encoder()
toks = list(range(100, 132))  # two blocks of 16
h1, h2 = b"\x01" * 32, b"\x02" * 32
fixtures = {
    "kv_array_stored_int.msgpack": ABatch(
        1.5, [BlockStored([-7, 2**64 - 1], None, toks, 16, None, "GPU")]),
    "kv_array_stored_bytes.msgpack": ABatch(
        2.0, [BlockStored([h2], h1, toks[:16], 16, 3, None)], 0),
    "kv_array_removed_cleared.msgpack": ABatch(
        3.0, [BlockRemoved([h1, 5], "GPU"), AllBlocksCleared(), Future(9)]),
    "kv_map_stored.msgpack": MBatch(4.0, [
        MBlockStored([h1, h2], None, toks, 16, None, None, "sql-lora", [("x", 1), None], 0),
        MFuture("y"),
        MBlockRemoved([h2], None, 1),
    ], 0),
    "kv_array_v09.msgpack": V09Batch(5.0, [
        V09BlockStored([11, 12], 10, toks, 16, None),
        V09BlockRemoved([10]),
    ]),
    "kv_map_latest.msgpack": MBatch(6.0, [
        LStored([h1, h2], None, toks, 16, 7, "GPU", "sql-lora", [("sql-lora", ("mm", 0), "salt", b"\x03" * 32), None],
                0, "full_attention", None, "LOCAL", None, "req-1"),
        # the offloading connector's placeholder: a chunk's key, no tokens, block_size 0
        LStored([5], None, [], 0, None, "CPU", None, group_idx=0, locality="LOCAL"),
        LStored([], None, toks, 16, None, "GPU", None, group_idx=1,
                kv_cache_spec_kind="sliding_window", kv_cache_spec_sliding_window=128),
        LStored([6], None, toks[:16], 16, None, "STORAGE", None, group_idx=0, locality="REMOTE", ownership="tier2"),
        LRemoved([h2], "GPU", 0, "LOCAL"),
    ], 0),
    "kv_array_latest.msgpack": ABatch(7.0, [
        LAStored([h1], None, toks[:16], 16, None, "GPU", None, [("x",)], 0, "full_attention", None, "REMOTE", "t", "req-2"),
        LARemoved([h1], "GPU", 0, "LOCAL", "t"),
    ], 0),
    "kv_mixed.msgpack": ABatch(8.0, [
        LStored([h1], None, toks[:16], 16, None, "GPU", None, group_idx=0, kv_cache_spec_kind="full_attention"),
        LRemoved([h1], "GPU", 0),
        MFuture("z"),
    ], 0),
}


def h8(v):
    return v.to_bytes(8, "big")


def lora_id(name):  # the sim-server's stand-in for vLLM's lora_int_id: FNV-1a 32 >> 1 | 1
    x = 0x811C9DC5
    for c in name.encode():
        x = ((x ^ c) * 0x01000193) & 0xFFFFFFFF
    return x >> 1 | 1


fixtures["../../sim/simserver/testdata/kv_batch.msgpack"] = ABatch(1700000000.25, [
    BlockRemoved([h8(7), h8(2**64 - 1)], "GPU"),
    BlockStoredNamed([h8(1), h8(2)], None, list(range(100000, 100032)), 16, None, "GPU", None),
    BlockStoredNamed([h8(3)], h8(2), [5] * 16, 16, lora_id("sql-lora"), "GPU", "sql-lora"),
], 0)
for name, batch in fixtures.items():
    with open(name, "wb") as f:
        f.write(enc.encode(batch))
