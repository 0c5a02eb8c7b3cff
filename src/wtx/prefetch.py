"""Background iteration: reading audio ahead of the device, and cutting streams into batches."""

import threading
from collections.abc import Iterable, Iterator
from itertools import islice
from queue import Empty, Full, Queue


def prefetch(items: Iterable, depth: int) -> Iterator:
    """Iterates `items` in a background thread, up to `depth` ahead; re-raises its errors."""
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
        while thread.is_alive():  # unblock a producer waiting on a full queue
            try:
                queue.get_nowait()
            except Empty:
                thread.join(timeout=0.1)


def batched(items: Iterable, n: int) -> Iterator[list]:
    it = iter(items)
    while batch := list(islice(it, n)):
        yield batch
