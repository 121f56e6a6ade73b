"""The MNIST benchmark script end to end on a small generated data set in IDX files."""

import json

import numpy as np

from benchmarks import mnist_online
from tests.benchmarks.test_mnist_data import write_idx


def test_one_pass_ends_with_a_json_line_of_the_documented_fields(tmp_path, capsys):
    rng = np.random.default_rng(0)
    for split, n in (("train", 120), ("t10k", 40)):
        labels = rng.integers(0, 10, n)
        images = rng.integers(0, 40, (n, 28, 28))
        for digit in range(10):  # a bright square whose place encodes the label
            rows = labels == digit
            images[rows, 2 * digit:2 * digit + 8, 6:14] = 255
        write_idx(tmp_path / f"{split}-images-idx3-ubyte", images, False)
        write_idx(tmp_path / f"{split}-labels-idx1-ubyte", labels, False)
    result = mnist_online.main(["--data-dir", str(tmp_path), "--deskew", "--layer-sizes",
                                "16,1", "--batch", "50"])
    printed = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert printed == result
    assert result["n_train"] == 120 and result["n_test"] == 40 and result["deskew"] is True
    assert result["config"]["gating_window"] == 10 and result["config"]["side_info"] == "per_row"
    assert 0.0 <= result["prequential_accuracy"] <= 1.0 and result["examples_per_second"] > 0
    assert result["test_accuracy"] > 0.3  # ten classes: chance is 0.1
