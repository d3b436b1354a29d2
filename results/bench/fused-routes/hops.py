import time, logging
from distributed import Client
from gpu_dedup.run.cluster.connection import local_cluster, worker_threads
logging.getLogger("distributed").setLevel(logging.ERROR)
def inc(x): return x + 1
def wset(dask_worker, v):
    dask_worker.batched_stream.interval = v
def sset(dask_scheduler, v):
    for bs in dask_scheduler.stream_comms.values(): bs.interval = v
    for bs in dask_scheduler.client_comms.values(): bs.interval = v
def run(c, ws):
    f = c.submit(inc, 0, pure=False, workers=[ws[0]])
    t0 = time.perf_counter()
    for i in range(50):
        f = c.submit(inc, f, pure=False, workers=[ws[i % 2]])
    f.result(); t1 = time.perf_counter()
    for i in range(20):
        c.gather(c.submit(inc, i, pure=False))
    t2 = time.perf_counter()
    return (t1-t0)/50*1e3, (t2-t1)/20*1e3
if __name__ == "__main__":
    cluster = local_cluster(2, "auto", {"NUMBA_NUM_THREADS": "1"})
    with Client(cluster) as c:
        ws = sorted(c.nthreads())
        for v in (None, 0.0, None, 0.0):
            if v is not None:
                c.run(wset, v=v); c.run_on_scheduler(sset, v=v)
            else:
                c.run(wset, v=0.002); c.run_on_scheduler(sset, v=0.005)
            print(v, *(f"{x:.2f}" for x in run(c, ws)))
    cluster.close()
