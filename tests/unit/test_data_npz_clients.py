"""``npz`` with natural clients: ``client`` (n,) and ``client_test`` (n_test,) integer ids, mapped in
ascending order to clients 0..K-1, each client's own test rows (hand-checked)."""

import numpy as np
import pytest

from hpcfl import data
from hpcfl.config import options
from hpcfl.errors import DataError


def load(path, **opts):
    o = options.build(data.dataset_options("npz"), {"file": str(path), **opts}, "data.npz")
    return data.load_dataset("npz", o, None, 0)


IDS = np.array([7, 3, 7, 3, 9, 7, 3, 9])


def test_client_ids_in_ascending_order_and_their_own_test_rows(tmp_path):
    x = np.stack([IDS, np.arange(8)], axis=1).astype(np.float32)
    np.savez(tmp_path / "d.npz", x=x, y=np.arange(8) % 3, x_test=np.zeros((3, 2)), y_test=np.array([0, 1, 2]),
             client=IDS, client_test=np.array([9, 5, 3]))
    ds = load(tmp_path / "d.npz")
    # ids 3, 7, 9 are clients 0, 1, 2; test id 5 is no client's
    assert [list(c) for c in ds.natural_clients] == [[1, 3, 6], [0, 2, 5], [4, 7]]
    assert [list(t) for t in ds.natural_test] == [[2], [], [0]]
    parts = data.make_partition("natural", ds.y_train, 3, None, 0, ds)
    assert [list(p) for p in parts] == [[1, 3, 6], [0, 2, 5], [4, 7]]
    np.savez(tmp_path / "e.npz", x=x, y=np.arange(8) % 3, x_test=np.zeros((3, 2)), y_test=np.array([0, 1, 2]),
             client=IDS)
    ds = load(tmp_path / "e.npz")
    assert len(ds.natural_clients) == 3 and ds.natural_test is None


def test_the_seeded_held_out_rows_keep_their_clients(tmp_path):
    ids = np.repeat([40, 10, 30, 20], 10)
    x = np.stack([ids, np.arange(40)], axis=1).astype(np.float32)
    np.savez(tmp_path / "d.npz", x=x, y=np.arange(40) % 4, client=ids)
    ds = load(tmp_path / "d.npz", test_fraction=0.25)
    assert len(ds.y_train) == 30 and len(ds.y_test) == 10
    for i, cid in enumerate([10, 20, 30, 40]):
        assert (ds.x_train[ds.natural_clients[i], 0] == cid).all()
        assert (ds.x_test[ds.natural_test[i], 0] == cid).all()
    seen = np.concatenate([ds.x_train[:, 1], ds.x_test[:, 1]])
    assert sorted(seen.tolist()) == list(range(40))
    assert sum(len(t) for t in ds.natural_test) == 10 and sum(len(c) for c in ds.natural_clients) == 30


@pytest.mark.parametrize("arrays, message", [
    ({"client": np.arange(5)}, (r"client has dtype int64 and shape \(5,\); expected one integer client id per "
                                r"row, shape \(4,\)")),
    ({"client": np.zeros(4)}, r"client has dtype float64"),
    ({"client_test": np.zeros(2, int), "x_test": np.zeros((2, 2)), "y_test": np.zeros(2, int)},
     r"lacks client \(client_test names"),
    ({"client": np.zeros(4, int), "client_test": np.zeros(2, int)}, r"lacks x_test"),
])
def test_malformed_client_arrays_are_refused(tmp_path, arrays, message):
    np.savez(tmp_path / "d.npz", x=np.zeros((4, 2)), y=np.zeros(4, int), **arrays)
    with pytest.raises(DataError, match=r"d\.npz:? .*" + message):
        load(tmp_path / "d.npz")
