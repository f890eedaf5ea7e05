"""`bmoe-ci ab`: decode speed of two engine configurations on one device, with the device state recorded.

* :mod:`bmoe_ci.ab.devstate` reads the device state (CPU frequency and governor, thermal zones, load,
  battery) over the device's transport and judges drift between two readings;
* :mod:`bmoe_ci.ab.stats` holds the bootstrap confidence interval of the B/A speed ratio;
* :mod:`bmoe_ci.ab.run` leases the device and runs the cells in ABBA order;
* :mod:`bmoe_ci.ab.report` writes ``ab.json`` and ``ab.md``; :mod:`bmoe_ci.ab.cli` is the command.

docs/release.md describes the command and its output.
"""
