"""Nightly CI across architectures: the history store, classification against earlier runs, the report.

* :mod:`~bmoe_ci.nightly.history`   the SQLite history (runs, results, device state, outputs, mutation scores)
* :mod:`~bmoe_ci.nightly.classify`  new failure / still failing / fixed / flaky / new error / device missing,
  cross-device agreement over time (pure functions over history rows)
* :mod:`~bmoe_ci.nightly.report`    nightly.json, report.md, report.html, index.html
* :mod:`~bmoe_ci.nightly.run`       ``bmoe-ci nightly`` itself, retention, ``bmoe-ci history import``
* :mod:`~bmoe_ci.nightly.merge`     ``bmoe-ci report --merge``: shards into one report
"""
