"""The engine thread wakes waiting streams through one loop callback per burst of rings."""

from __future__ import annotations

import asyncio
import threading

from adapters.http.doorbell import Doorbell


def test_rings_from_another_thread_set_every_event_with_one_callback_per_burst():
    async def scenario() -> tuple[int, bool, int]:
        loop = asyncio.get_running_loop()
        calls = 0
        original = loop.call_soon_threadsafe

        def counting(callback, *args):
            nonlocal calls
            calls += 1
            return original(callback, *args)

        loop.call_soon_threadsafe = counting
        events = [asyncio.Event() for _ in range(64)]
        doorbell = Doorbell.of(loop)
        # The loop is busy here (this coroutine holds it), as while it writes frames.
        ringer = threading.Thread(target=lambda: [doorbell.ring(e) for e in events])
        ringer.start()
        ringer.join()
        first_burst = calls
        await asyncio.wait_for(asyncio.gather(*(e.wait() for e in events)), timeout=5)
        # A ring after the loop answered gets a callback of its own.
        late = asyncio.Event()
        threading.Thread(target=doorbell.ring, args=(late,)).start()
        await asyncio.wait_for(late.wait(), timeout=5)
        return first_burst, all(e.is_set() for e in events), calls

    first_burst, all_set, calls = asyncio.run(scenario())

    assert (first_burst, all_set, calls) == (1, True, 2)


def test_each_loop_has_its_own_doorbell():
    first = asyncio.new_event_loop()
    second = asyncio.new_event_loop()
    try:
        assert Doorbell.of(first) is Doorbell.of(first)
        assert Doorbell.of(first) is not Doorbell.of(second)
    finally:
        first.close()
        second.close()
