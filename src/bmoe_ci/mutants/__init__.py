"""Mutation testing of the gate suite: `bmoe-ci mutants` builds each fault of the engine's catalogue
(:mod:`bmoe_ci.faults`) and runs the gate suite against it (:mod:`bmoe_ci.gaterun.suite`)."""
