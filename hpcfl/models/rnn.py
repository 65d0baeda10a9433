"""Recurrent classifiers: ``kws_lstm`` over feature frames, ``char_lstm`` over character ids.

GIFT (Chen et al. 2023) trains keyword spotting on Speech Commands with an LSTM of 2
recurrent layers and hidden size 64. The paper does not give the input features or the
head; we choose 40 MFCC / log-mel features per frame and the last hidden state ->
Linear(64, 10). With 40 input features and 10 classes that is 61,066 parameters.

LEAF's Shakespeare model (Caldas et al. 2018) predicts the next character of 80: an 8-dim
embedding of every character, a 2-layer LSTM of 256 units and a linear layer on the top
layer's last output. Over LEAF's 80 characters that is 819,920 parameters: embedding
80 x 8 = 640, LSTM 4 x 256 x (8 + 256 + 2) = 272,384 and 4 x 256 x (256 + 256 + 2) =
526,336 (torch keeps two bias vectors per layer), linear 256 x 80 + 80 = 20,560.
"""

from __future__ import annotations

import torch
from torch import nn

from ._common import ZooModel
from .options import CharLstmOptions, KwsLstmOptions
from .options import lstm_fits as fits  # noqa: F401


class KwsLstm(ZooModel):
    """Stacked LSTM over time; the top layer's last output feeds a linear layer.

    Parameters
    ----------
    input_shape : (T, F)
    num_classes : int
    opts : KwsLstmOptions
    """

    def __init__(self, input_shape: tuple[int, ...], num_classes: int, opts: KwsLstmOptions):
        super().__init__()
        n_features = input_shape[1]
        self.lstm = nn.LSTM(n_features, opts.hidden, num_layers=opts.layers, batch_first=True)
        self.feature_dim = opts.hidden
        self.fc = nn.Linear(opts.hidden, num_classes)

    def features(self, x: torch.Tensor) -> torch.Tensor:
        """(B, T, F) -> (B, hidden): top-layer output after the last frame (= h_T)."""
        out, _ = self.lstm(x)
        return out[:, -1]


def build_kws_lstm(opts: KwsLstmOptions, input_shape: tuple[int, ...], num_classes: int) -> KwsLstm:
    """Build the KWS LSTM; the registry has checked the shape."""
    return KwsLstm(input_shape, num_classes, opts)


class CharLstm(ZooModel):
    """Character embedding, stacked LSTM, and a linear layer on the last step's output.

    Parameters
    ----------
    input_shape : (T,)
        T character ids per row, stored as floats (the engine's inputs are float tensors).
    num_classes : int
    opts : CharLstmOptions

    The embedding draws N(0, 1) and the LSTM and linear layers torch's uniform init, all from
    torch's global RNG; the only state is float parameters (no integer buffer).
    """

    def __init__(self, input_shape: tuple[int, ...], num_classes: int, opts: CharLstmOptions):
        super().__init__()
        self.vocab_size = opts.vocab_size or num_classes
        self.embed = nn.Embedding(self.vocab_size, opts.embed_dim)
        self.lstm = nn.LSTM(opts.embed_dim, opts.hidden, num_layers=opts.layers, batch_first=True)
        self.feature_dim = opts.hidden
        self.fc = nn.Linear(opts.hidden, num_classes)

    def features(self, x: torch.Tensor) -> torch.Tensor:
        """(B, T) ids as floats -> (B, hidden): the top layer's output after the last character."""
        out, _ = self.lstm(self.embed(x.long()))   # float ids are exact integers: the cast loses nothing
        return out[:, -1]


def build_char_lstm(opts: CharLstmOptions, input_shape: tuple[int, ...], num_classes: int) -> CharLstm:
    """Build LEAF's Shakespeare LSTM; the registry has checked the shape."""
    return CharLstm(input_shape, num_classes, opts)
