"""llama.cpp's vocabulary test sets: vocabulary-only GGUFs with held-out texts and the token ids the
Hugging Face tokenizers give for them.

llama.cpp ships them as ``models/ggml-vocab-NAME.gguf`` (the vocabulary), ``.gguf.inp`` (the texts,
separated by a line ``__ggml_vocab_test__``) and ``.gguf.out`` (one line of space-separated ids per
text). The project does not carry them: :func:`fetch` downloads the llama-cpp-python source
distribution that vendors llama.cpp (``pip download``, PyPI only; pip prepares its metadata, about 15 s)
into the cache once and extracts the vocabulary files only. The engine's tokenizer tests
(tests/test_tokenizers.py) compare against them.
"""

from __future__ import annotations

import fcntl
import subprocess
import sys
import tarfile
from dataclasses import dataclass
from pathlib import Path

from bmoe_ci.paths import Places

#: the source distribution whose vendored llama.cpp holds the test sets
PACKAGE = "llama-cpp-python"
VERSION = "0.3.36"
SDIST = f"llama_cpp_python-{VERSION}.tar.gz"
MODELS = f"llama_cpp_python-{VERSION}/vendor/llama.cpp/models/"
SEPARATOR = "\n__ggml_vocab_test__\n"

#: the vocabularies whose model and pre-tokenizer the engine supports (docs/tokenizers.md)
SUPPORTED = ("gpt-2", "qwen2", "qwen35", "llama-bpe", "llama-spm", "mpt", "phi-3", "gemma-4")


class VocabFetchError(RuntimeError):
    """The test sets could not be downloaded or read (one line saying what and why)."""


@dataclass(frozen=True)
class VocabCase:
    """One vocabulary's test set: the GGUF and its texts with the expected ids."""

    name: str
    gguf: Path
    texts: tuple[str, ...]
    ids: tuple[tuple[int, ...], ...]


def vocab_dir(cache: Path | None = None) -> Path:
    """Under ``cache`` (default: the bmoe-ci cache with no override: a caller that has read
    ``$BMOE_CI_CACHE`` passes ``Places.cache_dir()``)."""
    return (cache or Places().cache_dir()) / "vocabs" / VERSION


def _download(dest: Path) -> Path:
    """The sdist in dest, downloaded when missing."""
    sdist = dest / SDIST
    if sdist.is_file():
        return sdist
    dest.mkdir(parents=True, exist_ok=True)
    cmd = [
        sys.executable,
        "-m",
        "pip",
        "download",
        "--no-deps",
        "--no-binary",  # the source distribution; build dependencies may still come as wheels (seconds, not
        PACKAGE,  # a from-source build of cmake that ":all:" would ask for)
        f"{PACKAGE}=={VERSION}",
        "-d",
        str(dest),
    ]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=600, check=False)
    if proc.returncode != 0 or not sdist.is_file():
        tail = (proc.stderr or proc.stdout).strip().splitlines()[-1:] or ["no output"]
        raise VocabFetchError(f"pip download {PACKAGE}=={VERSION} failed (exit {proc.returncode}): {tail[0]}")
    return sdist


def fetch(cache: Path | None = None) -> Path:
    """The directory holding the extracted ``ggml-vocab-*`` files (downloaded and extracted once, by one
    process at a time: test workers that start together on a new cache wait for the first instead of
    downloading and extracting into the same names at once)."""
    root = vocab_dir(cache)
    out = root / "models"
    if (out / ".complete").is_file():
        return out
    root.mkdir(parents=True, exist_ok=True)
    with open(root / ".lock", "a") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        return _fetch_locked(root, out)


def _fetch_locked(root: Path, out: Path) -> Path:
    done = out / ".complete"
    if done.is_file():
        return out
    sdist = _download(root)
    out.mkdir(parents=True, exist_ok=True)
    try:
        with tarfile.open(sdist, "r:gz") as tar:
            for member in tar.getmembers():
                name = member.name
                if not (name.startswith(MODELS) and member.isfile()):
                    continue
                base = name[len(MODELS) :]
                if "/" in base or not base.startswith("ggml-vocab-"):
                    continue
                src = tar.extractfile(member)
                if src is None:
                    continue
                tmp = out / (base + ".part")
                tmp.write_bytes(src.read())
                tmp.replace(out / base)
    except (OSError, tarfile.TarError) as exc:
        raise VocabFetchError(f"cannot extract the vocabularies from {sdist}: {exc}") from exc
    done.write_text(f"{PACKAGE}=={VERSION}\n")
    return out


def parse(inp: str, out: str) -> tuple[tuple[str, ...], tuple[tuple[int, ...], ...]]:
    """Texts and expected ids of one test set (llama.cpp's test-tokenizer-0 format)."""
    texts = inp.split(SEPARATOR)
    if texts and texts[-1] == "":
        texts = texts[:-1]
    lines = out.split("\n")
    if len(lines) < len(texts):
        raise VocabFetchError(f"{len(texts)} texts but {len(lines)} lines of ids")
    ids = tuple(tuple(int(x) for x in line.split()) for line in lines[: len(texts)])
    return tuple(texts), ids


def load(name: str, cache: Path | None = None) -> VocabCase:
    d = fetch(cache)
    gguf = d / f"ggml-vocab-{name}.gguf"
    inp, out = Path(f"{gguf}.inp"), Path(f"{gguf}.out")
    if not (gguf.is_file() and inp.is_file() and out.is_file()):
        raise VocabFetchError(f"{PACKAGE} {VERSION} has no test set ggml-vocab-{name}")
    texts, ids = parse(inp.read_text(encoding="utf-8"), out.read_text(encoding="utf-8"))
    return VocabCase(name, gguf, texts, ids)


@dataclass(frozen=True)
class Tokenized:
    ids: tuple[int, ...]
    decoded: bytes


def engine_tokenize(
    engine: Path, model: Path, texts: list[str] | tuple[str, ...], work: Path, *extra: str
) -> list[Tokenized]:
    """Every text through ``bmoe tokenize --texts`` in one process (texts NUL-terminated)."""
    import json

    blob = work / "texts.bin"
    blob.write_bytes(b"".join(t.encode("utf-8") + b"\0" for t in texts))
    proc = subprocess.run(
        [str(engine), "tokenize", "-m", str(model), "--texts", str(blob), *extra],
        capture_output=True,
        timeout=300,
        check=False,
    )
    if proc.returncode != 0:
        raise RuntimeError(f"bmoe tokenize exited {proc.returncode}: {proc.stderr.decode(errors='replace').strip()}")
    rows = [json.loads(line) for line in proc.stdout.decode().splitlines()]
    if len(rows) != len(texts):
        raise RuntimeError(f"bmoe tokenize printed {len(rows)} results for {len(texts)} texts")
    return [Tokenized(tuple(r["ids"]), bytes.fromhex(r["decoded_hex"])) for r in rows]


def _main(argv: list[str]) -> int:
    """``python -m bmoe_ci.vocabs``: fetch the test sets and print where they are."""
    del argv
    try:
        print(fetch())
    except VocabFetchError as exc:
        print(f"vocabs: error: {exc}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    raise SystemExit(_main(sys.argv))
