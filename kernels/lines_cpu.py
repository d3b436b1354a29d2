"""Line scanning of JSON Lines buffers (Numba): one pass over the bytes, 16 bytes per line of output.

A line ends at ``\\n`` (or the end of the buffer); a line is blank when it holds
only spaces, tabs and carriage returns.  Positions are byte offsets into the
buffer; ``ends`` exclude the newline.
"""

import numba
import numpy as np


@numba.njit(cache=True)
def _count_lines(data):
    n = 0
    blank = True
    for i in range(data.shape[0]):
        b = data[i]
        if b == 10:
            if not blank:
                n += 1
            blank = True
        elif b != 32 and b != 9 and b != 13:
            blank = False
    if not blank:
        n += 1
    return n


@numba.njit(cache=True)
def _fill_lines(data, starts, ends):
    k = 0
    start = 0
    blank = True
    for i in range(data.shape[0]):
        b = data[i]
        if b == 10:
            if not blank:
                starts[k] = start
                ends[k] = i
                k += 1
            blank = True
            start = i + 1
        elif b != 32 and b != 9 and b != 13:
            blank = False
    if not blank:
        starts[k] = start
        ends[k] = data.shape[0]
        k += 1
    return k


def nonblank_lines(data: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(starts, ends) int64 of the non-blank lines of a uint8 buffer."""
    n = _count_lines(data)
    starts = np.empty(n, np.int64)
    ends = np.empty(n, np.int64)
    _fill_lines(data, starts, ends)
    return starts, ends


@numba.njit(cache=True)
def _gather(data, starts, ends, newline, out):
    o = 0
    for k in range(starts.shape[0]):
        for i in range(starts[k], ends[k]):
            out[o] = data[i]
            o += 1
        if newline:
            out[o] = 10
            o += 1
    return o


def gather_lines(data: np.ndarray, starts: np.ndarray, ends: np.ndarray, newline: bool = True) -> np.ndarray:
    """data[starts[i]:ends[i]] (each followed by ``\\n`` if ``newline``), concatenated."""
    total = int((ends - starts).sum()) + (starts.shape[0] if newline else 0)
    out = np.empty(total, np.uint8)
    _gather(data, starts, ends, newline, out)
    return out


@numba.njit(cache=True)
def first_nonblank(data, starts, ends):
    """The first byte of each line that is not a space, tab or carriage return (lines are non-blank)."""
    out = np.empty(starts.shape[0], np.uint8)
    for k in range(starts.shape[0]):
        i = starts[k]
        while i < ends[k] - 1 and (data[i] == 32 or data[i] == 9 or data[i] == 13):
            i += 1
        out[k] = data[i]
    return out
