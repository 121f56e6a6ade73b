"""A family of models learns rows of many members in one call, and each member ends byte for byte
where a model of its own that learned its rows in order would."""

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from gln import GLN, GLNFamily
from gln.kernels import cpu_family
from gln.scaling import family_moments_before_each_row

INVERSE_TIME = {"schedule": "inverse_time", "scale": 0.5, "cap": 0.2}  # 0.5 / t from t = 3
CONFIGS = {  # small networks: a layer of neurons in blocks of four and one left over
    "binary-constant-standardize": dict(num_classes=2, learning_rate=0.05),
    "binary-scheduled-unit": dict(num_classes=2, learning_rate=INVERSE_TIME,
                                  input_scaling="unit"),
    "three-classes-scheduled-standardize": dict(num_classes=3, learning_rate=INVERSE_TIME),
    "four-classes-constant-unit": dict(num_classes=4, learning_rate=0.02, input_scaling="unit",
                                       side_info="per_row"),
}
FEATURES = 5


def config_of(name, **more):
    return dict(num_features=FEATURES, layer_sizes=(6, 5, 1), context_dim=3, seed=7,
                **CONFIGS[name], **more)


def rows(rng, config, n):
    """Rows the configuration takes: in [0, 1] for "unit", else far from 0 (the shift matters)."""
    if config.get("input_scaling") == "unit":
        X = rng.uniform(0, 1, (n, FEATURES))
    else:
        X = rng.normal(40.0, 3.0, (n, FEATURES))
    return X, rng.integers(0, config["num_classes"], n)


def alone(config, X, y, cuts):
    """A model of its own that learned ``X, y`` in calls cut at ``cuts``: (model, the
    probabilities of each row)."""
    model = GLN(**config)
    bounds = [0, *sorted(c for c in cuts if 0 < c < len(X)), len(X)]
    probs = [model.learn(X[a:b], y[a:b]) for a, b in zip(bounds[:-1], bounds[1:], strict=True)]
    return model, np.concatenate(probs) if probs else np.zeros((0, config["num_classes"]))


def learned_in_calls(family, X, y, members, cuts):
    bounds = [0, *sorted(c for c in cuts if 0 < c < len(X)), len(X)]
    return np.concatenate([family.learn(X[a:b], y[a:b], members[a:b])
                           for a, b in zip(bounds[:-1], bounds[1:], strict=True)])


def assert_members_are_models_alone(family, config, X, y, members, probs, cuts=()):
    for member in range(family.size):
        mine = np.flatnonzero(members == member)
        model, expected = alone(config, X[mine], y[mine], cuts)
        assert family.member(member).to_bytes() == model.to_bytes()
        assert family.member_bytes(member) == model.to_bytes()
        assert probs[mine].tobytes() == expected.tobytes()
        assert family.examples_seen[member] == len(mine)
        probe = X[:3]
        assert (family.predict_proba(probe, [member] * len(probe)).tobytes()
                == model.predict_proba(probe).tobytes())


@pytest.mark.parametrize("use_kernels", [True, False], ids=["kernels", "array-code"])
@pytest.mark.parametrize("name", sorted(CONFIGS))
@settings(max_examples=20, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(data=st.data())
def test_each_member_learns_its_rows_as_a_model_alone_would(name, use_kernels, data):
    config = config_of(name, use_kernels=use_kernels)
    size = data.draw(st.integers(1, 4), label="size")
    n = data.draw(st.integers(0, 30), label="rows")
    members = np.array(data.draw(st.lists(st.integers(0, size - 1), min_size=n, max_size=n),
                                 label="members"), dtype=np.int64)
    family_cuts = data.draw(st.lists(st.integers(1, 29), max_size=3), label="family's calls")
    alone_cuts = data.draw(st.lists(st.integers(1, 10), max_size=2), label="models' calls")
    X, y = rows(np.random.default_rng(n * 31 + size), config, n)
    family = GLNFamily(size, **config)
    probs = learned_in_calls(family, X, y, members, family_cuts)
    assert_members_are_models_alone(family, config, X, y, members, probs, alone_cuts)


def test_long_chunks_of_wide_layers_run_every_thread_and_stay_exact():
    """Over CHUNK_ROWS rows, and layers wide enough for the parallel builds of the kernels."""
    config = dict(num_features=12, layer_sizes=(70, 9, 1), seed=3,
                  learning_rate=INVERSE_TIME)
    rng = np.random.default_rng(0)
    X = rng.normal(0, 1, (600, 12))
    y = rng.integers(0, 2, 600)
    members = rng.integers(0, 3, 600)
    family = GLNFamily(3, **config)
    probs = family.learn(X, y, members)
    assert_members_are_models_alone(family, config, X, y, members, probs)


def test_the_family_kernel_gives_the_single_models_bytes_on_this_cpu():
    """Else every call would take the member-by-member path, and the kernel would go untested."""
    assert cpu_family.family_pass_agrees()


def test_the_member_by_member_path_gives_the_same_bytes(monkeypatch):
    """Where the family's kernel disagrees with the single model's, each member's rows go
    through the single model's kernel: the same bytes."""
    config = config_of("three-classes-scheduled-standardize")
    rng = np.random.default_rng(1)
    X, y = rows(rng, config, 40)
    members = rng.integers(0, 3, 40)
    monkeypatch.setattr(cpu_family, "family_pass_agrees", lambda: False)
    family = GLNFamily(3, **config)
    probs = family.learn(X, y, members)
    assert_members_are_models_alone(family, config, X, y, members, probs)


def test_the_compiled_fold_gives_the_specifications_bits():
    rng = np.random.default_rng(2)
    size, n, d = 4, 50, 6
    members = rng.integers(0, size, n)
    x64 = rng.normal(1e4, 0.05, (n, d))
    shifts = rng.normal(1e4, 0.05, (size, d))
    start = (rng.integers(0, 9, size), rng.normal(0, 1, (size, d)), rng.uniform(0, 1, (size, d)))
    results = []
    for fold in (cpu_family.cpu_family_moments,
                 lambda *a: family_moments_before_each_row(np, *a)):
        counts, totals, totals_sq = (a.copy() for a in start)
        before = fold(members, x64, shifts, counts, totals, totals_sq)
        results.append(b"".join(a.tobytes() for a in (*before, counts, totals, totals_sq)))
    assert results[0] == results[1]


def test_members_that_learned_nothing_are_new_models():
    config = config_of("binary-constant-standardize")
    family = GLNFamily(5, **config)
    X, y = rows(np.random.default_rng(3), config, 10)
    family.learn(X, y, [1, 3] * 5)
    fresh = GLN(**config).to_bytes()
    assert [family.member_bytes(i) == fresh for i in range(5)] == [True, False, True, False, True]


def test_members_leave_and_come_back_as_snapshots():
    """A member's snapshot is a model's; stacked again (``from_models``), or put back in its
    place (``set_member``), it learns on as before."""
    config = config_of("three-classes-scheduled-standardize")
    rng = np.random.default_rng(4)
    X, y = rows(rng, config, 60)
    members = rng.integers(0, 3, 60)
    family = GLNFamily(3, **config)
    family.learn(X[:30], y[:30], members[:30])
    snapshots = [family.member_bytes(i) for i in range(3)]
    restacked = GLNFamily.from_models(snapshots)
    assert [restacked.member_bytes(i) for i in range(3)] == snapshots
    copy = family.member(2)
    assert copy.learn(X[:1], y[:1]) is not None and family.member_bytes(2) == snapshots[2]
    family.set_member(2, snapshots[2])
    first = family.learn(X[30:], y[30:], members[30:])
    again = restacked.learn(X[30:], y[30:], members[30:])
    assert first.tobytes() == again.tobytes()
    assert [restacked.member_bytes(i) for i in range(3)] == [family.member_bytes(i)
                                                             for i in range(3)]


def test_models_with_histories_of_their_own_learn_on_in_a_family():
    config = config_of("binary-scheduled-unit")
    rng = np.random.default_rng(5)
    models, expected = [], []
    for k in range(3):
        X, y = rows(rng, config, 5 * k)
        models.append(GLN(**config))
        models[-1].learn(X, y)
        expected.append(GLN.from_bytes(models[-1].to_bytes()))
    family = GLNFamily.from_models(models)
    X, y = rows(rng, config, 30)
    members = rng.integers(0, 3, 30)
    probs = family.learn(X, y, members)
    for k, model in enumerate(expected):
        mine = members == k
        assert model.learn(X[mine], y[mine]).tobytes() == probs[mine].tobytes()
        assert model.to_bytes() == family.member_bytes(k)
    assert GLNFamily.from_models(models, use_kernels=False).use_kernels is False


def test_other_configurations_and_hyperplanes_are_refused():
    config = config_of("binary-constant-standardize")
    with pytest.raises(ValueError, match=r"models\[1\].*differs in seed"):
        GLNFamily.from_models([GLN(**config), GLN(**{**config, "seed": 8})])
    with pytest.raises(ValueError, match=r"models\[2\].*differs in learning_rate"):
        GLNFamily.from_models([GLN(**config)] * 2 + [GLN(**{**config, "learning_rate": 0.1})])
    with pytest.raises(ValueError, match="at least one"):
        GLNFamily.from_models([])
    other = GLN(**config)
    other.normals[0, 0] += 0.5
    family = GLNFamily(2, **config)
    with pytest.raises(ValueError, match="hyperplanes"):
        family.set_member(0, other)
    with pytest.raises(ValueError, match="member index"):
        family.member(2)
    with pytest.raises(ValueError, match="learning_rate"):
        GLNFamily(2, **{**config, "learning_rate": lambda t: 0.1})
    with pytest.raises(ValueError, match="size"):
        GLNFamily(0, **config)


@pytest.mark.parametrize(("X", "y", "members", "message"), [
    (np.zeros((3, FEATURES)), [0, 1, 0], [0, 3, 1], r"members\[1\] is 3"),
    (np.zeros((3, FEATURES)), [0, 1, 0], [0, 1, -1], r"members\[2\] is -1"),
    (np.zeros((3, FEATURES)), [0, 1, 0], [0.0, 1.0, 1.0], "members must be integers"),
    (np.zeros((3, FEATURES)), [0, 1, 0], [0, 1], "one member index per row"),
    (np.zeros((3, FEATURES + 1)), [0, 1, 0], [0, 1, 2], f"must have {FEATURES} features"),
    (np.full((3, FEATURES), np.nan), [0, 1, 0], [0, 1, 2], "row 0, column 0 is nan"),
    (np.zeros((3, FEATURES)), [0, 2, 0], [0, 1, 2], r"labels\[1\] is 2"),
    (np.zeros((3, FEATURES)), None, [0, 1, 2], "learn needs labels"),
], ids=["member-too-large", "member-negative", "member-float", "members-short", "width",
        "nan", "label", "no-labels"])
def test_bad_input_is_refused_naming_it_and_nothing_is_learned(X, y, members, message):
    config = config_of("binary-constant-standardize")
    family = GLNFamily(3, **config)
    family.learn(*rows(np.random.default_rng(6), config, 6), [0, 1, 2, 2, 1, 0])
    before = [family.member_bytes(i) for i in range(3)]
    with pytest.raises(ValueError, match=message):
        family.learn(X, y, members)
    assert [family.member_bytes(i) for i in range(3)] == before
    if y is not None and "labels" not in message:
        with pytest.raises(ValueError, match=message):
            family.predict_proba(X, members)


def test_features_by_name_and_empty_calls():
    config = dict(num_features=2, feature_names=["a", "b"], class_names=["no", "yes"])
    family = GLNFamily(2, **config)
    probs = family.learn([{"a": 1.0, "b": 2.0}, {"b": 0.0, "a": 3.0}], ["yes", "no"], [1, 1])
    model = GLN(**config)
    assert model.learn([[1.0, 2.0], [3.0, 0.0]], [1, 0]).tobytes() == probs.tobytes()
    assert family.member_bytes(1) == model.to_bytes()
    assert family.learn(np.zeros((0, 2)), [], []).shape == (0, 2)
    assert family.predict(np.zeros((2, 2)), [0, 1]).shape == (2,)


def test_a_warm_up_loads_the_family_kernels_and_changes_nothing():
    """What a server does as it makes a family, so that its first pass of many members does
    not compile: the family's kernels are loaded for its arrays' types and checked once, and
    no member learns anything."""
    family = GLNFamily(3, num_features=4, layer_sizes=(5, 1), seed=2)
    family.learn(np.ones((2, 4)), [1, 0], members=[2, 0])
    before = [family.member_bytes(i) for i in range(3)]
    family.warm_up()
    assert [family.member_bytes(i) for i in range(3)] == before
    assert family.examples_seen.tolist() == [1, 0, 1]
    assert cpu_family.family_pass_agrees.cache_info().currsize == 1
    assert cpu_family._family_moments.signatures
