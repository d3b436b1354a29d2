"""Child processes that a test interrupts.

A job started in the background by a non-interactive shell (``cmd &``, as CI scripts and ``nohup`` do) inherits
SIGINT ignored, and Python keeps an ignored SIGINT ignored: a child of such a test run would never see Ctrl-C.
``interruptible`` (a ``preexec_fn``) gives the child the default disposition, as a terminal's foreground job has,
so Python installs its own handler there.
"""

import signal


def interruptible() -> None:
    signal.signal(signal.SIGINT, signal.SIG_DFL)
