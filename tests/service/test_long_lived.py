"""service.engine.long_lived: what survives a full collection is frozen while installed, so
that the next full pass walks only what is newer; an hourly pass walks everything."""

from __future__ import annotations

import gc

from service.engine.long_lived import FrozenSurvivors


def test_what_survives_a_full_collection_is_frozen_until_uninstalled():
    survivors = FrozenSurvivors()
    survivors.install()
    try:
        frozen = gc.get_freeze_count()
        assert frozen > 0  # what existed at install
        kept = [[i] for i in range(5000)]  # new containers, not frozen yet
        assert gc.get_freeze_count() == frozen
        gc.collect()
        assert gc.get_freeze_count() >= frozen + len(kept)
    finally:
        survivors.uninstall()
    assert gc.get_freeze_count() == 0
    assert survivors._after_collection not in gc.callbacks


def test_installs_are_counted_and_the_last_uninstall_thaws():
    survivors = FrozenSurvivors()
    survivors.install()
    survivors.install()
    survivors.uninstall()
    assert survivors._after_collection in gc.callbacks and gc.get_freeze_count() > 0
    survivors.uninstall()
    assert survivors._after_collection not in gc.callbacks and gc.get_freeze_count() == 0


def test_when_a_refresh_is_due_one_full_pass_walks_everything_then_freezing_resumes():
    survivors = FrozenSurvivors(refresh_s=0.0)
    survivors.install()
    try:
        assert gc.get_freeze_count() > 0
        gc.collect()  # due: thawed, so the next full pass walks everything
        assert gc.get_freeze_count() == 0
        gc.collect()  # that pass: its survivors frozen again
        assert gc.get_freeze_count() > 0
    finally:
        survivors.uninstall()


def test_a_frozen_object_is_still_freed_when_its_last_reference_goes():
    import weakref

    class Model:
        pass

    survivors = FrozenSurvivors()
    model = Model()
    gone = weakref.ref(model)
    survivors.install()
    try:
        assert gc.get_freeze_count() > 0
        del model
        assert gone() is None
    finally:
        survivors.uninstall()


def test_the_refresh_is_counted_from_the_last_pass_over_everything_not_the_last_freeze():
    """Full passes come every few seconds under load and each one freezes; the hourly pass
    over everything still comes an hour after the last one."""
    now = [0.0]
    survivors = FrozenSurvivors(refresh_s=10.0, clock=lambda: now[0])
    survivors.install()
    try:
        for now[0] in (4.0, 8.0):  # passes before the hour: their survivors frozen
            gc.collect()
            assert gc.get_freeze_count() > 0
        now[0] = 11.0
        gc.collect()  # due, though the last freeze was 3 s ago: thawed
        assert gc.get_freeze_count() == 0
        now[0] = 12.0
        gc.collect()  # the pass over everything: frozen again, the hour counted from here
        assert gc.get_freeze_count() > 0
        now[0] = 21.0
        gc.collect()
        assert gc.get_freeze_count() > 0
        now[0] = 22.0
        gc.collect()
        assert gc.get_freeze_count() == 0
    finally:
        survivors.uninstall()
