"""No CUDA kernel is launched with a zero-size array (a device rejects what the simulator accepts).

The launches are recorded by a stand-in for the kernel, so no device and no simulator are needed."""

import numpy as np
import pytest

pytest.importorskip("numba_cuda")


class Recorder:
    """Stands in for a ``@cuda.jit`` kernel: ``kernel[grid, block](*args)`` records ``args``."""

    def __init__(self):
        self.launches = []

    def __getitem__(self, config):
        return lambda *args: self.launches.append(args)


def zero_size(args) -> list:
    return [k for k, a in enumerate(args) if isinstance(a, np.ndarray) and a.size == 0]


@pytest.mark.parametrize("texts", [[b"", b""], [b"", b"one two three four"]])
def test_text_signatures_never_pass_a_zero_size_buffer(monkeypatch, texts):
    from gpu_dedup.backends.strings import StringBuffers
    from gpu_dedup.kernels import cosine_cuda

    kernel = Recorder()
    monkeypatch.setattr(cosine_cuda, "simhash_docs", kernel)
    lengths = [len(t) for t in texts]
    buf = StringBuffers(np.concatenate(([0], np.cumsum(lengths))).astype(np.int64),
                        np.frombuffer(b"".join(texts), np.uint8))
    cosine_cuda.text_signatures_device(buf, np.arange(len(texts), dtype=np.int64), 64, 1, True, 3, False,
                                       np.zeros(1, np.int64), np.uint64(0), np)
    assert len(kernel.launches) == 1 and zero_size(kernel.launches[0]) == []
