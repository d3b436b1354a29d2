"""What a run's Dask processes keep to themselves (standard library only: the command line and a local cluster's
scheduler process load it before anything else)."""

from __future__ import annotations

import logging

SHUFFLE_LOGGER = "distributed.shuffle._scheduler_plugin"


class ShuffleChatter(logging.Filter):
    """Drops the two lines Dask's P2P shuffle logs at WARNING for every shuffle it starts and ends
    (normal operation: ``Shuffle <id> initialized by task ...`` and ``... deactivated due to stimulus``;
    18 of them in a two-worker run, 92 with small blocks).  Every other shuffle message, its errors included,
    passes.  Its scheduler logs them: in this process, or in a local cluster's scheduler process."""

    ROUTINE = ("Shuffle %s initialized by task", "Shuffle %s deactivated due to stimulus")

    def filter(self, record) -> bool:
        return not (isinstance(record.msg, str) and record.msg.startswith(self.ROUTINE))


def quiet_shuffles() -> None:
    """:class:`ShuffleChatter` on the shuffle's scheduler logger of this process (once)."""
    shuffle = logging.getLogger(SHUFFLE_LOGGER)
    if not any(isinstance(f, ShuffleChatter) for f in shuffle.filters):
        shuffle.addFilter(ShuffleChatter())
