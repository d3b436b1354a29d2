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


def ahead_each(sources: list, readers: int, depth: int = 2):
    """The items of every iterable made by ``sources`` (zero-argument callables, one per shard), in order,
    read by up to ``readers`` threads at once: reader ``w`` reads sources ``w``, ``w + readers``, ... each to
    its end, into its own queue of ``depth`` items, so at most ``readers x depth`` items wait beside the one
    in use.  Shards decode in parallel where one reader thread decodes one after another (Parquet pages
    of one text column decode on one thread).  An error is raised where its item was."""
    readers = max(1, min(int(readers), len(sources)))
    if readers == 1:
        yield from ahead((item for make in sources for item in make()), depth)
        return
    queues = [queue.Queue(depth) for _ in range(readers)]
    stop = threading.Event()
    end = object()

    def put(q, entry) -> bool:
        while not stop.is_set():
            try:
                q.put(entry, timeout=0.1)
                return True
            except queue.Full:
                continue
        return False

    def produce(w: int):
        q = queues[w]
        try:
            for k in range(w, len(sources), readers):
                for item in sources[k]():
                    if not put(q, (item, None)):
                        return
                if not put(q, (end, None)):
                    return
        except BaseException as exc:  # handed to the consumer, raised there
            put(q, (_DONE, exc))

    threads = [threading.Thread(target=produce, args=(w,), name=f"gpu_dedup-read-{w}", daemon=True)
               for w in range(readers)]
    for t in threads:
        t.start()
    try:
        for k in range(len(sources)):
            q = queues[k % readers]
            while True:
                item, exc = q.get()
                if item is end:
                    break
                if item is _DONE:
                    raise exc
                yield item
    finally:
        stop.set()
        for t, q in zip(threads, queues):
            while t.is_alive():  # let a blocked producer finish its put and see the stop
                try:
                    q.get_nowait()
                except queue.Empty:
                    t.join(0.05)
