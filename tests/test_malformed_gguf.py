"""Hostile GGUF files against the engine's command line, under AddressSanitizer + UBSan.

The CLI contract (docs/design.md, engine: result and exit codes; engine/src/gguf.h): `bmoe info -m FILE`
on a malformed or unreadable model exits 3 (4 is for I/O that fails once the model is open), and writes
exactly one stderr line starting with `bmoe: error:` that names the file. No signal, no sanitizer
report, no hang, whatever the file says.

The files come from tests/gguf_corpus.py (raw bytes written with struct, so any field can lie); the
metadata cases start from the real qwen3moe fixture and change one key.
"""

from __future__ import annotations

import os
import re
import shutil
import struct
import subprocess
import tempfile
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import pytest

import gguf_corpus as gc
from engine_make import make_engine

REPO = Path(__file__).resolve().parents[1]
ENGINE = REPO / "engine"
SANITIZER_MARKS = ("AddressSanitizer", "LeakSanitizer", "UndefinedBehaviorSanitizer", "runtime error:", "SUMMARY:")
TIMEOUT = 60


@dataclass
class Outcome:
    code: int
    stdout: str
    stderr: str

    @property
    def lines(self) -> list[str]:
        return self.stderr.splitlines()


def run_engine(binary: Path, *args: str | Path, env: dict[str, str] | None = None) -> Outcome:
    env = {**os.environ, **(env or {})}
    env.setdefault("ASAN_OPTIONS", "detect_leaks=1:abort_on_error=0")
    env.setdefault("UBSAN_OPTIONS", "print_stacktrace=1")
    r = subprocess.run([str(binary), *map(str, args)], capture_output=True, timeout=TIMEOUT, env=env)
    return Outcome(r.returncode, r.stdout.decode(errors="replace"), r.stderr.decode(errors="replace"))


def assert_rejected(out: Outcome, code: int, path: Path | str, *fragments: str) -> str:
    """Exit `code`, exactly one stderr line `bmoe: error: ...` naming `path` and containing every fragment;
    no signal, no sanitizer report. Returns the message."""
    assert out.code >= 0, f"killed by signal {-out.code}: {out.stderr[-2000:]}"
    for mark in SANITIZER_MARKS:
        assert mark not in out.stderr, f"sanitizer report:\n{out.stderr[-4000:]}"
    assert out.code == code, f"exit {out.code}, expected {code}: {out.stderr[-2000:]}"
    assert len(out.lines) == 1, f"expected one stderr line, got {len(out.lines)}: {out.stderr[-2000:]!r}"
    line = out.lines[0]
    assert line.startswith("bmoe: error: "), line
    assert str(path) in line, f"message does not name {path}: {line}"
    for frag in fragments:
        assert frag in line, f"{frag!r} not in: {line}"
    return line


def info(binary: Path, path: Path | str) -> Outcome:
    return run_engine(binary, "info", "-m", path)


# -- every malformation class of the corpus ---------------------------------------------------------

CASES = gc.malformed_cases()


@pytest.mark.parametrize("name", sorted(CASES))
def test_malformed_file(engine_asan_bin: Path, tmp_path: Path, name: str) -> None:
    data, expect = CASES[name]
    path = tmp_path / f"{name}.gguf"
    path.write_bytes(data)
    assert_rejected(info(engine_asan_bin, path), 3, path, expect)


# -- truncation at every field boundary and inside every field ---------------------------------------

BASE = gc.small_model().build()
TRUNCATION_WORDING = re.compile(r"truncated|past end of file|cannot fit|empty file")


@pytest.mark.parametrize(("cut", "where"), BASE.cut_points(), ids=[f"{c}-{w}" for c, w in BASE.cut_points()])
def test_truncated_file(engine_asan_bin: Path, tmp_path: Path, cut: int, where: str) -> None:
    path = tmp_path / "cut.gguf"
    path.write_bytes(BASE.data[:cut])
    line = assert_rejected(info(engine_asan_bin, path), 3, path)
    assert TRUNCATION_WORDING.search(line), line


def test_truncation_points_cover_every_section() -> None:
    labels = " ".join(w for _, w in BASE.cut_points())
    for section in (
        "magic",
        "version",
        "tensor count",
        "kv count",
        "key length",
        "value type",
        "string length",
        "array type",
        "array length",
        "element",
        "n_dims",
        "ne[1]",
        "type",
        "offset",
        "alignment padding",
        "tensor data",
    ):
        assert section in labels, section
    assert len(BASE.cut_points()) > 200


# -- counts that pass the size bound but are followed by garbage cost no memory -----------------------


def _bomb(kind: str) -> bytes:
    """The head of a 64 MiB file whose count claims as many entries as the size allows, one real entry,
    then a string length no file could hold."""
    size, q = 64 << 20, struct.pack
    if kind == "kv":
        head = b"GGUF" + q("<IQQ", 3, 0, (size - 24) // 14) + q("<Q", 1) + b"a" + q("<IB", gc.U8, 1)
    elif kind == "string_array":
        head = (
            b"GGUF"
            + q("<IQQ", 3, 0, 1)
            + q("<Q", 1)
            + b"t"
            + q("<I", gc.ARRAY)
            + q("<IQ", gc.STRING, (size - 60) // 8)
            + q("<Q", 0)
        )
    else:
        head = b"GGUF" + q("<IQQ", 3, (size - 24) // 33, 0) + q("<Q", 1) + b"w" + q("<IQIQ", 1, 4, 0, 0)
    return head + q("<Q", 1 << 40)


@pytest.mark.parametrize("kind", ["kv", "string_array", "tensor_info"])
def test_count_bomb_allocates_only_what_was_parsed(engine_asan_bin: Path, tmp_path: Path, kind: str) -> None:
    path = tmp_path / f"bomb_{kind}.gguf"
    with path.open("wb") as f:
        f.write(_bomb(kind))
        f.truncate(64 << 20)  # sparse
    env = {"ASAN_OPTIONS": "max_allocation_size_mb=16:allocator_may_return_null=1:detect_leaks=1"}
    out = run_engine(engine_asan_bin, "info", "-m", path, env=env)
    assert_rejected(out, 3, path, "length 1099511627776 exceeds")


# -- unreadable files: exit 3 ------------------------------------------------------------------------


def test_missing_file(engine_asan_bin: Path, tmp_path: Path) -> None:
    path = tmp_path / "nope.gguf"
    assert_rejected(info(engine_asan_bin, path), 3, path, "No such file")


def test_directory(engine_asan_bin: Path, tmp_path: Path) -> None:
    assert_rejected(info(engine_asan_bin, tmp_path), 3, tmp_path, "directory")


def test_fifo_does_not_hang(engine_asan_bin: Path, tmp_path: Path) -> None:
    path = tmp_path / "pipe.gguf"
    os.mkfifo(path)
    assert_rejected(info(engine_asan_bin, path), 3, path, "not a regular file")


def test_permission_denied(engine_asan_bin: Path, tmp_path: Path) -> None:
    if os.geteuid() != 0:
        path = gc.small_model().write(tmp_path / "locked.gguf")
        path.chmod(0)
        assert_rejected(info(engine_asan_bin, path), 3, path, "Permission denied")
        return
    # Root reads any file: run the engine as `nobody` instead (CI runs as root), from a directory
    # nobody may enter, on a file nobody may read.
    setpriv = shutil.which("setpriv")
    if setpriv is None:
        pytest.skip("running as root without setpriv (util-linux) to drop privileges")
    shared = Path(tempfile.mkdtemp(prefix="bmoe-perm-"))
    try:
        shared.chmod(0o755)
        binary = Path(shutil.copy(engine_asan_bin, shared / "bmoe-asan"))
        binary.chmod(0o755)
        path = gc.small_model().write(shared / "locked.gguf")
        path.chmod(0)
        out = run_engine(Path(setpriv), "--reuid=65534", "--regid=65534", "--clear-groups", binary, "info", "-m", path)
        assert_rejected(out, 3, path, "Permission denied")
    finally:
        shutil.rmtree(shared, ignore_errors=True)


# -- split models ---------------------------------------------------------------------------------------


def _split(tmp_path: Path, images: list[gc.GGUFImage] | None = None) -> list[Path]:
    return gc.write_split(tmp_path, "m", images or gc.split_images(4))


def test_split_corpus_is_accepted_by_the_reader(engine_asan_bin: Path, tmp_path: Path) -> None:
    # the reader accepts the shards; the loader then refuses the made-up architecture "test"
    paths = _split(tmp_path)
    assert_rejected(info(engine_asan_bin, paths[0]), 3, paths[0], "general.architecture")


def test_split_missing_shard(engine_asan_bin: Path, tmp_path: Path) -> None:
    paths = _split(tmp_path)
    paths[2].unlink()
    assert_rejected(info(engine_asan_bin, paths[0]), 3, paths[2], "shard 3 of 4", "No such file")


def test_split_given_a_later_shard(engine_asan_bin: Path, tmp_path: Path) -> None:
    paths = _split(tmp_path)
    assert_rejected(info(engine_asan_bin, paths[1]), 3, paths[1], "split.no 1", "first shard", paths[0].name)


@pytest.mark.parametrize(
    ("key", "value", "expect"),
    [
        ("split.no", 1, "split.no is 1, expected 2"),
        ("split.count", 5, "split.count is 5, expected 4"),
        ("split.tensors.count", 7, "split.tensors.count is 7, expected 6"),
        ("split.count", None, "split.count is missing"),
        ("split.no", None, "split.no is missing"),
    ],
)
def test_split_inconsistent_shard(
    engine_asan_bin: Path, tmp_path: Path, key: str, value: int | None, expect: str
) -> None:
    images = gc.split_images(4)
    third = images[2].without(key) if value is None else images[2].with_kv(gc.KV(key, gc.U16, value))
    images[2] = third
    paths = _split(tmp_path, images)
    assert_rejected(info(engine_asan_bin, paths[0]), 3, paths[2], expect)


def test_split_tensor_count_short(engine_asan_bin: Path, tmp_path: Path) -> None:
    images = gc.split_images(4)
    images[3].tensors.pop()
    paths = _split(tmp_path, images)
    assert_rejected(info(engine_asan_bin, paths[0]), 3, paths[0], "split.tensors.count is 6 but the 4 shards hold 5")


def test_split_duplicate_tensor_across_shards(engine_asan_bin: Path, tmp_path: Path) -> None:
    images = gc.split_images(4)
    images[3].tensors[0].name = images[1].tensors[0].name
    paths = _split(tmp_path, images)
    assert_rejected(info(engine_asan_bin, paths[0]), 3, paths[3], "duplicate tensor name", paths[1].name)


def test_split_truncated_shard(engine_asan_bin: Path, tmp_path: Path) -> None:
    paths = _split(tmp_path)
    paths[3].write_bytes(paths[3].read_bytes()[:-1])
    assert_rejected(info(engine_asan_bin, paths[0]), 3, paths[3], "past end of file")


def test_split_shard_not_gguf(engine_asan_bin: Path, tmp_path: Path) -> None:
    paths = _split(tmp_path)
    paths[1].write_bytes(b"not a model at all\n")
    assert_rejected(info(engine_asan_bin, paths[0]), 3, paths[1], "not a GGUF file")


def test_split_fixture_missing_and_swapped_shards(
    engine_asan_bin: Path, fixtures: dict[str, Path], tmp_path: Path
) -> None:
    first = Path(fixtures["qwen3moe-split4"])
    stem = first.name[: -len("-00001-of-00004.gguf")]
    for i in range(1, 5):
        shutil.copy(gc.shard_path(first.parent, stem, i, 4), gc.shard_path(tmp_path, stem, i, 4))
    head = gc.shard_path(tmp_path, stem, 1, 4)
    assert info(engine_asan_bin, head).code == 0
    third = gc.shard_path(tmp_path, stem, 3, 4)
    fourth = gc.shard_path(tmp_path, stem, 4, 4)
    saved = third.read_bytes()
    third.unlink()
    assert_rejected(info(engine_asan_bin, head), 3, third, "No such file")
    shutil.copy(fourth, third)  # the right count, the wrong split.no
    assert_rejected(info(engine_asan_bin, head), 3, third, "split.no is 3, expected 2")
    third.write_bytes(saved)
    assert info(engine_asan_bin, head).code == 0


# -- metadata the model loader needs (a well-formed GGUF that is not a usable model) ---------------------


def _qwen3moe(fixtures: dict[str, Path]) -> gc.GGUFImage:
    return gc.parse(Path(fixtures["qwen3moe"]).read_bytes())


def _retype(img: gc.GGUFImage, name: str, **changes: object) -> gc.GGUFImage:
    tensors = []
    for t in img.tensors:
        if t.name == name:
            t = gc.Tensor(**{**t.__dict__, **changes})
        tensors.append(t)
    return gc.GGUFImage(kvs=img.kvs, tensors=tensors, alignment=img.alignment)


def _drop_tensor(img: gc.GGUFImage, name: str) -> gc.GGUFImage:
    kept = [t for t in img.tensors if t.name != name]
    return gc.GGUFImage(kvs=img.kvs, tensors=kept, alignment=img.alignment)


def _set(key: str, vtype: int, value: object, **kw: object) -> Callable[[gc.GGUFImage], gc.GGUFImage]:
    return lambda img: img.with_kv(gc.KV(key, vtype, value, **kw))


def _unset(key: str) -> Callable[[gc.GGUFImage], gc.GGUFImage]:
    return lambda img: img.without(key)


BC = "qwen3moe.block_count"
UP0 = "blk.0.ffn_up_exps.weight"
DOWN3 = "blk.3.ffn_down_exps.weight"
METADATA_CASES: dict[str, tuple[Callable[[gc.GGUFImage], gc.GGUFImage], str]] = {
    "no_block_count": (_unset(BC), BC),
    "block_count_string": (_set(BC, gc.STRING, "4"), BC),
    "block_count_negative": (_set(BC, gc.I32, -1), BC),
    "block_count_zero": (_set(BC, gc.U32, 0), BC),
    "block_count_huge": (_set(BC, gc.U64, (1 << 64) - 1), BC),
    "block_count_past_tensors": (_set(BC, gc.U32, 5), "blk.4."),
    "expert_count_huge": (_set("qwen3moe.expert_count", gc.U32, 1 << 31), "qwen3moe.expert_count"),
    "top_k_above_experts": (_set("qwen3moe.expert_used_count", gc.U32, 9), "qwen3moe.expert_used_count"),
    "embedding_length_huge": (_set("qwen3moe.embedding_length", gc.U32, 1 << 30), "qwen3moe.embedding_length"),
    "head_count_zero": (_set("qwen3moe.attention.head_count", gc.U32, 0), "qwen3moe.attention.head_count"),
    "epsilon_nan": (_set("qwen3moe.attention.layer_norm_rms_epsilon", gc.F32, float("nan")), "layer_norm_rms_epsilon"),
    "no_architecture": (_unset("general.architecture"), "general.architecture"),
    "unknown_architecture": (_set("general.architecture", gc.STRING, "llama"), "llama"),
    "no_tokens": (_unset("tokenizer.ggml.tokens"), "tokenizer.ggml.tokens"),
    "tokens_not_strings": (_set("tokenizer.ggml.tokens", gc.ARRAY, [1, 2], arr_type=gc.U32), "tokenizer.ggml.tokens"),
    "missing_expert_tensor": (lambda img: _drop_tensor(img, DOWN3), DOWN3),
    "expert_tensor_wrong_shape": (lambda img: _retype(img, UP0, dims=[32, 256, 8]), UP0),
    "expert_tensor_iq2_xxs": (
        lambda img: _retype(img, UP0, ggml_type=gc.GGML_IQ2_XXS, dims=[256, 128, 8], data=b"\0" * (128 * 8 * 66)),
        "type 16 (iq2_xxs) is not supported",
    ),
    # a supported K-quant whose rows do not match the model's width (64 is not even one block)
    "expert_tensor_q4_K_shape": (
        lambda img: _retype(img, UP0, ggml_type=gc.GGML_Q4_K, dims=[256, 128, 8], data=b"\0" * (128 * 8 * 144)),
        UP0 + ": shape [256,128,8] but expected [64,128,8]",
    ),
}


def test_fixture_round_trips(engine_asan_bin: Path, fixtures: dict[str, Path], tmp_path: Path) -> None:
    """The control for the cases below: the fixture re-emitted by gguf_corpus is byte-identical and loads."""
    src = Path(fixtures["qwen3moe"])
    img = _qwen3moe(fixtures)
    assert img.bytes() == src.read_bytes()
    path = img.write(tmp_path / "same.gguf")
    out = info(engine_asan_bin, path)
    assert out.code == 0, out.stderr
    assert '"arch":"qwen3moe"' in out.stdout.replace(" ", "")


@pytest.mark.parametrize("name", sorted(METADATA_CASES))
def test_metadata_missing_or_wrong(engine_asan_bin: Path, fixtures: dict[str, Path], tmp_path: Path, name: str) -> None:
    change, expect = METADATA_CASES[name]
    path = change(_qwen3moe(fixtures)).write(tmp_path / f"{name}.gguf")
    assert_rejected(info(engine_asan_bin, path), 3, path, expect)


@pytest.mark.parametrize(
    ("key", "vtype", "value"),
    [
        ("tokenizer.ggml.eos_token_id", gc.U32, 100000),
        ("tokenizer.ggml.bos_token_id", gc.I32, -7),
        ("tokenizer.ggml.eot_token_id", gc.U32, 259),
        ("tokenizer.ggml.fim_pad_token_id", gc.U32, 1 << 31),
    ],
)
def test_token_ids_beyond_the_vocabulary(
    engine_asan_bin: Path, fixtures: dict[str, Path], tmp_path: Path, key: str, vtype: int, value: int
) -> None:
    path = _qwen3moe(fixtures).with_kv(gc.KV(key, vtype, value)).write(tmp_path / "tok.gguf")
    out = run_engine(engine_asan_bin, "run", "--mmap", "-m", path, "--prompt-tokens", "1", "-n", "1")
    assert_rejected(out, 3, path, key)


# -- the fuzz driver, briefly ---------------------------------------------------------------------------


def test_fuzz_smoke(tmp_path: Path) -> None:
    """The gcc-built fuzz target (ASan + UBSan) runs a bounded deterministic mutation loop over the
    committed seeds: a few seconds, exit 0, no finding."""
    make_engine("build/fuzz_gguf_smoke")
    corpus = ENGINE / "fuzz" / "corpus"
    assert sorted(p.name for p in corpus.iterdir()) == sorted(gc.fuzz_seeds()), "seed corpus out of date"
    for name, data in gc.fuzz_seeds().items():
        assert (corpus / name).read_bytes() == data, f"{name} differs from gguf_corpus.fuzz_seeds()"
    out = run_engine(ENGINE / "build" / "fuzz_gguf_smoke", "--iterations", "100000", "--seed", "7", corpus)
    assert out.code == 0, out.stderr[-4000:]
    for mark in SANITIZER_MARKS:
        assert mark not in out.stderr, out.stderr[-4000:]
    assert "0 findings" in out.stdout, out.stdout
    m = re.search(r"(\d+) parsed, (\d+) rejected", out.stdout)
    assert m and int(m.group(1)) > 0 and int(m.group(2)) > 0, out.stdout


# -- K-quant data: truncated super-blocks and non-finite scales -------------------------------------------
# A K-quant block carries f16 scales; a NaN or infinite one does not crash anything, it silently turns the
# logits into NaN. The engine refuses it (exit 3, one line naming tensor, expert and block): dense tensors
# when the model opens, experts the first time each is used when streamed, at open when resident (--mmap).

F16_NAN, F16_INF = b"\x00\x7e", b"\x00\x7c"
Q4K_BLOCK, Q5K_BLOCK, Q6K_BLOCK, Q8_0_BLOCK = 144, 176, 210, 34


def _q4k(fixtures: dict[str, Path]) -> gc.GGUFImage:
    return gc.parse(Path(fixtures["qwen3moe-q4k"]).read_bytes())


def _poke(
    img: gc.GGUFImage, name: str, block_bytes: int, offset: int, value: bytes, every: int | None = None
) -> gc.GGUFImage:
    """Writes `value` at `offset` of block 1 of tensor `name` (of block 1 of each slice of `every` bytes)."""
    tensors = []
    for t in img.tensors:
        if t.name == name:
            assert t.data is not None
            data = bytearray(t.data)
            starts = range(0, len(data), every) if every else [0]
            for s in starts:
                at = s + block_bytes + offset
                data[at : at + len(value)] = value
            t = gc.Tensor(**{**t.__dict__, "data": bytes(data)})
        tensors.append(t)
    return gc.GGUFImage(kvs=img.kvs, tensors=tensors, alignment=img.alignment)


def _tensor(img: gc.GGUFImage, name: str) -> gc.Tensor:
    return next(t for t in img.tensors if t.name == name)


def test_kquant_fixture_runs(engine_asan_bin: Path, fixtures: dict[str, Path], tmp_path: Path) -> None:
    """The control: the Q4_K_M fixture (llama.cpp's mix) re-emitted unchanged runs in both expert modes."""
    path = _q4k(fixtures).write(tmp_path / "same.gguf")
    for mode in (["--mmap"], ["--cache-mb", "0"]):
        out = run_engine(engine_asan_bin, "run", *mode, "-m", path, "-p", "hello", "-n", "2")
        assert out.code == 0, out.stderr[-2000:]


@pytest.mark.parametrize(
    ("name", "block", "offset", "value", "field"),
    [
        ("blk.0.attn_q.weight", Q4K_BLOCK, 0, F16_NAN, "non-finite d"),  # Q4_K d
        ("blk.1.attn_q.weight", Q4K_BLOCK, 2, F16_INF, "non-finite dmin"),  # Q4_K dmin
        ("blk.1.attn_output.weight", Q5K_BLOCK, 2, F16_INF, "non-finite dmin"),  # Q5_K (eight experts) dmin
        ("blk.2.attn_k.weight", Q8_0_BLOCK, 0, F16_NAN, "non-finite d"),  # Q8_0 (eight experts) d
        ("output.weight", Q6K_BLOCK, 208, F16_NAN, "non-finite d"),  # Q6_K keeps d last
    ],
)
def test_kquant_dense_bad_scale(
    engine_asan_bin: Path,
    fixtures: dict[str, Path],
    tmp_path: Path,
    name: str,
    block: int,
    offset: int,
    value: bytes,
    field: str,
) -> None:
    img = _q4k(fixtures)
    path = _poke(img, name, block, offset, value).write(tmp_path / "bad.gguf")
    for mode in (["--mmap"], ["--cache-mb", "0"]):
        out = run_engine(engine_asan_bin, "run", *mode, "-m", path, "-p", "hello", "-n", "2", "--json")
        assert_rejected(out, 3, path, name, "block 1", field)
        assert '"kind":"model"' in out.stdout.replace(" ", ""), out.stdout


@pytest.mark.parametrize(
    ("name", "ggml_type", "block", "offset", "field"),
    [
        ("blk.1.ffn_down_exps.weight", gc.GGML_Q4_K, Q4K_BLOCK, 2, "non-finite dmin"),  # a Q4_K layer
        ("blk.2.ffn_down_exps.weight", gc.GGML_Q6_K, Q6K_BLOCK, 208, "non-finite d"),  # a Q6_K layer of the mix
    ],
)
@pytest.mark.parametrize("mode", [["--mmap"], ["--cache-mb", "0"], ["--cache-mb", "2", "--force-cache"]])
def test_kquant_expert_bad_scale(
    engine_asan_bin: Path,
    fixtures: dict[str, Path],
    tmp_path: Path,
    mode: list[str],
    name: str,
    ggml_type: int,
    block: int,
    offset: int,
    field: str,
) -> None:
    """Every expert of one layer's down projection has a NaN scale in its block 1: whichever is routed
    first stops the run, in the resident and the streamed modes (the mix gives layer 1's Q4_K, layer
    2's Q6_K)."""
    img = _q4k(fixtures)
    t = _tensor(img, name)
    n_expert = t.dims[2]
    assert t.data is not None and t.ggml_type == ggml_type
    path = _poke(img, name, block, offset, F16_NAN, every=len(t.data) // n_expert).write(tmp_path / "bad.gguf")
    out = run_engine(engine_asan_bin, "run", *mode, "-m", path, "-p", "hello", "-n", "2")
    msg = assert_rejected(out, 3, path, name, "block 1", field)
    assert re.search(r": expert \d+: ", msg), msg


def test_kquant_truncated_superblock(engine_asan_bin: Path, fixtures: dict[str, Path], tmp_path: Path) -> None:
    """A file cut in the middle of its last super-block (tensor data past the end of the file)."""
    data = _q4k(fixtures).bytes()
    path = tmp_path / "cut.gguf"
    path.write_bytes(data[: len(data) - Q4K_BLOCK // 2])
    assert_rejected(info(engine_asan_bin, path), 3, path, "past end of file")
