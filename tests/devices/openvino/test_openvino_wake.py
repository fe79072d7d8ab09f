"""The OPENVINO queue engine's loop wake (aioinfer/devices/openvino/wake.py): a wake from
any thread calls on the event loop's thread, under asyncio and trio (an eventfd on
Linux under both); detached, it calls no more; collected, it closes its eventfd."""

from __future__ import annotations

import gc
import os
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


def open_files() -> set[str]:
    return set(os.listdir("/proc/self/fd"))


@pytest.mark.skipif(
    not hasattr(os, "eventfd") or not os.path.isdir("/proc/self/fd"), reason="Linux only"
)
async def test_a_wake_watches_an_eventfd_and_closes_it_once_collected():
    before = open_files()
    calls: list[int] = []
    called = anyio.Event()

    def call() -> None:
        calls.append(1)
        called.set()

    wake = loop_wake(call)
    assert len(open_files() - before) == 1  # its eventfd (asyncio and trio alike)
    wake_from_a_thread(wake)
    with anyio.fail_after(30):
        await called.wait()
    del wake
    gc.collect()
    with anyio.fail_after(30):
        while open_files() - before:  # closed on the loop's thread (trio: its task ends)
            await anyio.sleep(0.005)
    assert calls == [1]
