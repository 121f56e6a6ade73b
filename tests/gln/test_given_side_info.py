"""Side information given with each row: it gates, the rows are the base predictions."""

import numpy as np
import pytest

from gln import GLN, GLNFamily
from gln.network import with_bias

SIDE = 7


def given_model(**overrides):
    config = dict(num_features=3, layer_sizes=(5, 4, 1), context_dim=2, learning_rate=0.05,
                  input_scaling="unit", side_info="given", side_info_size=SIDE, seed=2)
    config.update(overrides)
    return GLN(**config)


def stream(n=120, seed=0):
    rng = np.random.default_rng(seed)
    X = rng.random((n, 3))
    Z = rng.normal(0, 1, (n, SIDE))
    y = ((Z[:, 0] > 0) ^ (X[:, 0] > 0.5)).astype(int)
    return X, Z, y


def test_the_side_information_picks_the_contexts_and_the_rows_are_what_is_mixed(monkeypatch):
    """Each layer pass sees the contexts of the given side information and layer 1 mixes the
    logits of the rows, not of the side information."""
    import gln.kernels as kernels

    X, Z, _ = stream(10)
    seen = []
    original = kernels.reference_layer_pass

    def recording(xp):
        inner = original(xp)

        def layer_pass(weights, contexts, inputs, *rest):
            seen.append((contexts.copy(), inputs.copy()))
            inner(weights, contexts, inputs, *rest)

        return layer_pass

    monkeypatch.setattr(kernels, "reference_layer_pass", recording)
    model = given_model(use_kernels=False)
    model.predict_proba(X, side_info=Z)
    contexts, inputs = seen[0]
    z32 = Z.astype(np.float32).astype(np.float64)
    bits = (z32 @ model.normals.T.astype(np.float64)) >= model.offsets
    expected = (bits[:, :10].reshape(10, 5, 2) * [1, 2]).sum(axis=2)  # layer 1: 5 neurons
    assert np.array_equal(contexts[:, 0, :], expected)
    p0 = np.clip(X, 0.01, 0.99)
    logits = np.log(p0 / (1 - p0))[:, None, :].astype(np.float32)
    assert np.allclose(inputs, with_bias(np, logits, model._config.bias_logit, False),
                       atol=1e-6)


def test_other_side_information_changes_the_gating_and_not_the_mixed_inputs():
    X, Z, y = stream()
    first, second = given_model(), given_model()
    before = first.predict_proba(X, side_info=Z)
    # Before learning every weight is 1/K: outputs depend on the rows alone, not the gating.
    assert np.array_equal(before, second.predict_proba(X, side_info=-Z))
    # Learning the same rows under other side information lands in other weights.
    assert not np.array_equal(first.learn(X, y, side_info=Z), second.learn(X, y, side_info=-Z))
    assert first.to_bytes() != second.to_bytes()
    # The same side information with other rows: the same contexts, other mixed inputs.
    other = given_model()
    assert not np.array_equal(other.learn(1 - X, y, side_info=Z), before)


def test_the_side_information_alone_can_carry_the_label():
    """A label that the rows know nothing of is learned from the side information, through the
    gating alone."""
    rng = np.random.default_rng(1)
    n = 3000
    Z = rng.normal(0, 1, (n, SIDE))
    y = (Z[:, 0] > 0).astype(int)
    X = np.full((n, 3), 0.5)
    model = given_model(layer_sizes=(8, 1), context_dim=4, offset_scale=0.05)
    probs = model.learn(X, y, side_info=Z)
    late = probs[-1000:]
    assert -np.log(late[np.arange(1000), y[-1000:]]).mean() < 0.4  # chance: ln 2 = 0.69


def test_chunked_learning_and_snapshots_stay_byte_identical():
    X, Z, y = stream()
    whole, single = given_model(), given_model()
    p_whole = whole.learn(X, y, side_info=Z)
    p_single = np.concatenate([single.learn(X[i:i + 1], y[i:i + 1], side_info=Z[i:i + 1])
                               for i in range(len(X))])
    assert p_whole.tobytes() == p_single.tobytes()
    assert whole.to_bytes() == single.to_bytes()
    again = GLN.from_bytes(whole.to_bytes())
    assert again.config["side_info_size"] == SIDE and again.normals.shape[1] == SIDE
    assert again.predict_proba(X, side_info=Z).tobytes() == whole.predict_proba(
        X, side_info=Z).tobytes()
    assert GLN(**whole.config).config == whole.config
    again.warm_up()  # a row of zeros with side information of zeros: learns nothing
    assert again.to_bytes() == whole.to_bytes()
    assert again.predict_names(X[:3], side_info=Z[:3]).tolist() == again.predict(
        X[:3], side_info=Z[:3]).tolist()


@pytest.mark.parametrize("use_kernels", [True, False], ids=["kernels", "array-code"])
def test_a_family_with_side_information_per_row_learns_as_its_members_alone(use_kernels):
    X, Z, y = stream(90, seed=3)
    members = np.random.default_rng(4).integers(0, 3, len(X))
    config = dict(num_features=3, layer_sizes=(5, 4, 1), context_dim=2, learning_rate=0.05,
                  input_scaling="unit", side_info="given", side_info_size=SIDE, seed=2,
                  use_kernels=use_kernels)
    family = GLNFamily(3, **config)
    probs = family.learn(X, y, members, side_info=Z)
    for member in range(3):
        mine = members == member
        alone = GLN(**config)
        assert alone.learn(X[mine], y[mine], side_info=Z[mine]).tobytes() == probs[mine].tobytes()
        assert family.member_bytes(member) == alone.to_bytes()
        assert (family.predict_proba(X[:4], [member] * 4, side_info=Z[:4]).tobytes()
                == alone.predict_proba(X[:4], side_info=Z[:4]).tobytes())


def test_the_window_of_a_given_image_is_that_of_the_side_information():
    model = given_model(side_info_size=16, image_shape=(4, 4), gating_window=2)
    assert model.normals.shape[1] == 16
    assert ((model.normals != 0).sum(axis=1) == 4).all()
    with pytest.raises(ValueError, match="height \\* width = 16"):
        given_model(side_info_size=16, image_shape=(1, 3), gating_window=1)


def test_the_estimate_counts_the_hyperplanes_in_the_side_informations_space():
    small, wide = given_model(side_info_size=2), given_model(side_info_size=200)
    assert GLN.estimate_nbytes(wide.config_for_estimate()) > GLN.estimate_nbytes(
        small.config_for_estimate())
    assert GLN.estimate_nbytes(wide.config_for_estimate()) >= wide.nbytes


@pytest.mark.parametrize("overrides, message", [
    (dict(side_info_size=0), "side_info_size must be >= 1 with side_info='given'"),
    (dict(side_info="scaled"), "side_info_size must be >= 1 with side_info='given'"),
    (dict(side_info_size=-1), "side_info_size"),
])
def test_bad_configurations_are_refused(overrides, message):
    with pytest.raises(ValueError, match=message):
        given_model(**overrides)


def test_bad_side_information_is_refused_before_anything_is_learned():
    model = given_model()
    X, Z, y = stream(5)
    fresh = model.to_bytes()
    with pytest.raises(ValueError, match="needs side_info"):
        model.learn(X, y)
    with pytest.raises(ValueError, match="side_info: each row must have 7"):
        model.learn(X, y, side_info=Z[:, :3])
    with pytest.raises(ValueError, match="one row per row of X"):
        model.learn(X, y, side_info=Z[:4])
    bad = Z.copy()
    bad[2, 1] = np.nan
    with pytest.raises(ValueError, match="side_info: .*row 2, column 1 is nan"):
        model.learn(X, y, side_info=bad)
    with pytest.raises(ValueError, match="needs side_info"):
        model.predict_proba(X)
    assert model.to_bytes() == fresh
    with pytest.raises(ValueError, match="makes its own from the rows"):
        GLN(num_features=3).learn(X, y, side_info=Z)


def test_a_cuda_model_takes_given_side_information_as_the_cpu_model_does(cp):
    """On the GPU path (a GPU, or the emulated device): the CPU model's results, and a chunk
    equal to its rows one call at a time (given side information is not replayed)."""
    X, Z, y = stream(60, seed=5)
    cpu, chunked, rows = (given_model(device=d) for d in ("cpu", "cuda", "cuda"))
    assert isinstance(chunked.normals, cp.ndarray)
    learned = chunked.learn(X, y, side_info=Z)
    one_by_one = np.concatenate([rows.learn(X[t:t + 1], y[t:t + 1], side_info=Z[t:t + 1])
                                 for t in range(len(X))])
    np.testing.assert_array_equal(one_by_one, learned)
    assert rows.to_bytes() == chunked.to_bytes()
    np.testing.assert_allclose(learned, cpu.learn(X, y, side_info=Z), atol=1e-4)
    np.testing.assert_allclose(chunked.predict_proba(X, side_info=Z),
                               cpu.predict_proba(X, side_info=Z), atol=1e-4)
