"""`bmoe-ci release-gate`: judge a proposed change of the app's engine defaults on evidence measured on
devices (docs/release.md).

* :mod:`~bmoe_ci.release.yamlfile`: YAML with line numbers into pydantic models, one error per problem
  as ``FILE:LINE: KEY: message`` (the farm loader's machinery);
* :mod:`~bmoe_ci.release.settings`: ``ci/app-defaults.yaml`` and proposals, their engine flags, the diff;
* :mod:`~bmoe_ci.release.policy`: ``ci/release-policy.yaml``;
* :mod:`~bmoe_ci.release.evidence`: gate results (fresh history rows or a gate run), speed (`bmoe-ci ab`),
  quality (the engine's instruments), replay;
* :mod:`~bmoe_ci.release.verdict`: requirements against thresholds, GO / NO-GO / NO VERDICT;
* :mod:`~bmoe_ci.release.report`: release.json, release.md, release.html; :mod:`~bmoe_ci.release.cli`.
"""
