"""Recurrent classifier for sequences of feature frames (``kws_lstm``).

GIFT (Chen et al. 2023) trains keyword spotting on Speech Commands with an LSTM of 2
recurrent layers and hidden size 64. The paper does not give the input features or the
head; we choose 40 MFCC / log-mel features per frame and the last hidden state ->
Linear(64, 10). With 40 input features and 10 classes that is 61,066 parameters.
"""

from __future__ import annotations

import torch
from torch import nn

from ._common import ZooModel
from .options import KwsLstmOptions
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
