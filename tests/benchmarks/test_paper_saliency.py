"""The paper's saliency script end to end on a small generated data set in IDX files."""

import json

import numpy as np
import pytest

from benchmarks.paper import saliency
from tests.benchmarks.test_mnist_data import write_idx


@pytest.fixture
def digits_dir(tmp_path):
    """Ten classes of noise with a bright bar whose place encodes the label; a 3-pixel border
    is 0 in every image (MNIST's never-seen frame)."""
    rng = np.random.default_rng(0)
    for split, n in (("train", 200), ("t10k", 60)):
        labels = np.arange(n) % 10
        images = np.zeros((n, 28, 28), dtype=np.int64)
        images[:, 3:25, 3:25] = rng.integers(0, 40, (n, 22, 22))
        for digit in range(10):
            images[labels == digit, 4 + 2 * digit:6 + 2 * digit, 6:22] = 255
        write_idx(tmp_path / f"{split}-images-idx3-ubyte", images, False)
        write_idx(tmp_path / f"{split}-labels-idx1-ubyte", labels, False)
    return tmp_path


def test_writes_the_figure_and_a_json_line_of_the_similarity_figures(digits_dir, tmp_path,
                                                                     capsys):
    pytest.importorskip("matplotlib")
    figure = tmp_path / "out" / "saliency.png"
    result = saliency.main(["--data-dir", str(digits_dir), "--per-class", "4",
                            "--figure", str(figure)])
    assert json.loads(capsys.readouterr().out.strip().splitlines()[-1]) == result
    assert figure.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert result["n_train"] == 200 and result["maps_per_class"] == 4
    config = result["config"]
    assert (config["layer_sizes"], config["context_dim"], config["learning_rate"]) == (
        [50, 25, 1], 4, 0.01)
    for key in ("map_correlation", "digit_correlation", "contribution_correlation"):
        assert set(result[key]) == {"within_class", "between_classes"}
        assert all(-1.0 <= v <= 1.0 for v in result[key].values())
    # The border is 0 in every training image: 28 * 28 - 22 * 22 pixels, flat on every map.
    assert result["frame"]["pixels"] == 300
    assert result["frame"]["spread_on_frame"] < 1e-9 < result["frame"]["spread_on_seen"]


def test_without_a_figure_needs_no_matplotlib(digits_dir, capsys):
    result = saliency.main(["--data-dir", str(digits_dir), "--per-class", "2",
                            "--input-scaling", "standardize", "--figure", "none"])
    assert result["figure"] is None and result["config"]["input_scaling"] == "standardize"
    assert result["frame"]["spread_on_frame"] < 1e-9


def test_maps_and_correlations_on_known_rows():
    groups = np.array([0, 0, 1, 1])
    rows = np.array([[1.0, 2, 3], [2, 4, 6], [3, 2, 1], [1, 2, 3]])
    got = saliency.pairwise_correlation(rows, groups)
    assert got["within_class"] == pytest.approx(0.0)  # pairs (0,1): 1 and (2,3): -1
    assert got["between_classes"] == pytest.approx(0.0)  # 1, -1, -1, 1
