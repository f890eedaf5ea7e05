"""Stand-ins for the devices of a lab, on this machine: what the embedded local farm and the project's
tests reach through the real transports (no phone, no lab needed). Shipped in the wheel: ``make gates``
and ``bmoe-ci farm up`` use them.

* :mod:`~bmoe_ci.standins.localfarm`  the embedded local farm's bring-up (``up``, ``down``,
  ``sshd_status``, ``running``): one sshd per SSH device, the stand-in adbd and an adb server of its own;
* :mod:`~bmoe_ci.standins.adbd`       the device end of an ADB connection
  (``python -m bmoe_ci.standins.adbd``, docs/adbd-standin.md).

Nothing in :mod:`bmoe_ci.farm` imports this package: the farm only knows where the local farm's file is
(:mod:`bmoe_ci.farm.embedded`).
"""
