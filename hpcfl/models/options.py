"""The model zoo's options and the input shapes each model accepts, without torch.

Reading a job (``hpcfl config``, ``--help``, ``hpcfl report``) needs every model's option
dataclass and nothing that builds a network, so they live here and the model modules
(:mod:`hpcfl.models.simple`, ``cnn``, ``vgg``, ``resnet``, ``rnn``, ``quadratic``) import
them. A shape check takes (options, input_shape) and returns None when the shape fits, else
a short reason ("needs an image shape ..."); :mod:`hpcfl.models` turns that into a
ConfigError listing the models that fit, by calling each check with default options.
"""

from __future__ import annotations

from dataclasses import dataclass, field

# ---- shared: shape checks, normalisation ---------------------------------------------------

def any_shape(opts, input_shape: tuple[int, ...]) -> str | None:
    """Models that flatten their input accept every shape."""
    return None


def image_at_least(min_hw: int):
    """Shape check for (C, H, W) inputs with ``H, W >= min_hw``."""

    def check(opts, input_shape: tuple[int, ...]) -> str | None:
        if len(input_shape) != 3 or min(input_shape[1:]) < min_hw:
            return f"needs an image shape (C, H, W) with H, W >= {min_hw}"
        return None

    return check


NORMS = ("none", "batch", "group")


def groups_problem(norm: str, groups: int, widths: tuple[int, ...]) -> list[str]:
    """Cross-field check shared by options with ``norm`` and ``groups`` fields."""
    bad = [w for w in widths if w % groups]
    if norm == "group" and bad:
        return [f"groups = {groups} must divide every layer width {sorted(set(widths))}"]
    return []


# ---- logreg, mlp, fedlga_mlp (simple.py) ---------------------------------------------------

ACTIVATIONS = ("relu", "tanh")   # simple.py maps each to its torch module
# "default": torch's nn.Linear init (Kaiming-uniform with a=sqrt(5); uniform bias).
# "he_normal": every layer W ~ N(0, 2/fan_in), b = 0 (He et al. 2015; the FedDisco digits check).
# "he_lecun": hidden layers W ~ N(0, 2/fan_in), output layer W ~ N(0, 1/fan_in), b = 0
#   (W1 ~ N(0, 2/D), W2 ~ N(0, 1/H), zero biases: the MLP of the FedGSNR GMM-10 checks).
MLP_INITS = ("default", "he_normal", "he_lecun")


@dataclass(frozen=True)
class LogRegOptions:
    """Options of ``logreg``.

    init : "default" keeps torch's nn.Linear init; "zeros" starts at W = 0, b = 0 (the
        problem is convex, so a zero start is common; it ignores the seed).
    """

    init: str = field(default="default", metadata={
        "choices": ("default", "zeros"),
        "help": "default: torch's nn.Linear init; zeros: W = 0, b = 0 (ignores the seed)"})


@dataclass(frozen=True)
class MlpOptions:
    """Options of ``mlp``.

    hidden : widths of the hidden layers, input side first; () gives logistic regression.
    activation : nonlinearity after every hidden layer.
    init : see ``MLP_INITS`` above. The MLPs of our small-scale checks are all
        expressible here: the FedDisco digits check's MLP 64 -> 32 (ReLU) -> 10 with
        He-normal init is hidden=[32], init="he_normal"; the FedGSNR GMM-10 check's
        MLP 20 -> 64 -> 10 (and a 32 -> 64 -> 10 MLP) is hidden=[64], init="he_lecun".
    """

    hidden: tuple[int, ...] = field(default=(200,), metadata={
        "gt": 0, "help": "widths of the hidden layers, input side first; []: logistic regression"})
    activation: str = field(default="relu", metadata={
        "choices": ACTIVATIONS,
        "help": "nonlinearity after every hidden layer"})
    init: str = field(default="default", metadata={
        "choices": MLP_INITS, "help": "default: torch's nn.Linear init; he_normal: W ~ N(0, 2/fan_in), b = 0; "
                                      "he_lecun: the same but N(0, 1/fan_in) for the output layer"})


@dataclass(frozen=True)
class FedlgaMlpOptions(MlpOptions):
    """Options of ``fedlga_mlp``: ``mlp`` with the 400 hidden units of FedLGA's MLP (Li et al.)."""

    hidden: tuple[int, ...] = field(default=(400,), metadata={
        "gt": 0, "help": "widths of the hidden layers, input side first (FedLGA: [400])"})


# ---- lenet5, simple_cnn (cnn.py) -----------------------------------------------------------

#: Smallest H or W for which the second pooling still leaves a 1x1 map:
#: ((16 - 4) // 2 - 4) // 2 = 1.
LENET_MIN_SIDE = 16
lenet_fits = image_at_least(LENET_MIN_SIDE)


@dataclass(frozen=True)
class LeNet5Options:
    """LeNet-5 has no options: the papers fix the architecture."""


# ---- vgg11, vgg16 (vgg.py) -----------------------------------------------------------------

VGG_WIDTHS = (64, 128, 256, 512)

#: Five 2x2 pools: the input must be at least 32 on each side to keep a 1x1 map.
vgg_fits = image_at_least(32)


@dataclass(frozen=True)
class Vgg11Options:
    """Options of ``vgg11`` (FedNova's VGG-11, Wang et al. 2020).

    head : "mlp" is Dropout -> FC 512 -> ReLU -> Dropout -> FC 512 -> ReLU -> FC C (FedMA /
        FedNova code); "linear" is a single FC C on the flattened conv output.
    dropout : drop probability of the two Dropout layers of the "mlp" head (unused by
        "linear"). Dropout draws random masks in train mode: per-sample gradients with
        torch.func.vmap need ``randomness="different"`` or dropout = 0.
    norm : "none" (default, per-sample-gradient safe), "batch" (adds float running-stat
        buffers) or "group" (GroupNorm with ``groups`` groups) after every conv.
    groups : GroupNorm groups; must divide 64.
    """

    head: str = field(default="mlp", metadata={
        "choices": ("mlp", "linear"),
        "help": "classifier: mlp = Dropout, FC 512, ReLU, Dropout, FC 512, ReLU, FC C (FedNova); linear = one FC"})
    dropout: float = field(default=0.5, metadata={
        "ge": 0.0, "lt": 1.0, "help": "drop probability of the mlp head's two Dropout layers (unused by linear)"})
    norm: str = field(default="none", metadata={
        "choices": NORMS, "help": "after every conv: none, batch (adds running-stat buffers) or group (GroupNorm)"})
    groups: int = field(default=32, metadata={"gt": 0, "help": "GroupNorm groups for norm = 'group'; must divide 64"})

    def validate(self) -> list[str]:
        return groups_problem(self.norm, self.groups, VGG_WIDTHS)


@dataclass(frozen=True)
class Vgg16Options(Vgg11Options):
    """Options of ``vgg16`` (the FedGSNR paper's VGG-16); as ``vgg11`` but the default head is "linear".

    GIFT's VGG-16 (Chen et al. 2023) is ``norm = "batch"`` with the default head.
    """

    head: str = field(default="linear", metadata={
        "choices": ("mlp", "linear"),
        "help": "classifier: linear = one FC (the default here); mlp = FedNova's FC 512-512 head"})


# ---- resnet18 (resnet.py) ------------------------------------------------------------------

RESNET_WIDTHS = (64, 128, 256, 512)   # resnet.py's stage widths
#: Total downsampling is 8 with the CIFAR stem, 32 with the ImageNet stem; the input
#: must be at least that large to reach the 512-channel stage with a non-empty map.
RESNET_MIN_SIDE = {"cifar": 8, "imagenet": 32}


@dataclass(frozen=True)
class ResNet18Options:
    """Options of ``resnet18``.

    norm : "group" (default; FedDisco), "batch" (adds float running-stat buffers;
        breaks per-sample gradients in train mode) or "none".
    groups : GroupNorm groups, 2 as in FedDisco; must divide 64.
    stem : "cifar" (3x3 stride-1 conv, no max-pool) or "imagenet" (7x7 stride-2 conv and
        3x3 stride-2 max-pool, torchvision's stem; FedLGA).
    zero_init_residual : start every residual branch at zero, so each block is the
        identity at init (the last norm's weight = 0; with norm = "none", the second
        conv's weight = 0). Worth trying with norm = "none", where activations otherwise
        grow by about sqrt(2) per block at init (nothing rescales the residual sums).
    """

    norm: str = field(default="group", metadata={
        "choices": NORMS, "help": "group (FedDisco), batch (adds running-stat buffers; breaks per-sample gradients) "
                                  "or none"})
    groups: int = field(default=2, metadata={
        "gt": 0, "help": "GroupNorm groups for norm = 'group' (2 in FedDisco); must divide 64"})
    stem: str = field(default="cifar", metadata={
        "choices": tuple(RESNET_MIN_SIDE),
        "help": "cifar: 3x3 stride-1 conv, no max-pool; imagenet: 7x7 stride-2 conv and 3x3 stride-2 max-pool "
                "(FedLGA)"})
    zero_init_residual: bool = field(default=False, metadata={
        "help": "start every residual branch at zero, so every block is the identity at init"})

    def validate(self) -> list[str]:
        return groups_problem(self.norm, self.groups, RESNET_WIDTHS)


def resnet_fits(opts: ResNet18Options, input_shape: tuple[int, ...]) -> str | None:
    """Shape check; the minimum side depends on ``opts.stem``."""
    problem = image_at_least(RESNET_MIN_SIDE[opts.stem])(opts, input_shape)
    return problem and f"{problem} when model.resnet18.stem = {opts.stem!r}"


# ---- kws_lstm (rnn.py) ---------------------------------------------------------------------

@dataclass(frozen=True)
class KwsLstmOptions:
    """Options of ``kws_lstm``.

    hidden : LSTM hidden size (64 in GIFT).
    layers : stacked LSTM layers (2 in GIFT).
    """

    hidden: int = field(default=64, metadata={"gt": 0, "help": "LSTM hidden size (64 in GIFT)"})
    layers: int = field(default=2, metadata={"gt": 0, "help": "stacked LSTM layers (2 in GIFT)"})


def lstm_fits(opts, input_shape: tuple[int, ...]) -> str | None:
    """Accept (T, F) sequences: T frames of F features each."""
    if len(input_shape) == 2:
        return None
    return "needs a sequence shape (T, F): T frames of F features"


# ---- char_lstm (rnn.py) --------------------------------------------------------------------

@dataclass(frozen=True)
class CharLstmOptions:
    """Options of ``char_lstm`` (LEAF's Shakespeare model, Caldas et al. 2018).

    embed_dim : size of the character embedding (8 in LEAF).
    hidden : LSTM hidden size (256 in LEAF).
    layers : stacked LSTM layers (2 in LEAF).
    vocab_size : embedding rows; 0: num_classes (next-character prediction: the inputs' ids and
        the classes are one vocabulary). Every input id must be below it.
    """

    embed_dim: int = field(default=8, metadata={"gt": 0, "help": "character embedding size (8 in LEAF)"})
    hidden: int = field(default=256, metadata={"gt": 0, "help": "LSTM hidden size (256 in LEAF)"})
    layers: int = field(default=2, metadata={"gt": 0, "help": "stacked LSTM layers (2 in LEAF)"})
    vocab_size: int = field(default=0, metadata={
        "ge": 0, "help": "embedding rows, above every input id; 0: num_classes (inputs and labels share the "
                         "vocabulary)"})


def char_fits(opts, input_shape: tuple[int, ...]) -> str | None:
    """Accept (T,) sequences of character ids."""
    if len(input_shape) == 1:
        return None
    return "needs a sequence of character ids, shape (T,) (data.leaf or data.tff with features = 'chars')"


# ---- quadratic (quadratic.py) --------------------------------------------------------------

@dataclass(frozen=True)
class QuadraticModelOptions:
    init: float = field(default=0.0, metadata={
        "help": "starting value of every coordinate of x (GIFT's toy: -100; its noisy quadratics: -20)"})


def fits_quadratic(opts, input_shape) -> str | None:
    if len(input_shape) == 1 or (len(input_shape) == 2 and input_shape[0] == 3):
        return None
    return "needs the quadratic dataset's inputs: rows e of shape (dim,), or [c; h; n] of shape (3, dim)"
