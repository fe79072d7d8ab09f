"""``python -m aioinfer.devices.process``: the worker process of the PROCESS device."""

from aioinfer.devices.process.worker import main

main()
