"""Output channels stay bounded without ever blocking the engine thread."""

from __future__ import annotations

import threading
import time

from domain.emission.channel import OutputChannel
from domain.emission.outputs import ChoiceDelta, RequestEnd, Usage


def test_a_lagging_reader_sees_merged_deltas_and_the_channel_stays_bounded():
    channel = OutputChannel(capacity=4)

    for position in range(100):
        channel.put(ChoiceDelta(0, text=str(position % 10), token_ids=(position,)))
    channel.put(RequestEnd(Usage(3, 100)))

    items = list(channel)
    deltas = [i for i in items if isinstance(i, ChoiceDelta)]
    assert len(items) <= 5
    assert [t for d in deltas for t in d.token_ids] == list(range(100))
    assert "".join(d.text for d in deltas) == "".join(str(p % 10) for p in range(100))
    assert isinstance(items[-1], RequestEnd)


def test_merging_keeps_the_finish_of_the_later_delta():
    merged = ChoiceDelta(1, "a", (1,)).merge(ChoiceDelta(1, "b", (2,), "stop", "b"))

    assert merged == ChoiceDelta(1, "ab", (1, 2), "stop", "b")


def test_nothing_is_accepted_after_the_end():
    channel = OutputChannel()
    channel.put(RequestEnd(Usage(1, 0)))

    channel.put(ChoiceDelta(0, "late"))

    assert len(channel) == 1


def test_a_reader_blocked_in_get_wakes_when_an_item_is_put():
    channel = OutputChannel()
    got: list = []
    reader = threading.Thread(target=lambda: got.append(channel.get(timeout=30)))
    reader.start()
    deadline = time.monotonic() + 30
    while not channel._waiting and time.monotonic() < deadline:
        time.sleep(0.001)
    assert channel._waiting == 1  # the reader waits on the condition now
    channel.put(ChoiceDelta(0, "a", (1,)))
    reader.join(timeout=30)
    assert got == [ChoiceDelta(0, "a", (1,))]
    assert channel._waiting == 0


def test_a_get_that_times_out_returns_nothing_and_stops_waiting():
    channel = OutputChannel()
    assert channel.get(timeout=0.01) is None
    assert channel._waiting == 0
    channel.put(ChoiceDelta(0, "b", (2,)))
    assert channel.get(timeout=0.01) == ChoiceDelta(0, "b", (2,))
