"""The row kernel's chain lengths, read off a model's contexts on generated IDX data."""

import numpy as np

from benchmarks import context_chains
from tests.benchmarks.test_mnist_data import write_idx


def test_a_neurons_longest_chain_is_its_most_common_contexts_count():
    contexts = np.array([[[0, 1]], [[0, 3]], [[2, 3]], [[0, 3]]])  # (n=4, G=1, K=2)
    np.testing.assert_array_equal(context_chains.longest_chains(contexts, 4), [[3, 3]])


def test_the_rows_finish_when_the_busiest_slot_does():
    # Two slots: 2 | 2, then 3 after either (5); longest first: 3 | 2, then 2 after 2 (4).
    assert context_chains.finish_time(np.array([2, 2, 3]), 2) == 5
    assert context_chains.finish_time(np.array([3, 2, 2]), 2) == 4
    assert context_chains.finish_time(np.array([3, 3]), 1) == 6


def test_each_layer_gets_a_line_whose_chains_lie_between_the_mean_and_the_chunk(tmp_path,
                                                                                capsys):
    rng = np.random.default_rng(0)
    images = rng.integers(0, 256, (300, 28, 28))
    write_idx(tmp_path / "train-images-idx3-ubyte", images, False)
    write_idx(tmp_path / "train-labels-idx1-ubyte", rng.integers(0, 10, 300), False)
    records = context_chains.main(["--data-dir", str(tmp_path), "--rows", "160",
                                   "--learned", "100"])
    assert [r["layer"] for r in records] == [0, 1, 2]
    for r in records:
        assert r["rows"] == 160 and r["mean_examples_per_row"] == 10
        assert 10 <= r["longest_chain_median"] <= r["longest_chain_p90"]
        assert r["longest_chain_p90"] <= r["longest_chain_max"] <= 160
        assert r["longest_chain_max"] <= r["finish_longest_first"] <= r["finish_natural_order"]
    assert len(capsys.readouterr().out.splitlines()) == 3
