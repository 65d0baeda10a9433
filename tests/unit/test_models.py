"""Model zoo: parameter counts, shapes, shape errors, deterministic init, init laws."""

from __future__ import annotations

import functools
import math

import pytest
import torch
from torch import nn
from torch.func import functional_call, grad, vmap

from hpcfl.config import options
from hpcfl.errors import ConfigError
from hpcfl.models import MODELS, ModelSpec, build_model, model_options

CIFAR = (3, 32, 32)
FMNIST = (1, 28, 28)
DIGITS = (1, 8, 8)
SYNTH = (60,)
FLAT64 = (64,)
SEQ = (101, 40)  # 101 frames of 40 MFCCs (keyword spotting, as for GIFT's LSTM)
SHAPES = (CIFAR, FMNIST, DIGITS, SYNTH, FLAT64, SEQ)

# Written out by hand (not derived from the code's fits()) so the test can disagree.
FITS = {
    "logreg": {CIFAR, FMNIST, DIGITS, SYNTH, FLAT64, SEQ},
    "mlp": {CIFAR, FMNIST, DIGITS, SYNTH, FLAT64, SEQ},
    "fedlga_mlp": {CIFAR, FMNIST, DIGITS, SYNTH, FLAT64, SEQ},
    "lenet5": {CIFAR, FMNIST},
    "simple_cnn": {CIFAR, FMNIST},
    "vgg11": {CIFAR},
    "vgg16": {CIFAR},
    "resnet18": {CIFAR, FMNIST, DIGITS},
    "kws_lstm": {SEQ},
    "char_lstm": {SYNTH, FLAT64},   # (T,) character ids
    "quadratic": {SYNTH, FLAT64},  # any flat shape: x has the targets' dimension
}


def make(name, shape, num_classes=10, seed=0, **table):
    """Build through the same path as the engine: options.build, seed, build_model."""
    opts = options.build(model_options(name), table, "model")
    torch.manual_seed(seed)
    return build_model(name, opts, shape, num_classes)


@functools.lru_cache(maxsize=None)
def _shared(name, shape, num_classes, items):
    return make(name, shape, num_classes, **dict(items))


def shared(name, shape, num_classes=10, **table):
    """Like :func:`make`, but cached: building the big models dominates the run time.

    Callers must not change the model (no training steps, no grads, no train-mode BN).
    """
    items = tuple(sorted((k, tuple(v) if isinstance(v, list) else v) for k, v in table.items()))
    model = _shared(name, shape, num_classes, items)
    return model.eval()


def first_shape(name):
    """CIFAR where the model takes it, else the model's smallest supported shape."""
    return CIFAR if CIFAR in FITS[name] else sorted(FITS[name])[0]


def sample(name, shape, batch=2):
    """A batch the model takes: character ids (as floats) for char_lstm, Gaussian inputs otherwise."""
    if name == "char_lstm":
        return torch.randint(0, 10, (batch, *shape)).float()
    return torch.randn(batch, *shape)


def count(model: nn.Module) -> int:
    return sum(p.numel() for p in model.parameters())


def test_registry_covers_expected_models():
    assert set(MODELS) == set(FITS)
    for name, spec in MODELS.items():
        assert isinstance(spec, ModelSpec)
        assert spec.doc and "\n" not in spec.doc and "et al." in spec.doc, name   # one line citing its source
        spec.options()  # every field has a default


# VGG conv stacks, each conv k*k*cin*cout + cout (3x3 everywhere):
#   3->64 1,792; 64->64 36,928; 64->128 73,856; 128->128 147,584; 128->256 295,168;
#   256->256 590,080; 256->512 1,180,160; 512->512 2,359,808.
# VGG-11 (A): 1,792 + 73,856 + 295,168 + 590,080 + 1,180,160 + 3 * 2,359,808 = 9,220,480
# VGG-16 (D): 1,792 + 36,928 + 73,856 + 147,584 + 295,168 + 2 * 590,080 + 1,180,160
#             + 5 * 2,359,808 = 14,714,688
# "mlp" head: 2 * (512 * 512 + 512) = 525,312, then 512 * C + C.
# VGG-16 BN: 2 * (2*64 + 2*128 + 3*256 + 6*512) = 8,448 affine parameters.
# ResNet-18, CIFAR stem, per stage (convs without bias; every norm has 2*width params):
#   stem 3*64*9 + 128 = 1,856; stage1 4 * 36,864 + 4 * 128 = 147,968;
#   stage2 73,728 + 147,456 + 8,192 (1x1 proj) + 2 * 147,456 + 5 * 256 = 525,568;
#   stage3 294,912 + 589,824 + 32,768 + 2 * 589,824 + 5 * 512 = 2,099,712;
#   stage4 1,179,648 + 2,359,296 + 131,072 + 2 * 2,359,296 + 5 * 1,024 = 8,393,728;
#   sum 11,168,832, plus FC 512 * C + C.
# ResNet-18 norm none: drop 9,600 norm params, add 4,800 conv biases (one per out channel
#   of 20 convs: 64 + 4*64 + 5*128 + 5*256 + 5*512).
# ImageNet stem: 7*7*3*64 = 9,408 instead of 3*3*3*64 = 1,728.
COUNTS = [
    ("logreg", SYNTH, 10, {}, 60 * 10 + 10),  # 610: W in R^{60x10}, b in R^10 (FedNova's Synthetic(1,1))
    ("mlp", DIGITS, 10, {}, 64 * 200 + 200 + 200 * 10 + 10),  # 15,010
    ("mlp", DIGITS, 10, {"hidden": [32]}, 64 * 32 + 32 + 32 * 10 + 10),  # 2,410: the FedDisco digits check
    ("mlp", (20,), 10, {"hidden": [64]}, 1_994),  # 20*64 + 64 + 64*10 + 10 = 1,994 (FedGSNR GMM-10 check)
    ("mlp", FMNIST, 10, {"hidden": [200, 200]}, 784 * 200 + 200 + 200 * 200 + 200 + 2010),
    ("fedlga_mlp", FMNIST, 10, {}, 784 * 400 + 400 + 400 * 10 + 10),  # 318,010
    # LeNet-5: conv 3*6*25+6 = 456, conv 6*16*25+16 = 2,416, FC 400*120+120 = 48,120,
    # FC 120*84+84 = 10,164, FC 84*10+10 = 850.
    ("lenet5", CIFAR, 10, {}, 62_006),  # FedGSNR's and GIFT's LeNet-5
    ("simple_cnn", CIFAR, 10, {}, 62_006),
    # 1x28x28: conv 1*6*25+6 = 156, flatten 16*4*4 = 256 -> FC 256*120+120 = 30,840.
    ("lenet5", FMNIST, 10, {}, 156 + 2_416 + 30_840 + 10_164 + 850),  # 44,426
    ("simple_cnn", FMNIST, 10, {}, 44_426),
    ("vgg11", CIFAR, 10, {}, 9_750_922),  # FedNova's VGG-11: 9,220,480 + 525,312 + 5,130
    ("vgg11", CIFAR, 10, {"head": "linear"}, 9_220_480 + 5_130),
    ("vgg16", CIFAR, 100, {}, 14_765_988),  # 14,714,688 + 51,300 (FedGSNR's VGG-16)
    ("vgg16", CIFAR, 100, {"head": "mlp"}, 15_291_300),  # + 525,312 (FedMA-style head)
    ("vgg16", CIFAR, 10, {"norm": "batch"}, 14_728_266),  # + 8,448 + 5,130 (GIFT's VGG-16 with BN)
    ("vgg16", CIFAR, 10, {"norm": "group"}, 14_728_266),  # GN has the same affine params
    ("resnet18", CIFAR, 10, {}, 11_168_832 + 5_130),  # 11,173,962
    ("resnet18", CIFAR, 100, {}, 11_168_832 + 51_300),  # 11,220,132
    ("resnet18", CIFAR, 10, {"norm": "batch"}, 11_173_962),
    ("resnet18", CIFAR, 10, {"norm": "none"}, 11_173_962 - 9_600 + 4_800),
    ("resnet18", CIFAR, 10, {"stem": "imagenet"}, 11_173_962 - 1_728 + 9_408),
    # LSTM layer: 4 gates * (H*(F+H) + 2*H): 4*(64*104 + 128) = 27,136 and
    # 4*(64*128 + 128) = 33,280; FC 64*10+10 = 650 (61,066 in all).
    ("kws_lstm", SEQ, 10, {}, 27_136 + 33_280 + 650),
    # LEAF's Shakespeare LSTM over its 80 characters: embedding 80*8 = 640, LSTM 4*(256*(8+256) + 2*256)
    # = 272,384 and 4*(256*512 + 512) = 526,336, FC 256*80+80 = 20,560 (819,920 in all)
    ("char_lstm", (80,), 80, {}, 640 + 272_384 + 526_336 + 20_560),
    # 90 embedding rows (720), 81 classes (FC 20,817); 1 layer of 32 units over 4 dims: 4*(32*36 + 64) = 4,864
    ("char_lstm", (80,), 81, {"vocab_size": 90}, 720 + 798_720 + 20_817),
    ("char_lstm", (20,), 10, {"hidden": 32, "layers": 1, "embed_dim": 4}, 40 + 4_864 + 330),
]


@pytest.mark.parametrize("name,shape,classes,table,expected", COUNTS)
def test_parameter_count(name, shape, classes, table, expected):
    assert count(shared(name, shape, classes, **table)) == expected


CLASSIFIERS = sorted(set(FITS) - {"quadratic"})  # quadratic is an objective, not a classifier


@pytest.mark.parametrize("name", CLASSIFIERS)
def test_output_shape_on_every_fitting_shape(name):
    for shape in sorted(FITS[name]):
        model = shared(name, shape)  # eval mode: forward == fc(features) needs no dropout
        x = sample(name, shape)
        logits, feats = model(x), model.features(x)
        assert logits.shape == (2, 10), (name, shape)
        assert torch.isfinite(logits).all()
        assert feats.shape == (2, model.feature_dim)
        assert torch.equal(logits, model.fc(feats))


@pytest.mark.parametrize(
    "name", ["logreg", "mlp", "fedlga_mlp", "lenet5", "simple_cnn", "kws_lstm", "char_lstm"]
)
def test_num_classes_sets_the_output_width(name):
    # The big models are covered by the 100-class parameter counts above.
    shape = first_shape(name)
    model = make(name, shape, num_classes=12) if name == "char_lstm" else make(name, shape, num_classes=3)
    assert model(sample(name, shape)).shape == (2, 12 if name == "char_lstm" else 3)


@pytest.mark.parametrize("name", sorted(FITS))
def test_misfit_shape_raises_config_error(name):
    for shape in SHAPES:
        if shape in FITS[name]:
            continue
        with pytest.raises(ConfigError) as err:
            make(name, shape)
        msg = str(err.value)
        assert "model.name" in msg and repr(name) in msg and str(shape) in msg
        listed = msg.split(f"Models that fit {shape}: ")[1].split(", ")
        assert set(listed) == {n for n in FITS if shape in FITS[n]}


def test_lenet5_on_digits_names_the_models_that_fit():
    with pytest.raises(ConfigError) as err:
        make("lenet5", DIGITS)
    msg = str(err.value)
    assert "(1, 8, 8)" in msg and "H, W >= 16" in msg
    assert "mlp" in msg and "resnet18" in msg and "vgg11" not in msg


def test_lenet5_keeps_the_parameter_paths_of_the_unfused_stack():
    """ReLU and pooling are one layer now; the parameters keep the paths they had as positions 0
    and 3 of Conv, ReLU, MaxPool, Conv, ... so results files written before still load."""
    model = make("lenet5", CIFAR)
    assert [n for n, _ in model.named_parameters()] == [
        "conv.0.weight", "conv.0.bias", "conv.3.weight", "conv.3.bias", "mlp.0.weight", "mlp.0.bias",
        "mlp.2.weight", "mlp.2.bias", "fc.weight", "fc.bias"]


def test_vgg_keeps_the_parameter_paths_of_the_unfused_stack():
    """VGG's ReLU + "M" pairs are fused too; the names stay those of Conv, [norm,] ReLU, MaxPool."""
    plain = make("vgg11", CIFAR)
    convs = [0, 3, 6, 8, 11, 13, 16, 18]
    assert [n for n, _ in plain.named_parameters()][: 2 * len(convs)] == [
        f"conv.{i}.{w}" for i in convs for w in ("weight", "bias")]
    normed = make("vgg11", CIFAR, norm="batch")   # Conv, BN, ReLU per width: 3 positions, +1 per "M"
    assert [n for n, _ in normed.named_parameters()][:6] == [
        "conv.0.weight", "conv.0.bias", "conv.1.weight", "conv.1.bias", "conv.4.weight", "conv.4.bias"]
    assert "conv.5.running_mean" in normed.state_dict()


def test_resnet_imagenet_stem_needs_32_pixels():
    shared("resnet18", CIFAR, stem="imagenet")
    with pytest.raises(ConfigError, match=r"model\.resnet18\.stem = 'imagenet'"):
        make("resnet18", FMNIST, stem="imagenet")


def test_quadratic_objective_by_hand():
    # x starts at 0; targets e = [[1, 2], [3, -1]]: mean of 1/2 ||x - e||^2 = (5/2 + 10/2) / 2 = 3.75
    model = make("quadratic", FLAT64[:0] + (2,))
    e = torch.tensor([[1.0, 2.0], [3.0, -1.0]])
    assert torch.equal(model(e), e) and model.loss(model(e), None).item() == 3.75
    assert [n for n, _ in model.named_parameters()] == ["x"] and count(model) == 2


@pytest.mark.parametrize("name", CLASSIFIERS)
def test_init_is_deterministic_given_the_seed(name):
    shape = first_shape(name)
    a, b = shared(name, shape), make(name, shape, seed=0)
    c = make(name, shape, seed=1)
    sa, sb = a.state_dict(), b.state_dict()
    assert sa.keys() == sb.keys()
    for key in sa:
        assert torch.equal(sa[key], sb[key]), key
    assert any(not torch.equal(pa, pc) for pa, pc in zip(a.parameters(), c.parameters()))


def _kurtosis(w: torch.Tensor) -> float:
    z = (w - w.mean()) / w.std()
    return float(z.pow(4).mean())


@pytest.mark.parametrize("name", ["vgg11", "vgg16"])
def test_vgg_conv_init_is_he_fan_out_normal(name):
    model = shared(name, CIFAR)
    convs = [m for m in model.modules() if isinstance(m, nn.Conv2d)]
    assert len(convs) == (8 if name == "vgg11" else 13)
    for conv in convs:
        assert torch.count_nonzero(conv.bias) == 0
        w = conv.weight.detach().double()
        if conv.out_channels < 128:
            continue  # too few weights (< 40k) for a tight check
        target = math.sqrt(2.0 / (9 * conv.out_channels))
        # >= 73,728 weights: the sample std is within ~0.3% of the truth at 1 sigma.
        assert w.std().item() == pytest.approx(target, rel=0.02)
        assert abs(w.mean().item()) < 0.02 * target
        if conv is convs[-1]:  # one 512-channel layer (2.4M weights) is plenty
            # Kurtosis 3 for a normal; 1.8 would mean a uniform draw.
            assert _kurtosis(w) == pytest.approx(3.0, abs=0.05)


def test_vgg11_linear_layers_keep_torch_default_init():
    model = shared("vgg11", CIFAR)
    for lin in [m for m in model.modules() if isinstance(m, nn.Linear)]:
        bound = 1 / math.sqrt(lin.in_features)  # torch default: U(-bound, bound) for W and b
        assert lin.weight.abs().max() <= bound and lin.bias.abs().max() <= bound
        assert lin.weight.abs().max() > 0.9 * bound


def test_vgg11_head_layout_and_dropout_option():
    model = make("vgg11", CIFAR, dropout=0.25)
    kinds = [type(m).__name__ for m in model.mlp] + [type(model.fc).__name__]
    assert kinds == ["Dropout", "Linear", "ReLU", "Dropout", "Linear", "ReLU", "Linear"]
    assert all(m.p == 0.25 for m in model.mlp if isinstance(m, nn.Dropout))


def test_default_models_have_no_batchnorm_and_no_buffers():
    for name, shapes in FITS.items():
        model = shared(name, first_shape(name))
        batch_norms = nn.modules.batchnorm._BatchNorm
        assert not any(isinstance(m, batch_norms) for m in model.modules()), name
        assert list(model.buffers()) == [], name


def test_resnet_default_is_groupnorm_with_two_groups():
    norms = [m for m in shared("resnet18", CIFAR).modules() if isinstance(m, nn.GroupNorm)]
    assert len(norms) == 20  # stem 1 + 16 in blocks + 3 projection shortcuts
    assert all(n.num_groups == 2 for n in norms)


@pytest.mark.parametrize("name", ["vgg16", "resnet18"])
def test_batch_norm_buffers_are_float_running_stats_only(name):
    shape = (3, 8, 8) if name == "resnet18" else CIFAR  # small input: faster forward
    model = make(name, shape, norm="batch")
    buffers = dict(model.named_buffers())
    assert buffers and all(k.endswith(("running_mean", "running_var")) for k in buffers)
    assert all(b.dtype == torch.float32 for b in buffers.values())
    before = {k: b.clone() for k, b in buffers.items()}
    model.train()
    model(torch.randn(4, *shape))  # updating running stats must work without the counter
    assert any(not torch.equal(before[k], b) for k, b in model.named_buffers())
    assert set(model.state_dict()) == {k for k, _ in model.named_parameters()} | set(buffers)


def test_mlp_he_inits():
    he = make("mlp", FMNIST, 100, hidden=[512], init="he_normal")
    mixed = make("mlp", FMNIST, 100, hidden=[512], init="he_lecun")
    for model, out_gain in ((he, 2.0), (mixed, 1.0)):
        hidden, out = model.body[1], model.fc
        assert hidden.weight.std().item() == pytest.approx(math.sqrt(2 / 784), rel=0.02)
        assert out.weight.std().item() == pytest.approx(math.sqrt(out_gain / 512), rel=0.02)
        assert torch.count_nonzero(hidden.bias) == 0 and torch.count_nonzero(out.bias) == 0


def test_mlp_flattens_and_uses_the_activation():
    model = make("mlp", DIGITS, hidden=[16, 8], activation="tanh")
    assert [type(m).__name__ for m in model.body] == ["Flatten", "Linear", "Tanh", "Linear", "Tanh"]
    assert model.body[1].in_features == 64
    x = torch.randn(3, *DIGITS)
    assert torch.equal(model(x), model(x.reshape(3, 64)))  # same weights, pre-flattened


def test_logreg_zero_init():
    model = make("logreg", SYNTH, init="zeros")
    assert all(torch.count_nonzero(p) == 0 for p in model.parameters())


@pytest.mark.parametrize("norm,zeroed", [("group", "norm2"), ("none", "conv2")])
def test_resnet_zero_init_residual(norm, zeroed):
    model = make("resnet18", DIGITS, norm=norm, zero_init_residual=True)
    blocks = [m for m in model.modules() if type(m).__name__ == "BasicBlock"]
    assert len(blocks) == 8
    assert all(torch.count_nonzero(getattr(b, zeroed).weight) == 0 for b in blocks)


@pytest.mark.parametrize(
    "name,shape", [("lenet5", CIFAR), ("resnet18", (3, 8, 8)), ("mlp", DIGITS)]
)
def test_per_sample_gradients_with_vmap_match_single_backward(name, shape):
    """The default (BN-free) models support torch.func per-sample gradients."""
    model = make(name, shape)
    params = {k: p.detach() for k, p in model.named_parameters()}

    def loss(p, x, y):
        return nn.functional.cross_entropy(functional_call(model, p, (x[None],)), y[None])

    x, y = torch.randn(2, *shape), torch.tensor([3, 7])
    per_sample = vmap(grad(loss), in_dims=(None, 0, 0))(params, x, y)
    nn.functional.cross_entropy(model(x[1:2]), y[1:2]).backward()
    for key, p in model.named_parameters():
        torch.testing.assert_close(per_sample[key][1], p.grad, rtol=1e-3, atol=1e-5)  # fp32 sums


def test_unknown_model_name_lists_valid_names():
    with pytest.raises(ConfigError) as err:
        model_options("vgg19")
    msg = str(err.value)
    assert "model.name = 'vgg19'" in msg
    assert all(name in msg for name in MODELS)
    with pytest.raises(ConfigError, match="vgg19"):
        build_model("vgg19", None, CIFAR, 10)


def test_option_errors_name_the_key():
    with pytest.raises(ConfigError, match=r"unknown key model\.dropuot; did you mean model\.dropout\?"):
        options.build(model_options("vgg11"), {"dropuot": 0.1}, "model")
    with pytest.raises(ConfigError, match=r"model\.norm = 'layer' is not valid"):
        options.build(model_options("resnet18"), {"norm": "layer"}, "model")
    with pytest.raises(ConfigError, match=r"groups = 3 must divide"):
        options.build(model_options("resnet18"), {"groups": 3}, "model")
    with pytest.raises(ConfigError, match=r"model\.hidden = 0 must be greater than 0"):
        options.build(model_options("mlp"), {"hidden": [64, 0]}, "model")
    with pytest.raises(ConfigError, match=r"model\.dropout = 1\.0 must be less than 1"):
        options.build(model_options("vgg16"), {"dropout": 1.0}, "model")
    # groups only matter for GroupNorm
    options.build(model_options("resnet18"), {"groups": 3, "norm": "none"}, "model")


def test_fedlga_mlp_defaults_to_400_hidden_units():
    assert model_options("fedlga_mlp")().hidden == (400,)
    assert model_options("mlp")().hidden == (200,)


def test_wrong_options_type_is_a_programming_error():
    with pytest.raises(TypeError):
        build_model("vgg11", model_options("vgg16")(), CIFAR, 10)
    with pytest.raises(ValueError):
        build_model("mlp", model_options("mlp")(), CIFAR, 0)


def test_grad_into_equals_grad_and_reuses_one_buffer():
    """The training loop's gradient (no per-step allocation) is bitwise the fresh one, also
    after ``zero_grad`` dropped the views and with a batch-norm model's buffers after the parameters."""
    import torch.nn.functional as F

    from hpcfl.params import FlatModel

    torch.manual_seed(0)
    net = nn.Sequential(nn.Linear(5, 4), nn.BatchNorm1d(4), nn.ReLU(), nn.Linear(4, 3))
    m = FlatModel(net, torch.device("cpu"), torch.float64)
    x, y = torch.randn(7, 5, dtype=torch.float64), torch.randint(0, 3, (7,))
    want = m.grad(F.cross_entropy(m.module(x), y))
    first = m.grad_into(F.cross_entropy(m.module(x), y))
    assert torch.equal(first, want) and first.numel() == m.num_params
    again = m.grad_into(F.cross_entropy(m.module(2 * x), y))
    assert again.data_ptr() == first.data_ptr()                   # the same buffer, overwritten
    assert torch.equal(again, m.grad(F.cross_entropy(m.module(2 * x), y)))
    m.module.zero_grad()                                          # sets every .grad to None
    assert torch.equal(m.grad_into(F.cross_entropy(m.module(x), y)), want)


def test_char_lstm_reads_float_ids_as_the_embedding_rows_they_name():
    model = make("char_lstm", (6,), 80)
    ids = torch.tensor([[0, 79, 3, 3, 12, 45], [1, 2, 3, 4, 5, 6]])
    out = model(ids.double().float())
    emb = model.embed.weight[ids]                   # the rows the ids pick, by hand
    h, _ = model.lstm(emb)
    assert torch.equal(out, model.fc(h[:, -1]))
    assert model.embed.weight.shape == (80, 8) and model.lstm.hidden_size == 256 and model.lstm.num_layers == 2
    assert [n for n, _ in model.named_buffers()] == []                      # nothing but float parameters
    assert not torch.equal(out[0], model(ids[1:].float())[0])
    with pytest.raises(ConfigError, match=r"char_lstm.*needs a sequence of character ids, shape \(T,\)"):
        make("char_lstm", SEQ)
