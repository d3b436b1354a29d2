"""What numba-cuda needs from NumPy that a newer NumPy no longer has.

numba-cuda 0.30 registers an overload for ``np.row_stack`` when its typing context first loads (at
the first kernel compile).  NumPy removed that name in 2.5 after deprecating it in 2.0 as a plain
alias of ``np.vstack``, so with NumPy >= 2.5 every CUDA compile failed with ``AttributeError:
module 'numpy' has no attribute 'row_stack'`` (seen on an H100 with numpy 2.5.2 and numba-cuda
0.30.4).  ``restore_numpy_aliases()`` puts the alias back where it is missing, before any kernel
compiles; it changes nothing on a NumPy that still has it.
"""

import numpy as np

# name -> the function NumPy documented it as an alias of
REMOVED_ALIASES = {"row_stack": "vstack"}


def restore_numpy_aliases() -> list[str]:
    """Re-add the removed aliases numba-cuda reads; returns the names it added."""
    added = []
    for name, target in REMOVED_ALIASES.items():
        if name not in np.__dict__:
            setattr(np, name, getattr(np, target))
            added.append(name)
    return added
