"""A YAML file validated by a pydantic model, every problem located as ``FILE:LINE: KEY: message``.

Reuses the farm loader's line-aware YAML (:func:`bmoe_ci.farm.yamllines.load_yaml_with_lines`) and its way of
turning pydantic errors into located messages, so a release file reads like a farm file when it is wrong.
"""

from __future__ import annotations

import difflib
from collections.abc import Sequence
from pathlib import Path
from typing import Annotated, Any, TypeVar

import yaml
from pydantic import BaseModel, BeforeValidator, ValidationError

from bmoe_ci import inputs
from bmoe_ci.farm.errors import ConfigIssue
from bmoe_ci.farm.yamllines import LineDict, LineList, closest, display_path, format_loc, load_yaml_with_lines, locate

M = TypeVar("M", bound=BaseModel)


def _real(v: Any) -> Any:
    if isinstance(v, bool) or not isinstance(v, int | float):
        raise ValueError(f"expected a number, e.g. 0.75 (got {v!r})")
    if v != v:
        raise ValueError("NaN is not accepted")
    return float(v)


#: A real number as YAML writes one (an int or a float; not a string, a boolean or NaN).
Real = Annotated[float, BeforeValidator(_real)]


def _type_name(v: Any) -> str:
    return "a list" if isinstance(v, list) else "a mapping" if isinstance(v, dict) else repr(v)


class ReleaseConfigError(ValueError):
    """A release file is unreadable or invalid; ``issues`` lists every problem in file order."""

    def __init__(self, issues: Sequence[ConfigIssue]):
        self.issues = sorted(dict.fromkeys(issues), key=lambda i: (i.file, i.line or 0, i.key))
        super().__init__("\n".join(str(i) for i in self.issues))


def _message(err: dict[str, Any], loc: tuple[Any, ...], fields: Sequence[str]) -> str:
    etype = err["type"]
    if etype == "extra_forbidden":
        return "unknown key" + closest(str(loc[-1]), list(fields))
    if etype == "missing":
        return "missing required key"
    got = err.get("input")
    shown = "" if isinstance(got, dict | list) or etype == "value_error" else f" (got {got!r})"
    if etype in ("list_type", "tuple_type"):
        return f"expected a list, e.g. [a, b]{shown}"
    if etype in ("dict_type", "model_type", "model_attributes_type"):
        return f"expected a mapping of keys{shown}"
    msg = err["msg"].removeprefix("Value error, ")
    return f"{msg}{shown}"


def _fields_at(model: type[BaseModel], loc: tuple[Any, ...]) -> list[str]:
    """The keys a mapping at ``loc`` (minus its last part) may have, for 'did you mean'."""

    def model_in(ann: Any) -> type[BaseModel] | None:
        for a in (ann, *getattr(ann, "__args__", ())):
            if isinstance(a, type) and issubclass(a, BaseModel):
                return a
            inner = model_in(a) if getattr(a, "__args__", None) and a is not ann else None
            if inner is not None:
                return inner
        return None

    cls: type[BaseModel] | None = model
    for part in loc[:-1]:
        if cls is None:
            return []
        if isinstance(part, int) or part not in cls.model_fields:
            continue  # a list index or a key of a dict[str, Model]: same model
        cls = model_in(cls.model_fields[part].annotation)
    return list(cls.model_fields) if cls is not None else []


def parse_text(text: str, shown: str) -> Any:
    """Line-aware YAML of a release file (ReleaseConfigError on bad YAML or duplicate keys)."""
    try:
        raw = load_yaml_with_lines(text)
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None) or getattr(exc, "context_mark", None)
        problem = (getattr(exc, "problem", None) or str(exc)).replace("farm file", "file")
        raise ReleaseConfigError(
            [ConfigIssue(shown, mark.line + 1 if mark else None, "", f"invalid YAML: {problem}")]
        ) from None
    issues: list[ConfigIssue] = []

    def walk(node: Any, loc: tuple[Any, ...]) -> None:
        if isinstance(node, LineDict):
            for key, line, first in node.duplicates:
                issues.append(
                    ConfigIssue(shown, line, format_loc((*loc, key)), f"duplicate key (first given at line {first})")
                )
            for k, v in node.items():
                walk(v, (*loc, k))
        elif isinstance(node, LineList):
            for i, v in enumerate(node):
                walk(v, (*loc, i))

    walk(raw, ())
    if issues:
        raise ReleaseConfigError(issues)
    return raw


def validate(model: type[M], raw: Any, shown: str, what: str) -> M:
    """``model`` from parsed YAML; every pydantic error becomes one located issue."""
    if raw is None:
        raise ReleaseConfigError([ConfigIssue(shown, 1, "", f"the file is empty; {what} is a mapping of keys")])
    if not isinstance(raw, LineDict):
        line = getattr(raw, "line", None) or 1
        raise ReleaseConfigError([ConfigIssue(shown, line, "", f"{what} is a mapping of keys (got {_type_name(raw)})")])
    try:
        return model.model_validate(raw)
    except ValidationError as exc:
        errors = exc.errors()
        # a misspelt key is one problem, not two: drop "missing" for the key an unknown sibling resembles
        meant: set[tuple[Any, ...]] = set()
        for err in errors:
            if err["type"] == "extra_forbidden":
                loc = tuple(err["loc"])
                hits = difflib.get_close_matches(str(loc[-1]), _fields_at(model, loc), n=1, cutoff=0.6)
                meant.update((*loc[:-1], h) for h in hits)
        issues = []
        for err in errors:
            loc = tuple(err["loc"])
            if err["type"] == "missing" and loc in meant:
                continue
            line, shown_loc = locate(raw, loc)
            msg = _message(dict(err), loc, _fields_at(model, loc))
            issues.append(ConfigIssue(shown, line, format_loc(shown_loc), msg))
        raise ReleaseConfigError(issues) from None


#: A settings file or release policy is a page of YAML; anything larger is not one.
MAX_RELEASE_FILE_BYTES = 1 << 20


def read_text(path: Path, what: str) -> tuple[str, str]:
    """(text, the name to show in messages) of a release file."""
    shown = display_path(path)
    try:
        return inputs.read_text(path, what=what, limit=MAX_RELEASE_FILE_BYTES), shown
    except inputs.InputError as exc:
        why = str(exc).split(": ", 1)[-1]
        raise ReleaseConfigError([ConfigIssue(shown, None, "", f"cannot read {what}: {why}")]) from None


def key_line(raw: Any, loc: tuple[Any, ...]) -> int | None:
    """The line of the key at ``loc`` (or of its nearest present parent)."""
    return locate(raw, loc)[0]
