"""Small CPU models of one configuration kept together in one family (``gln.GLNFamily``), so
that a pass can learn the rows of many of them in one library call.

With one small model per customer and traffic spread over them, a pass (``passes``) holds
one or two rows of each of many models; learned one model at a time, each row pays a library
call's fixed cost (~50-70 us of checks, staging and kernel launches for a model of 20 features
and layers [32, 32, 1]) for a few microseconds of arithmetic. Models of one configuration,
seed included, share their hyperplanes, and a family learns rows of many members in one call,
each member ending byte for byte where a model of its own would (``gln.family``). So every
model small enough (``FAMILY_MODEL_BYTES``) is kept as a member of its configuration's family,
served through its ``gln.FamilyMember``, which answers everything a ``GLN`` does.

A family is made with room for every model of its configuration the server could hold (the
memory budget over one model's bytes, at most ``GLN_MAX_MODELS``): arrays allocated and not
touched take address space, not memory, and a member's pages are written only when a model is
placed there. Room is never moved, so a member's index holds for its life. A model that finds
no room (or that is too large) keeps a ``GLN`` of its own, as before.

On a GPU the same holds, with one difference: a family's arrays are device memory from the
start (CUDA has no untouched pages), so its room, as many models as the budget allows and at
most ``GLN_MAX_MODELS``, is taken when the first model of its configuration is created. A pass
of many members is then one launch a layer (``gln.family``).
"""

from __future__ import annotations

import logging
import threading
from typing import Any

from gln import GLN, FamilyMember, GLNFamily

log = logging.getLogger(__name__)

# Models up to this many bytes join a family: above it a model's own arithmetic outweighs a
# library call's fixed cost many times over, and its family's room would be large.
FAMILY_MODEL_BYTES = 1 << 20


class Families:
    """The families of one engine, one per configuration; ``place`` puts a model in its
    family, ``release`` frees its room. Safe to call from any thread."""

    def __init__(self, capacity_for: Any) -> None:
        # capacity_for(model_nbytes) -> how many models of that size the server could hold
        self._capacity_for = capacity_for
        self._families: dict[str, tuple[GLNFamily, list[int]]] = {}  # key -> (family, free)
        self._lock = threading.Lock()

    def place(self, model: GLN) -> GLN | FamilyMember:
        """``model`` as a member of its configuration's family (its state copied there), or
        ``model`` itself where it stays apart: too large, without compiled kernels, or no room
        left. On a GPU the family's room is device memory, taken when the family is made."""
        if not model.use_kernels:
            return model
        nbytes = GLN.estimate_nbytes(model.config_for_estimate())
        if nbytes > FAMILY_MODEL_BYTES:
            return model
        config = model.config
        key = repr(sorted(config.items()))
        with self._lock:
            held = self._families.get(key)
            if held is None:
                capacity = self._capacity_for(nbytes)
                if capacity < 2:
                    return model
                try:
                    family = GLNFamily.with_capacity(capacity, **config)
                except ValueError as exc:  # the address space refused (a strict overcommit)
                    log.warning("no family for models of %r (%s): they are served apart",
                                config, exc)
                    return model
                family.warm_up()  # not in the first pass of many members: seconds, uncached
                held = self._families[key] = (family, list(range(capacity - 1, -1, -1)))
            family, free = held
            if not free:
                return model
            index = free.pop()
        family.set_member(index, model)
        return FamilyMember(family, index)

    def release(self, model: GLN | FamilyMember) -> None:
        """Free the room of a member whose model is gone (a GLN of its own has none)."""
        if not isinstance(model, FamilyMember):
            return
        with self._lock:
            for family, free in self._families.values():
                if family is model.family:
                    free.append(model.index)
                    return
