"""`bmoe-ci release-gate`: judge a proposed change of the app's engine defaults on evidence measured on
devices (docs/release.md).

* :mod:`~bmoe_ci.release.yamlfile`: YAML with line numbers into pydantic models, one error per problem
  as ``FILE:LINE: KEY: message`` (the farm loader's machinery);
* :mod:`~bmoe_ci.release.settings`: ``ci/app-defaults.yaml`` and proposals, their engine flags (the one
  place settings become flags), the diff;
* :mod:`~bmoe_ci.release.policy`: ``ci/release-policy.yaml``;
* :mod:`~bmoe_ci.release.evidence`: the evidence record (``evidence.json``), what a verdict is judged on;
* :mod:`~bmoe_ci.release.gather`: gathering it step by step, stopping at the first failed requirement;
  :mod:`~bmoe_ci.release.measure` (gate results: fresh history rows on the policy's fixture or a gate
  run; reachability; replay) and :mod:`~bmoe_ci.release.quality` (the engine's instruments) measure;
* :mod:`~bmoe_ci.release.judge`: the pure judge, requirements against thresholds; the verdict rules are
  in :mod:`~bmoe_ci.release.verdict`;
* :mod:`~bmoe_ci.release.report`: release.json, release.md, release.html; :mod:`~bmoe_ci.release.gate`
  (gather then judge, or re-judge) and :mod:`~bmoe_ci.release.cli`.
"""
