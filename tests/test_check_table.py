"""The validate() table through the CLI: ``bmoe check <argv>`` under ASan + UBSan, every case of
src/bmoe_ci/check_table.py, exact verdict, exact message, exit code. Also keeps the C unit test's copy of
the table (engine/tests/test_config.c) identical to the Python one."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest

from bmoe_ci.check_table import C_BEGIN, C_END, CASES, ERROR, OK, Case, c_table, expected_exit, expected_stdout

REPO = Path(__file__).resolve().parents[1]
SANITIZER_MARKS = ("AddressSanitizer", "LeakSanitizer", "runtime error:", "UndefinedBehaviorSanitizer")


def run_check(binary: Path, case: Case) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [str(binary), "check", *case.argv],
        capture_output=True,
        text=True,
        timeout=60,
        env={"PATH": "/usr/bin:/bin", "LC_ALL": "C", "ASAN_OPTIONS": "detect_leaks=1"},
    )


@pytest.mark.parametrize("case", CASES, ids=[c.name for c in CASES])
def test_check_case(engine_asan_bin: Path, case: Case) -> None:
    r = run_check(engine_asan_bin, case)
    for mark in SANITIZER_MARKS:
        assert mark not in r.stderr, f"sanitizer report for {case.name}:\n{r.stderr}"
    assert r.stdout == expected_stdout(case), f"argv={list(case.argv)[:12]}"
    assert r.returncode == expected_exit(case), f"stdout={r.stdout!r} stderr={r.stderr[-500:]!r}"


def test_check_is_deterministic(engine_asan_bin: Path) -> None:
    """The same argv twice gives the same bytes (no time, address or environment in the answer)."""
    for case in CASES[::25]:
        a, b = run_check(engine_asan_bin, case), run_check(engine_asan_bin, case)
        assert (a.stdout, a.returncode) == (b.stdout, b.returncode)


# --- the table itself (no engine needed) --------------------------------------------------------


def test_table_well_formed() -> None:
    names = [c.name for c in CASES]
    assert len(names) == len(set(names))
    for c in CASES:
        assert c.verdict in (OK, ERROR), c.name
        assert (c.message is None) == (c.verdict == OK), c.name
        assert all(isinstance(a, str) for a in c.argv), c.name
        if c.message is not None:
            assert "\n" not in c.message and c.message == c.message.strip(), c.name
            # every message names the flag (or, for a stray positional, the argument)
            assert c.message.startswith(("-", "'-", "unexpected argument")), c.name


def test_table_covers_every_option() -> None:
    options = [
        "-m", "-p", "--prompt-tokens", "-n", "-t", "-c", "--n-expert-used", "--mmap", "--cache-mb",
        "--force-cache", "--io-threads", "--no-odirect", "--prefetch", "--prefetch-sync",
        "--drop-cold-experts", "--drop-in-prefill", "--drop-no-renorm", "--expert-substitute",
        "--route-trace", "--json", "--logits-out",
    ]  # fmt: skip
    used = {a.split("=", 1)[0] for c in CASES for a in c.argv if a.startswith("-")}
    missing = [o for o in options if o not in used]
    assert not missing, f"options without a case: {missing}"
    accepted = {a.split("=", 1)[0] for c in CASES if c.verdict == OK for a in c.argv if a.startswith("-")}
    assert not [o for o in options if o not in accepted], "every option has an accepted case"


def test_c_unit_test_carries_the_same_table() -> None:
    src = (REPO / "engine" / "tests" / "test_config.c").read_text()
    assert C_BEGIN in src and C_END in src, "markers missing in engine/tests/test_config.c"
    block = src[src.index(C_BEGIN) : src.index(C_END) + len(C_END)]
    assert block == c_table(), (
        "engine/tests/test_config.c and src/bmoe_ci/check_table.py differ: regenerate the block with "
        "`python -m bmoe_ci.check_table --c`"
    )
