"""References to the process groups a worker's code creates, dropped last.

torch frees a gloo process group by joining its worker threads, and a thread
that is still freeing its last work needs the GIL: the work's thread-local
state holds a Python object (the autograd engine's context, captured while
DDP's backward queued the allreduce). When the last reference to the group
goes from C++ with the GIL held, the two wait for each other for ever
(pytorch#56297). That is what a torchrun script does under a launcher that
keeps its process: it ends with ``destroy_process_group()``, and DDP's
reducer, freed with the script's namespace a moment later, holds the last
reference. A process that exits never frees the namespace, so torchrun
does not meet it.

torch releases the GIL in the destructor of the Python ``ProcessGroup``
object (pytorch#154976; an older torch gains nothing here and loses nothing).
So the worker holds one for each group its code creates and drops it after
the call's own objects are gone: then it is the last reference.
"""

from __future__ import annotations

from typing import List


class GroupRefs:
    """The groups a worker's code created, held until ``release``."""

    def __init__(self) -> None:
        self._groups: List[object] = []

    def hold(self, group: object) -> None:
        if group is not None:
            self._groups.append(group)

    def release(self) -> None:
        """Drop the references: call it once the call's own objects are gone.
        (What a reference cycle holds goes later, with the collector; by then
        the group's threads have long finished their last work.)"""
        self._groups.clear()
