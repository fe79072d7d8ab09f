"""The CPU device's compiler passes, one per module, and :mod:`.pipeline`, their order.

These passes build and match the device's own operators (:mod:`aioinfer.devices.cpu.ops`)
or lay weights out for its kernels. The passes any device's compiler may run (folding,
no-op elimination, subgraphs, loop invariants, make-stateful) and the rewrite helpers
are in :mod:`aioinfer.transforms`.
"""
