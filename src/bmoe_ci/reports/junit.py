"""JUnit XML: one file per device, and the merged file of a run (junitparser).

Shape (see docs/results.md): ``results/<run>/<device>/junit.xml`` holds one ``<testsuite>`` named
after the device, with the device's facts as properties. Test case ``classname`` is prefixed with the
device name (``pixel8.gates.test_streaming``): Jenkins and GitLab identify a case by classname + name
and ignore the suite name, so without the prefix the same gate on two devices would collide.
"""

from __future__ import annotations

import io
import re
import xml.etree.ElementTree as ET
from collections.abc import Mapping
from pathlib import Path

from junitparser import Error, Failure, JUnitXml, Skipped, TestCase, TestSuite
from junitparser.junitparser import JUnitXmlError

from bmoe_ci import inputs
from bmoe_ci.reports.records import (
    DEVICE_JSON,
    INFRA_CLASSNAME,
    INFRA_NAME,
    NO_RESULTS,
    DeviceRun,
    ReportError,
    TestRecord,
    atomic_write,
    device_dir,
    read_device_json,
    write_device_json,
)

JUNIT_XML = "junit.xml"

# Per-field cap in the XML (device.json keeps everything). GitLab refuses files over 30 MB.
MAX_TEXT = 64 * 1024

# Characters XML 1.0 cannot carry at all (ElementTree would write them and produce an unreadable
# file), and lone surrogates (which cannot be encoded as UTF-8).
_XML_ILLEGAL = re.compile("[\x00-\x08\x0b\x0c\x0e-\x1f\ufffe\uffff\ud800-\udfff]")
_ATTACHMENT = re.compile(r"^\[\[ATTACHMENT\|(.+)\]\]$")
_NAME_PARTS = re.compile(r"^([^\[]+)(?:\[(.*)\])?$")


def _escape_char(m: re.Match[str]) -> str:
    code = ord(m.group())
    return f"\\x{code:02x}" if code < 0x100 else f"\\u{code:04x}"


def xml_text(text: str | None, limit: int = MAX_TEXT) -> str:
    """*text* made safe for an XML document: illegal characters escaped as ``\\xNN``, long text cut
    in the middle (head and tail are where the useful parts of a log are)."""
    if not text:
        return ""
    text = _XML_ILLEGAL.sub(_escape_char, text)
    if len(text) > limit:
        cut = len(text) - limit
        half = limit // 2
        text = f"{text[:half]}\n… [{cut} characters cut; the full text is in {DEVICE_JSON}] …\n{text[-half:]}"
    return text


#: The environment variable that asks for absolute attachment paths (read by the entry points).
ENV_ATTACHMENT_PATHS = "BMOE_CI_ATTACHMENT_PATHS"


def absolute_attachments(environ: Mapping[str, str]) -> bool:
    """Whether ``environ`` asks for absolute attachment paths (``BMOE_CI_ATTACHMENT_PATHS=absolute``)."""
    return environ.get(ENV_ATTACHMENT_PATHS, "").lower() == "absolute"


def _attachment_ref(dev_dir: Path, rel: str, absolute: bool) -> str:
    """How a CI system finds an artifact: GitLab resolves paths relative to the project directory
    (the working directory of the run), Jenkins' attachments plugin wants absolute ones
    (``BMOE_CI_ATTACHMENT_PATHS=absolute``, read by the entry point, gives ``absolute``)."""
    path = (dev_dir / rel).absolute()
    if absolute:
        return str(path)
    try:
        return str(path.relative_to(Path.cwd()))
    except ValueError:
        return str(path)


def _testcase(rec: TestRecord, dev_dir: Path, absolute: bool = False) -> TestCase:
    case = TestCase(xml_text(rec.name, 1000), f"{rec.device}.{xml_text(rec.classname, 1000)}", rec.duration_s)
    message = xml_text(rec.message, 1000)
    if rec.outcome == "fail":
        result: Failure | Error | Skipped | None = Failure(message or "failed")
    elif rec.outcome == "error":
        result = Error(message or "error", "infrastructure" if rec.classname == INFRA_CLASSNAME else None)
    elif rec.outcome == "skip":
        result = Skipped(message or "skipped (no reason given)")
    else:
        result = None
    if result is not None:
        if rec.details:
            result.text = xml_text(rec.details)
        case.result = [result]
    out = xml_text(rec.system_out)
    if rec.artifacts:
        refs = "\n".join(f"[[ATTACHMENT|{_attachment_ref(dev_dir, a, absolute)}]]" for a in rec.artifacts)
        out = f"{out}\n{refs}" if out else refs
    if out:
        case.system_out = out
    if rec.system_err:
        case.system_err = xml_text(rec.system_err)
    return case


def device_suite(run: DeviceRun, dev_dir: Path, absolute: bool = False) -> TestSuite:
    """The ``<testsuite>`` of one device: properties, then its test cases."""
    suite = TestSuite(run.device)
    if run.started:
        suite.timestamp = run.started
    props: list[tuple[str, str]] = [
        ("device", run.device),
        ("arch", run.arch),
        ("os", run.os),
        ("kind", run.kind),
        ("engine_build_id", run.engine_build_id),
        ("target", run.target),
        ("kernels", ",".join(run.kernels)),
    ]
    props += [(f"fixture.{name}.sha256", sha) for name, sha in sorted(run.fixtures.items())]
    props += [
        ("pushed_bytes", str(run.pushed_bytes)),
        ("verified_files", str(run.verified_files)),
        ("retries", str(len(run.retries))),
        ("engine_s", f"{run.engine_s:.3f}"),
        ("wall_s", f"{run.wall_s:.3f}"),
    ]
    props += [(f"output.{name}.sha256", sha) for name, sha in sorted(run.outputs.items())]
    props += [(f"repushed.{i}", what) for i, what in enumerate(run.repushed)]
    props += [(f"retry.{i}", what) for i, what in enumerate(run.retries)]
    if run.infra_error is not None:
        props.append(("infra_error", run.infra_error))
    if run.faults:
        props.append(("engine_faults", ",".join(run.faults)))
    for name, value in props:
        suite.add_property(xml_text(name, 1000), xml_text(value, 4000))
    suite.add_testcases([_testcase(rec, dev_dir, absolute) for rec in run.reported_records()])
    if run.wall_s > 0:
        suite.time = round(run.wall_s, 3)
    return suite


def _write_xml(xml: JUnitXml, path: Path) -> None:
    """Atomic, indented write (a crash mid-write never leaves half a junit.xml).

    Indentation is redone from scratch: whitespace-only text between elements (left by a parsed,
    already indented file) is dropped first, so merging indented files does not pile it up. Text of
    leaf elements (failure details, system-out) is never touched."""
    root = ET.fromstring(xml.tostring())
    for elem in root.iter():
        if len(elem) and elem.text is not None and not elem.text.strip():
            elem.text = None
        if elem.tail is not None and not elem.tail.strip():
            elem.tail = None
    ET.indent(root, "  ")
    buf = io.BytesIO()
    ET.ElementTree(root).write(buf, encoding="utf-8", xml_declaration=True)
    atomic_write(path, buf.getvalue() + b"\n")


def write_device_junit(results_dir: Path | str, device_run: DeviceRun, *, absolute: bool = False) -> Path:
    """Write ``<results_dir>/<device>/junit.xml`` and ``device.json`` beside it; returns the junit path.

    Safe to call again as results accumulate (each call rewrites both files atomically). ``absolute``:
    attachments by absolute path (else relative to the working directory)."""
    dev_dir = device_dir(results_dir, device_run.device)
    dev_dir.mkdir(parents=True, exist_ok=True)
    write_device_json(results_dir, device_run)
    xml = JUnitXml(device_run.device)
    xml.add_testsuite(device_suite(device_run, dev_dir, absolute))
    _set_totals(xml)
    path = dev_dir / JUNIT_XML
    _write_xml(xml, path)
    return path


def read_junit(path: Path) -> JUnitXml:
    """Parse a JUnit file; any problem is a :class:`ReportError` naming the file."""
    try:
        xml = JUnitXml.fromfile(str(path))
    except OSError as exc:
        raise ReportError(f"{path}: cannot read: {exc.strerror or exc}") from None
    except JUnitXmlError as exc:
        raise ReportError(f"{path}: not a JUnit XML file ({exc})") from None
    except Exception as exc:  # xml.etree.ElementTree.ParseError and friends
        raise ReportError(f"{path}: unparsable JUnit XML: {exc}") from None
    return xml


def _has_results(path: Path) -> bool:
    return (path / DEVICE_JSON).is_file() or (path / JUNIT_XML).is_file()


def is_run_dir(path: Path) -> bool:
    """A run's directory (its subdirectories are devices), as opposed to a device's directory."""
    return path.is_dir() and any(c.is_dir() and _has_results(c) for c in path.iterdir())


def device_dirs(results_dir: Path | str) -> list[Path]:
    """The device directories of a run: subdirectories holding a device.json or a junit.xml (and not
    themselves a run's directory, as when a results root is given instead of one run)."""
    root = Path(results_dir)
    return sorted(p for p in root.iterdir() if p.is_dir() and _has_results(p) and not is_run_dir(p))


def _suite_stats(suite: TestSuite) -> tuple[int, int, int, int, float]:
    time = suite.time  # junitparser recomputes time as the sum of cases; keep the device's wall time
    suite.update_statistics()
    if time is not None and time > 0:
        suite.time = time
    return suite.tests, suite.failures, suite.errors, suite.skipped, suite.time or 0.0


def _set_totals(xml: JUnitXml) -> None:
    tests = failures = errors = skipped = 0
    time = 0.0
    for suite in xml:
        t, f, e, s, d = _suite_stats(suite)
        tests, failures, errors, skipped, time = tests + t, failures + f, errors + e, skipped + s, time + d
    xml.tests, xml.failures, xml.errors, xml.skipped = tests, failures, errors, skipped
    xml.time = round(time, 3)


def merge(results_dir: Path | str, *, absolute: bool = False) -> Path:
    """Merge every ``<device>/junit.xml`` into ``<results_dir>/junit.xml``: one testsuite per device.

    A device directory with a device.json but no junit.xml gets its junit.xml written first. A
    device file with no test case at all gets an error case: an empty report never reads as a pass.
    Raises :class:`ReportError` on a missing directory, no devices, or an unparsable file."""
    root = Path(results_dir)
    if not root.is_dir():
        raise ReportError(f"{root}: no such results directory")
    dirs = device_dirs(root)
    if not dirs:
        raise ReportError(f"{root}: no device results (expected <device>/{DEVICE_JSON} or <device>/{JUNIT_XML})")
    merged = JUnitXml(root.resolve().name)
    for dev_dir in dirs:
        path = dev_dir / JUNIT_XML
        if not path.is_file():
            write_device_junit(root, read_device_json(dev_dir / DEVICE_JSON), absolute=absolute)
        xml = read_junit(path)
        suites = list(xml)
        if not suites:
            suites = [TestSuite(dev_dir.name)]
        for suite in suites:
            if len(suite) == 0:
                case = TestCase(INFRA_NAME, f"{dev_dir.name}.{INFRA_CLASSNAME}", 0.0)
                case.result = [Error(NO_RESULTS, "infrastructure")]
                suite.add_testcase(case)
            merged.add_testsuite(suite)
    _set_totals(merged)
    out = root / JUNIT_XML
    _write_xml(merged, out)
    return out


def device_run_from_junit(path: Path) -> DeviceRun:
    """Rebuild a :class:`DeviceRun` from a device's junit.xml alone (when its device.json is lost).

    Lossy where the XML is: long output was cut, gate and fixture are read back from the case name
    (``G1[qwen3moe]``)."""
    return _device_run_from_xml(read_junit(path), path)


def salvage_junit(path: Path) -> tuple[DeviceRun | None, int]:
    """What a damaged device ``junit.xml`` still holds (a file cut short by a writer killed mid-write,
    as versions before atomic writes could leave): its properties and every test case whose element
    is complete before the damage. Returns the run (None when not even the suite's start is there) and
    the number of test cases read."""
    parser: ET.XMLPullParser[ET.Element] = ET.XMLPullParser(events=("start", "end"))
    suite: ET.Element | None = None
    props: list[ET.Element] = []
    cases: list[ET.Element] = []
    try:
        parser.feed(inputs.read_bytes(path, what="junit.xml", limit=inputs.MAX_JSON_BYTES))
        parser.close()
    except (inputs.InputError, ET.ParseError):
        pass  # keep what was complete before the damage
    try:
        for item in parser.read_events():
            event, elem = item[0], item[-1]
            if not isinstance(elem, ET.Element):
                continue  # only "start" and "end" were asked for, and each of those carries its element
            if event == "start" and elem.tag == "testsuite" and suite is None:
                suite = elem
            elif event == "end" and elem.tag == "property":
                props.append(elem)
            elif event == "end" and elem.tag == "testcase":
                cases.append(elem)
    except ET.ParseError:
        pass
    if suite is None:
        return None, 0
    root = ET.Element("testsuites")
    whole = ET.SubElement(root, "testsuite", {k: v for k, v in suite.attrib.items() if k in ("name", "timestamp")})
    if props:
        ET.SubElement(whole, "properties").extend(props)
    whole.extend(cases)
    try:
        return _device_run_from_xml(JUnitXml.fromstring(ET.tostring(root, encoding="unicode")), path), len(cases)
    except ReportError:
        return None, 0


def _device_run_from_xml(xml: JUnitXml, path: Path) -> DeviceRun:
    suites = list(xml)
    if len(suites) != 1:
        raise ReportError(f"{path}: expected one testsuite (the device), found {len(suites)}")
    suite = suites[0]
    props = {p.name: p.value or "" for p in suite.properties()}
    device = props.get("device") or suite.name or path.parent.name
    dev_dir = path.parent
    records: list[TestRecord] = []
    infra_error: str | None = props.get("infra_error")
    for case in suite:
        classname = case.classname or ""
        if classname.startswith(f"{device}."):
            classname = classname[len(device) + 1 :]
        results = case.result
        if classname == INFRA_CLASSNAME and case.name == INFRA_NAME:
            msg = results[0].message if results else None
            if msg and msg != NO_RESULTS:
                infra_error = msg
            continue
        if not results:
            outcome, message, details = "pass", "", ""
        else:
            res = results[0]
            outcome = "fail" if isinstance(res, Failure) else "error" if isinstance(res, Error) else "skip"
            message, details = res.message or "", res.text or ""
        out_lines, artifacts = [], []
        for line in (case.system_out or "").splitlines():
            m = _ATTACHMENT.match(line)
            if m:
                ref = Path(m.group(1)).absolute()
                if ref.is_relative_to(dev_dir.absolute()):  # outside the device directory: not ours
                    artifacts.append(str(ref.relative_to(dev_dir.absolute())))
            else:
                out_lines.append(line)
        name = case.name or "?"
        parts = _NAME_PARTS.match(name)
        gate = parts.group(1) if parts else name
        records.append(
            TestRecord(
                device=device,
                gate=gate,
                fixture=parts.group(2) if parts else None,
                name=name,
                classname=classname,
                outcome=outcome,  # type: ignore[arg-type]
                duration_s=case.time or 0.0,
                message=message,
                details=details,
                system_out="\n".join(out_lines) or None,
                system_err=case.system_err,
                artifacts=artifacts,
            )
        )

    def _float(key: str) -> float:
        try:
            return float(props.get(key, "0") or 0)
        except ValueError:
            return 0.0

    try:
        pushed = int(props.get("pushed_bytes", "0") or 0)
    except ValueError:
        pushed = 0
    try:
        verified = int(props.get("verified_files", "0") or 0)
    except ValueError:
        verified = 0
    numbered = {int(k[9:]): v for k, v in props.items() if k.startswith("repushed.") and k[9:].isdigit()}
    repushed = [numbered[i] for i in sorted(numbered)]
    retried = {int(k[6:]): v for k, v in props.items() if k.startswith("retry.") and k[6:].isdigit()}
    try:
        return DeviceRun(
            device=device,
            arch=props.get("arch", ""),
            os=props.get("os", ""),
            kind=props.get("kind", ""),
            engine_build_id=props.get("engine_build_id", ""),
            target=props.get("target", ""),
            kernels=[k for k in props.get("kernels", "").split(",") if k],
            fixtures=_prefixed(props, "fixture."),
            pushed_bytes=pushed,
            verified_files=verified,
            repushed=repushed,
            retries=[retried[i] for i in sorted(retried)],
            engine_s=_float("engine_s"),
            wall_s=_float("wall_s"),
            outputs=_prefixed(props, "output."),
            infra_error=infra_error,
            started=suite.timestamp,
            records=records,
            faults=[f for f in props.get("engine_faults", "").split(",") if f],
        )
    except ValueError as exc:
        raise ReportError(f"{path}: {exc}") from None


def _prefixed(props: dict[str, str], prefix: str) -> dict[str, str]:
    suffix = ".sha256"
    return {k[len(prefix) : -len(suffix)]: v for k, v in props.items() if k.startswith(prefix) and k.endswith(suffix)}
