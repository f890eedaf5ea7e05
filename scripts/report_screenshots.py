"""The screenshots of docs/ci.md: a fault night's nightly report and the clean night after it, as a
person sees them in a browser 1280 px wide (Debian's chromium, headless).

    python scripts/report_screenshots.py docs/images

Three nights of `bmoe-ci nightly` on a farm of two local devices (fixture qwen3moe, about two minutes on
two cores): clean, then an engine built with the fault THREAD_ORDER (DET-threads and XDEV fail), then
clean again. Then four pictures in OUT_DIR: the fault night's report (nightly-fault-night.png), the
clean night after it (nightly-after-fault.png), the history page of the failing test
(nightly-test-history.png) and its evidence page on the first device (nightly-evidence.png). Each is cut
below its last line of content.
"""

from __future__ import annotations

import json
import platform
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path
from urllib.parse import unquote

CHROMIUM = (
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--no-first-run",
)
FAULT = "THREAD_ORDER"


def farm(tmp: Path) -> Path:
    arch = {"arm64": "aarch64", "amd64": "x86_64"}.get(platform.machine().lower(), platform.machine().lower())
    devices = "".join(
        f"  - name: {name}\n    kind: desktop\n    os: linux\n    arch: {arch}\n    transport: local\n"
        f"    workdir: {tmp / ('work-' + name)}\n"
        for name in ("host", "desk-b")
    )
    path = tmp / "farm.yaml"
    path.write_text(f"version: 1\ndevices:\n{devices}pools:\n  nightly: [host, desk-b]\n")
    return path


def night(history: Path, farm_file: Path, *extra: str) -> Path:
    cmd = [sys.executable, "-m", "bmoe_ci.cli", "nightly", "--farm", str(farm_file), "--history", str(history)]
    proc = subprocess.run([*cmd, "--fixture", "qwen3moe", *extra], capture_output=True, text=True, check=False)
    if proc.returncode not in (0, 1):
        sys.exit(f"bmoe-ci nightly exited {proc.returncode}:\n{proc.stderr[-3000:]}")
    return Path(proc.stdout.strip().splitlines()[-1])


def shot(page: Path, png: Path, height: int) -> None:
    with tempfile.TemporaryDirectory() as profile:
        subprocess.run(
            [
                shutil.which("chromium") or "chromium",
                *CHROMIUM,
                f"--user-data-dir={profile}",
                f"--window-size=1280,{height}",
                f"--screenshot={png}",
                page.as_uri(),
            ],
            capture_output=True,
            check=True,
            timeout=120,
        )
    crop(png)


def crop(png: Path) -> None:
    """Cut the picture 24 px below its last row that is not plain white; store it with a palette."""
    from PIL import Image

    img = Image.open(png).convert("RGB")
    width, height = img.size
    pixels = img.load()
    last = 0
    for y in range(height - 1, -1, -1):
        if any(pixels[x, y] != (255, 255, 255) for x in range(0, width - 16, 4)):  # the scroll bar aside
            last = y
            break
    # 256 colours are plenty for a page of text and flat colours, and a third of the bytes
    img.crop((0, 0, width, min(height, last + 24))).quantize(colors=256).save(png, optimize=True)


def main() -> int:
    if len(sys.argv) != 2:
        sys.exit("usage: python scripts/report_screenshots.py OUT_DIR")
    out = Path(sys.argv[1])
    out.mkdir(parents=True, exist_ok=True)
    if shutil.which("chromium") is None:
        sys.exit("needs Debian's chromium (apt-get install chromium)")
    with tempfile.TemporaryDirectory() as tmp_name:
        tmp = Path(tmp_name)
        farm_file, history = farm(tmp), tmp / "history"
        night(history, farm_file)
        fault = night(history, farm_file, "--fault", FAULT)
        after = night(history, farm_file)
        n = json.loads((fault.parent / "nightly.json").read_text())
        first = next(f for f in n["new_failures"] if f["gate"] != "XDEV")
        shot(fault, out / "nightly-fault-night.png", 2200)
        shot(after, out / "nightly-after-fault.png", 2000)
        shot(after.parent / first["history"], out / "nightly-test-history.png", 900)
        shot(fault.parent / unquote(first["evidence"]), out / "nightly-evidence.png", 900)
    for name in ("nightly-fault-night", "nightly-after-fault", "nightly-test-history", "nightly-evidence"):
        print(out / f"{name}.png")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
