"""A reader thread ahead of its consumer: decoding (Parquet pages, JSON blocks, decompression) releases the
GIL, so the next batch is read while this one is used."""

from __future__ import annotations

import queue
import threading

_DONE = object()


def ahead(items, depth: int = 2):
    """``items``, produced on a thread ``depth`` items ahead of the consumer (reading and decoding release
    the GIL, so the next batch is read while this one is used); an error is raised where the item was."""
    q: queue.Queue = queue.Queue(depth)
    stop = threading.Event()

    def produce():
        try:
            for item in items:  # the reader's loop: one step per batch
                while not stop.is_set():
                    try:
                        q.put((item, None), timeout=0.1)
                        break
                    except queue.Full:
                        continue
                if stop.is_set():
                    return
            q.put((_DONE, None))
        except BaseException as exc:  # handed to the consumer, raised there
            q.put((_DONE, exc))

    thread = threading.Thread(target=produce, name="gpu_dedup-read", daemon=True)
    thread.start()
    try:
        while True:
            item, exc = q.get()
            if item is _DONE:
                if exc is not None:
                    raise exc
                return
            yield item
    finally:
        stop.set()
        while thread.is_alive():  # let a blocked producer finish its put and see the stop
            try:
                q.get_nowait()
            except queue.Empty:
                thread.join(0.05)
