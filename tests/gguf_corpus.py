"""Raw GGUF bytes, written with `struct` so that any field can be made wrong.

The `gguf` package writes only well-formed files; the hostile-input tests need files where a length, a
count, a type or an offset lies. This module builds a GGUF image from a plain description
(`GGUFImage`: header fields, key-value pairs, tensor infos, tensor data), every field of which can be
overridden, and records where each field landed (`Built.fields`) so that tests can cut a file at every
field boundary or inside any field.

It also reads a GGUF file back into that description (`parse`), keeping each value's raw bytes, so a
real fixture can be re-emitted with one key removed or changed (`GGUFImage.without`, `.with_kv`).

Command line (for the fuzz seed corpus and for looking at the malformed corpus by hand):

    python tests/gguf_corpus.py seeds engine/fuzz/corpus
    python tests/gguf_corpus.py malformed DIR
"""

from __future__ import annotations

import dataclasses
import struct
import sys
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

# GGUF value types
U8, I8, U16, I16, U32, I32, F32, BOOL, STRING, ARRAY, U64, I64, F64 = range(13)
_SCALAR_FMT = {
    U8: "<B",
    I8: "<b",
    U16: "<H",
    I16: "<h",
    U32: "<I",
    I32: "<i",
    F32: "<f",
    BOOL: "<B",
    U64: "<Q",
    I64: "<q",
    F64: "<d",
}

# ggml tensor types: id -> (block elements, block bytes)
GGML_F32, GGML_F16, GGML_Q4_0, GGML_Q8_0, GGML_Q4_K = 0, 1, 2, 8, 12
GGML_Q4_1, GGML_Q2_K, GGML_Q5_0, GGML_Q5_K, GGML_Q6_K, GGML_BF16 = 3, 10, 6, 13, 14, 30
GGML_IQ2_XXS, GGML_TQ1_0 = 16, 34  # types the engine does not compute with
# ggml type -> (values per block, bytes per block)
GGML_BLOCKS = {
    0: (1, 4),
    1: (1, 2),
    2: (32, 18),
    3: (32, 20),
    6: (32, 22),
    8: (32, 34),
    10: (256, 84),
    12: (256, 144),
    13: (256, 176),
    14: (256, 210),
    16: (256, 66),
    30: (1, 2),
    34: (256, 54),
}

DEFAULT_ALIGNMENT = 32


def tensor_nbytes(ggml_type: int, dims: Iterable[int]) -> int:
    dims = list(dims)
    blk, bb = GGML_BLOCKS[ggml_type]
    n = 1
    for d in dims:
        n *= d
    return n // blk * bb


@dataclass
class KV:
    """One key-value pair. `value` is encoded by `vtype` (for ARRAY: a list encoded by `arr_type`).
    `raw` replaces the encoded value bytes (after the type field) verbatim; `key_len`, `str_len`,
    `arr_len` override the length fields that are written (to make them lie)."""

    key: str | bytes
    vtype: int
    value: Any = None
    arr_type: int | None = None
    raw: bytes | None = None
    key_len: int | None = None
    str_len: int | None = None
    arr_len: int | None = None


@dataclass
class Tensor:
    """A tensor info plus its data. `dims` is in ggml order (ne[0] first). `offset` (relative to the
    data section) is laid out automatically when None; `data` defaults to a deterministic pattern of the
    right size; `n_dims` overrides the count written (to make it lie)."""

    name: str | bytes
    dims: list[int]
    ggml_type: int = GGML_F32
    offset: int | None = None
    data: bytes | None = None
    n_dims: int | None = None
    name_len: int | None = None


@dataclass
class Built:
    data: bytes
    fields: list[tuple[int, int, str]]  # (start, end, label) of every field written
    data_offset: int
    tensor_offsets: list[int]  # absolute

    def boundaries(self) -> list[int]:
        """Every field start and end (sorted, unique, excluding the full length)."""
        pts = {s for s, _, _ in self.fields} | {e for _, e, _ in self.fields}
        return sorted(p for p in pts if p < len(self.data))

    def cut_points(self) -> list[tuple[int, str]]:
        """Truncation points: every field boundary and one point inside every multi-byte field."""
        out: dict[int, str] = {}
        for s, e, label in self.fields:
            out.setdefault(s, f"before {label}")
            if e - s > 1:
                out.setdefault(s + (e - s) // 2, f"inside {label}")
        return sorted((p, lbl) for p, lbl in out.items() if p < len(self.data))


@dataclass
class GGUFImage:
    kvs: list[KV] = field(default_factory=list)
    tensors: list[Tensor] = field(default_factory=list)
    magic: bytes = b"GGUF"
    version: int = 3
    n_tensors: int | None = None  # override the count written
    n_kv: int | None = None
    alignment: int = DEFAULT_ALIGNMENT  # used for layout; add a general.alignment KV to declare it
    pad_end: bool = False  # pad the file after the last tensor to the alignment
    tail: bytes = b""

    # -- editing -------------------------------------------------------------------------------
    def without(self, key: str) -> GGUFImage:
        return dataclasses.replace(self, kvs=[kv for kv in self.kvs if _s(kv.key) != key.encode()])

    def with_kv(self, kv: KV) -> GGUFImage:
        k = _s(kv.key)
        kvs = [kv if _s(x.key) == k else x for x in self.kvs]
        if not any(_s(x.key) == k for x in self.kvs):
            kvs.append(kv)
        return dataclasses.replace(self, kvs=kvs)

    # -- writing -------------------------------------------------------------------------------
    def build(self) -> Built:
        w = _W()
        w.put(self.magic, "magic")
        w.put(struct.pack("<I", self.version), "version")
        n_t = len(self.tensors) if self.n_tensors is None else self.n_tensors
        w.put(struct.pack("<Q", n_t), "tensor count")
        w.put(struct.pack("<Q", len(self.kvs) if self.n_kv is None else self.n_kv), "kv count")
        for i, kv in enumerate(self.kvs):
            _write_kv(w, i, kv)
        # tensor layout (relative offsets)
        offs: list[int] = []
        datas: list[bytes] = []
        nxt = 0
        for t in self.tensors:
            d = t.data if t.data is not None else _pattern(tensor_nbytes(t.ggml_type, t.dims))
            off = t.offset if t.offset is not None else nxt
            if t.offset is None:
                nxt = _pad(off + len(d), self.alignment)
            offs.append(off)
            datas.append(d)
        for i, (t, off) in enumerate(zip(self.tensors, offs, strict=True)):
            lbl = f"tensor {i}"
            name = _s(t.name)
            w.put(struct.pack("<Q", len(name) if t.name_len is None else t.name_len), f"{lbl} name length")
            w.put(name, f"{lbl} name")
            w.put(struct.pack("<I", len(t.dims) if t.n_dims is None else t.n_dims), f"{lbl} n_dims")
            for j, d in enumerate(t.dims):
                w.put(struct.pack("<Q", d & 0xFFFFFFFFFFFFFFFF), f"{lbl} ne[{j}]")
            w.put(struct.pack("<I", t.ggml_type), f"{lbl} type")
            w.put(struct.pack("<Q", off & 0xFFFFFFFFFFFFFFFF), f"{lbl} offset")
        data_offset = _pad(len(w.buf), self.alignment)
        if self.tensors:
            w.put(b"\0" * (data_offset - len(w.buf)), "alignment padding", record=data_offset > len(w.buf))
        abs_offs = []
        # data section: write in offset order where it fits; overlapping / out-of-range offsets are the
        # caller's lie, data is placed best-effort
        section = bytearray()
        explicit = [t.offset is not None for t in self.tensors]
        for off, d, lie in sorted(zip(offs, datas, explicit, strict=True), key=lambda x: x[0]):
            if not lie or 0 <= off < (1 << 16):  # an explicit offset far past the end is not materialised
                if len(section) < off:
                    section += b"\0" * (off - len(section))
                section[off : off + len(d)] = d
        for off in offs:
            abs_offs.append(data_offset + off)
        if section:
            w.put(bytes(section), "tensor data")
        if self.pad_end and self.tensors:
            w.put(b"\0" * (_pad(len(w.buf), self.alignment) - len(w.buf)), "end padding", record=False)
        if self.tail:
            w.put(self.tail, "tail")
        return Built(bytes(w.buf), w.fields, data_offset, abs_offs)

    def bytes(self) -> bytes:
        return self.build().data

    def write(self, path: Path) -> Path:
        path = Path(path)
        path.write_bytes(self.bytes())
        return path


class _W:
    def __init__(self) -> None:
        self.buf = bytearray()
        self.fields: list[tuple[int, int, str]] = []

    def put(self, b: bytes, label: str, record: bool = True) -> None:
        s = len(self.buf)
        self.buf += b
        if record and b:
            self.fields.append((s, len(self.buf), label))


def _s(x: str | bytes) -> bytes:
    return x if isinstance(x, bytes) else x.encode()


def _pad(x: int, a: int) -> int:
    return (x + a - 1) // a * a


def _pattern(n: int) -> bytes:
    # small finite values for every type: f32 1.0 / f16 1.0 patterns do not matter to the reader
    return bytes((i * 7 + 3) & 0x3F for i in range(n))


def _enc_scalar(vtype: int, v: Any) -> bytes:
    if vtype == BOOL:
        return struct.pack("<B", int(v))
    if vtype in (F32, F64):
        return struct.pack(_SCALAR_FMT[vtype], v)
    fmt = _SCALAR_FMT[vtype]
    size = struct.calcsize(fmt)
    return (int(v) & ((1 << (8 * size)) - 1)).to_bytes(size, "little")


def _write_kv(w: _W, i: int, kv: KV) -> None:
    lbl = f"kv {i}"
    key = _s(kv.key)
    w.put(struct.pack("<Q", len(key) if kv.key_len is None else kv.key_len), f"{lbl} key length")
    w.put(key, f"{lbl} key")
    w.put(struct.pack("<I", kv.vtype & 0xFFFFFFFF), f"{lbl} value type")
    if kv.raw is not None:
        w.put(kv.raw, f"{lbl} value")
        return
    if kv.vtype == STRING:
        s = _s(kv.value)
        w.put(struct.pack("<Q", len(s) if kv.str_len is None else kv.str_len), f"{lbl} string length")
        w.put(s, f"{lbl} string")
    elif kv.vtype == ARRAY:
        assert kv.arr_type is not None
        vals = list(kv.value)
        w.put(struct.pack("<I", kv.arr_type), f"{lbl} array type")
        w.put(struct.pack("<Q", len(vals) if kv.arr_len is None else kv.arr_len), f"{lbl} array length")
        for j, v in enumerate(vals):
            if kv.arr_type == STRING:
                s = _s(v)
                w.put(struct.pack("<Q", len(s)), f"{lbl} element {j} length")
                w.put(s, f"{lbl} element {j}")
            else:
                w.put(_enc_scalar(kv.arr_type, v), f"{lbl} element {j}")
    else:
        w.put(_enc_scalar(kv.vtype, kv.value), f"{lbl} value")


# -- reading ---------------------------------------------------------------------------------------


class ParseError(ValueError):
    pass


def parse(data: bytes) -> GGUFImage:
    """Reads a well-formed GGUF (v2/v3, little-endian) into a GGUFImage: values kept as raw bytes,
    tensors with their data, the layout alignment from general.alignment."""
    pos = 0

    def take(n: int) -> bytes:
        nonlocal pos
        if n > len(data) - pos:
            raise ParseError(f"truncated at {pos}")
        b = data[pos : pos + n]
        pos += n
        return b

    def u32() -> int:
        return struct.unpack("<I", take(4))[0]

    def u64() -> int:
        return struct.unpack("<Q", take(8))[0]

    def string() -> bytes:
        return take(u64())

    if take(4) != b"GGUF":
        raise ParseError("bad magic")
    version = u32()
    n_t, n_kv = u64(), u64()
    kvs: list[KV] = []
    alignment = DEFAULT_ALIGNMENT
    for _ in range(n_kv):
        key = string()
        vt = u32()
        start = pos
        if vt == STRING:
            string()
        elif vt == ARRAY:
            at, n = u32(), u64()
            for _ in range(n):
                if at == STRING:
                    string()
                else:
                    take(struct.calcsize(_SCALAR_FMT[at]))
        else:
            take(struct.calcsize(_SCALAR_FMT[vt]))
        raw = data[start:pos]
        if key == b"general.alignment" and vt == U32:
            alignment = struct.unpack("<I", raw)[0]
        kvs.append(KV(key.decode("utf-8", "surrogateescape"), vt, raw=raw))
    infos = []
    for _ in range(n_t):
        name = string()
        nd = u32()
        dims = [u64() for _ in range(nd)]
        gt = u32()
        off = u64()
        infos.append((name, dims, gt, off))
    data_offset = _pad(pos, alignment)
    tensors = []
    for name, dims, gt, off in infos:
        nb = tensor_nbytes(gt, dims)
        a = data_offset + off
        tensors.append(Tensor(name.decode(), dims, gt, data=data[a : a + nb]))
    return GGUFImage(kvs=kvs, tensors=tensors, version=version, alignment=alignment)


# -- ready-made images -------------------------------------------------------------------------------


def kv_str(key: str, v: str | bytes) -> KV:
    return KV(key, STRING, v)


def kv_u32(key: str, v: int) -> KV:
    return KV(key, U32, v)


def kv_arr(key: str, arr_type: int, vals: list[Any]) -> KV:
    return KV(key, ARRAY, vals, arr_type=arr_type)


def every_type_kvs() -> list[KV]:
    """One KV of every value type, arrays of several element types included."""
    return [
        kv_str("general.architecture", "test"),
        KV("t.u8", U8, 200),
        KV("t.i8", I8, -5),
        KV("t.u16", U16, 60000),
        KV("t.i16", I16, -30000),
        KV("t.u32", U32, 4000000000),
        KV("t.i32", I32, -2000000000),
        KV("t.f32", F32, 0.5),
        KV("t.bool", BOOL, True),
        KV("t.u64", U64, 1 << 40),
        KV("t.i64", I64, -(1 << 40)),
        KV("t.f64", F64, 0.25),
        kv_arr("t.arr.u8", U8, [1, 2, 3]),
        kv_arr("t.arr.i32", I32, [-1, 0, 7]),
        kv_arr("t.arr.f32", F32, [0.5, 1.5]),
        kv_arr("t.arr.bool", BOOL, [True, False]),
        kv_arr("t.arr.str", STRING, ["a", "", "ccc"]),
        kv_arr("t.arr.empty", U64, []),
    ]


def small_model(**kw: Any) -> GGUFImage:
    """A valid image: KVs of every type and one tensor of each supported type."""
    img = GGUFImage(
        kvs=[*every_type_kvs(), kv_u32("general.alignment", DEFAULT_ALIGNMENT)],
        tensors=[
            Tensor("a.weight", [4, 2], GGML_F32),
            Tensor("b.weight", [8], GGML_F16),
            Tensor("c.weight", [32, 2], GGML_Q8_0),
        ],
    )
    return dataclasses.replace(img, **kw)


def split_images(n_shards: int = 3, metadata_only_first: bool = True, tensors_per_shard: int = 2) -> list[GGUFImage]:
    """A split model in llama.cpp's layout: split.no (u16, from 0), split.count (u16),
    split.tensors.count (i32) in every shard; metadata only in the first."""
    data_shards = n_shards - 1 if metadata_only_first else n_shards
    total = data_shards * tensors_per_shard
    out = []
    k = 0
    for s in range(n_shards):
        kvs = [KV("split.no", U16, s), KV("split.count", U16, n_shards), KV("split.tensors.count", I32, total)]
        if s == 0:
            kvs = [kv_str("general.architecture", "test"), kv_u32("test.block_count", 1), *kvs]
        tensors = []
        if not (s == 0 and metadata_only_first):
            for _ in range(tensors_per_shard):
                tensors.append(Tensor(f"t{k}.weight", [8, 2], GGML_F32))
                k += 1
        out.append(GGUFImage(kvs=kvs, tensors=tensors))
    return out


def shard_path(directory: Path, stem: str, i: int, n: int) -> Path:
    """llama.cpp naming: i counts from 1."""
    return Path(directory) / f"{stem}-{i:05d}-of-{n:05d}.gguf"


def write_split(directory: Path, stem: str, images: list[GGUFImage]) -> list[Path]:
    paths = []
    for i, img in enumerate(images):
        paths.append(img.write(shard_path(directory, stem, i + 1, len(images))))
    return paths


# -- the malformed corpus --------------------------------------------------------------------------


def _set(b: bytes, at: int, new: bytes) -> bytes:
    return b[:at] + new + b[at + len(new) :]


def _field(built: Built, label: str) -> tuple[int, int]:
    for s, e, lbl in built.fields:
        if lbl == label:
            return s, e
    raise KeyError(label)


def _patch(img: GGUFImage, label: str, new: bytes) -> bytes:
    built = img.build()
    s, e = _field(built, label)
    assert len(new) == e - s, (label, e - s)
    return _set(built.data, s, new)


def malformed_cases() -> dict[str, tuple[bytes, str]]:
    """name -> (file bytes, a fragment the error message must contain)."""
    base = small_model()
    q = struct.pack
    cases: dict[str, tuple[bytes, str]] = {}

    def add(name: str, data: bytes, expect: str) -> None:
        cases[name] = (data, expect)

    def kvs(*items: KV) -> bytes:  # the small model with these KVs instead of its own
        return small_model(kvs=list(items)).bytes()

    def ts(*items: Tensor) -> bytes:  # the small model with these tensors instead of its own
        return small_model(tensors=list(items)).bytes()

    u64max = (1 << 64) - 1
    # header
    add("empty", b"", "empty")
    add("bad_magic", _set(base.bytes(), 0, b"GGML"), "not a GGUF file")
    add("text_file", b"hello, this is not a model\n" * 4, "not a GGUF file")
    add("version_1", small_model(version=1).bytes(), "version 1")
    add("version_4", small_model(version=4).bytes(), "version 4")
    add("big_endian", _patch(base, "version", q(">I", 3)), "big-endian")
    add("header_only_20", base.bytes()[:20], "truncated")
    add("n_tensors_huge", small_model(n_tensors=1 << 62).bytes(), "tensor count")
    add("n_tensors_wrap", small_model(n_tensors=u64max).bytes(), "tensor count")
    add("n_kv_huge", small_model(n_kv=1 << 61).bytes(), "kv count")
    add("n_kv_more_than_present", small_model(n_kv=len(base.kvs) + 5).bytes(), "")
    # keys and values
    add("key_len_huge", kvs(KV("general.architecture", STRING, "x", key_len=1 << 32)), "key length 4294967296 exceeds")
    add("key_len_u64max", kvs(KV("k", U8, 1, key_len=u64max)), "key length")
    add("key_empty", kvs(KV("", U8, 1)), "empty key")
    add("key_nul", kvs(KV(b"gen\0eral", U8, 1)), "NUL")
    add(
        "string_len_past_end",
        kvs(KV("general.name", STRING, "abc", str_len=1 << 32)),
        "string length 4294967296 exceeds",
    )
    add("string_len_u64max", kvs(KV("general.name", STRING, "abc", str_len=u64max)), "string length")
    add("array_len_past_end", kvs(KV("a", ARRAY, [1, 2], arr_type=U32, arr_len=1 << 40)), "array of 1099511627776 u32")
    add("array_len_wraps_alloc", kvs(KV("a", ARRAY, [1], arr_type=U64, arr_len=1 << 61)), "array of")
    add("string_array_len_huge", kvs(KV("t", ARRAY, ["a"], arr_type=STRING, arr_len=1 << 59)), "strings")
    add(
        "string_array_elem_len",
        kvs(KV("tokenizer.ggml.tokens", ARRAY, raw=q("<IQ", STRING, 2) + q("<Q", 1) + b"a" + q("<Q", 1 << 33))),
        "element 1",
    )
    add("nested_array", kvs(KV("n", ARRAY, raw=q("<IQ", ARRAY, 1) + q("<IQ", U8, 1) + b"\x01")), "nested arrays")
    add("unknown_kv_type", kvs(KV("k", 13, raw=b"\0" * 8)), "unknown value type 13")
    add("unknown_kv_type_huge", kvs(KV("k", 0xFFFFFFFF, raw=b"\0" * 8)), "unknown value type")
    add("unknown_array_type", kvs(KV("k", ARRAY, raw=q("<IQ", 99, 1) + b"\0" * 8)), "unknown array element type 99")
    add("bool_2", kvs(KV("b", BOOL, raw=b"\x02")), "bool")
    add("duplicate_key", kvs(kv_u32("x.y", 1), kv_u32("x.z", 2), kv_u32("x.y", 3)), "duplicate key")
    # general.alignment
    add("alignment_0", kvs(kv_u32("general.alignment", 0)), "general.alignment is 0")
    add("alignment_3", kvs(kv_u32("general.alignment", 3)), "not a power of two")
    add("alignment_2p31", kvs(kv_u32("general.alignment", 1 << 31)), "exceeds")
    add("alignment_u64", kvs(KV("general.alignment", U64, 32)), "expected u32")
    add("alignment_string", kvs(kv_str("general.alignment", "32")), "expected u32")
    # tensor infos
    t0 = Tensor("blk.0.attn_q.weight", [4, 2])
    add("n_dims_0", ts(Tensor("w" * 40, [], n_dims=0)), "n_dims 0")
    add("n_dims_5", ts(Tensor("w", [1, 1, 1, 1, 1])), "n_dims 5")
    add("n_dims_huge", ts(Tensor("w", [4], n_dims=0xFFFFFFFF)), "n_dims 4294967295")
    add("ne_zero", ts(Tensor("w", [4, 0])), "ne[1] = 0")
    add("ne_negative", ts(Tensor("w", [4, -5], data=b"")), "ne[1] = -5")
    add("ne_2p62", ts(Tensor("w", [1 << 62], data=b"")), "2^62")
    add("nel_overflow", ts(Tensor("w", [1 << 40, 1 << 40], data=b"")), "element count overflows")
    add("nel_overflow_4d", ts(Tensor("w", [1 << 16] * 4, data=b"")), "element count overflows")
    add("nbytes_overflow_f32", ts(Tensor("w", [1 << 31, 1 << 31], data=b"")), "byte size overflows")
    add("nbytes_past_end_f32", ts(Tensor("w", [1 << 61], data=b"")), "past end of file")
    add("q8_0_not_multiple", ts(Tensor("w", [33], GGML_Q8_0, data=b"")), "not a multiple of the q8_0 block size 32")
    add("q8_0_past_end", ts(Tensor("w", [1 << 61, 3], GGML_Q8_0, data=b"")), "past end of file")
    add("type_iq2_xxs", ts(Tensor("w", [256], GGML_IQ2_XXS)), "type 16 (iq2_xxs) is not supported")
    add("type_tq1_0", ts(Tensor("w", [256], GGML_TQ1_0)), "type 34 (tq1_0) is not supported")
    add("q4_K_not_multiple", ts(Tensor("w", [320], GGML_Q4_K, data=b"")), "not a multiple of the q4_K block size 256")
    add("q4_K_past_end", ts(Tensor("w", [256, 1 << 40], GGML_Q4_K, data=b"")), "past end of file")
    add("type_unknown", ts(Tensor("w", [4], 1000, data=b"\0" * 16)), "type 1000 (unknown)")
    add("type_u32max", ts(Tensor("w", [4], 0xFFFFFFFF, data=b"\0" * 16)), "not supported")
    add("tensor_name_empty", ts(Tensor("", [4])), "empty name")
    add("tensor_name_len_huge", ts(Tensor("w", [4], name_len=1 << 40)), "name length")
    add("tensor_name_newline", ts(Tensor("evil\nname", [4], offset=3)), "evil\\x0aname")
    add("tensor_name_too_long", ts(Tensor("x" * 70000, [4])), "exceeds the maximum 65535")
    add("duplicate_tensor", ts(Tensor("a", [4]), Tensor("b", [4]), Tensor("a", [4])), "duplicate tensor name")
    # tensor data placement
    add("offset_past_end", ts(t0, Tensor("w", [4], offset=1 << 20)), "past end of file")
    add("offset_wraps", ts(Tensor("w", [4], offset=(1 << 64) - 32)), "past end of file")
    add("offset_misaligned", ts(Tensor("w", [4], offset=4)), "not a multiple of the alignment")
    add("tensor_data_short", base.bytes()[:-1], "past end of file")
    add("tensors_overlap", ts(Tensor("a", [16], offset=0), Tensor("b", [16], offset=32)), "overlaps")
    return cases


def fuzz_seeds() -> dict[str, bytes]:
    """Small valid images covering every structure the reader knows: the fuzzer's starting points."""
    shards = split_images(3, metadata_only_first=True, tensors_per_shard=1)
    return {
        "valid_every_type.gguf": small_model().bytes(),
        "valid_align64.gguf": small_model(
            alignment=64, kvs=[kv_str("general.architecture", "a"), kv_u32("general.alignment", 64)]
        ).bytes(),
        "valid_v2.gguf": small_model(version=2, kvs=[kv_str("general.name", "v2")]).bytes(),
        "valid_no_tensors.gguf": GGUFImage(kvs=every_type_kvs()[:4]).bytes(),
        "valid_tokens.gguf": GGUFImage(
            kvs=[
                kv_str("tokenizer.ggml.model", "gpt2"),
                kv_arr("tokenizer.ggml.tokens", STRING, [bytes([i]) for i in range(32, 48)]),
                kv_arr("tokenizer.ggml.token_type", I32, [1] * 16),
            ],
            tensors=[Tensor("token_embd.weight", [32, 4], GGML_Q8_0)],
        ).bytes(),
        "split_first_metadata_only.gguf": shards[0].bytes(),
        "split_second.gguf": shards[1].bytes(),
    }


def _main(argv: list[str]) -> int:
    if len(argv) == 3 and argv[1] in ("seeds", "malformed"):
        out = Path(argv[2])
        out.mkdir(parents=True, exist_ok=True)
        if argv[1] == "seeds":
            items = fuzz_seeds().items()
        else:
            items = ((f"{k}.gguf", v[0]) for k, v in malformed_cases().items())
        total = 0
        for name, data in items:
            (out / name).write_bytes(data)
            total += len(data)
            print(f"{out / name} {len(data)}")
        print(f"total {total} bytes")
        return 0
    print(__doc__, file=sys.stderr)
    return 2


if __name__ == "__main__":
    sys.exit(_main(sys.argv))
