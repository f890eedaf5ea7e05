"""The gate run library: everything a gate run does that is not pytest.

The `bmoe` pytest plugin (:mod:`bmoe_ci.plugin`) is a thin layer over it: it reads the options and the
environment, calls :func:`~bmoe_ci.gaterun.prepare.prepare`, hands each test a
:class:`~bmoe_ci.gaterun.runner.DeviceRunner`, and turns pytest's reports into records. Nothing here
imports pytest, so the commands that only start a gate run, or run the engine, never load it.

* :mod:`~bmoe_ci.gaterun.context`   what the controller prepared (:class:`GateRun`, :class:`DeviceContext`),
  as JSON for xdist workers;
* :mod:`~bmoe_ci.gaterun.prepare`   build, generate fixtures, lease/push/preflight every device;
* :mod:`~bmoe_ci.gaterun.progress`  the lines the preparation tells the user, by verbosity;
* :mod:`~bmoe_ci.gaterun.engine`    ONE engine run on a device: :func:`run_engine` -> :class:`EngineResult`;
* :mod:`~bmoe_ci.gaterun.runner`    a device's plans (`bmoe batch`) and single runs, with deadlines;
* :mod:`~bmoe_ci.gaterun.state`     per-process runners, one per device;
* :mod:`~bmoe_ci.gaterun.suite`     ONE gate run from a command: :func:`run_gate_suite` -> :class:`SuiteResult`.

The package's modules are imported one by one (this file imports none of them): a command that only
runs the gate suite as a subprocess does not load the builder, the fixtures or numpy for it.
"""
