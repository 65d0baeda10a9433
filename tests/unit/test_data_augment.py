"""augment_batch (crop with padding + horizontal flip) and normalize_images."""

import numpy as np
import pytest
import torch

from hpcfl.data.augment import augment_batch, normalize_images


def gen(seed):
    g = torch.Generator()
    g.manual_seed(seed)
    return g


def batch(b=16, c=3, h=8, w=8):
    return torch.arange(b * c * h * w, dtype=torch.float32).reshape(b, c, h, w)


def test_deterministic_and_shape_preserving():
    x = batch()
    a = augment_batch(x, gen(1))
    assert a.shape == x.shape and a.dtype == x.dtype
    assert torch.equal(a, augment_batch(x, gen(1)))
    assert not torch.equal(a, augment_batch(x, gen(2)))
    assert torch.equal(x, batch()), "input untouched"


def test_flip_actually_flips():
    x = batch(b=64)
    out = augment_batch(x, gen(0), pad=0)
    flipped = [torch.equal(out[i], x[i].flip(-1)) for i in range(64)]
    same = [torch.equal(out[i], x[i]) for i in range(64)]
    assert all(f or s for f, s in zip(flipped, same))
    assert 16 < sum(flipped) < 48  # p = 0.5
    # the coins are the third draw: B row offsets, B column offsets, then B uniforms
    g = gen(0)
    torch.randint(0, 1, (64,), generator=g)
    torch.randint(0, 1, (64,), generator=g)
    coins = torch.rand(64, generator=g) < 0.5
    assert flipped == coins.tolist()
    assert torch.equal(augment_batch(x, gen(0), pad=0, flip=False), x)


def test_every_output_is_a_padded_window_possibly_flipped():
    x = batch(b=12, c=2, h=6, w=5) + 1  # nonzero so the zero padding is visible
    out = augment_batch(x, gen(3), pad=2)
    padded = torch.nn.functional.pad(x, (2, 2, 2, 2))
    offsets = set()
    for i in range(12):
        hits = [(dy, dx, f) for dy in range(5) for dx in range(5) for f in (0, 1)
                if torch.equal(out[i], (lambda v: v.flip(-1) if f else v)(padded[i, :, dy:dy + 6, dx:dx + 5]))]
        assert hits, f"image {i} is not a crop of its padded self"
        offsets.add(hits[0][:2])
    assert len(offsets) > 3


def test_fill_value_per_channel():
    x = torch.zeros(32, 3, 4, 4)
    out = augment_batch(x, gen(0), pad=4, fill=[1.0, 2.0, 3.0])
    vals = {c: set(out[:, c].unique().tolist()) for c in range(3)}
    assert vals[0] <= {0.0, 1.0} and vals[1] <= {0.0, 2.0} and vals[2] <= {0.0, 3.0}
    assert 1.0 in vals[0]


def test_rejects_wrong_rank():
    with pytest.raises(ValueError, match="B, C, H, W"):
        augment_batch(torch.zeros(3, 4, 4), gen(0))


def test_normalize_images():
    x = np.array([[[[0, 255]], [[51, 102]]]], dtype=np.uint8)  # (1, 2, 1, 2)
    out = normalize_images(x, (0.5, 0.2), (0.5, 0.4))
    assert out.dtype == np.float32
    np.testing.assert_allclose(out[0, 0, 0], [-1.0, 1.0], atol=1e-6)
    np.testing.assert_allclose(out[0, 1, 0], [0.0, 0.5], atol=1e-6)


def test_padding_fill_is_black_after_normalisation():
    from hpcfl.data.augment import padding_fill

    mean, std = (0.4914, 0.4822, 0.4465), (0.2023, 0.1994, 0.2010)
    black = normalize_images(np.zeros((1, 3, 1, 1), np.uint8), mean, std)[0, :, 0, 0]
    np.testing.assert_allclose(padding_fill(mean, std), black, rtol=1e-6)
