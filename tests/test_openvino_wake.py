"""The OPENVINO queue engine's loop wake (aioinfer/devices/openvino/wake.py): a wake from
any thread calls on the event loop's thread, under asyncio (an eventfd on Linux) and
trio (the loop's token); detached, it calls no more."""

from __future__ import annotations

import threading

import anyio
import pytest

from aioinfer.devices.openvino.wake import loop_wake

pytestmark = pytest.mark.anyio


def wake_from_a_thread(wake: object) -> None:
    thread = threading.Thread(target=wake)  # type: ignore[arg-type]
    thread.start()
    thread.join()


async def test_a_wake_from_another_thread_calls_on_the_loop():
    calls: list[int] = []
    called = anyio.Event()

    def call() -> None:
        calls.append(threading.get_ident())
        called.set()

    wake = loop_wake(call)
    wake_from_a_thread(wake)
    with anyio.fail_after(30):
        await called.wait()
    assert calls == [threading.get_ident()]

    called = anyio.Event()
    for _ in range(3):
        wake_from_a_thread(wake)
    with anyio.fail_after(30):
        await called.wait()
    assert 2 <= len(calls) <= 4  # the wakes before the loop ran may be one call
    assert set(calls) == {threading.get_ident()}
    wake.detach()


async def test_a_detached_wake_calls_no_more():
    calls: list[int] = []
    wake = loop_wake(lambda: calls.append(1))
    wake.detach()
    wake_from_a_thread(wake)
    for _ in range(20):  # turns of the loop in which a call would run
        await anyio.sleep(0.005)
    assert calls == []
