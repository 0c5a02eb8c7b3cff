"""Background iteration: reading audio ahead of the device, and cutting streams into batches."""

import threading
from collections.abc import Iterable, Iterator
from itertools import islice
from queue import Empty, Full, Queue


ABANDON_AFTER = 1.0  # seconds a stopped producer may take to notice, with nothing to hand over


def prefetch(items: Iterable, depth: int) -> Iterator:
    """Iterates `items` in a background thread, up to `depth` ahead; re-raises its errors. Closed
    early, it waits for the thread to stop, or ABANDON_AFTER seconds for one stuck in `items`."""
    queue: Queue = Queue(maxsize=depth)
    stop = threading.Event()
    done = object()

    def produce():
        try:
            for item in items:
                while not stop.is_set():
                    try:
                        queue.put((item, None), timeout=0.1)
                        break
                    except Full:
                        continue
                if stop.is_set():
                    return
            queue.put((done, None))
        except BaseException as e:  # handed to the consumer, raised there
            queue.put((done, e))

    thread = threading.Thread(target=produce, name="wtx-prefetch", daemon=True)
    thread.start()
    try:
        while True:
            item, error = queue.get()
            if item is done:
                if error is not None:
                    raise error
                return
            yield item
    finally:
        stop.set()
        idle = 0.0
        # unblock a producer waiting on a full queue
        while thread.is_alive() and idle < ABANDON_AFTER:
            try:
                queue.get_nowait()
                idle = 0.0
            except Empty:
                thread.join(timeout=0.1)
                idle += 0.1
        # a producer still running waits on its input (a FIFO whose writer never comes): it is left
        # behind, a daemon thread that ends with its next item


def batched(items: Iterable, n: int) -> Iterator[list]:
    it = iter(items)
    while batch := list(islice(it, n)):
        yield batch
