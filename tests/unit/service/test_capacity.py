"""Capacity: client calls wait in a bounded line for a slot; streams are capped per tenant and in total."""

from __future__ import annotations

import threading
import time

import pytest

from service.capacity import Capacity, CapacityLimits
from xaudit.contract.errors import ResourceExhausted


def test_a_call_over_the_cap_waits_for_a_slot_and_a_full_line_is_refused() -> None:
    capacity = Capacity(CapacityLimits(client_calls=1, client_queue=1, streams=4, streams_per_tenant=2))
    served: list[float] = []

    def second() -> None:
        started = time.monotonic()
        with capacity.call("/s/M", wait=5):
            served.append(time.monotonic() - started)

    with capacity.call("/s/M"):
        waiter = threading.Thread(target=second)
        waiter.start()
        time.sleep(0.2)
        with pytest.raises(ResourceExhausted), capacity.call("/s/M"):  # one running, one waiting: full
            pass
    waiter.join(5)
    assert served and served[0] >= 0.15  # it waited for the first call, then ran
    # A slot that never frees: refused at the deadline.
    with pytest.raises(ResourceExhausted), capacity.call("/s/M"), capacity.call("/s/M", wait=0.1):
        pass


def test_streams_are_capped_per_tenant_and_in_total() -> None:
    capacity = Capacity(CapacityLimits(client_calls=1, client_queue=0, streams=3, streams_per_tenant=2))
    with capacity.stream("tenant a"), capacity.stream("tenant a"):
        with pytest.raises(ResourceExhausted, match="tenant a"), capacity.stream("tenant a"):
            pass
        with capacity.stream("tenant b"):
            with pytest.raises(ResourceExhausted, match="streams open"), capacity.stream("tenant c"):
                pass
            assert capacity.open_streams == 3
    assert capacity.open_streams == 0
