"""One generation at a time on the engine: a single worker thread fed by a bounded queue, each job awaited by the
event loop; a job past the queue's bound is refused at once (the server answers 429 with Retry-After). The model
loads on the same thread first, while the event loop already answers (`/health`: 503 until it is ready). The thread
is a daemon: a server told to stop while the model still loads exits without waiting for the load."""

import asyncio
import queue
import threading
from concurrent.futures import Future
from typing import Callable


class QueueFull(Exception):
    """The engine is busy and `max_queue` requests already wait for it."""


class EngineWorker:
    """`submit(job)` runs `job()` on the engine thread after the jobs before it and returns an awaitable of its result.
    `pending` (running + waiting) counts until the job has really finished on the thread, so a request that went
    away cannot let a new one past the bound while its generation still winds down."""

    def __init__(self, max_queue: int):
        if max_queue < 0:
            raise ValueError("the queue bound must be at least 0")
        self.max_queue = max_queue
        self.pending = 0                 # read and written on the event loop only
        self._jobs: queue.SimpleQueue = queue.SimpleQueue()
        self._thread = threading.Thread(target=self._run, name="bitnest-engine", daemon=True)
        self._thread.start()

    def _run(self) -> None:
        while (item := self._jobs.get()) is not None:
            done, job = item
            if done.set_running_or_notify_cancel():
                try:
                    done.set_result(job())
                except BaseException as e:      # handed to the awaiting handler
                    done.set_exception(e)

    def _put(self, job: Callable) -> Future:
        done: Future = Future()
        self._jobs.put((done, job))
        return done

    @property
    def waiting(self) -> int:
        return max(0, self.pending - 1)

    @property
    def running(self) -> int:
        return min(1, self.pending)

    def submit(self, job: Callable) -> asyncio.Future:
        if self.pending > self.max_queue:
            raise QueueFull(f"the engine is busy and {self.waiting} requests are waiting (--max-queue "
                            f"{self.max_queue}): retry later")
        loop = asyncio.get_running_loop()
        self.pending += 1
        done = self._put(job)
        done.add_done_callback(lambda _: loop.call_soon_threadsafe(self._finished))
        return asyncio.wrap_future(done, loop=loop)

    def load(self, job: Callable) -> asyncio.Future:
        """Run `job` (the model's loading) on the engine thread ahead of every generation, outside the queue's
        bound."""
        return asyncio.wrap_future(self._put(job), loop=asyncio.get_running_loop())

    def _finished(self) -> None:
        self.pending -= 1

    def close(self, wait: bool = True) -> None:
        """No more jobs; with `wait`, return once the thread has finished the one it runs (jobs still queued are
        dropped by the handlers that set their cancel events first)."""
        self._jobs.put(None)
        if wait:
            self._thread.join()
