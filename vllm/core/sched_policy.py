"""The scheduling policies (vLLM's --scheduling-policy): how the queues are ordered.

fcfs: the waiting queue is in arrival order, a preempted request goes back to its
front, and the request preempted when the KV pool runs dry is the last one admitted.

priority: both queues are kept sorted by `priority_key` (the request's `priority`,
lower first, then its arrival time). The scheduler's rules stay the same ("admit from
the front of waiting", "preempt from the back of running"), so the sorted order alone
makes them pick the best waiting request and the worst running one; the one rule
priority adds is that a waiting request may preempt a running one ranked below it
(see Scheduler._preempt_for).
"""
from __future__ import annotations

import bisect
from typing import MutableSequence

from vllm.request import Request

FCFS = "fcfs"
PRIORITY = "priority"


def priority_key(request: Request) -> tuple[int, float]:
    """Lower runs first: the priority, then FCFS within a priority."""
    return (request.priority, request.arrival_time)


def insert_by_priority(queue: MutableSequence[Request], request: Request) -> None:
    """Insert into a queue sorted by priority_key, after the requests ranked equal
    (so equal keys, as the n samples of one request, keep their order)."""
    index = bisect.bisect_right(queue, priority_key(request), key=priority_key)
    queue.insert(index, request)
