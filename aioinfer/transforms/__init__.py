"""Passes over the IR that any device's compiler may run (folding, no-op elimination,
subgraphs, loop invariants, make-stateful), one per module, and :mod:`.rewrite`, what
passes share. A device's own passes live with it (the CPU's in
:mod:`aioinfer.devices.cpu.passes`)."""
