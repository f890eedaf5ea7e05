"""Transports over a real local farm (sshd on 127.0.0.2): run, put, get, push, timeouts, classification,
host key pinning, unreachable and dropped devices. Every transport test runs on the local, the ssh and the
adb transport (the real adb client and server, and the stand-in adbd of the local farm)."""

from __future__ import annotations

import os
import socket
import subprocess
import time
from pathlib import Path

import pytest

from bmoe_ci.farm import (
    Ending,
    InfraError,
    PushItem,
    load_farm_file,
    open_transport,
    push,
    sha256_file,
)
from bmoe_ci.farm.transports.remote_shell import build_remote_command
from bmoe_ci.farm.transports.ssh import SshTransport
from bmoe_ci.standins import localfarm

SSH = str(localfarm.layout()["SSH_HOST_NAME"])


@pytest.fixture(scope="module")
def farm(tmp_path_factory: pytest.TempPathFactory):
    state = tmp_path_factory.mktemp("farm-state")
    with localfarm.running(state) as path:
        yield load_farm_file(path)


@pytest.fixture(scope="module", params=["local", "ssh", "adb"])
def t(request: pytest.FixtureRequest, farm):
    tr = open_transport(farm.devices[{"local": "host", "ssh": SSH, "adb": localfarm.ADB_DEVICE}[request.param]])
    tr.connect()
    yield tr
    tr.close()


@pytest.fixture(scope="module")
def ssh_dev(farm):
    return farm.devices[SSH]


def _gone(pid: int) -> bool:
    """Dead, or a zombie nobody reaped yet (it no longer runs)."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return True
    return stat[stat.rfind(")") + 2] == "Z"


def _wait_gone(pids: list[int], within: float = 5.0) -> list[int]:
    deadline = time.monotonic() + within
    while time.monotonic() < deadline:
        alive = [p for p in pids if not _gone(p)]
        if not alive:
            return []
        time.sleep(0.05)
    return alive


# ------------------------------------------------------------------------------------------ commands


def test_every_argument_arrives_verbatim(t) -> None:
    args = [
        "a b",
        "'q'",
        '"dq"',
        "$HOME",
        "`id`",
        "$(id)",
        "; rm -rf /tmp/nothing",
        "*",
        "new\nline",
        "",
        "-n",
        "\\",
        "é",
    ]
    r = t.run(["printf", "%s\\0", *args], 10)
    assert r.ok, r.describe()
    assert r.stdout.split(b"\0")[:-1] == [a.encode() for a in args]


def test_exit_code_and_byte_streams(t) -> None:
    r = t.run(["sh", "-c", "printf 'out\\000bin\\377'; printf 'err, no newline' >&2; exit 7"], 10)
    assert (r.outcome, r.exit_code, r.signal) == (Ending.EXITED, 7, None)
    assert r.stdout == b"out\x00bin\xff" and r.stderr == b"err, no newline"
    assert not r.ok and r.duration > 0
    assert t.run(["cat"], 10, stdin=b"in\x00put").stdout == b"in\x00put"
    missing = t.run(["no-such-command-bmoe"], 10)
    assert (missing.outcome, missing.exit_code) == (Ending.EXITED, 127)


@pytest.mark.parametrize(("sig", "name"), [(11, "SIGSEGV"), (6, "SIGABRT")])
def test_signal_death_is_not_an_exit(t, sig: int, name: str) -> None:
    r = t.run(["sh", "-c", f"kill -{sig} $$"], 10)
    assert (r.outcome, r.signal, r.signal_name, r.exit_code) == (Ending.SIGNALED, sig, name, None)
    assert r.infra is None and r.describe().startswith(f"killed by {name}")


def test_timeout_kills_the_process_group(t) -> None:
    start = time.monotonic()
    r = t.run(["sh", "-c", "echo $$; sleep 60 & echo $!; wait"], 1)
    assert r.outcome is Ending.INFRA and r.infra is not None and r.infra.kind == "timeout", r.describe()
    assert time.monotonic() - start < 6
    pids = [int(p) for p in r.stdout.split()]
    assert len(pids) == 2
    assert _wait_gone(pids) == [], "the timed-out command (or its child) is still running"
    with pytest.raises(InfraError, match="timeout"):
        r.raise_for_infra()


def test_cwd_is_the_workdir_and_exec_prefix_only_for_engine(t, farm) -> None:
    assert t.run(["pwd", "-P"], 10).stdout.decode().strip() == str(Path(t.workdir).resolve())
    dev = t.device.model_copy(update={"exec_prefix": ("env", "BMOE_PREFIXED=yes")})
    with open_transport(dev) as tp:
        engine = tp.run(["sh", "-c", "echo ${BMOE_PREFIXED:-no}"], 10, engine=True)
        plain = tp.run(["sh", "-c", "echo ${BMOE_PREFIXED:-no}"], 10)
    assert engine.stdout == b"yes\n" and engine.argv[:2] == ("env", "BMOE_PREFIXED=yes")
    assert plain.stdout == b"no\n"


# ------------------------------------------------------------------------------------------ files


def test_put_get_and_traversal(t, tmp_path: Path) -> None:
    src = tmp_path / "payload.bin"
    src.write_bytes(bytes(range(256)) * 40)
    assert t.put(src, "payload.bin") == 10240
    results = tmp_path / "results"
    got = t.get("payload.bin", "dev/artifacts/copy.bin", root=results)
    assert got == (results / "dev" / "artifacts" / "copy.bin").resolve() and got.read_bytes() == src.read_bytes()
    for bad in ("../escape.bin", str(tmp_path / "elsewhere.bin"), "a/../../escape.bin"):
        with pytest.raises(ValueError, match="outside the results directory"):
            t.get("payload.bin", bad, root=results)
    (results / "link").symlink_to(tmp_path)
    with pytest.raises(ValueError, match="outside the results directory"):
        t.get("payload.bin", "link/escape.bin", root=results)
    assert not (tmp_path / "escape.bin").exists() and not (tmp_path / "elsewhere.bin").exists()
    with pytest.raises(InfraError) as ei:
        t.get("does-not-exist", "x", root=results)
    assert ei.value.kind == "transfer"


def test_push_is_content_addressed_and_warm_push_sends_nothing(t, tmp_path: Path) -> None:
    engine = tmp_path / "bmoe"
    engine.write_text("#!/bin/sh\necho 'bmoe 0.1.0 build abc target x86_64-linux-musl'\n")
    model = tmp_path / "m-00001-of-00002.gguf"
    model.write_bytes(b"GGUF" + bytes(5000) + t.device.name.encode())
    items = [PushItem(engine, executable=True), PushItem(model, name="fixtures/m-00001-of-00002.gguf")]
    first = push(t, items)
    assert first.bytes_pushed == engine.stat().st_size + model.stat().st_size and first.uploaded == 2
    second = push(t, items)
    assert second.bytes_pushed == 0 and second.uploaded == 0
    eng = first.files[0]
    assert eng.path == t.path(f"store/{eng.sha256}")
    assert t.run([eng.path], 10).stdout.startswith(b"bmoe 0.1.0")  # executable
    link = second.path_of("fixtures/m-00001-of-00002.gguf")
    assert link == t.path("fixtures/m-00001-of-00002.gguf")
    assert t.run(["cat", link], 10).stdout == model.read_bytes()
    listing = t.run(["ls", "-a", t.path("store")], 10).stdout.decode().split()
    assert not [n for n in listing if n.startswith(".tmp")]


def test_hash_mismatch_is_detected(t, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    good = tmp_path / "model.gguf"
    good.write_bytes(b"precious bytes " + t.device.name.encode() + str(time.time()).encode())
    orig = t._put

    def corrupting_put(local: Path, remote: str) -> int:
        bad = tmp_path / "corrupt"
        bad.write_bytes(b"X" + local.read_bytes()[1:])
        return orig(bad, remote)

    monkeypatch.setattr(t, "_put", corrupting_put)
    with pytest.raises(InfraError) as ei:
        push(t, [good])
    assert ei.value.kind == "push" and "hash mismatch again" in ei.value.reason and "model.gguf" in ei.value.reason
    monkeypatch.undo()
    listing = t.run(["ls", "-a", t.path("store")], 10).stdout.decode().split()
    assert not [n for n in listing if n.startswith(".tmp")]
    assert sha256_file(good) not in listing  # nothing half-verified was stored
    assert push(t, [good]).bytes_pushed == good.stat().st_size


def test_upload_corrupted_once_is_repushed_and_recorded(t, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    good = tmp_path / "once.gguf"
    good.write_bytes(b"arrives bad once " + t.device.name.encode() + str(time.time()).encode())
    orig, calls = t._put, []

    def corrupt_first(local: Path, remote: str) -> int:
        calls.append(remote)
        if len(calls) > 1:
            return orig(local, remote)
        bad = tmp_path / "corrupt"
        bad.write_bytes(b"X" + local.read_bytes()[1:])
        return orig(bad, remote)

    monkeypatch.setattr(t, "_put", corrupt_first)
    rep = push(t, [good])
    assert len(calls) == 2 and rep.verified == 1
    [m] = rep.mismatches
    assert (m.name, m.where, m.expected) == ("once.gguf", "upload", sha256_file(good)) and m.found != m.expected
    assert t.run(["cat", rep.files[0].path], 10).stdout == good.read_bytes()


def test_flipped_byte_in_the_store_is_found_and_repushed(t, tmp_path: Path) -> None:
    f = tmp_path / "stored.bin"
    f.write_bytes(b"stored content " + t.device.name.encode() + str(time.time()).encode())
    sha = sha256_file(f)
    stored = push(t, [f]).files[0].store_path
    t.run(["sh", "-c", 'chmod u+w "$1" && printf Z | dd of="$1" bs=1 seek=3 conv=notrunc 2>/dev/null', "x", stored], 10)
    again = push(t, [f])
    [m] = again.mismatches
    assert (m.where, m.expected) == ("store", sha) and m.found not in ("", sha)
    assert again.bytes_pushed == f.stat().st_size and again.verified == 1
    assert t.run(["cat", stored], 10).stdout == f.read_bytes()
    assert push(t, [f]).mismatches == []  # and intact again


def test_leftover_temporaries_are_swept_and_gc_keeps_the_last_runs(t, tmp_path: Path) -> None:
    store = t.path("store")
    t.run(["sh", "-c", 'mkdir -p "$1" && echo half > "$1/.tmp-deadbeef-0000"', "x", store], 10)
    files = []
    for i in range(3):
        f = tmp_path / f"run{i}.bin"
        f.write_bytes(f"content of run {i} {time.time()} {t.device.name}".encode())
        files.append(f)
    runs = t.path("runs-gc-test")
    rep = push(t, [files[0]], sweep=True, uses=runs + "/r0")
    assert rep.swept >= 1
    assert ".tmp-deadbeef-0000" not in t.run(["ls", "-a", store], 10).stdout.decode().split()
    for i in (1, 2):
        time.sleep(1.05)  # use lists are ordered by modification time
        push(t, [files[i]], uses=f"{runs}/r{i}")
    from bmoe_ci.farm.store import _GC

    r = t.sh(_GC, store, runs, "2")
    assert r.ok, r.stderr
    listing = t.run(["ls", store], 10).stdout.decode().split()
    assert sha256_file(files[0]) not in listing
    assert sha256_file(files[1]) in listing and sha256_file(files[2]) in listing
    assert sorted(t.run(["ls", runs], 10).stdout.decode().split()) == ["r1", "r2"]
    assert f"removed {sha256_file(files[0])} {files[0].stat().st_size}" in r.stdout.decode()


def test_an_interrupted_upload_is_retried_and_verified(
    ssh_dev, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    t = SshTransport(ssh_dev)
    t.connect()
    f = tmp_path / "big.bin"
    f.write_bytes(os.urandom(4 << 20))
    (tmp_path / "small").write_bytes(b"opens the SFTP session")
    t.put(tmp_path / "small", "small.bin")
    orig, calls = t._put, []

    def drop_first(local: Path, remote: str) -> int:
        calls.append(remote)
        if len(calls) == 1:
            t._conn.transport.close()  # the link drops under the upload: the real error path
        return orig(local, remote)

    monkeypatch.setattr(t, "_put", drop_first)
    try:
        rep = push(t, [f], sweep=True)
        assert len(calls) == 2 and rep.bytes_pushed == f.stat().st_size and rep.mismatches == []
        assert len(t.retries) == 1 and "upload of big.bin failed (disconnect" in t.retries[0]
        listing = t.run(["ls", "-a", t.path("store")], 10).stdout.decode().split()
        assert sha256_file(f) in listing and not [n for n in listing if n.startswith(".tmp-")]
    finally:
        t.close()


# ------------------------------------------------------------------------------------------ ssh security


def _keygen(path: Path) -> Path:
    subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", str(path)], check=True)
    return path


def test_changed_host_key_is_refused(ssh_dev, tmp_path: Path) -> None:
    other = _keygen(tmp_path / "impostor")
    pub = other.with_suffix(".pub").read_text().split()
    kh = tmp_path / "known_hosts"
    kh.write_text(f"[{ssh_dev.link.host}]:{ssh_dev.link.port} {pub[0]} {pub[1]}\n")
    before = kh.read_bytes()
    dev = ssh_dev.updated(known_hosts=str(kh))
    with pytest.raises(InfraError) as ei:
        SshTransport(dev).connect()
    assert ei.value.kind == "hostkey" and "HOST KEY CHANGED" in ei.value.reason
    assert kh.read_bytes() == before  # nothing was added or replaced
    r = SshTransport(dev).run(["true"], 10)  # run() reports instead of raising
    assert r.outcome is Ending.INFRA and r.infra.kind == "hostkey"


def test_unknown_host_key_is_refused(ssh_dev, tmp_path: Path) -> None:
    kh = tmp_path / "empty_known_hosts"
    kh.write_text("")
    dev = ssh_dev.updated(known_hosts=str(kh))
    with pytest.raises(InfraError) as ei:
        SshTransport(dev).connect()
    assert ei.value.kind == "hostkey" and "not in the pinned known_hosts" in ei.value.reason
    assert kh.read_text() == ""


def test_a_revoked_host_key_is_refused_and_a_bad_line_is_one_error(ssh_dev, tmp_path: Path) -> None:
    """An `@revoked` line (which paramiko cannot read: it used to stop the whole run with an INTERNALERROR)
    revokes the key even where another line pins it; a line that cannot be read names the file and line."""
    pinned = Path(ssh_dev.link.known_hosts).read_text()
    host = f"[{ssh_dev.link.host}]:{ssh_dev.link.port}"
    ours = next(ln for ln in pinned.splitlines() if ln.startswith(host)).split()
    kh = tmp_path / "known_hosts"
    kh.write_text(
        f"# the lab's keys\n{pinned}@revoked {host} {ours[1]} {ours[2]}\n@cert-authority *.lab ssh-ed25519 AAAA\n"
    )
    dev = ssh_dev.updated(known_hosts=str(kh))
    with pytest.raises(InfraError) as ei:
        SshTransport(dev).connect()
    assert ei.value.kind == "hostkey" and "is REVOKED" in ei.value.reason and f"{kh}:" in ei.value.reason
    kh.write_text(pinned + f"{host} ssh-ed25519 not-base64!!\n")
    with pytest.raises(InfraError) as ei:
        SshTransport(ssh_dev.updated(known_hosts=str(kh))).connect()
    assert ei.value.kind == "hostkey" and f"{kh}:{len(pinned.splitlines()) + 1}: unreadable" in ei.value.reason
    # a known_hosts with only comments and markers around the pinned key still connects
    kh.write_text("# keys\n\n@cert-authority *.lab ssh-ed25519 AAAA\n" + pinned)
    t = SshTransport(ssh_dev.updated(known_hosts=str(kh)))
    t.connect()
    t.close()


def test_wrong_key_is_an_auth_error(ssh_dev, tmp_path: Path) -> None:
    dev = ssh_dev.updated(key=str(_keygen(tmp_path / "stranger")))
    with pytest.raises(InfraError) as ei:
        SshTransport(dev).connect()
    assert ei.value.kind == "auth"
    assert "stranger" in ei.value.reason and "BEGIN" not in ei.value.reason  # names the file, not the secret


def test_unreachable_device(ssh_dev) -> None:
    with socket.socket() as s:
        s.bind((ssh_dev.link.host, 0))
        port = s.getsockname()[1]
    dev = ssh_dev.updated(port=port, retries=0)  # nothing listens there any more
    start = time.monotonic()
    r = SshTransport(dev).run(["true"], 10)
    assert r.outcome is Ending.INFRA and r.infra.kind == "unreachable", r.describe()
    assert time.monotonic() - start < 5
    # refused is transient: retried with backoff (1 s, 2 s), each retry noted, the error says how many
    t = SshTransport(dev.model_copy(update={"retries": 2}))
    start = time.monotonic()
    r = t.run(["true"], 10)
    took = time.monotonic() - start
    assert r.outcome is Ending.INFRA and r.infra.kind == "unreachable" and "(3 attempts)" in r.infra.reason
    assert 3 <= took < 8 and len(t.retries) == 2 and "retry 2 of 2 in 2s" in t.retries[1]


def test_silent_server_hits_the_connect_timeout(ssh_dev) -> None:
    with socket.socket() as s:  # accepts TCP, never speaks SSH
        s.bind((ssh_dev.link.host, 0))
        s.listen(1)
        dev = ssh_dev.updated(port=s.getsockname()[1], connect_timeout=1.0, retries=0)
        start = time.monotonic()
        with pytest.raises(InfraError) as ei:
            SshTransport(dev).connect()
    assert ei.value.kind == "timeout" and time.monotonic() - start < 5, ei.value.line()


def test_dropped_connection_is_infrastructure_and_recovers(ssh_dev) -> None:
    tr = SshTransport(ssh_dev)
    tr.connect()
    try:
        # the wrapper's parent is the sshd session process serving us: kill it mid-command
        kill_session = "w=$(cut -d' ' -f4 /proc/$PPID/stat); s=$(cut -d' ' -f4 /proc/$w/stat); kill -9 $s; sleep 5"
        r = tr.run(["sh", "-c", kill_session], 20)
        assert r.outcome is Ending.INFRA and r.infra.kind == "disconnect", r.describe()
        assert r.signal is None and r.exit_code is None
        again = tr.run(["echo", "back"], 10)  # the next command reconnects
        assert again.ok and again.stdout == b"back\n"
    finally:
        tr.close()


def test_remote_command_is_quoted() -> None:
    cmd = build_remote_command(["bmoe", "-p", "a'b; rm -rf ~"], 30, "/w d", "M")
    assert "'a'\"'\"'b; rm -rf ~'" in cmd and "'/w d'" in cmd and cmd.startswith("sh -c ")


def test_home_relative_workdir_is_resolved_on_the_device(ssh_dev, tmp_path: Path) -> None:
    name = f".cache/bmoe-ci-test-{os.getpid()}-{time.monotonic_ns()}"
    dev = ssh_dev.model_copy(update={"workdir": f"~/{name}"})
    src = tmp_path / "f.bin"
    src.write_bytes(b"home")
    with SshTransport(dev) as t:
        try:
            assert t.workdir == f"{Path.home()}/{name}"  # the local farm logs in as this user
            rep = push(t, [PushItem(src, name="x/f.bin")])
            assert rep.files[0].path == f"{t.workdir}/x/f.bin"
            assert t.run(["cat", "x/f.bin"], 10).stdout == b"home"
        finally:
            t.run(["rm", "-rf", t.workdir], 10)
