"""Farm files and device selection: schema errors name the file, the line and the key."""

from __future__ import annotations

import os
import shutil
import textwrap
import time
from pathlib import Path

import pytest

from bmoe_ci.farm import (
    FarmConfigError,
    FarmNotUp,
    SelectionError,
    load_farm,
    load_farm_file,
    parse_version,
    select_devices,
)
from bmoe_ci.farm.lock import LockOwner
from bmoe_ci.farm.model import emulated_arch, normalize_arch, triple_arch

REPO = Path(__file__).resolve().parents[1]

GOOD = """\
version: 1
defaults:
  key: id_test
  known_hosts: known
devices:
  - name: a
    kind: desktop
    arch: x86_64
    transport: local
    workdir: wd/a
    labels: [fast]
  - name: b
    kind: phone
    os: android
    arch: arm64
    transport: ssh
    host: 127.0.0.9
    port: 2222
    workdir: ~/bmoe
    exec_prefix: [taskset, -c, 4-7]
    labels: [fast, arm]
  - name: c
    kind: phone
    arch: aarch64
    transport: local
    workdir: /tmp/c
    exec_prefix: [qemu-aarch64-static]
pools:
  mixed: [a, label:arm]
  phones: [kind:phone]
  nested: [pool:mixed, c]
"""


def write(tmp_path: Path, text: str, name: str = "farm.yaml") -> Path:
    (tmp_path / "id_test").write_text("not really a key\n")
    (tmp_path / "id_test").chmod(0o600)
    (tmp_path / "known").write_text("")
    p = tmp_path / name
    p.write_text(textwrap.dedent(text))
    return p


def issues(tmp_path: Path, text: str) -> list[str]:
    path = write(tmp_path, text)
    with pytest.raises(FarmConfigError) as ei:
        load_farm_file(path)
    return [str(i) for i in ei.value.issues]


def only(tmp_path: Path, text: str) -> str:
    got = issues(tmp_path, text)
    assert len(got) == 1, got
    return got[0]


@pytest.fixture(autouse=True)
def _cwd(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)  # messages show paths relative to the cwd: farm.yaml:LINE


def test_good_farm_resolves(tmp_path: Path) -> None:
    farm = load_farm_file(write(tmp_path, GOOD))
    assert farm.names == ["a", "b", "c"]
    a, b, c = farm.devices.values()
    assert a.workdir == str(tmp_path / "wd" / "a")  # relative to the YAML file
    assert b.arch == "aarch64" and b.link.key == str(tmp_path / "id_test")
    assert b.link.known_hosts == str(tmp_path / "known")
    assert b.workdir == "~/bmoe" and b.link.port == 2222 and b.exec_prefix == ("taskset", "-c", "4-7")
    # each transport's keys are its model's: defaults of ssh-only keys are not forced on local devices
    assert type(a.link).__name__ == "LocalKeys" and "key" not in type(a.link).model_fields
    assert type(b.link).__name__ == "SshKeys"
    assert c.emulated_arch == "aarch64" and b.emulated_arch is None
    assert farm.pools == {"mixed": ("a", "b"), "phones": ("b", "c"), "nested": ("a", "b", "c")}
    assert a.timeout_scale == 1.0 and a.connect_timeout == 10.0 and a.min_free_mb == 256
    assert b.source == "farm.yaml:12"


def test_example_farm_is_valid(tmp_path: Path) -> None:
    shutil.copy(REPO / "devices" / "farm.example.yaml", tmp_path / "lab.yaml")
    with pytest.raises(FarmConfigError) as ei:  # keys not there yet: one line per problem, not per device
        load_farm_file(tmp_path / "lab.yaml")
    assert [i.key for i in ei.value.issues] == ["defaults.key", "defaults.known_hosts"]
    (tmp_path / "keys").mkdir()
    (tmp_path / "keys" / "farm_ed25519").write_text("k")
    (tmp_path / "keys" / "farm_ed25519").chmod(0o600)
    (tmp_path / "lab_known_hosts").write_text("")
    farm = load_farm_file(tmp_path / "lab.yaml")
    assert farm.devices["galaxy-a54"].arch == "aarch64"
    assert [d.name for d in select_devices(farm, "pool:release")] == ["pixel8", "galaxy-a54", "rpi5", "ws-x86"]
    assert farm.pools["phones"] == ("pixel8", "galaxy-a54")


def test_typo_key_suggests_closest(tmp_path: Path) -> None:
    msg = only(tmp_path, GOOD.replace("    port: 2222", "    prot: 2222"))
    assert msg == "farm.yaml:18: devices[1].prot: unknown key (did you mean 'port'?)"


def test_typo_top_level_and_defaults(tmp_path: Path) -> None:
    got = issues(tmp_path, GOOD.replace("pools:", "pool:").replace("  known_hosts: known", "  known_host: known"))
    assert "farm.yaml:4: defaults.known_host: unknown key (did you mean 'known_hosts'?)" in got
    assert any(m.startswith("farm.yaml:28: pool: unknown key (did you mean 'pools'?)") for m in got), got


def test_wrong_types(tmp_path: Path) -> None:
    assert only(tmp_path, GOOD.replace("port: 2222", "port: twenty")).startswith(
        "farm.yaml:18: devices[1].port: Input should be a valid integer"
    )
    msg = only(tmp_path, GOOD.replace("kind: desktop", "kind: tablet"))
    assert msg.startswith("farm.yaml:7: devices[0].kind: Input should be 'phone' or 'desktop'"), msg
    msg = only(tmp_path, GOOD.replace("exec_prefix: [qemu-aarch64-static]", "exec_prefix: qemu-aarch64-static"))
    assert msg == "farm.yaml:27: devices[2].exec_prefix: expected a list, e.g. [a, b] (got 'qemu-aarch64-static')"
    msg = only(tmp_path, GOOD.replace("    workdir: /tmp/c\n", "    workdir: /tmp/c\n    timeout_scale: -1\n"))
    assert msg.startswith("farm.yaml:27: devices[2].timeout_scale: Input should be greater than 0"), msg


def test_missing_required_key_points_at_the_device(tmp_path: Path) -> None:
    msg = only(tmp_path, GOOD.replace("    kind: desktop\n", ""))
    assert msg == "farm.yaml:6: devices[0].kind: missing required key"


def test_unknown_pool_member_lists_devices(tmp_path: Path) -> None:
    msg = only(tmp_path, GOOD.replace("mixed: [a, label:arm]", "mixed: [a, bb]"))
    assert msg == "farm.yaml:29: pools.mixed[1]: unknown device 'bb' (did you mean 'b'?) (devices: a, b, c)"
    msg = only(tmp_path, GOOD.replace("label:arm", "label:gpu"))
    assert msg == "farm.yaml:29: pools.mixed[1]: selector 'label:gpu' matches no device"
    msg = only(tmp_path, GOOD.replace("pool:mixed", "pool:mixd"))
    assert "pools.nested[0]: unknown pool 'mixd' (did you mean 'mixed'?)" in msg


def test_empty_pool(tmp_path: Path) -> None:
    assert (
        only(tmp_path, GOOD.replace("phones: [kind:phone]", "phones: []")) == "farm.yaml:30: pools.phones: empty pool"
    )


def test_block_style_pool_lines(tmp_path: Path) -> None:
    text = GOOD.replace("  phones: [kind:phone]\n", "  phones:\n    - b\n    - zz\n")
    assert only(tmp_path, text).startswith("farm.yaml:32: pools.phones[1]: unknown device 'zz'")


def test_duplicate_device_name(tmp_path: Path) -> None:
    msg = only(tmp_path, GOOD.replace("  - name: c\n", "  - name: a\n").replace("nested: [pool:mixed, c]", "n: [a]"))
    assert msg == "farm.yaml:22: devices[2].name: duplicate device name 'a' (first defined at line 6)"


def test_duplicate_yaml_key(tmp_path: Path) -> None:
    msg = only(tmp_path, GOOD.replace("    port: 2222\n", "    port: 2222\n    port: 2223\n"))
    assert msg == "farm.yaml:19: devices[1].port: duplicate key (first given at line 18)"


def test_unreadable_key_file(tmp_path: Path) -> None:
    msg = only(tmp_path, GOOD.replace("  key: id_test", "  key: missing_key"))
    assert msg.startswith("farm.yaml:3: defaults.key: cannot read key file ")
    assert "missing_key: No such file or directory" in msg
    text = GOOD.replace("    port: 2222\n", "    port: 2222\n    known_hosts: nope/known_hosts\n")
    msg = only(tmp_path, text)
    assert msg.startswith("farm.yaml:19: devices[1].known_hosts: cannot read known_hosts file ")


@pytest.mark.skipif(os.geteuid() == 0, reason="root reads files whatever their mode")
def test_unreadable_key_permissions(tmp_path: Path) -> None:  # pragma: no cover - CI runs as root
    path = write(tmp_path, GOOD)
    (tmp_path / "id_test").chmod(0)
    with pytest.raises(FarmConfigError, match="Permission denied"):
        load_farm_file(path)


def test_ssh_rules(tmp_path: Path) -> None:
    assert (
        only(tmp_path, GOOD.replace("    host: 127.0.0.9\n", ""))
        == "farm.yaml:12: devices[1]: missing required key 'host' (transport ssh)"
    )
    msg = only(tmp_path, GOOD.replace("workdir: ~/bmoe", "workdir: bmoe"))
    assert msg.startswith("farm.yaml:19: devices[1].workdir: workdir of an ssh device must be absolute")
    msg = only(tmp_path, GOOD.replace("    workdir: wd/a\n", "    workdir: wd/a\n    host: x\n"))
    assert msg == "farm.yaml:11: devices[0].host: only meaningful for transport ssh"


def test_bad_names_and_yaml(tmp_path: Path) -> None:
    msg = only(tmp_path, GOOD.replace("name: a", "name: ../etc"))
    assert msg.startswith("farm.yaml:6: devices[0].name: invalid name ('../etc')") or "invalid name" in msg, msg
    msg = only(tmp_path, GOOD.replace("labels: [fast]", "labels: [fast"))
    assert msg.startswith("farm.yaml:") and "invalid YAML" in msg
    msg = only(tmp_path, "- just\n- a list\n")
    assert "a farm file is a mapping" in msg


def test_all_issues_reported_at_once(tmp_path: Path) -> None:
    got = issues(
        tmp_path, GOOD.replace("prot", "x").replace("port: 2222", "prot: 2222").replace("kind: desktop", "kind: laptop")
    )
    assert len(got) == 2 and got[0].startswith("farm.yaml:7:") and got[1].startswith("farm.yaml:18:")


def test_variables(tmp_path: Path) -> None:
    farm = load_farm_file(write(tmp_path, GOOD.replace("/tmp/c", "${FARM_DIR}/c")))
    assert farm.devices["c"].workdir == f"{tmp_path}/c"
    msg = only(tmp_path, GOOD.replace("/tmp/c", "${NOPE}/c"))
    assert msg.startswith("farm.yaml:26: devices[2].workdir: unknown variable ${NOPE}")


def test_unreadable_farm_file(tmp_path: Path) -> None:
    with pytest.raises(FarmConfigError, match="cannot read farm file"):
        load_farm_file(tmp_path / "absent.yaml")


def test_local_farm_not_up(tmp_path: Path) -> None:
    from bmoe_ci.paths import Places

    places = Places.from_environ({"BMOE_CI_STATE": str(tmp_path / "state")})
    with pytest.raises(FarmNotUp, match=r"run `bmoe-ci farm up`"):
        load_farm(places=places)


# ---------------------------------------------------------------------------------------------- selection


@pytest.fixture
def farm(tmp_path: Path):
    return load_farm_file(write(tmp_path, GOOD))


def names(devs) -> list[str]:
    return [d.name for d in devs]


def test_selection_syntax(farm) -> None:
    assert names(select_devices(farm, "b")) == ["b"]
    assert names(select_devices(farm, "c,a")) == ["a", "c"]  # farm order
    assert names(select_devices(farm, ["c", "a", "a"])) == ["a", "c"]  # repeatable, deduplicated
    assert names(select_devices(farm, "pool:mixed")) == ["a", "b"]
    assert names(select_devices(farm, "arch:aarch64")) == ["b", "c"]
    assert names(select_devices(farm, "arch:arm64")) == ["b", "c"]
    assert names(select_devices(farm, "label:fast")) == ["a", "b"]
    assert names(select_devices(farm, "kind:phone")) == ["b", "c"]
    assert names(select_devices(farm, "os:android")) == ["b"]
    assert names(select_devices(farm, "all")) == ["a", "b", "c"]
    assert names(select_devices(farm, ["pool:phones", "label:fast,c"])) == ["a", "b", "c"]
    assert farm.device("c").name == "c"


def test_unknown_device_lists_known(farm) -> None:
    with pytest.raises(SelectionError) as ei:
        select_devices(farm, "pixel8")
    assert str(ei.value) == "unknown device 'pixel8'; known devices: a, b, c"
    with pytest.raises(SelectionError, match=r"unknown device 'bb' \(did you mean 'b'\?\); known devices: a, b, c"):
        farm.device("bb")


def test_selection_errors(farm) -> None:
    with pytest.raises(SelectionError, match="unknown pool 'nightly'; pools: mixed, phones, nested"):
        select_devices(farm, "pool:nightly")
    with pytest.raises(
        SelectionError,
        match=r"'arch:riscv64' matches no device \(values of arch in this farm: "
        r"aarch64, x86_64\)",
    ):
        select_devices(farm, "arch:riscv64")
    with pytest.raises(SelectionError, match="'label:gpu' matches no device"):
        select_devices(farm, ["a", "label:gpu"])
    with pytest.raises(SelectionError, match="no device selected"):
        select_devices(farm, [])
    with pytest.raises(SelectionError, match="empty term"):
        select_devices(farm, "a,,b")
    with pytest.raises(SelectionError, match="unknown selector 'host:'"):
        select_devices(farm, "host:x")


# ---------------------------------------------------------------------------------------------- helpers


def test_a_private_key_others_can_read_is_refused_as_ssh_refuses_it(tmp_path: Path) -> None:
    path = write(tmp_path, GOOD)
    (tmp_path / "id_test").chmod(0o644)
    with pytest.raises(FarmConfigError) as ei:
        load_farm_file(path)
    (msg,) = [str(i) for i in ei.value.issues]
    assert "defaults.key: key file" in msg and "accessible by others (mode 0644)" in msg and "chmod 600" in msg


def test_arch_helpers() -> None:
    assert normalize_arch("ARM64") == "aarch64" and normalize_arch("amd64") == "x86_64"
    assert triple_arch("aarch64-linux-musl") == "aarch64" and triple_arch("x86_64-linux-gnu") == "x86_64"
    assert emulated_arch(["taskset", "-c", "4-7", "/usr/bin/qemu-aarch64-static"]) == "aarch64"
    assert emulated_arch(["qemu-x86_64"]) == "x86_64" and emulated_arch(["taskset"]) is None


def test_parse_version() -> None:
    v = parse_version("bmoe 0.1.0 build abc123 target aarch64-linux-musl\n")
    assert v and (v.version, v.build, v.target, v.arch) == ("0.1.0", "abc123", "aarch64-linux-musl", "aarch64")
    assert parse_version("bmoe 0.1.0\n") is None and parse_version("") is None


def test_lock_owner_staleness() -> None:
    me = LockOwner.mine("r1")
    assert me.stale_reason(ttl=60) is None  # our own live process
    old = LockOwner("elsewhere", "boot", 1, None, "r0", time.time() - 500, time.time() - 500, "t")
    # another machine: its wall clock is only a hint (a lease is broken after watching it, see
    # test_farm_lease.py), never a reason to break it at once
    assert old.stale_reason(ttl=100) is None and old.looks_stale(100) and not old.looks_stale(1000)
    assert LockOwner("e", "b", 1, None, "r", 0.0, time.time(), "t", ttl=float("nan")).bounded_ttl(60) == 60
    assert LockOwner.from_json(me.to_json()) == me
    assert LockOwner.from_json("garbage") is None


def test_infra_errors_pickle_with_their_kind() -> None:
    import pickle

    from bmoe_ci.farm import DeviceBusy, InfraError

    e = pickle.loads(pickle.dumps(InfraError("pixel8", "disconnect", "link lost")))
    assert (e.device, e.kind, e.reason, str(e)) == (
        "pixel8",
        "disconnect",
        "link lost",
        "pixel8: disconnect: link lost",
    )
    b = pickle.loads(pickle.dumps(DeviceBusy("pixel8", "run-1 (pid 7 on ci)", "2026-01-01 00:00:00 UTC")))
    assert isinstance(b, DeviceBusy) and b.kind == "busy" and "held by run-1" in str(b)


def test_unknown_arch_is_refused_at_its_line(tmp_path: Path) -> None:
    msg = only(tmp_path, GOOD.replace("    arch: aarch64\n", "    arch: mips\n"))
    assert msg.startswith("farm.yaml:24: devices[2].arch: unknown arch 'mips': the engine is built for aarch64, x86_64")
    msg = only(
        tmp_path,
        GOOD.replace("  known_hosts: known\n", "  known_hosts: known\n  arch: riscv64\n")
        .replace("    arch: x86_64\n", "")
        .replace("    arch: arm64\n", "")
        .replace("    arch: aarch64\n", ""),
    )
    assert msg.startswith("farm.yaml:5: defaults.arch: unknown arch 'riscv64'"), msg  # once, at its line


def test_new_keys_are_validated(tmp_path: Path) -> None:
    bad = GOOD.replace("    workdir: /tmp/c\n", "    workdir: /tmp/c\n    entry_timeout: 0\n")
    assert only(tmp_path, bad).startswith("farm.yaml:27: devices[2].entry_timeout: Input should be greater than 0")
    bad = GOOD.replace("    workdir: /tmp/c\n", "    workdir: /tmp/c\n    lease_ttl: 1\n")
    assert only(tmp_path, bad).startswith("farm.yaml:27: devices[2].lease_ttl: Input should be greater than or equal")
    bad = GOOD.replace("    workdir: /tmp/c\n", "    workdir: /tmp/c\n    keep_runs: 0\n")
    assert only(tmp_path, bad).startswith("farm.yaml:27: devices[2].keep_runs: Input should be greater than or equal")
    good = GOOD.replace("defaults:\n", "defaults:\n  entry_timeout: 30\n  lease_ttl: 60\n  keep_runs: 3\n")
    farm = load_farm_file(write(tmp_path, good))
    assert {(d.entry_timeout, d.lease_ttl, d.keep_runs) for d in farm.devices.values()} == {(30.0, 60.0, 3)}


def test_alias_bombs_and_huge_files_are_bounded(tmp_path: Path) -> None:
    rows = ['a: &a ["x","x","x","x","x","x","x","x","x"]']
    for prev, name in zip("abcdefgh", "bcdefghi", strict=True):
        rows.append(f"{name}: &{name} [{','.join(['*' + prev] * 9)}]")
    bomb = "\n".join(rows) + "\nversion: 1\n"  # under 1 KB, 9**9 strings once expanded
    assert len(bomb) < 1024
    start = time.monotonic()
    msg = only(tmp_path, bomb)
    assert time.monotonic() - start < 5
    assert "aliases expand to more than 100000 nodes" in msg and msg.startswith("farm.yaml:")
    assert "larger than 1048576 bytes" in only(tmp_path, "version: 1\n#" + "x" * (1 << 20) + "\n")
    anchors = GOOD.replace("    labels: [fast]\n", "    labels: &l [fast]\n").replace(
        "    workdir: /tmp/c\n", "    workdir: /tmp/c\n    labels: *l\n"
    )
    assert load_farm_file(write(tmp_path, anchors)).devices["c"].labels == ("fast",)  # ordinary aliases work


ADB_DEVICE = """\
  - name: p8
    kind: phone
    os: android
    arch: arm64
    transport: adb
    serial: 35161FDJH000GX
"""


def test_adb_rules_defaults_and_the_transport_registry(tmp_path: Path) -> None:
    farm = load_farm_file(write(tmp_path, GOOD.replace("pools:\n", ADB_DEVICE + "pools:\n")))
    p8 = farm.devices["p8"]
    # the work directory of an app-less shell on every Android; the ssh defaults are not the adb device's
    assert (p8.workdir, p8.link.serial, p8.link.adb_server) == ("/data/local/tmp/bmoe", "35161FDJH000GX", None)
    assert set(type(p8.link).model_fields) == {"serial", "adb_server"}
    assert p8.where == "adb 35161FDJH000GX" and "adb 35161FDJH000GX" in p8.describe()
    with_server = GOOD.replace(
        "pools:\n", ADB_DEVICE + "    adb_server: lab-host:5037\n    workdir: /data/x\n" + "pools:\n"
    )
    served = load_farm_file(write(tmp_path, with_server)).devices["p8"]
    assert served.where == "adb 35161FDJH000GX on server lab-host:5037"
    assert only(
        tmp_path, GOOD.replace("pools:\n", ADB_DEVICE.replace("    serial: 35161FDJH000GX\n", "") + "pools:\n")
    ) == ("farm.yaml:28: devices[3]: missing required key 'serial' (transport adb: what `adb devices` lists)")
    msg = only(tmp_path, GOOD.replace("pools:\n", ADB_DEVICE + "    adb_server: lab-host\n" + "pools:\n"))
    assert msg.startswith("farm.yaml:34: devices[3].adb_server: expected HOST:PORT of an adb server"), msg
    msg = only(tmp_path, GOOD.replace("pools:\n", ADB_DEVICE + "    workdir: bmoe\n" + "pools:\n"))
    assert msg == "farm.yaml:34: devices[3].workdir: workdir of an adb device must be absolute (got 'bmoe')"
    msg = only(tmp_path, GOOD.replace("pools:\n", ADB_DEVICE + "    host: 10.0.0.8\n" + "pools:\n"))
    assert msg == "farm.yaml:34: devices[3].host: only meaningful for transport ssh"
    msg = only(tmp_path, GOOD.replace("    workdir: wd/a\n", "    workdir: wd/a\n    serial: X\n"))
    assert msg == "farm.yaml:11: devices[0].serial: only meaningful for transport adb"
    msg = only(tmp_path, GOOD.replace("transport: local\n    workdir: wd/a", "transport: abd\n    workdir: wd/a"))
    assert msg == (
        "farm.yaml:9: devices[0].transport: unknown transport 'abd' (known: adb, local, ssh) (did you mean 'adb'?)"
    )
    msg = only(tmp_path, GOOD.replace("    workdir: wd/a\n", ""))
    assert msg == "farm.yaml:6: devices[0]: missing required key 'workdir' (transport local)"
