"""bmoe-ci: test-and-gate CI for an on-device MoE inference engine."""

__version__ = "0.1.0"
