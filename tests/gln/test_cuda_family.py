"""A family of models on the GPU (``GLNFamily(device="cuda")``): each member ends byte for byte
where a GPU model of its own that learned its rows alone would, and a layer over a chunk of
many members' rows is one launch. Runs on a GPU and on the emulated device (``conftest.py``).
"""

import numpy as np
import pytest

from gln import GLN, GLNFamily
from tests.gln.test_family import CONFIGS, config_of, rows

GIVEN = dict(num_classes=2, learning_rate=0.05, side_info="given", side_info_size=3)


def interleaved_members(rng, n, size):
    """Rows of every member but the last (which learns none), in shuffled order, the first
    member's several times in a row."""
    members = rng.integers(0, size - 1, n)
    members[:4] = 0
    return members


def assert_members_are_gpu_models_alone(family, config, X, y, members, probs, side=None):
    """Each member's snapshot, prequential probabilities and predictions (of a few rows, and
    of more than a warp's share of one member's rows) are those of a GPU model alone."""
    probe = X[:40]
    for member in range(family.size):
        mine = np.flatnonzero(members == member)
        model = GLN(**config)
        own_side = None if side is None else side[mine]
        expected = (model.learn(X[mine], y[mine], side_info=own_side) if len(mine)
                    else np.zeros((0, config["num_classes"])))
        assert family.member_bytes(member) == model.to_bytes()
        assert family.member(member).to_bytes() == model.to_bytes()
        assert probs[mine].tobytes() == expected.tobytes()
        probe_side = None if side is None else side[:len(probe)]
        predicted = family.predict_proba(probe, [member] * len(probe), side_info=probe_side)
        assert predicted.tobytes() == model.predict_proba(probe, side_info=probe_side).tobytes()


@pytest.mark.parametrize("name", sorted(CONFIGS))
def test_each_member_learns_its_rows_as_a_gpu_model_alone_would(cp, name):
    config = config_of(name, device="cuda")
    rng = np.random.default_rng(5)
    X, y = rows(rng, config, 45)
    members = interleaved_members(rng, len(X), 4)
    family = GLNFamily(4, **config)
    assert isinstance(family.member(0).weights[0], cp.ndarray)
    probs = np.concatenate([family.learn(X[:30], y[:30], members[:30]),
                            family.learn(X[30:], y[30:], members[30:])])
    assert_members_are_gpu_models_alone(family, config, X, y, members, probs)


def test_chunks_longer_than_the_gpus_chunk_and_given_side_information(cp, monkeypatch):
    """A call cut into several chunks, with rows of given side information (the density
    model's members)."""
    import gln.family  # noqa: PLC0415

    monkeypatch.setattr(gln.family, "CHUNK_ROWS_GPU", 16)
    config = dict(num_features=4, layer_sizes=(5, 1), context_dim=2, seed=3, **GIVEN,
                  device="cuda")
    rng = np.random.default_rng(6)
    X, y = rng.normal(2.0, 1.0, (50, 4)), rng.integers(0, 2, 50)
    side = rng.normal(0, 1, (50, 3)).astype(np.float32)
    members = interleaved_members(rng, len(X), 3)
    family = GLNFamily(3, **config)
    probs = family.learn(X, y, members, side_info=side)
    assert_members_are_gpu_models_alone(family, config, X, y, members, probs, side)


def test_a_member_equals_a_model_whose_long_call_took_another_kernel(cp):
    """A model alone learns a member's 280 rows with the row kernel (from
    ``ROW_WARPS_MIN_ROWS``), the family with its own: every kernel gives the same bytes."""
    config = config_of("three-classes-scheduled-standardize", device="cuda")
    rng = np.random.default_rng(12)
    X, y = rows(rng, config, 300)
    members = np.where(rng.random(300) < 0.07, 1, 0)
    assert (members == 0).sum() >= 256
    family = GLNFamily(2, **config)
    probs = family.learn(X, y, members)
    assert_members_are_gpu_models_alone(family, config, X, y, members, probs)


def test_the_array_code_on_the_gpu_gives_a_gpu_models_array_code_bytes(cp):
    config = config_of("three-classes-scheduled-standardize", device="cuda", use_kernels=False)
    rng = np.random.default_rng(7)
    X, y = rows(rng, config, 12)
    members = interleaved_members(rng, len(X), 3)
    family = GLNFamily(3, **config)
    probs = family.learn(X, y, members)
    assert_members_are_gpu_models_alone(family, config, X, y, members, probs)


def test_rows_wider_than_a_lanes_registers_take_the_wide_kernel(cp, monkeypatch):
    """The family's wide kernel, as a model's (``MAX_INPUTS`` lowered: both take it)."""
    import gln.kernels.cuda as cuda  # noqa: PLC0415

    monkeypatch.setattr(cuda, "MAX_INPUTS", 4)
    launches = count_family_launches(monkeypatch)
    config = config_of("binary-constant-standardize", device="cuda")
    rng = np.random.default_rng(8)
    X, y = rows(rng, config, 20)
    members = interleaved_members(rng, len(X), 3)
    family = GLNFamily(3, **config)
    probs = family.learn(X, y, members)
    assert launches[cuda.FAMILY_WIDE] > 0
    assert_members_are_gpu_models_alone(family, config, X, y, members, probs)


def count_family_launches(monkeypatch):
    """Launches of the family's layer kernels by name, counted as they are made."""
    import collections  # noqa: PLC0415

    import gln.kernels.cuda as cuda  # noqa: PLC0415

    launches = collections.Counter()
    layer_kernel = cuda._layer_kernel

    def counted(lanes, name, defines=()):
        kernel = layer_kernel(lanes, name, defines)
        if name not in (cuda.FAMILY, cuda.FAMILY_WIDE):
            return kernel

        def launch(*args, **kwargs):
            launches[name] += 1
            return kernel(*args, **kwargs)

        return launch

    monkeypatch.setattr(cuda, "_layer_kernel", counted)
    return launches


@pytest.mark.parametrize("learning", [True, False], ids=["learn", "predict"])
def test_a_layer_over_a_chunk_of_many_members_is_one_launch(cp, monkeypatch, learning):
    import gln.kernels.cuda as cuda  # noqa: PLC0415

    config = config_of("four-classes-constant-unit", device="cuda")
    rng = np.random.default_rng(9)
    X, y = rows(rng, config, 60)
    members = rng.integers(0, 20, 60)
    family = GLNFamily(20, **config)
    launches = count_family_launches(monkeypatch)
    before = dict(getattr(cp, "operations", {}))
    if learning:
        family.learn(X, y, members)
    else:
        family.predict_proba(X, members)
    layers = len(config["layer_sizes"])
    assert launches == {cuda.FAMILY: layers}
    if hasattr(cp, "operations"):  # the emulated device counts every launch
        ran = {name: count - before.get(name, 0) for name, count in cp.operations.items()}
        assert ran["kernel gln_family_layer_pass"] == layers
        assert ran.get("kernel gln_family_running_moments", 0) == int(learning)


def test_members_move_between_gpu_families_and_models(cp):
    """``from_models``, ``set_member``, ``with_capacity`` and ``member`` on the GPU: models with
    histories of their own learn on in a family as they would alone."""
    config = config_of("binary-scheduled-unit", device="cuda")
    rng = np.random.default_rng(10)
    X, y = rows(rng, config, 30)
    models = [GLN(**config) for _ in range(3)]
    for index, model in enumerate(models):
        model.learn(X[:5 * index], y[:5 * index])
    family = GLNFamily.from_models([models[0], models[1].to_bytes(), models[2]])
    room = GLNFamily.with_capacity(3, **config)
    for index in range(3):
        room.set_member(index, family.member_bytes(index))
    members = np.tile([2, 0, 1], 10)
    for stacked in (family, room):
        stacked.learn(X, y, members)
    for index, model in enumerate(models):
        model.learn(X[members == index], y[members == index])
        assert family.member_bytes(index) == room.member_bytes(index) == model.to_bytes()
        assert family.member(index).to_bytes() == model.to_bytes()


def test_a_learning_chunk_must_be_grouped_by_member(cp):
    from gln.kernels.cuda import member_runs  # noqa: PLC0415

    with pytest.raises(ValueError, match="grouped by member"):
        member_runs(np.array([0, 1, 0]), learning=True)
    runs = member_runs(np.array([0, 0, 1]), learning=True)
    assert (runs.count, runs.longest, runs.host_members.tolist()) == (2, 2, [0, 1])
    assert member_runs(np.zeros(0, np.int64), learning=True).count == 0
    predicting = member_runs(np.zeros(70, np.int64), learning=False)  # a warp's share a run
    assert (predicting.count, predicting.host_members.tolist()) == (3, [0, 0, 0])
    assert predicting.starts.get().tolist() == [0, 32, 64, 70]


def test_a_member_served_alone_learns_in_the_gpu_familys_arrays(cp):
    """``FamilyMember`` on a GPU family: the single model's code (short calls replayed from
    their graphs) on views of the member's arrays, between the family's own calls."""
    from gln import FamilyMember  # noqa: PLC0415

    config = config_of("three-classes-scheduled-standardize", device="cuda")
    rng = np.random.default_rng(11)
    X, y = rows(rng, config, 24)
    family = GLNFamily(3, **config)
    tenant, model = FamilyMember(family, 1), GLN(**config)
    for start in range(0, 24, 3):
        rows_here = slice(start, start + 3)
        assert (tenant.learn(X[rows_here], y[rows_here]).tobytes()
                == model.learn(X[rows_here], y[rows_here]).tobytes())
        family.learn(X[rows_here], y[rows_here], [0, 2, 0])
    assert tenant.to_bytes() == family.member_bytes(1) == model.to_bytes()


def test_a_density_model_on_the_gpu_is_each_pixels_gpu_model_alone(cp):
    """``gln.density`` on a GPU family ("unit" inputs, given side information): every
    pixel's model as a GPU model of that pixel alone learns it, in one call of more rows
    than a short call's (they travel as float32), and each image's nats as those give them."""
    from gln.density import ContextCounts, GLNDensity, pixel_rows  # noqa: PLC0415
    from tests.gln.test_density import CONFIG, SHAPE, images  # noqa: PLC0415

    data = images(70, seed=3)
    density = GLNDensity(SHAPE, **CONFIG, device="cuda")
    online = np.concatenate([density.learn(data[:2]), density.learn(data[2:])])
    side, labels, members = pixel_rows(data, SHAPE)
    base = ContextCounts(SHAPE).predictions(data, learn=True)
    expected = np.zeros(len(data))
    for pixel in range(SHAPE[0] * SHAPE[1]):
        mine = members == pixel
        alone = GLN(**density.family.config)
        probs = alone.learn(base[mine], labels[mine], side_info=side[mine])
        assert density.family.member_bytes(pixel) == alone.to_bytes(), pixel
        expected -= np.log(probs[np.arange(len(data)), labels[mine]])
    np.testing.assert_allclose(online, expected, rtol=1e-12)  # summed in another order
