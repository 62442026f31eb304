"""`JobContext.cancelled` (`jobs.actions.Cancellation`): what a handler sees of
a lost lease or a shutdown, with `threading.Event`'s behaviour for the
calls a handler makes — made cheaply, since a batch worker makes one per job."""

import threading
import time

from jobs.actions import Cancellation, JobContext


def test_a_new_context_is_not_cancelled_and_a_wait_times_out_false():
    ctx = JobContext(job=None, worker_id="w", store=None)
    assert not ctx.cancelled.is_set()
    assert ctx.cancelled.wait(0.01) is False


def test_a_handler_waiting_wakes_when_another_thread_cancels():
    flag, woke = Cancellation(), []
    waiter = threading.Thread(target=lambda: woke.append(flag.wait(30)))
    waiter.start()
    time.sleep(0.05)  # (the waiter is usually waiting by now; either order must work)
    started = time.monotonic()
    flag.set()
    waiter.join(10)
    assert woke == [True] and time.monotonic() - started < 5
    assert flag.is_set()


def test_a_wait_after_the_cancellation_returns_at_once_and_clear_resets_it():
    flag = Cancellation()
    flag.set()
    assert flag.wait() is True
    flag.clear()
    assert not flag.is_set() and flag.wait(0.01) is False


def test_each_context_has_its_own_flag():
    first, second = (JobContext(job=None, worker_id="w", store=None) for _ in range(2))
    first.cancelled.set()
    assert first.cancelled.is_set() and not second.cancelled.is_set()
