"""The release gate's files and rules without devices: the shipped settings pass the engine's validate(),
malformed or invalid settings, policies and proposals give one clear error naming file, line and key,
and the pieces the verdict is built from (diff, decision, the A/B's statistics and drift rule) behave."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import pytest

from bmoe_ci.ab.devstate import DriftBounds, drift, parse_state
from bmoe_ci.ab.run import AbSpec, cell_order, summarise
from bmoe_ci.ab.stats import ratio_ci
from bmoe_ci.cli import main
from bmoe_ci.farm import Device
from bmoe_ci.release.policy import load_policy, parse_policy
from bmoe_ci.release.report import write_release
from bmoe_ci.release.settings import SETTINGS, diff, flags, load_settings, parse_settings
from bmoe_ci.release.verdict import FAIL, MISSING, PASS, Check, decide
from bmoe_ci.release.yamlfile import ReleaseConfigError

REPO = Path(__file__).resolve().parents[1]
DEFAULTS = REPO / "ci" / "app-defaults.yaml"
POLICY = REPO / "ci" / "release-policy.yaml"
GOOD = "version: 1\nsettings:\n  cache_mb: 2048\n  drop_cold_experts: 0.75\n  expert_substitute: null\n  prefetch: 1\n"


def test_shipped_defaults_pass_the_engines_validate(engine_bin: Path) -> None:
    loaded = load_settings(DEFAULTS)  # runs `bmoe check` itself
    assert loaded.settings.drop_cold_experts == 0.75 and loaded.settings.expert_substitute is None
    proc = subprocess.run([str(engine_bin), "check", *flags(loaded.settings)], capture_output=True, text=True)
    assert (proc.returncode, proc.stdout.strip()) == (0, "ok")
    policy = load_policy(POLICY)
    assert set(policy.model.settings) == set(SETTINGS)


SETTINGS_CASES = [
    # (what a user might write, the expected "line: key: message" fragment)
    (GOOD.replace("0.75", "1.5"), "p.yaml:4: settings.drop_cold_experts: Input should be less than or equal to 1"),
    (GOOD.replace("0.75", "'0.75'"), "p.yaml:4: settings.drop_cold_experts: expected a number"),
    (GOOD.replace("0.75", "75%"), "p.yaml:4: settings.drop_cold_experts: expected a number"),
    (GOOD.replace("null", "off"), "p.yaml:5: settings.expert_substitute: expected a number, e.g. 0.75 (got False)"),
    (
        GOOD.replace("drop_cold_experts", "drop_cold_expert"),
        "p.yaml:4: settings.drop_cold_expert: unknown key (did you mean 'drop_cold_experts'?)",
    ),
    (
        GOOD.replace("2048", "0").replace("prefetch: 1", "prefetch: 0"),
        "p.yaml:4: settings.drop_cold_experts: the engine's validate() refuses these "
        "settings: --drop-cold-experts: needs the expert cache",
    ),
    (
        GOOD.replace("2048", "100"),
        "p.yaml:3: settings.cache_mb: the engine's validate() refuses these settings: "
        "--cache-mb: 100 MiB is in the band",
    ),
    (GOOD.replace("prefetch: 1", "prefetch: 65"), "p.yaml:6: settings.prefetch: Input should be less than or equal"),
    (GOOD + "  prefetch: 2\n", "p.yaml:7: settings.prefetch: duplicate key (first given at line 6)"),
    (GOOD.replace("  prefetch: 1\n", ""), "p.yaml:2: settings.prefetch: missing required key"),
    (GOOD.replace("2048", "2048.5"), "p.yaml:3: settings.cache_mb: Input should be a valid integer"),
    (GOOD.replace("version: 1", "version: 2"), "p.yaml:1: version: Input should be 1"),
    (
        "cache_mb: 2048\ndrop_cold_experts: 1.0\n",
        "p.yaml:1: cache_mb: a setting at the top level: put the settings under 'settings:'",
    ),
    ("", "p.yaml:1: the file is empty"),
    ("- cache_mb: 2048\n", "p.yaml:1: a settings file is a mapping of keys (got a list)"),
    (GOOD.replace("  prefetch: 1", " prefetch: 1"), "p.yaml:6: invalid YAML"),
    (  # an alias bomb is refused before it expands
        'a: &a ["x","x","x","x","x","x","x","x","x","x"]\n'
        + "".join(f"{c}: &{c} [{', '.join(['*' + p] * 10)}]\n" for p, c in zip("abcdef", "bcdefg", strict=True)),
        "p.yaml:1: invalid YAML: aliases expand to more than 100000 nodes",
    ),
]


@pytest.mark.parametrize("text,expected", SETTINGS_CASES, ids=[str(i) for i in range(len(SETTINGS_CASES))])
def test_bad_settings_get_one_located_error(text: str, expected: str) -> None:
    with pytest.raises(ReleaseConfigError) as info:
        parse_settings(text, "p.yaml")
    assert len(info.value.issues) == 1, str(info.value)
    assert str(info.value).startswith(expected), str(info.value)


POLICY_TEXT = POLICY.read_text()
POLICY_CASES = [
    (
        ("min_ratio: 1.0, confidence: 0.9}\n    quality", "min_ratio: 1.0, confidence: 90}\n    quality"),
        "settings.drop_cold_experts.speed.confidence: Input should be less than 1",
    ),
    (
        ("[desktop-x86_64, phone-aarch64]", "[desktop-x86_64, phone-arm64]"),
        "settings.drop_cold_experts.classes[1]: unknown device class 'phone-arm64' (did you mean 'phone-aarch64'?)",
    ),
    (("G8a, G8b", "G8a, G9"), "settings.drop_cold_experts.gates[3]: unknown gate 'G9'"),
    (("arch: aarch64}", "arch: mips}"), "device_classes.phone-aarch64.arch: unknown arch 'mips'"),
    (
        ("max_ppl_increase: 0.05, min_agreement: 0.85, max_accuracy_drop: 0.05", "max_ppl_rise: 0.05"),
        "settings.drop_cold_experts.quality.max_ppl_rise: unknown key (did you mean 'max_ppl_increase'?)",
    ),
    (("freshness_hours: 72", "freshness_hours: -1"), "freshness_hours: Input should be greater than 0"),
    (("    replay: true\n", "    replay: yes please\n"), "settings.drop_cold_experts.replay: Input should be a valid"),
    (
        ("{min_ratio: 1.0, confidence: 0.9}", "{min_ratio: fast}"),
        "settings.drop_cold_experts.speed.min_ratio: expected a number",
    ),
]


@pytest.mark.parametrize("edit,expected", POLICY_CASES, ids=[str(i) for i in range(len(POLICY_CASES))])
def test_bad_policies_get_one_located_error(edit: tuple[str, str], expected: str) -> None:
    text = POLICY_TEXT.replace(*edit, 1)
    assert text != POLICY_TEXT
    line = next(i for i, t in enumerate(text.splitlines(), 1) if edit[1].splitlines()[0] in t)
    with pytest.raises(ReleaseConfigError) as info:
        parse_policy(text, "pol.yaml")
    assert len(info.value.issues) == 1, str(info.value)
    assert str(info.value).startswith(f"pol.yaml:{line}: {expected}"), str(info.value)


def test_a_policy_must_cover_every_setting_and_only_known_ones() -> None:
    text = POLICY_TEXT.replace("  prefetch:\n", "  prefech:\n", 1)
    with pytest.raises(ReleaseConfigError) as info:
        parse_policy(text, "pol.yaml")
    msg = str(info.value)
    assert "settings.prefetch: missing: every setting of the app needs a requirement" in msg
    assert "settings.prefech: unknown setting (did you mean 'prefetch'?)" in msg


def test_release_gate_refuses_a_bad_proposal_with_exit_2(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    bad = tmp_path / "proposal.yaml"
    bad.write_text(GOOD.replace("0.75", "1.5"))
    assert main(["release-gate", "--proposed", str(bad)]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert (
        len(err) == 1
        and "proposal.yaml:4: settings.drop_cold_experts: Input should be less than or equal to 1" in err[0]
    )
    assert main(["release-gate", "--proposed", str(tmp_path / "missing.yaml")]) == 2
    assert "missing.yaml: cannot read settings file" in capsys.readouterr().err
    good = tmp_path / "good.yaml"
    good.write_text(GOOD)
    assert main(["release-gate", "--proposed", str(good), "--base", "no-such-ref"]) == 2
    assert "--base no-such-ref: cannot read ci/app-defaults.yaml" in capsys.readouterr().err


def test_diff_compares_values_not_spellings() -> None:
    a = parse_settings(GOOD, "a", check=False).settings
    assert diff(a, parse_settings(GOOD.replace("0.75", "7.5e-1"), "b", check=False).settings) == []
    (change,) = diff(a, parse_settings(GOOD.replace("null", "0.0"), "b", check=False).settings)
    assert (change.setting, change.base, change.proposed, str(change)) == (
        "expert_substitute",
        None,
        0.0,
        "expert_substitute: off -> 0.0",
    )


def test_the_verdict_rules() -> None:
    ok, bad, gone = (Check("s", "speed", "c", st) for st in (PASS, FAIL, MISSING))
    assert decide([], False) == ("GO", "no setting changed")
    assert decide([ok], True)[0] == "GO"
    assert decide([ok, gone], True)[0] == "NO VERDICT"
    assert decide([ok, gone, bad], True)[0] == "NO-GO"  # a failed requirement decides even with gaps


def test_bootstrap_interval_is_reproducible_and_can_exclude_one() -> None:
    a, b = [100.0, 104.0, 98.0, 101.0], [201.0, 199.0, 205.0, 196.0]
    first, again = ratio_ci(a, b), ratio_ci(a, b)
    assert first == again and 1.9 < first.low <= first.ratio <= first.high < 2.1
    same = ratio_ci(a, a)
    assert same.low < 1.0 < same.high
    with pytest.raises(ValueError):
        ratio_ci([], b)


SYS = (
    "/sys/devices/system/cpu/cpu0/cpufreq/scaling_cur_freq\t1800000\n"
    "/sys/devices/system/cpu/cpu0/cpufreq/scaling_max_freq\t2400000\n"
    "/sys/devices/system/cpu/cpu0/cpufreq/scaling_governor\tschedutil\n"
    "/sys/class/thermal/thermal_zone0/temp\t{temp}\n/sys/class/thermal/thermal_zone0/type\tcpu-big\n"
    "/proc/loadavg\t0.50 0.40 0.30 1/100 42\nncpu\t8\n"
)


def test_device_state_is_parsed_missing_is_missing_and_drift_names_the_numbers() -> None:
    before, after = parse_state(SYS.format(temp=41000), 0.0), parse_state(SYS.format(temp=48500), 1.0)
    assert before.thermal_c == {"thermal_zone0 (cpu-big)": 41.0} and before.governor == {"cpu0": "schedutil"}
    assert before.missing == ("battery_pct", "charging") and before.load1 == 0.5 and before.ncpu == 8
    bounds = DriftBounds(max_thermal_rise_c=5.0)
    assert drift(before, before, bounds) == []
    assert drift(before, after, bounds) == ["thermal thermal_zone0 (cpu-big) rose 7.5 °C (41.0 → 48.5), bound 5.0 °C"]
    throttled = parse_state(SYS.format(temp=41000).replace("2400000", "1200000").replace("schedutil", "powersave"), 2)
    assert len(drift(before, throttled, bounds)) == 2
    nothing = parse_state("", 0.0)
    assert set(nothing.missing) >= {"thermal_c", "governor", "load1"} and drift(nothing, nothing, bounds) == []


def test_a_drifted_cell_refuses_the_verdict_naming_cell_and_numbers() -> None:
    device = Device(name="pixel8", kind="phone", arch="aarch64", transport="local", workdir="/tmp/x")
    spec = AbSpec(device=device, model=Path("m.gguf"), a=("--cache-mb", "2"), b=("--cache-mb", "3"), rounds=1)
    assert [n for _, n in cell_order(["A", "B"], 2)] == ["A", "B", "B", "A", "A", "B", "B", "A"]
    cool, hot = parse_state(SYS.format(temp=40000), 0), parse_state(SYS.format(temp=52000), 1)
    cells = []
    for i, (_, name) in enumerate(cell_order(["A", "B"], 1)):
        after = hot if i == 2 else cool
        cells.append(
            {
                "index": i,
                "round": 1,
                "config": name,
                "decode_step_s": [0.01] * 4,
                "tok_s": 100.0 + i,
                "flash_bytes_per_token": 10.0,
                "hit_rate": 0.5,
                "before": cool.to_dict(),
                "after": after.to_dict(),
                "drift": drift(cool, after, spec.bounds),
            }
        )
    ab = summarise(spec, cells, run_id="r1", build_id="b1", target="aarch64-linux-musl")
    assert ab["verdict"] == "refused"
    assert ab["refusals"] == [
        "cell 2 (B, round 1): thermal thermal_zone0 (cpu-big) rose 12.0 °C (40.0 → 52.0), bound 5.0 °C"
    ]
    assert ab["state_missing"] == ["battery_pct", "charging"]
    cells[2]["drift"] = []
    assert summarise(spec, cells, run_id="r1", build_id="b1", target="t")["verdict"] == "measured"


def sample_release(ab: dict) -> dict:
    checks = [
        Check(
            "expert_substitute",
            "quality agreement",
            None,
            FAIL,
            value=0.63,
            threshold=">= 0.9",
            evidence={"run": "r2", "device": "pixel8", "build_id": "b1", "source": "instruments"},
        ).to_dict(),
        Check(
            "expert_substitute",
            "speed",
            "phone-aarch64",
            PASS,
            value=1.2,
            threshold=">= 1.0",
            evidence={"run": "r1", "device": "pixel8", "build_id": "b1", "source": "ab"},
        ).to_dict(),
    ]
    return {
        "run": "rel-1",
        "verdict": "NO-GO",
        "reason": "expert_substitute: quality agreement ...",
        "exit_code": 1,
        "proposed": "p.yaml",
        "base": "HEAD:ci/app-defaults.yaml",
        "policy": "ci/release-policy.yaml",
        "pool": "release",
        "evidence_mode": "auto",
        "engine_builds": {"aarch64-linux-musl": "b1"},
        "changes": [{"setting": "expert_substitute", "base": None, "proposed": 0.6}],
        "checks": checks,
        "stale": [{"device": "rpi5", "run": "n1", "reason": "evidence of run n1 ... refused as stale"}],
        "notes": [],
        "ab": {"phone-aarch64": ab},
    }


@pytest.mark.skipif(shutil.which("chromium") is None, reason="needs Debian's chromium (scripts/setup.sh installs it)")
def test_the_release_report_renders_in_headless_chromium(tmp_path: Path) -> None:
    from test_nightly_report import console_errors, render_in_chromium

    device = Device(name="pixel8", kind="phone", arch="aarch64", transport="local", workdir="/tmp/x")
    spec = AbSpec(device=device, model=Path("m.gguf"), a=("--cache-mb", "2"), b=("--cache-mb", "3"), rounds=2)
    state = parse_state(SYS.format(temp=40000), 0).to_dict()
    cells = [
        {
            "index": i,
            "round": 1 + i // 4,
            "config": n,
            "decode_step_s": [0.01],
            "tok_s": 100.0 + 10 * (n == "B") + i,
            "flash_bytes_per_token": 10.0,
            "hit_rate": 0.5,
            "before": state,
            "after": state,
            "drift": [],
        }
        for i, (_, n) in enumerate(cell_order(["A", "B"], 2))
    ]
    r = sample_release(summarise(spec, cells, run_id="r1", build_id="b1", target="aarch64-linux-musl"))
    page = write_release(tmp_path / "out", r)
    md = (tmp_path / "out" / "release.md").read_text()
    assert "**NO-GO: expert_substitute" in md and "| expert_substitute | quality agreement | - | FAIL | 0.63 |" in md
    dom, log = render_in_chromium(page, tmp_path / "release.png", tmp_path)
    assert console_errors(log) == []
    assert 'id="verdict"' in dom and "NO-GO" in dom and '<figure id="speed-plot"><svg' in dom
    assert "refused as stale" in dom and "<script" not in page.read_text()


def test_ab_refuses_bad_input_before_touching_a_device(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    farm = tmp_path / "farm.yaml"
    farm.write_text(
        "version: 1\ndevices:\n"
        + "".join(
            f"  - {{name: {n}, kind: desktop, arch: x86_64, transport: local, workdir: {tmp_path / n}}}\n"
            for n in ("a1", "a2")
        )
    )
    base = ["ab", "--farm", str(farm), "--device", "a1", "--b", "--cache-mb 2 --force-cache"]
    assert main([*base, "--a", "--cache-mb 2"]) == 2
    assert "--a '--cache-mb 2': the engine refuses it: --cache-mb: 2 MiB is in the band" in capsys.readouterr().err
    assert main([*base, "--a", "--cache-mb 2 --force-cache", "--device", "all"]) == 2
    assert "selects 2 devices; an A/B runs on one" in capsys.readouterr().err
    assert main([*base, "--a", "--cache-mb 2 --force-cache", "--rounds", "0"]) == 2
    assert "--rounds must be at least 1" in capsys.readouterr().err
    assert not (tmp_path / "a1").exists()  # nothing was pushed
