"""The public GLN API: exact sequential learning, validation, saliency, bytes, accuracy."""

import copy
import json
import math
import pickle
import tracemalloc
import warnings

import numpy as np
import pytest
from sklearn.datasets import load_breast_cancer, load_digits

from gln import GLN, Constant, InverseTime, SnapshotBuffer, SnapshotFormatError
from gln.checks import EXACT_IN_FLOAT32
from tests.gln.snapshot_bytes import with_header, without_array


def small_model(**overrides):
    config = dict(num_features=6, num_classes=3, layer_sizes=(8, 4, 1), context_dim=3,
                  learning_rate=0.05, seed=7)
    config.update(overrides)
    return GLN(**config)


def stream(n=300, d=6, classes=3, seed=0):
    rng = np.random.default_rng(seed)
    X = rng.normal(size=(n, d)) * [1, 10, 0.1, 1, 5, 1][:d] + 3
    y = (X[:, 0] + X[:, 3] > 6).astype(int) + (X[:, 1] > 30) * (classes > 2)
    return X, np.minimum(y, classes - 1)


@pytest.mark.parametrize("use_kernels", [True, False])
@pytest.mark.parametrize("input_scaling", ["standardize", "unit"])
def test_chunked_learning_is_byte_identical_to_single_examples(use_kernels, input_scaling):
    X, y = stream()
    if input_scaling == "unit":
        X = 1 / (1 + np.exp(-(X - 3)))
    whole = small_model(use_kernels=use_kernels, input_scaling=input_scaling)
    single = small_model(use_kernels=use_kernels, input_scaling=input_scaling)
    p_whole = whole.learn(X, y)
    p_single = np.concatenate([single.learn(X[i:i + 1], y[i:i + 1]) for i in range(len(X))])
    assert np.array_equal(p_whole, p_single)
    assert whole.to_bytes() == single.to_bytes()
    assert whole.examples_seen == single.examples_seen == len(X)


def test_chunks_larger_than_the_kernel_chunk_are_exact(monkeypatch):
    import gln.model

    monkeypatch.setattr(gln.model, "CHUNK_ROWS", 16)
    X, y = stream(100)
    a, b = small_model(), small_model()
    a.learn(X, y)
    for lo in range(0, 100, 37):
        b.learn(X[lo:lo + 37], y[lo:lo + 37])
    assert a.to_bytes() == b.to_bytes()


def test_a_progress_bar_shows_the_rows_and_changes_nothing_learned(monkeypatch, capsys):
    import gln.model

    monkeypatch.setattr(gln.model, "CHUNK_ROWS", 8)  # pieces of 64 rows: several bars' steps
    X, y = stream(150)
    plain, shown = small_model(), small_model()
    expected = plain.learn(X, y)
    assert np.array_equal(shown.learn(X, y, progress=True), expected)
    assert shown.to_bytes() == plain.to_bytes()
    bar = capsys.readouterr().err
    assert "learn" in bar and "150/150" in bar
    assert shown.learn(X[:0], y[:0], progress=True).shape == (0, 3)


@pytest.mark.parametrize("overrides", [
    {}, {"num_classes": 2}, {"learning_rate": lambda t: 1.0 / (t + 20)},
    {"learning_rate": {"schedule": "inverse_time", "scale": 10, "cap": 0.05}},
    {"input_scaling": "unit"},
])
def test_rows_already_checked_learn_and_predict_the_bits_of_the_public_verbs(
    monkeypatch, overrides
):
    """The service checks a request's rows once and hands ``check_input``'s arrays to
    ``learn`` / ``predict_proba`` with ``checked=True``, which skip the model's own check: the
    same outputs and bytes as ``learn`` / ``predict_proba`` on the rows as sent, call by call."""
    import gln.model

    monkeypatch.setattr(gln.model, "CHUNK_ROWS", 16)  # the 40-row call is three chunks
    classes = overrides.get("num_classes", 3)
    X, y = stream(121, classes=classes)
    if overrides.get("input_scaling") == "unit":
        X = 1 / (1 + np.exp(-(X - 3)))
    public, checked = small_model(**overrides), small_model(**overrides)
    start = 0
    for rows in (1, 1, 2, 3, 1, 8, 40, 1, 64):
        sent = X[start:start + rows].tolist(), y[start:start + rows].tolist()  # as JSON gives
        X32, labels = checked.check_input(*sent, strict=True)
        assert np.array_equal(checked.learn(X32, labels, checked=True), public.learn(*sent))
        assert np.array_equal(checked.predict_proba(X32, checked=True),
                              public.predict_proba(sent[0]))
        start += rows
    for name, array in checked._state.arrays().items():  # to_bytes refuses a callable rate
        assert np.array_equal(array, public._state.arrays()[name]), name
    assert checked.examples_seen == public.examples_seen == start
    assert np.array_equal(checked.learn(X32[:0], labels[:0], progress=True, checked=True),
                          public.learn(X[:0], y[:0]))


def test_the_public_verbs_still_check_their_rows():
    model = small_model()
    with pytest.raises(ValueError, match="row 0, column 1"):
        model.learn([[0.0, np.inf, 0, 0, 0, 0]], [0])
    with pytest.raises(ValueError, match="labels"):
        model.learn(np.zeros((1, 6), np.float32), [3])
    with pytest.raises(ValueError, match="6 features"):
        model.predict_proba(np.zeros((1, 5), np.float32))
    assert model.examples_seen == 0


def test_same_seed_same_bytes_other_seed_other_hyperplanes():
    X, y = stream()
    a, b, c = small_model(), small_model(), small_model(seed=8)
    for model in (a, b, c):
        model.learn(X, y)
    assert a.to_bytes() == b.to_bytes()
    assert not np.array_equal(a.normals, c.normals)


def test_kernel_and_reference_agree_after_learning():
    X, y = stream(500)
    fast, reference = small_model(), small_model(use_kernels=False)
    np.testing.assert_allclose(fast.learn(X, y), reference.learn(X, y), atol=1e-4)
    for w_fast, w_ref in zip(fast.weights, reference.weights, strict=True):
        np.testing.assert_allclose(w_fast, w_ref, atol=1e-4)


def test_prequential_predictions_equal_predict_proba_before_the_update():
    X, y = stream(50)
    model = small_model()
    model.learn(X[:20], y[:20])
    before = model.predict_proba(X[20:21])
    assert np.array_equal(model.learn(X[20:21], y[20:21]), before)
    assert not np.array_equal(model.predict_proba(X[20:21]), before)


def test_probabilities_rows_sum_to_one_and_predict_is_argmax():
    X, y = stream(100)
    for classes in (2, 3):
        model = small_model(num_classes=classes)
        model.learn(X, np.minimum(y, classes - 1))
        P = model.predict_proba(X)
        assert P.shape == (100, classes)
        np.testing.assert_allclose(P.sum(axis=1), 1.0)
        assert np.array_equal(model.predict(X), P.argmax(axis=1))


@pytest.mark.parametrize("use_kernels", [True, False])
def test_a_new_model_predicts_alike_for_every_row_as_its_first_learn_does(use_kernels):
    """Before any row is learned there is no scale to judge a value by (z = 0): every row gets
    the model's prior, which is also the prequential prediction of the first row learned. Raw
    values used to be taken as already standardised (a feature near 1e3 saturated)."""
    X, y = stream(3)
    rows = np.vstack([X, X * 1000, -X])
    model = small_model(use_kernels=use_kernels)
    before = model.predict_proba(rows)
    np.testing.assert_array_equal(before, np.broadcast_to(before[0], before.shape))
    np.testing.assert_array_equal(model.learn(rows[4:5], y[1:2]), before[:1])


def test_predict_does_not_learn():
    X, y = stream(50)
    model = small_model()
    model.learn(X, y)
    blob = model.to_bytes()
    model.predict_proba(X)
    model.saliency(X[:3])
    assert model.to_bytes() == blob


def test_initial_weights_are_one_over_inputs_and_initial_prediction_uninformed():
    model = small_model(num_classes=2)
    assert [w.shape for w in model.weights] == [(1, 8, 8, 7), (1, 4, 8, 9), (1, 1, 8, 5)]
    for w in model.weights:
        assert np.all(w == np.float32(1 / w.shape[-1]))


def test_learning_rate_schedule_counts_examples_not_layers():
    """min(100/t, 0.01) with t the example count; the update size reveals the rate used."""
    rates_seen = []

    def rate(t):
        rates_seen.append(t)
        return 0.01

    model = small_model(learning_rate=rate)
    X, y = stream(10)
    model.learn(X[:4], y[:4])
    model.learn(X[4:7], y[4:7])
    assert rates_seen == list(range(1, 8))
    with pytest.raises(ValueError, match="callable"):
        model.to_bytes()


def test_inverse_time_schedule_changes_learning():
    X, y = stream(200)
    constant = small_model(learning_rate=0.01)
    decayed = small_model(learning_rate={"schedule": "inverse_time", "scale": 1.0, "cap": 0.01})
    constant.learn(X, y)
    decayed.learn(X, y)
    assert constant.to_bytes() != decayed.to_bytes()
    assert decayed.config["learning_rate"] == {"schedule": "inverse_time", "scale": 1.0,
                                               "cap": 0.01}


BAD_FEATURES = [
    (np.zeros((2, 5)), [0, 1], "6 features"),
    (np.zeros(6), [0], "2-D"),
    ([[0, 0, 0, 0, 0, float("nan")]], [0], "finite"),
    ([[0, 0, 0, 0, 0, float("inf")]], [0], "finite"),
    ([[0, 0, 0, 0, 0, 1e300]], [0], "fit in float32"),
    ([[0, 0, 0, 0, 0, 10**400]], [0], "row 0, column 5 is an integer of 401 digits"),
    ([["a"] * 6], [0], "numbers"),
    ([["1.5"] * 6], [0], "real numbers"),  # strings are not features, even numeric ones
    (np.ones((1, 6), dtype=complex), [0], "real numbers"),  # not silently made real
    ([[0.0] * 6, [0.0] * 6, [0.0] * 7], [0, 1, 2], "row 2 has 7"),  # ragged
    # A masked value is missing, not a number: NumPy's min and max would skip it, and its data
    # (here NaN) would reach the weights.
    (np.ma.array([[0, 0, 0, 0, 0, np.nan]], mask=[[0, 0, 0, 0, 0, 1]]), [0],
     r"^features must not hold masked values: row 0, column 5 is masked"),
]
BAD_LABELS = [
    (np.zeros((2, 6)), [0, 3], r"^labels must be class indices in \[0, 3\); labels\[1\] is 3$"),
    (np.zeros((2, 6)), [0, -1], r"\[0, 3\)"),
    (np.zeros((2, 6)), [0, 1.5], r"\[0, 3\); labels\[1\] is 1.5$"),
    (np.zeros((2, 6)), [0], "one label per row"),
    # Beyond int64 (a JSON client may send them): named like any other label.
    (np.zeros((2, 6)), [0, 10**20], r"labels\[1\] is 100000000000000000000$"),
    (np.zeros((2, 6)), [10**400, 0], r"labels\[0\] is an integer of 401 digits"),
    (np.zeros((2, 6)), [0, None], r"labels\[1\] is None"),
    (np.zeros((2, 6)), np.ma.array([0, 9], mask=[0, 1]), r"labels\[1\] is masked"),
    (np.zeros((2, 6)), None, "learn needs labels"),  # None is no labels: learn must refuse it
]


@pytest.mark.parametrize(
    ("X", "y", "message", "bad_features"),
    [(*case, True) for case in BAD_FEATURES] + [(*case, False) for case in BAD_LABELS],
)
def test_bad_input_raises_value_error_and_changes_nothing(X, y, message, bad_features):
    model = small_model()
    good_X, good_y = stream(30)
    model.learn(good_X, good_y)
    blob = model.to_bytes()
    with pytest.raises(ValueError, match=message):
        model.learn(X, y)
    assert model.to_bytes() == blob
    if bad_features:
        with pytest.raises(ValueError, match=message):
            model.predict_proba(X)


def test_a_strict_check_refuses_what_unit_scaling_would_clip():
    """``input_scaling="unit"`` clips inputs to [eps, 1 - eps]; ``check_input(strict=True)``
    (the service's check of its clients' rows) names a value outside [0, 1] instead, and
    says nothing of one for a standardising model. 0 and 1 themselves are in."""
    unit = small_model(input_scaling="unit")
    rows = np.full((3, 6), 0.5)
    rows[0, :2] = [0.0, 1.0]
    unit.check_input(rows, strict=True)
    rows[1, 2] = 255.0
    with pytest.raises(ValueError, match=r"^input_scaling='unit' takes features in \[0, 1\]: "
                                         r"row 1, column 2 is 255.0 \(scale them"):
        unit.check_input(rows, strict=True)
    unit.check_input(rows)  # not strict: learning would clip it
    small_model().check_input(rows, strict=True)


@pytest.mark.parametrize("dtype", [np.bool_, np.int8, np.uint8, np.int16, np.uint16, np.int32,
                                   np.int64])
def test_integer_rows_are_the_floats_they_equal(dtype):
    """Integer rows check and learn as the float32 rows of their values: those of at most 16
    bits (pixels as uint8) without a float64 copy, whose reductions every value of theirs would
    pass, and the wider ones through it (an int64 beyond float32's 24 bits is rounded)."""
    rng = np.random.default_rng(1)
    info = np.iinfo(dtype) if dtype != np.bool_ else None
    low, high = (0, 2) if info is None else (max(info.min, -1000), min(info.max, 1000) + 1)
    rows = rng.integers(low, high, (30, 6)).astype(dtype)
    rows[0, 0] = True if info is None else info.max  # 2^63 - 1 rounds to 2^63 in float32
    labels = rng.integers(0, 3, 30)
    as_ints, as_floats = small_model(), small_model()
    checked, _ = as_ints.check_input(rows)
    assert checked.dtype == np.float32 and checked.flags.c_contiguous
    np.testing.assert_array_equal(checked, rows.astype(np.float32))
    many = np.resize(rows, (20_000, 6))
    tracemalloc.start()
    try:
        as_ints.check_input(many)
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    wide_copy = 8 * many.size
    assert (peak < wide_copy) == (rows.dtype in EXACT_IN_FLOAT32), (peak, wide_copy)
    np.testing.assert_array_equal(as_ints.learn(rows, labels),
                                  as_floats.learn(rows.astype(np.float32), labels))
    assert as_ints.to_bytes() == as_floats.to_bytes()
    unit = small_model(input_scaling="unit")
    if info is None:
        unit.check_input(rows, strict=True)  # booleans are in [0, 1]
    else:
        with pytest.raises(ValueError, match=r"row 0, column 0 is "):
            unit.check_input(rows, strict=True)


@pytest.mark.parametrize("bad_rate", [math.nan, -0.1, 0.0, math.inf])
def test_a_callable_rate_that_is_no_rate_is_refused_before_anything_is_learned(bad_rate):
    """A user's schedule is checked for the whole call first: a bad rate late in a long
    call (a later chunk) names its example and changes nothing."""
    model = small_model(learning_rate=lambda t: bad_rate if t == 290 else 0.05)
    X, y = stream(300)
    model.learn(X[:10], y[:10])
    weights = [w.copy() for w in model.weights]
    with pytest.raises(ValueError, match=r"learning_rate\(290\)"):
        model.learn(X[10:], y[10:])
    assert model.examples_seen == 10
    for before, after in zip(weights, model.weights, strict=True):
        np.testing.assert_array_equal(before, after)


def test_a_bad_row_late_in_a_large_batch_changes_nothing():
    model = small_model()
    X, y = stream(1000)
    X[999, 2] = np.nan
    blob = model.to_bytes()
    with pytest.raises(ValueError, match="row 999"):
        model.learn(X, y)
    assert model.to_bytes() == blob and model.examples_seen == 0


def test_constant_features_never_produce_nan():
    model = small_model()
    X = np.full((50, 6), 4.0)
    P = model.learn(X, np.zeros(50, int))
    assert np.isfinite(P).all()
    assert all(np.isfinite(w).all() for w in model.weights)
    assert np.isfinite(model.predict_proba(np.full((1, 6), 1e6))).all()


@pytest.mark.parametrize(
    ("overrides", "name"),
    [({"num_features": 0}, "num_features"), ({"num_classes": 1}, "num_classes"),
     ({"layer_sizes": (4, 2)}, "layer_sizes"), ({"layer_sizes": "41"}, "layer_sizes"),
     ({"context_dim": 0}, "context_dim"), ({"learning_rate": -1}, "learning_rate"),
     ({"learning_rate": {"schedule": "cosine"}}, "learning_rate"),
     ({"pred_clip": 0.5}, "pred_clip"), ({"weight_clip": 0}, "weight_clip"),
     ({"bias": 0.5}, "bias"), ({"bias": 0.999}, "bias"),
     ({"input_scaling": "minmax"}, "input_scaling"), ({"device": "tpu"}, "device"),
     ({"seed": 1.5}, "seed"), ({"seed": -1}, "seed"), ({"layer_sizes": ()}, "layer_sizes"),
     ({"layer_sizes": (4, 0, 1)}, r"layer_sizes\[1\]"), ({"context_dim": 17}, "context_dim"),
     ({"layer_sizes": (1,) * 65}, "at most 64 layers"),
     ({"image_shape": (2, -3)}, r"image_shape\[1\]"),
     # Beyond what float32 neurons can compute without an infinite logit or NaN:
     ({"pred_clip": 1e-8}, "pred_clip"), ({"weight_clip": 1e7}, "weight_clip"),
     ({"learning_rate": 1e7}, "learning_rate"),
     ({"learning_rate": {"schedule": "inverse_time", "scale": 1.0, "cap": 1e7}}, "cap"),
     # Not finite: a NaN rate spoils every weight, and neither survives a JSON config.
     ({"learning_rate": {"schedule": "inverse_time", "scale": 1.0, "cap": math.nan}}, "cap"),
     ({"learning_rate": {"schedule": "inverse_time", "scale": math.inf, "cap": 0.1}}, "scale"),
     ({"offset_scale": math.inf}, "offset_scale"), ({"offset_scale": math.nan}, "offset_scale"),
     # Schedule objects are checked as their configurations are:
     ({"learning_rate": Constant(math.nan)}, "learning_rate"),
     ({"learning_rate": Constant(-1.0)}, "learning_rate"),
     ({"learning_rate": Constant("x")}, "learning_rate"),
     ({"learning_rate": InverseTime(-1.0, 0.01)}, "learning_rate.scale"),
     ({"learning_rate": InverseTime(100.0, 2e6)}, "cap"),
     ({"num_classes": 0}, "num_classes must be an int >= 2"),
     # The default bias, sigmoid(1), lies outside [eps, 1 - eps] for a large pred_clip:
     ({"pred_clip": 0.3}, r"bias .*needs pred_clip <= 0.268")],
)
def test_invalid_configuration_names_the_argument(overrides, name):
    with pytest.raises(ValueError, match=name):
        small_model(**overrides)


def test_schedule_objects_and_array_layer_sizes_give_the_config_of_plain_values():
    """``Constant``/``InverseTime`` and a NumPy ``layer_sizes`` are the numbers, dict and
    tuple they stand for: the same configuration, so a reloaded model keeps its bytes."""
    plain = small_model(learning_rate={"schedule": "inverse_time", "scale": 1, "cap": 0.01})
    for model in (small_model(learning_rate=InverseTime(1, 0.01)),
                  small_model(learning_rate=InverseTime(1, 0.01), layer_sizes=np.array([8, 4, 1]))):
        assert model.config == plain.config
        assert GLN.from_bytes(model.to_bytes()).to_bytes() == model.to_bytes()
    assert small_model(learning_rate=Constant(0.05)).config == small_model().config


def test_numpy_numbers_configure_a_model_as_the_python_numbers_they_hold():
    """A sweep's values (``np.linspace``, ``np.arange``) are numbers like any other: the same
    configuration, JSON-serialisable, and the same bytes after learning."""
    plain = small_model(learning_rate={"schedule": "inverse_time", "scale": 1, "cap": 0.05},
                        weight_clip=5, offset_scale=1.0, pred_clip=0.0625, image_shape=(2, 3))
    swept = small_model(
        learning_rate={"schedule": "inverse_time", "scale": np.int64(1), "cap": np.float64(0.05)},
        weight_clip=np.int64(5), offset_scale=np.arange(3)[1], pred_clip=np.float32(0.0625),
        image_shape=np.array([2, 3]))
    assert swept.config == plain.config
    json.dumps(swept.config)
    X, y = stream(50)
    np.testing.assert_array_equal(swept.learn(X, y), plain.learn(X, y))
    assert swept.to_bytes() == plain.to_bytes()
    assert small_model(learning_rate=np.float32(0.25)).config["learning_rate"] == 0.25
    for flag in (True, np.True_):
        with pytest.raises(ValueError, match="learning_rate must be a positive number"):
            small_model(learning_rate=flag)
        with pytest.raises(ValueError, match="weight_clip must be a number"):
            small_model(weight_clip=flag)


def test_labels_mean_the_same_classes_whatever_holds_them():
    """Bools are classes 0 and 1 in a list, a bool array or an object array (a pandas object
    column); NumPy ints and integral floats in an object array are their classes; a masked
    array with nothing masked is its data."""
    X = stream(4)[0]
    expected = small_model().learn(X, np.array([1, 0, 1, 1]))
    for labels in ([True, False, True, True], np.array([True, False, True, True]),
                   np.array([True, False, np.True_, 1], dtype=object),
                   np.array([np.int64(1), 0, np.float32(1.0), 1.0], dtype=object),
                   np.ma.array([1, 0, 1, 1])):
        np.testing.assert_array_equal(small_model().learn(X, labels), expected)
    features = small_model()
    np.testing.assert_array_equal(features.learn(np.ma.array(X), [1, 0, 1, 1]), expected)


def test_pandas_frames_and_series_are_rows_and_labels_like_arrays():
    """A DataFrame has a ``get`` of its own: it must not be taken for a GPU array."""
    pandas = pytest.importorskip("pandas")
    X, y = stream(40)
    from_arrays, from_pandas = small_model(), small_model()
    expected = from_arrays.learn(X, y)
    np.testing.assert_array_equal(
        from_pandas.learn(pandas.DataFrame(X), pandas.Series(y)), expected)
    np.testing.assert_array_equal(
        from_pandas.learn(pandas.DataFrame(X[:5]), pandas.Series(y[:5], dtype="Int64")),
        from_arrays.learn(X[:5], y[:5]))
    np.testing.assert_array_equal(from_pandas.predict_proba(pandas.DataFrame(X)),
                                  from_arrays.predict_proba(X))
    assert from_pandas.to_bytes() == from_arrays.to_bytes()


def test_a_callable_rate_that_returns_no_number_is_named():
    model = small_model(learning_rate=lambda t: np.array([0.1, 0.2]))
    X, y = stream(5)
    with pytest.raises(ValueError, match=r"learning_rate\(1\) must return a number, got ndarray"):
        model.learn(X, y)
    assert model.examples_seen == 0


@pytest.mark.parametrize("input_scaling", ["standardize", "unit"])
def test_an_outlier_far_beyond_the_running_statistics_never_makes_nan(input_scaling):
    """A float32-sized value over a small running spread scales to more than float32 holds:
    its side information is bounded, so no margin is NaN and no warning is raised."""
    X, y = stream(300)
    model = small_model(input_scaling=input_scaling)
    model.learn(X[:200], y[:200])
    outlier = X[200:201].copy()
    outlier[0, 2] = -3e38
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        P = model.learn(np.vstack([outlier, X[201:]]), y[200:])
        assert np.isfinite(P).all() and np.isfinite(model.predict_proba(outlier)).all()
    assert all(np.isfinite(w).all() for w in model.weights)


@pytest.mark.filterwarnings("ignore:overflow encountered in exp")  # sigmoid(-huge) is 0
@pytest.mark.parametrize("use_kernels", [True, False])
def test_the_extreme_settings_allowed_stay_finite(use_kernels):
    """The smallest pred_clip and largest weight bound and step allowed: predictions saturate
    (a neuron's output rounds to 1 - eps) but never become NaN or infinite."""
    X, y = stream(300)
    model = small_model(pred_clip=2.0**-24, weight_clip=9.9e5, learning_rate=1e6,
                        use_kernels=use_kernels)
    P = model.learn(np.vstack([X, 50 * X]), np.concatenate([y, y]))
    assert np.isfinite(P).all() and np.isfinite(model.predict_proba(100 * X)).all()
    assert all(np.isfinite(w).all() for w in model.weights)


@pytest.mark.parametrize(
    "overrides",
    [{"layer_sizes": ()}, {"layer_sizes": (4, 2)}, {"layer_sizes": (4, 0, 1)},
     {"layer_sizes": "41"}, {"context_dim": 17}, {"num_classes": 0}],
)
def test_the_size_estimate_refuses_what_the_constructor_refuses(overrides):
    """A host sizes a config before building it, so both must give the same message."""
    config = {"num_features": 6, **overrides}
    with pytest.raises(ValueError) as estimated:
        GLN.estimate_nbytes(config)
    with pytest.raises(ValueError) as built:
        GLN(**config)
    assert str(estimated.value) == str(built.value)


def test_a_bad_label_is_shown_as_the_client_wrote_it():
    with pytest.raises(ValueError, match=r"labels\[1\] is 7$"):
        small_model().learn(np.zeros((2, 6)), np.array([0, 7]))


@pytest.mark.parametrize("num_classes", [2, 3])
def test_saliency_reproduces_the_output_where_nothing_is_clipped(num_classes):
    """sigmoid(S . logit(p0) + bias_term) equals each GLN's output (paper, section 5)."""
    X, y = stream(200)
    model = small_model(num_classes=num_classes, pred_clip=1e-6, learning_rate=0.01)
    model.learn(X, np.minimum(y, num_classes - 1))
    rows = X[:20]
    maps, bias_terms = model.saliency_terms(rows)
    assert maps.shape == (20, num_classes, 6)
    np.testing.assert_array_equal(model.saliency(rows), maps)
    # logit(p0) for "standardize" scaling is the standardised feature (clipped at +-logit(eps)).
    from gln.scaling import scale_inputs

    m = model.moments
    _, base_logits = scale_inputs(np, rows, np.full((1, 1), float(m.count)), m.total[None],
                                  m.total_sq[None], mode="standardize", pred_clip=model.pred_clip,
                                  min_std=model.min_std, shift=model.moments_shift)
    logits = np.einsum("tcd,td->tc", maps, base_logits.astype(np.float64)) + bias_terms
    outputs = 1 / (1 + np.exp(-logits))
    P = model.predict_proba(rows)
    if num_classes == 2:
        np.testing.assert_allclose(outputs[:, 1], P[:, 1], rtol=1e-4)
        np.testing.assert_allclose(maps[:, 0], -maps[:, 1])
    else:
        np.testing.assert_allclose(outputs / outputs.sum(axis=1, keepdims=True), P, rtol=1e-4)


def test_round_trip_through_bytes_preserves_everything():
    X, y = stream()
    model = small_model(learning_rate={"schedule": "inverse_time", "scale": 10, "cap": 0.05})
    model.learn(X[:150], y[:150])
    clone = GLN.from_bytes(model.to_bytes())
    assert clone.config == model.config and clone.examples_seen == 150
    assert np.array_equal(clone.predict_proba(X), model.predict_proba(X))
    np.testing.assert_array_equal(clone.learn(X[150:], y[150:]), model.learn(X[150:], y[150:]))
    assert clone.to_bytes() == model.to_bytes()


def test_loading_samples_nothing_and_owns_its_arrays(monkeypatch):
    """``from_bytes`` takes the state it reads: it samples no hyperplanes (which the payload
    would overwrite: half the time of loading an MNIST-sized model), and each array it loads
    is the model's own, writable copy, not a view of the blob."""
    X, y = stream()
    model = small_model()
    model.learn(X[:100], y[:100])
    blob = model.to_bytes()

    def refuse(*args, **kwargs):
        raise AssertionError("loading sampled hyperplanes")

    monkeypatch.setattr("gln.state.sample_halfspaces", refuse)
    clone = GLN.from_bytes(blob)
    raw = np.frombuffer(blob, dtype=np.uint8)
    for name, array in clone._state.arrays().items():
        assert array.flags.writeable and not np.shares_memory(array, raw), name
    np.testing.assert_array_equal(clone.learn(X[100:], y[100:]), model.learn(X[100:], y[100:]))
    assert clone.to_bytes() == model.to_bytes()
    with pytest.raises(AssertionError, match="sampled"):
        small_model()  # the constructor does sample


@pytest.mark.parametrize("options", [
    {},
    {"side_info": "per_row", "side_info_blur": 1.0, "image_shape": (2, 3)},
])
def test_a_snapshot_buffer_holds_the_bytes_of_its_capture(options):
    """``SnapshotBuffer``: what ``seal`` returns is ``to_bytes`` at the time of ``capture``,
    however the model learns after it (the buffer holds a copy, and sealing reads nothing of
    the model), and a buffer serves capture after capture."""
    X, y = stream()
    model = small_model(learning_rate={"schedule": "inverse_time", "scale": 10, "cap": 0.05},
                        **options)
    buffer = SnapshotBuffer(model)
    for start in (0, 100):
        model.learn(X[start:start + 100], y[start:start + 100])
        expected, seen = model.to_bytes(), model.examples_seen
        buffer.capture(model)
        model.learn(X[200:], y[200:])  # after the capture: not in the snapshot
        blob = buffer.seal()
        assert bytes(blob) == expected
        clone = GLN.from_bytes(blob)
        assert clone.examples_seen == seen < model.examples_seen
        np.testing.assert_array_equal(clone.learn(X[200:], y[200:]),
                                      GLN.from_bytes(expected).learn(X[200:], y[200:]))


def test_a_snapshot_buffer_refuses_another_layout_and_sealing_nothing():
    model = small_model()
    buffer = SnapshotBuffer(model)
    with pytest.raises(ValueError, match="capture"):
        buffer.seal()
    with pytest.raises(ValueError, match="shape"):
        buffer.capture(small_model(layer_sizes=(5, 1)))
    buffer.capture(model)
    assert bytes(buffer.seal()) == model.to_bytes()


def test_corrupt_or_foreign_bytes_are_rejected():
    blob = small_model().to_bytes()
    with pytest.raises(SnapshotFormatError, match="magic"):
        GLN.from_bytes(b"PK\x03\x04" + blob)
    with pytest.raises(SnapshotFormatError, match="checksum"):
        GLN.from_bytes(blob[:-1] + bytes([blob[-1] ^ 1]))
    with pytest.raises(SnapshotFormatError, match="checksum"):
        GLN.from_bytes(blob[:-8])
    future = blob.replace(b'"version":1', b'"version":9', 1)
    with pytest.raises(SnapshotFormatError, match="version"):
        GLN.from_bytes(future)


@pytest.mark.parametrize("array", ["weights", "moments_total", "normals"])
def test_a_snapshot_holding_nan_or_infinity_is_refused(array):
    """A model loaded with them would answer null probabilities: refused as malformed."""
    model = small_model()
    model.learn(*stream(20))
    target = {"weights": model.weights[0], "moments_total": model.moments.total,
              "normals": model.normals}[array]
    target.reshape(-1)[0] = np.nan if array != "normals" else np.inf
    with pytest.raises(SnapshotFormatError, match="NaN or infinity"):
        GLN.from_bytes(model.to_bytes())


@pytest.mark.parametrize("scale", [2.0**-20, 2.0**20])
def test_the_scale_of_the_features_changes_nothing_learned(scale):
    """Standardising makes a model indifferent to the unit of a feature, down to spreads of
    about 1e-5 here (scaled by a power of two, the rows are exact and so are their z): the
    std floor is far below them. The floor of 1e-3 that was the default hid such features."""
    X, y = stream(500)
    plain, scaled = small_model(), small_model()
    expected = plain.learn(X, y)
    np.testing.assert_array_equal(scaled.learn(X * scale, y), expected)
    np.testing.assert_array_equal(scaled.predict_proba(X[:50] * scale),
                                  plain.predict_proba(X[:50]))
    if scale < 1:
        hidden = small_model(min_std=1e-3)
        assert np.abs(hidden.learn(X * scale, y) - expected).max() > 0.1


@pytest.mark.parametrize("offset", [1e6, 3e7])
def test_a_constant_offset_on_every_feature_changes_nothing_learned(offset):
    """Standardising makes a model indifferent to where a feature's values lie: rows that
    differ by a constant (exactly, in float32) give the same predictions and weights, bit for
    bit, because the running sums are of the rows less the first one learned. Sums of the raw
    rows lost the variance of features around 3e7 to cancellation (a spread of 0)."""
    rng = np.random.default_rng(3)
    X = 2.0 * rng.integers(-50, 51, size=(3000, 6))  # even integers: exact at 3e7 in float32
    y = (X[:, 0] + X[:, 3] > 0).astype(int) + (X[:, 1] > 40)
    plain, shifted = small_model(), small_model()
    expected = plain.learn(X, y)
    np.testing.assert_array_equal(shifted.learn(X + offset, y), expected)
    for a, b in zip(shifted.weights, plain.weights, strict=True):
        np.testing.assert_array_equal(a, b)
    np.testing.assert_array_equal(shifted.predict_proba(X[:50] + offset),
                                  plain.predict_proba(X[:50]))
    np.testing.assert_array_equal(shifted.moments_shift, X[0] + offset)


def test_a_snapshot_from_before_the_shift_loads_with_sums_of_the_rows_themselves():
    """Snapshots written before the running sums were shifted hold no shift: they load with a
    zero one, which is what their sums are of, and learn on as before (checked on a model whose
    first row, hence its shift, is zero, so both layouts hold the same state)."""
    X, y = stream(200)
    X[0] = 0.0
    model = small_model()
    model.learn(X[:100], y[:100])
    older = GLN.from_bytes(without_array(model.to_bytes(), "moments_shift"))
    assert not older.moments_shift.any()
    np.testing.assert_array_equal(older.learn(X[100:], y[100:]), model.learn(X[100:], y[100:]))
    assert older.to_bytes() == model.to_bytes()


def test_a_corrupt_header_is_refused_though_the_payload_is_intact():
    """The payload's checksum does not cover the header, which says how to read the payload:
    a changed digit of the configuration, or an array under another name, would load a
    wrong model. The header's own checksum refuses both (import answers 422)."""
    model = small_model()
    model.learn(*stream(20))
    blob = model.to_bytes()
    start = blob.index(b'"bias":') + len(b'"bias":0.73')
    flipped = blob[:start] + bytes([blob[start] ^ 0x01]) + blob[start + 1:]
    renamed = blob.replace(b'"name":"normals"', b'"name":"offsetx"', 1)
    for corrupt in (flipped, renamed):
        assert corrupt != blob and len(corrupt) == len(blob)
        with pytest.raises(SnapshotFormatError, match="header checksum"):
            GLN.from_bytes(corrupt)
        with pytest.raises(SnapshotFormatError, match="header checksum"):
            GLN.config_of_bytes(corrupt)


def test_config_of_bytes_reads_the_header_alone():
    model = small_model(learning_rate={"schedule": "inverse_time", "scale": 10, "cap": 0.05})
    blob = model.to_bytes()
    assert GLN.config_of_bytes(blob) == model.config
    assert GLN.estimate_nbytes(GLN.config_of_bytes(blob)) == GLN.estimate_nbytes(model.config)
    # The payload is not read: a corrupt one still gives the config (from_bytes refuses it).
    assert GLN.config_of_bytes(blob[:-8]) == model.config
    with pytest.raises(SnapshotFormatError, match="magic"):
        GLN.config_of_bytes(b"not a snapshot")
    with pytest.raises(SnapshotFormatError, match="no configuration"):
        GLN.config_of_bytes(with_header(blob, lambda h: json.dumps({**h, "config": [1]})))


@pytest.mark.parametrize("edit", [
    lambda h: json.dumps({k: v for k, v in h.items() if k != "arrays"}),
    lambda h: json.dumps({**h, "arrays": [{"name": "normals"}]}),
    lambda h: json.dumps({**h, "arrays": 7}),
    lambda h: json.dumps({**h, "arrays": [{**h["arrays"][0], "dtype": "no such dtype"}]}),
    lambda h: json.dumps({**h, "moments_count": "many"}),
    lambda h: json.dumps({**h, "examples_seen": None}),
    lambda h: json.dumps({**h, "examples_seen": 1e400}),  # inf: int() overflows
    lambda h: json.dumps({**h, "examples_seen": -5}),
    lambda h: json.dumps({**h, "examples_seen": 2.7}),
    lambda h: json.dumps({**h, "examples_seen": 10**30}),
    lambda h: json.dumps({**h, "examples_seen": 2**62}),  # the next learn is near overflow
    lambda h: json.dumps({**h, "junk": "x" * (1 << 20)}),  # not parsed at all
    lambda h: json.dumps({**h, "moments_count": -12}),
    lambda h: json.dumps({**h, "moments_count": True}),
    lambda h: json.dumps({**h, "config": "num_features=6"}),
    lambda h: json.dumps(h)[:-1] + ', "deep": ' + "[" * 100_000 + "]" * 100_000 + "}",
], ids=["no-arrays", "array-fields", "arrays-not-a-list", "dtype", "moments", "examples",
        "examples-inf", "examples-negative", "examples-fraction", "examples-huge",
        "examples-2**62", "header-over-1-MiB",
        "moments-negative", "moments-bool", "config", "nested-too-deep"])
def test_a_mangled_header_is_a_format_error(edit):
    """A header is not covered by the checksum: whatever it holds, loading says the blob is
    malformed (never a KeyError, OverflowError or RecursionError)."""
    blob = with_header(small_model().to_bytes(), edit)
    with pytest.raises(SnapshotFormatError):
        GLN.from_bytes(blob)


def test_breast_cancer_single_pass_reaches_93_percent():
    X, y = load_breast_cancer(return_X_y=True)
    order = np.random.default_rng(0).permutation(len(X))
    X, y = X[order], y[order]
    split = int(0.8 * len(X))
    model = GLN(num_features=30, num_classes=2, layer_sizes=(32, 32, 1), context_dim=4,
                learning_rate=0.01, seed=0)
    model.learn(X[:split], y[:split])
    accuracy = (model.predict(X[split:]) == y[split:]).mean()
    assert accuracy >= 0.93


def test_digits_one_vs_all_learns_ten_classes():
    X, y = load_digits(return_X_y=True)
    order = np.random.default_rng(0).permutation(len(X))
    X, y = X[order] / 16.0, y[order]
    model = GLN(num_features=64, num_classes=10, layer_sizes=(32, 1), context_dim=4,
                learning_rate={"schedule": "inverse_time", "scale": 20, "cap": 0.05},
                input_scaling="unit", seed=0)
    model.learn(X[:1400], y[:1400])
    assert (model.predict(X[1400:]) == y[1400:]).mean() >= 0.85


@pytest.mark.parametrize("use_kernels", [True, False])
def test_a_copy_a_pickle_or_a_load_is_the_same_model_and_learns_on_its_own(use_kernels):
    X, y = stream(60)
    model = small_model(use_kernels=use_kernels)
    model.learn(X[:40], y[:40])
    blob = model.to_bytes()
    reference = small_model(use_kernels=use_kernels)
    reference.learn(X[:40], y[:40])
    expected = reference.learn(X[40:], y[40:])
    loaded = GLN.from_bytes(blob, use_kernels=use_kernels)
    for copied in (copy.deepcopy(model), pickle.loads(pickle.dumps(model)), copy.copy(model),
                   loaded):
        assert copied.to_bytes() == blob and copied.use_kernels == use_kernels
        np.testing.assert_array_equal(copied.learn(X[40:], y[40:]), expected)
        assert model.to_bytes() == blob  # the original did not learn with its copy
    with pytest.raises(ValueError, match="callable"):
        copy.deepcopy(small_model(learning_rate=lambda t: 0.01))


def test_warm_up_learns_nothing_and_makes_what_a_short_call_needs():
    X, y = stream(200)
    model = small_model()
    model.learn(X, y)  # long calls only: no 16-bit copy of the normals yet
    blob, held = model.to_bytes(), model.nbytes
    model.warm_up()
    assert model.to_bytes() == blob
    assert held < model.nbytes == GLN.estimate_nbytes(model.config_for_estimate())
    np.testing.assert_array_equal(model.learn(X[:3], y[:3]),
                                  GLN.from_bytes(blob).learn(X[:3], y[:3]))


def test_nbytes_counts_the_weights():
    model = small_model()
    weight_bytes = sum(w.nbytes for w in model.weights)
    assert weight_bytes < model.nbytes < weight_bytes + model.normals.nbytes + 1000
    assert math.isclose(model.bias, 1 / (1 + math.exp(-1)))  # logit(beta) = 1


def test_the_cpu_path_never_imports_cupy():
    """CuPy is an optional extra: learning, predicting and saving on the CPU must not load it."""
    import subprocess
    import sys

    code = (
        "import sys, numpy as np\n"
        "from gln import GLN\n"
        "m = GLN(num_features=3, num_classes=3, layer_sizes=(4, 1), device='cpu')\n"
        "m.learn(np.ones((5, 3)), [0, 1, 2, 0, 1]); m.predict(np.ones((2, 3)))\n"
        "GLN.from_bytes(m.to_bytes()); m.saliency(np.ones((1, 3)))\n"
        "assert 'cupy' not in sys.modules, 'cupy was imported'\n"
    )
    subprocess.run([sys.executable, "-c", code], check=True, timeout=120)


@pytest.mark.parametrize("overrides", [
    {},
    # Rows of 41 and 14 inputs: vectorised loops with remainders, and a layer of 13 neurons
    # (three blocks of four and one neuron alone).
    {"layer_sizes": (13, 7, 1), "num_features": 40},
])
def test_results_do_not_depend_on_the_kernel_thread_count(monkeypatch, overrides):
    """Every kernel call on all threads, then every call on one: the bytes learned (in a long
    call and in single rows) and the predictions are the same."""
    import gln.kernels.cpu as cpu

    d = overrides.get("num_features", 6)
    X, y = stream(200)
    X = np.tile(X, (1, -(-d // 6)))[:, :d] + np.arange(d) * 0.01
    results = []
    for threshold in (0, 10**12):
        monkeypatch.setattr(cpu, "PARALLEL_MIN_WORK", threshold)
        model = small_model(**overrides)
        model.learn(X[:150], y[:150])
        for t in range(150, 160):
            model.learn(X[t:t + 1], y[t:t + 1])
        results.append((model.to_bytes(), model.predict_proba(X[160:]).tobytes()))
    assert results[0] == results[1]


@pytest.mark.parametrize("name", ["pred_clip", "weight_clip", "bias", "offset_scale", "min_std",
                                  "learning_rate"])
def test_numbers_too_large_for_a_float_are_a_clear_value_error(name):
    with pytest.raises(ValueError, match="learning_rate" if name == "learning_rate" else name):
        small_model(**{name: 10**400})
    with pytest.raises(ValueError, match="learning_rate"):
        small_model(learning_rate={"schedule": "inverse_time", "scale": 10**400, "cap": 0.1})


def test_every_value_that_rounds_to_a_finite_float32_is_a_feature():
    """3.4028235e38, float32's largest value as NumPy and most languages print it, is a little
    above it in float64 and rounds to it: a feature. The first value that rounds to infinity,
    as a float or as a Python int, is not."""
    from gln.checks import FLOAT32_OVERFLOW

    largest = float(np.nextafter(FLOAT32_OVERFLOW, 0))
    rows = np.zeros((3, 6))
    rows[0, 0], rows[1, 1], rows[2, 2] = 3.4028235e38, -largest, float(np.finfo(np.float32).max)
    model, labels = small_model(), [0, 1, 2]
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert np.isfinite(model.learn(rows, labels)).all()
        X32 = model.check_input(rows.tolist(), labels)[0]
    assert X32[0, 0] == X32[2, 2] == np.finfo(np.float32).max == -X32[1, 1]
    for too_large in (FLOAT32_OVERFLOW, -FLOAT32_OVERFLOW, int(FLOAT32_OVERFLOW)):
        rows[1, 1] = too_large
        for batch in (rows, rows.tolist()):
            with pytest.raises(ValueError, match=r"fit in float32 .*row 1, column 1"):
                model.check_input(batch)


def test_size_is_known_before_building_and_absurd_sizes_fail_cleanly():
    for config in [dict(num_features=6, num_classes=3, layer_sizes=(8, 4, 1), context_dim=3),
                   dict(num_features=30), dict(num_features=784, num_classes=10,
                                                layer_sizes=(128, 128, 1), context_dim=4)]:
        model = GLN(**config)
        int16_copy = 2 * model.normals.size + 20 * model.normals.shape[0]
        assert GLN.estimate_nbytes(config) == model.nbytes + int16_copy
        model.predict_proba(np.ones((1, config["num_features"])))  # makes the 16-bit copy
        assert GLN.estimate_nbytes(config) == model.nbytes
    with pytest.raises(ValueError, match="bytes"), pytest.warns(UserWarning, match="GiB"):
        GLN(num_features=10**13, num_classes=2, layer_sizes=(1,))  # warned, then refused


def test_the_size_counts_the_blur_matrices_of_image_side_info():
    """Blurred side information holds a (height, height) and a (width, width) matrix: tiny for
    images, but a host must see them before it builds a long thin 'image'."""
    config = dict(num_features=12, num_classes=2, layer_sizes=(4, 1), side_info="per_row",
                  image_shape=(3, 4), side_info_blur=1.0)
    model = GLN(**config)
    model.warm_up()
    assert model.nbytes == GLN.estimate_nbytes(config) == GLN.estimate_nbytes(
        model.config_for_estimate()
    )
    unblurred = GLN.estimate_nbytes({**config, "side_info_blur": 0.0})
    assert GLN.estimate_nbytes(config) - unblurred == 8 * (3 * 3 + 4 * 4)
    thin = dict(config, num_features=60_000, image_shape=(1, 60_000))
    assert GLN.estimate_nbytes(thin) > 8 * 60_000**2  # sized, not allocated
    with pytest.raises(ValueError, match="image_shape"):
        GLN.estimate_nbytes(dict(config, image_shape=(3, 5)))


def test_a_reference_model_runs_none_of_the_compiled_passes(monkeypatch):
    """``use_kernels=False`` is the array code that the kernels are checked against: it must not
    lean on them, or a fault in one would go unseen by the comparison."""
    import gln.kernels.cpu as cpu_kernels  # noqa: PLC0415
    import gln.kernels.cpu_gating as cpu_gating  # noqa: PLC0415
    import gln.kernels.cpu_scaling as cpu_scaling  # noqa: PLC0415

    def refuse(*args, **kwargs):
        raise AssertionError("a compiled pass ran for a use_kernels=False model")

    for module, name in ((cpu_scaling, "cpu_moments_before_each_row"),
                         (cpu_scaling, "cpu_standardize"), (cpu_kernels, "cpu_layer_pass"),
                         (cpu_gating, "CpuLayerContexts")):
        monkeypatch.setattr(module, name, refuse)
    X, y = stream(40)
    reference = small_model(use_kernels=False)
    reference.learn(X, y)
    assert reference.predict_proba(X).shape == (40, 3)
    with pytest.raises(AssertionError, match="compiled pass"):
        small_model().learn(X, y)
