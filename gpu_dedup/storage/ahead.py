"""Reader threads ahead of their consumer: decoding (Parquet pages, JSON blocks, decompression) releases the
GIL, so the next batch is read while this one is used, and several shards decode at once."""

from __future__ import annotations

import queue
import threading

_DONE = object()  # a reader's last entry, with the error that stopped it
_END = object()  # the end of one source


def ahead(items, depth: int = 2, name: str = "gpu_dedup-read"):
    """``items``, produced on a thread (``name``) ``depth`` items ahead of the consumer (reading and decoding
    release the GIL, so the next batch is read while this one is used); an error is raised where the item was."""
    return ahead_each([lambda: items], 1, depth, name)


def ahead_each(sources: list, readers: int, depth: int = 2, name: str = "gpu_dedup-read"):
    """The items of every iterable made by ``sources`` (zero-argument callables, one per shard), in order,
    read by up to ``readers`` threads at once: reader ``w`` reads sources ``w``, ``w + readers``, ... each to
    its end, into its own queue of ``depth`` items, so at most ``readers x depth`` items wait beside the one
    in use.  Shards decode in parallel where one reader thread decodes one after another (Parquet pages
    of one text column decode on one thread).  An error is raised where its item was."""
    readers = max(1, min(int(readers), len(sources)))
    queues = [queue.Queue(depth) for _ in range(readers)]
    stop = threading.Event()

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
                for item in sources[k]():  # the reader's loop: one step per batch
                    if not put(q, (item, None)):
                        return
                if not put(q, (_END, None)):
                    return
        except BaseException as exc:  # handed to the consumer, raised there
            put(q, (_DONE, exc))

    threads = [threading.Thread(target=produce, args=(w,), name=f"{name}-{w}", daemon=True)
               for w in range(readers)]
    for t in threads:
        t.start()
    try:
        for k in range(len(sources)):
            q = queues[k % readers]
            while True:
                item, exc = q.get()
                if item is _END:
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
