"""A member of a family served as a model of its own (``FamilyMember``): it learns,
predicts, explains and snapshots exactly as a ``GLN`` of its own would, in the family's arrays,
whether its rows come through it or through a family call with other members' rows."""

import numpy as np
import pytest

from gln import GLN, FamilyMember, GLNFamily, SnapshotBuffer

CONFIG = dict(num_features=5, num_classes=3, layer_sizes=(6, 5, 1), context_dim=3, seed=7,
              learning_rate={"schedule": "inverse_time", "scale": 0.5, "cap": 0.2})


def stream(seed, n):
    rng = np.random.default_rng(seed)
    return rng.normal(40.0, 3.0, (n, 5)), rng.integers(0, 3, n)


@pytest.mark.parametrize("use_kernels", [True, False])
def test_a_member_learns_and_predicts_as_a_model_of_its_own(use_kernels):
    family = GLNFamily.with_capacity(10_000, **CONFIG, use_kernels=use_kernels)
    alone = {i: GLN(**CONFIG, use_kernels=use_kernels) for i in (3, 9_999)}
    for i in alone:
        family.set_member(i, GLN(**CONFIG))
    members = {i: FamilyMember(family, i) for i in alone}
    X, y = stream(0, 60)
    for start in range(0, 60, 6):  # members' own calls and family calls, interleaved
        a, b = X[start:start + 6], y[start:start + 6]
        if start % 12:
            got = {i: members[i].learn(a, b) for i in alone}
        else:
            both = family.learn(np.concatenate([a, a]), np.concatenate([b, b]),
                                [3] * 6 + [9_999] * 6)
            got = {3: both[:6], 9_999: both[6:]}
        for i, model in alone.items():
            assert got[i].tobytes() == model.learn(a, b).tobytes()
    probe, _ = stream(1, 8)
    for i, model in alone.items():
        member = members[i]
        assert member.examples_seen == model.examples_seen == 60
        assert member.to_bytes() == model.to_bytes()
        assert member.predict_proba(probe).tobytes() == model.predict_proba(probe).tobytes()
        assert member.saliency(probe).tobytes() == model.saliency(probe).tobytes()
        assert member.moments.count == model.moments.count
        assert member.config == model.config and member.nbytes == model.nbytes


def test_a_members_snapshot_buffer_and_set_give_the_bytes_of_a_model():
    family = GLNFamily.with_capacity(4, **CONFIG)
    member = FamilyMember(family, 1)
    restored = GLN(**CONFIG)
    restored.learn(*stream(2, 20))
    member.set(restored.to_bytes())  # a restore: the member is the stored model
    buffer = SnapshotBuffer(member)
    buffer.capture(member)
    assert bytes(buffer.seal()) == restored.to_bytes()
    X, y = stream(3, 7)
    assert member.learn(X, y).tobytes() == restored.learn(X, y).tobytes()
    assert member.to_bytes() == restored.to_bytes()
    other = GLN(**{**CONFIG, "seed": 8})
    with pytest.raises(ValueError, match="hyperplanes|configuration"):
        member.set(other)


def test_a_member_checks_rows_and_labels_as_a_model_does():
    member = FamilyMember(GLNFamily.with_capacity(2, **CONFIG), 0)
    member.set(GLN(**CONFIG))
    with pytest.raises(ValueError, match="features|shape"):
        member.learn(np.zeros((2, 4)), [0, 1])
    with pytest.raises(ValueError, match="label"):
        member.learn(np.zeros((2, 5)), [0, 7])
    assert member.examples_seen == 0
    assert list(member.class_of(np.array([[0.1, 0.7, 0.2]]))) == [1]
