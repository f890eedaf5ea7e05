"""The release policy (``ci/release-policy.yaml``): per setting, which gates must be green on which
device classes, and which evidence with which thresholds (docs/release.md has the reference)."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Annotated, Any, Literal

from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    StrictBool,
    StrictInt,
    StringConstraints,
    field_validator,
    model_validator,
)

from bmoe_ci.builder import KNOWN_ARCHES, normalize_arch
from bmoe_ci.farm.errors import ConfigIssue
from bmoe_ci.farm.model import NAME_PATTERN
from bmoe_ci.farm.yamllines import closest
from bmoe_ci.release.settings import SETTINGS
from bmoe_ci.release.yamlfile import Real, ReleaseConfigError, key_line, parse_text, read_text, validate

POLICY_PATH = "ci/release-policy.yaml"

#: Gates of the suite a policy may require (docs/gates.md).
KNOWN_GATES = (
    "CFG",
    "DET",
    "REF",
    "G1",
    "G2",
    "G5",
    "G8a",
    "G8b",
    "G8c",
    "G8d",
    "G8e",
    "G8w",
    "INV",
    "REPLAY",
    "BATCH-STDERR",
    "XDEV",
    "SCORE",
)

Name = Annotated[str, StringConstraints(pattern=NAME_PATTERN)]
Path_ = Annotated[str, StringConstraints(min_length=1)]
Number = Real
Positive = Annotated[Number, Field(gt=0)]
Share = Annotated[Number, Field(ge=0, le=1)]


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class DeviceClass(_Strict):
    kind: Literal["phone", "desktop"]
    arch: str

    @field_validator("arch")
    @classmethod
    def _arch(cls, v: str) -> str:
        a = normalize_arch(v)
        if a not in KNOWN_ARCHES:
            raise ValueError(
                f"unknown arch {v!r}: the engine is built for {', '.join(KNOWN_ARCHES)} (arm64 is accepted for aarch64)"
            )
        return a


class Speed(_Strict):
    """The B/A decode speed's interval lower bound at ``confidence`` must be at least ``min_ratio``."""

    min_ratio: Positive
    confidence: Annotated[Number, Field(gt=0, lt=1)] = 0.9


class Quality(_Strict):
    """Thresholds on the proposal against the base, on the evaluation model (each optional)."""

    max_ppl_increase: Annotated[Number, Field(ge=0)] | None = None  # relative: ppl_B / ppl_A - 1
    min_agreement: Share | None = None  # share of positions whose argmax equals the lossless reference's
    max_accuracy_drop: Share | None = None  # accuracy_A - accuracy_B on the multiple-choice set

    @model_validator(mode="after")
    def _some(self) -> Quality:
        if self.max_ppl_increase is None and self.min_agreement is None and self.max_accuracy_drop is None:
            raise ValueError("give at least one of max_ppl_increase, min_agreement, max_accuracy_drop")
        return self


class Requirement(_Strict):
    """What a change of one setting must show."""

    gates: tuple[str, ...] = ()
    classes: Annotated[tuple[Name, ...], Field(min_length=1)]
    speed: Speed | None = None
    quality: Quality | None = None
    replay: StrictBool = False


class Drift(_Strict):
    max_thermal_rise_c: Positive = 5.0
    max_load_per_cpu: Positive = 1.5
    max_battery_drop_pct: Positive = 5.0


class Evaluation(_Strict):
    """How evidence is measured: the models, the run length, and the app's cache budget scaled onto the
    small evaluation models (``cache_mb x cache_scale``, at least 1 MiB)."""

    speed_fixture: Name = "qwen3moe"
    quality_fixture: Name = "trained"
    quality_text: tuple[Path_, ...] | Path_ | None = None  # held-out text(s) for --ppl-step, concatenated
    quality_choices: Path_ | None = None  # multiple-choice JSONL for --ppl-choices (repo-relative)
    prompt: Annotated[str, StringConstraints(min_length=1)] = "The quick brown fox jumps over the lazy dog."
    n_predict: Annotated[StrictInt, Field(ge=2, le=4096)] = 32
    rounds: Annotated[StrictInt, Field(ge=1, le=100)] = 3
    cache_scale: Annotated[Number, Field(gt=0, le=1)] = 0.001
    drift: Drift = Drift()


class PolicyFile(_Strict):
    version: Literal[1] = 1
    freshness_hours: Annotated[Number, Field(gt=0, le=8760)] = 72
    device_classes: Annotated[dict[Name, DeviceClass], Field(min_length=1)]
    evaluation: Evaluation = Evaluation()
    settings: dict[str, Requirement]


@dataclass(frozen=True)
class Policy:
    model: PolicyFile
    source: str
    raw: Any

    @property
    def classes(self) -> dict[str, DeviceClass]:
        return self.model.device_classes

    def requirement(self, setting: str) -> Requirement:
        return self.model.settings[setting]

    def line(self, *loc: Any) -> int | None:
        return key_line(self.raw, loc)


def parse_policy(text: str, shown: str) -> Policy:
    raw = parse_text(text, shown)
    model = validate(PolicyFile, raw, shown, "a release policy")
    issues: list[ConfigIssue] = []
    for key in model.settings:
        if key not in SETTINGS:
            issues.append(
                ConfigIssue(
                    shown,
                    key_line(raw, ("settings", key)),
                    f"settings.{key}",
                    f"unknown setting{closest(key, SETTINGS)} (settings: {', '.join(SETTINGS)})",
                )
            )
    for key in SETTINGS:
        if key not in model.settings:
            issues.append(
                ConfigIssue(
                    shown,
                    key_line(raw, ("settings",)),
                    f"settings.{key}",
                    "missing: every setting of the app needs a requirement",
                )
            )
    for key, req in model.settings.items():
        for i, gate in enumerate(req.gates):
            if gate not in KNOWN_GATES:
                issues.append(
                    ConfigIssue(
                        shown,
                        key_line(raw, ("settings", key, "gates", i)),
                        f"settings.{key}.gates[{i}]",
                        f"unknown gate {gate!r}{closest(gate, KNOWN_GATES)} (gates: {', '.join(KNOWN_GATES)})",
                    )
                )
        for i, cls in enumerate(req.classes):
            if cls not in model.device_classes:
                issues.append(
                    ConfigIssue(
                        shown,
                        key_line(raw, ("settings", key, "classes", i)),
                        f"settings.{key}.classes[{i}]",
                        f"unknown device class {cls!r}{closest(cls, list(model.device_classes))} "
                        f"(classes: {', '.join(model.device_classes)})",
                    )
                )
    if issues:
        raise ReleaseConfigError(issues)
    return Policy(model, shown, raw)


def load_policy(path: Path) -> Policy:
    text, shown = read_text(path, "release policy")
    return parse_policy(text, shown)
