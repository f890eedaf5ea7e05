"""Results of a gate run: per-device JUnit, the merged JUnit, and the summary (docs/results.md).

Layout of ``results/<run>/``::

    <device>/junit.xml     one <testsuite> named after the device, its facts as properties
    <device>/device.json   the DeviceRun, lossless (what `bmoe-ci report` rebuilds from)
    <device>/<artifacts>   engine stdout/stderr, route traces, ... of failing tests
    junit.xml              every device's testsuite, merged (junitparser)
    run.json               the RunMeta
    summary.json           machine-readable summary (schema bmoe-ci.summary/1)
    summary.md, matrix.svg the same for people

API (what the pytest plugin calls on the controller at session end)::

    from bmoe_ci.reports import DeviceRun, RunMeta, TestRecord, console_matrix, finalize

    rec = TestRecord(device="pixel8", gate="G1", fixture="qwen3moe", name="G1[qwen3moe]",
                     classname="gates.test_streaming", outcome="pass", duration_s=0.4)
    run = DeviceRun(device="pixel8", arch="aarch64", os="android", kind="phone",
                    engine_build_id="...", target="aarch64-linux-musl", records=[rec], ...)
    data = finalize(results_dir, [run, ...], RunMeta(run="...", engine_builds={...}, ...))
    print(console_matrix(data))

or step by step: ``write_device_junit(results_dir, run)`` for each device (safe to repeat as results
come in), then ``merge(results_dir)``, then ``summary(results_dir, run_meta)``. Outcomes: ``fail`` is
a wrong engine result (JUnit <failure>), ``error`` infrastructure (<error>), ``skip`` keeps its reason
(<skipped>). A device with an ``infra_error`` or with no records at all gets one ``error`` case named
``infrastructure``: an empty report never reads as a pass. Problems with a results directory raise
:class:`ReportError` (one line, naming the file).

Note: the package attribute ``summary`` is the function; import the module's other names with
``from bmoe_ci.reports.summary import ...``.
"""

from bmoe_ci.reports.junit import device_run_from_junit, merge, read_junit, write_device_junit
from bmoe_ci.reports.records import (
    OUTCOMES,
    Counts,
    DeviceRun,
    Outcome,
    ReportError,
    RunMeta,
    TestRecord,
    aggregate,
    strip_xdist_group,
)
from bmoe_ci.reports.summary import (
    GATE_ORDER,
    build_summary,
    console_matrix,
    exit_code,
    finalize,
    load_results,
    markdown,
    matrix_svg,
    rebuild,
    summary,
)

__all__ = [
    "GATE_ORDER",
    "OUTCOMES",
    "Counts",
    "DeviceRun",
    "Outcome",
    "ReportError",
    "RunMeta",
    "TestRecord",
    "aggregate",
    "build_summary",
    "console_matrix",
    "device_run_from_junit",
    "exit_code",
    "finalize",
    "load_results",
    "markdown",
    "matrix_svg",
    "merge",
    "read_junit",
    "rebuild",
    "strip_xdist_group",
    "summary",
    "write_device_junit",
]
