"""Google Speech Commands keyword spotting (``speech_commands``), read from the extracted archive.

GIFT (Chen et al. 2023) trains its LSTM on the 10-keyword subset of Speech Commands
(Warden 2018): yes, no, up, down, left, right, on, off, stop, go. The layout is the
distributed one::

    <root>/<keyword>/<speaker>_nohash_<n>.wav     16 kHz, 16-bit mono PCM, about 1 s
    <root>/validation_list.txt                     relative paths, one per line
    <root>/testing_list.txt

``data.root`` may be that folder or a parent holding ``speech_commands_v0.02`` or
``speech_commands_v0.01``. Training clips are every file of a chosen keyword named in
neither list; the test set is the testing list (or the validation list).

Features, per clip (GIFT does not state them; these are the usual KWS front end of
Warden 2018 and Zhang et al. 2017, "Hello Edge"): the clip zero-padded or cut to 1 s,
int16 scaled to [-1, 1), 25 ms periodic Hann windows at a 10 ms hop with no centre
padding (98 frames), the power spectrum of a 512-point FFT, 40 triangular mel filters on
the HTK scale between 20 Hz and 8 kHz, log(mel + 1e-6); ``mfcc`` applies the orthonormal
DCT-II and keeps all 40 coefficients. Every feature is then standardised with the
training set's mean and std, so the test set never informs the scaling.

Reading and transforming ~38k WAV files takes minutes, so the result is cached as an
.npz in ``<dataset folder>/.hpcfl_cache/`` under a hash of the options and the file list.
"""

from __future__ import annotations

import hashlib
import json
import os
import tempfile
import wave
from dataclasses import dataclass, field

import numpy as np

from ..errors import DataError
from ..inputs import open_regular
from .container import Dataset, DatasetSpec, check_arrays
from .disk import _find_dir, _need_root, root_check

KEYWORDS = ("yes", "no", "up", "down", "left", "right", "on", "off", "stop", "go")
FOLDERS = ("", "speech_commands_v0.02", "speech_commands_v0.01")

SAMPLE_RATE = 16000
CLIP = SAMPLE_RATE            # samples in the 1 s a clip is padded or cut to
WIN, HOP, N_FFT = 400, 160, 512
FRAMES = 1 + (CLIP - WIN) // HOP   # 98: no centre padding
N_MELS, F_MIN, F_MAX = 40, 20.0, 8000.0
LOG_FLOOR = 1e-6

_CHUNK = 256           # clips read and transformed at a time: ~50 MB of complex spectra
_CACHE_VERSION = 1     # bump when the features change, so old caches are not read


@dataclass(frozen=True)
class SpeechOptions:
    keywords: tuple[str, ...] = field(default=KEYWORDS, metadata={
        "help": "the classes, as folder names; the label is the index in this list (GIFT: the standard 10)"})
    features: str = field(default="logmel", metadata={
        "choices": ("logmel", "mfcc"),
        "help": "logmel: log of 40 HTK mel energies per 10 ms frame; mfcc: their orthonormal DCT-II (40 coefficients)"})
    test_split: str = field(default="testing", metadata={
        "choices": ("testing", "validation"),
        "help": "which list is the test set: testing_list.txt or validation_list.txt (training uses neither)"})
    cache: bool = field(default=True, metadata={
        "help": "keep the extracted features in <dataset folder>/.hpcfl_cache/ (skipped if it cannot be written)"})

    def validate(self) -> list[str]:
        out = []
        if len(self.keywords) < 2:
            out.append(f"keywords needs at least 2 classes, got {list(self.keywords)}")
        dup = sorted({k for k in self.keywords if self.keywords.count(k) > 1})
        if dup:
            out.append(f"keywords lists {', '.join(dup)} more than once; name each folder once")
        bad = [k for k in self.keywords if not k or k in (".", "..") or "/" in k or "\\" in k]
        if bad:
            out.append(f"keywords {bad} are not folder names; give the bare names of keyword folders")
        return out


# ------------------------------------------------------------------------ features


def hz_to_mel(f):
    """HTK mel scale: 2595 log10(1 + f / 700)."""
    return 2595.0 * np.log10(1.0 + np.asarray(f, dtype=np.float64) / 700.0)


def mel_to_hz(m):
    """Inverse of :func:`hz_to_mel`."""
    return 700.0 * (10.0 ** (np.asarray(m, dtype=np.float64) / 2595.0) - 1.0)


def mel_filterbank() -> np.ndarray:
    """(40, 257) triangular filters, peak 1, no area normalisation.

    Filter j rises from edge j to centre j + 1 and falls to edge j + 2, where the 42
    edges are equally spaced in HTK mel from 20 Hz to 8 kHz; each triangle is evaluated
    at the FFT bin frequencies k * 16000 / 512 (as torchaudio's ``melscale_fbanks``).
    """
    freqs = np.arange(N_FFT // 2 + 1) * (SAMPLE_RATE / N_FFT)
    edges = mel_to_hz(np.linspace(hz_to_mel(F_MIN), hz_to_mel(F_MAX), N_MELS + 2))
    lo, mid, hi = edges[:-2, None], edges[1:-1, None], edges[2:, None]
    rise = (freqs - lo) / (mid - lo)
    fall = (hi - freqs) / (hi - mid)
    return np.maximum(0.0, np.minimum(rise, fall))


def dct_matrix(n: int = N_MELS) -> np.ndarray:
    """(n, n) orthonormal DCT-II: row k is s_k cos(pi k (2i + 1) / (2n)), s_0 = sqrt(1/n), else sqrt(2/n)."""
    k = np.arange(n)[:, None]
    i = np.arange(n)[None, :]
    d = np.sqrt(2.0 / n) * np.cos(np.pi * k * (2 * i + 1) / (2 * n))
    d[0] /= np.sqrt(2.0)
    return d


_WINDOW = 0.5 - 0.5 * np.cos(2 * np.pi * np.arange(WIN) / WIN)   # periodic Hann
_FBANK_T = mel_filterbank().T                                     # (257, 40)
_DCT_T = dct_matrix().T


def extract(clips: np.ndarray, kind: str = "logmel") -> np.ndarray:
    """Unstandardised features of a batch of clips.

    Parameters
    ----------
    clips : (n, 16000) float array
        Audio in [-1, 1), already padded or cut to 1 s.
    kind : ``"logmel"`` or ``"mfcc"``

    Returns
    -------
    (n, 98, 40) float64
        log(mel energies + 1e-6) per frame, or their orthonormal DCT-II for ``mfcc``.
    """
    x = np.asarray(clips, dtype=np.float64)
    if x.ndim != 2 or x.shape[1] != CLIP:
        raise ValueError(f"clips must have shape (n, {CLIP}), got {x.shape}")
    # (n, 98, 400) view of the frames; the window multiply makes the one copy
    frames = np.lib.stride_tricks.sliding_window_view(x, WIN, axis=1)[:, ::HOP]
    spec = np.fft.rfft(frames * _WINDOW, n=N_FFT, axis=-1)
    power = spec.real ** 2 + spec.imag ** 2
    # one 2-D BLAS product: a stacked (n, 98, 257) @ (257, 40) is several times slower
    feats = np.log((power.reshape(-1, N_FFT // 2 + 1) @ _FBANK_T).reshape(len(x), FRAMES, N_MELS) + LOG_FLOOR)
    if kind == "mfcc":
        feats = feats @ _DCT_T
    elif kind != "logmel":
        raise ValueError(f"unknown feature kind {kind!r}; use 'logmel' or 'mfcc'")
    return feats


def read_wav(path: str) -> np.ndarray:
    """One clip as float64 in [-1, 1), zero-padded or cut to 16000 samples.

    Raises DataError naming the file unless it is 16-bit mono PCM at 16 kHz.
    """
    expected = "16-bit mono PCM WAV at 16000 Hz (the Speech Commands format)"
    try:
        with open_regular(path) as f, wave.open(f, "rb") as w:
            ch, width, rate, comp = w.getnchannels(), w.getsampwidth(), w.getframerate(), w.getcomptype()
            if (ch, width, rate, comp) != (1, 2, SAMPLE_RATE, "NONE"):
                raise DataError(f"{path}: found {ch} channel(s), {8 * width}-bit, {rate} Hz, compression "
                                f"{comp}; expected {expected}; convert the file (e.g. sox in.wav -r 16000 "
                                "-b 16 -c 1 out.wav)")
            raw = w.readframes(CLIP)
    except (wave.Error, EOFError) as e:
        raise DataError(f"{path} is truncated or not a PCM WAV file ({e}); expected {expected}") from None
    except OSError as e:
        raise DataError(f"cannot read {path}: {e.strerror or e}; expected {expected}") from None
    out = np.zeros(CLIP, dtype=np.float64)
    pcm = np.frombuffer(raw[: 2 * (len(raw) // 2)], dtype="<i2")
    out[: pcm.size] = pcm / 32768.0
    return out


# ------------------------------------------------------------------------ the file index


def _read_list(path: str) -> set[str]:
    try:
        with open_regular(path, "r", encoding="utf-8") as f:
            return {ln.strip().replace("\\", "/") for ln in f if ln.strip()}
    except FileNotFoundError:
        raise DataError(f"missing file {path}; expected the Speech Commands list of relative paths "
                        "(yes/0a7c2a8d_nohash_0.wav, one per line); re-extract the archive") from None
    except (OSError, UnicodeDecodeError) as e:
        raise DataError(f"cannot read {path}: {e}; expected a text list of relative .wav paths") from None


def list_clips(opts: SpeechOptions, root: str | None):
    """(folder, train, test) where train/test are lists of (relative path, size, label)."""
    root = _need_root(root, "speech_commands", "speech_commands_v0.02")
    d = _find_dir(root, "testing_list.txt", FOLDERS, "speech_commands")
    lists = {name: _read_list(os.path.join(d, f"{name}_list.txt")) for name in ("validation", "testing")}
    held = lists["validation"] | lists["testing"]
    train, test, on_disk = [], [], set()
    for label, kw in enumerate(opts.keywords):
        folder = os.path.join(d, kw)
        try:
            entries = sorted((e.name, e.stat().st_size) for e in os.scandir(folder)
                             if e.name.lower().endswith(".wav") and e.is_file())
        except FileNotFoundError:
            raise DataError(f"speech_commands: no folder {folder} for keyword {kw!r}; fix "
                            "data.speech_commands.keywords or point data.root at the extracted archive") from None
        except OSError as e:
            raise DataError(f"cannot list {folder}: {e.strerror or e}") from None
        for name, size in entries:
            rel = f"{kw}/{name}"
            on_disk.add(rel)
            if rel in lists[opts.test_split]:
                test.append((rel, size, label))
            elif rel not in held:
                train.append((rel, size, label))
    chosen = set(opts.keywords)
    for name, listed in lists.items():
        missing = sorted(r for r in listed if r.split("/", 1)[0] in chosen and r not in on_disk)
        if missing:
            raise DataError(f"{os.path.join(d, name + '_list.txt')} names {len(missing)} file(s) missing from "
                            f"{d} (first: {missing[0]}); re-extract the archive")
    if not train or not test:
        which = "training" if not train else opts.test_split
        raise DataError(f"speech_commands in {d}: no {which} clips for keywords {list(opts.keywords)}; "
                        "check the keyword folders and the list files")
    return d, train, test


# ------------------------------------------------------------------------ cache


def _cache_path(d: str, opts: SpeechOptions, train, test) -> str:
    key = {"version": _CACHE_VERSION, "keywords": list(opts.keywords), "features": opts.features,
           "test_split": opts.test_split, "train": [[r, s] for r, s, _ in train], "test": [[r, s] for r, s, _ in test]}
    digest = hashlib.sha256(json.dumps(key, sort_keys=True).encode()).hexdigest()[:20]
    return os.path.join(d, ".hpcfl_cache", f"speech_commands_{digest}.npz")


def _read_cache(path: str, n_train: int, n_test: int):
    try:
        with open_regular(path) as f, np.load(f, allow_pickle=False) as z:
            xtr, xte = z["x_train"], z["x_test"]
    except Exception:  # absent, partial or foreign: recompute (and overwrite)
        return None
    if xtr.shape != (n_train, FRAMES, N_MELS) or xte.shape != (n_test, FRAMES, N_MELS):
        return None
    return xtr.astype(np.float32, copy=False), xte.astype(np.float32, copy=False)


def _write_cache(path: str, xtr: np.ndarray, xte: np.ndarray) -> None:
    """Write atomically (temp file + os.replace); a folder that cannot be written means no cache."""
    tmp = None
    try:
        os.makedirs(os.path.dirname(path), exist_ok=True)
        fd, tmp = tempfile.mkstemp(dir=os.path.dirname(path), suffix=".tmp")
        with os.fdopen(fd, "wb") as f:
            np.savez(f, x_train=xtr, x_test=xte)
        os.replace(tmp, path)
    except OSError:
        if tmp is not None:
            try:
                os.remove(tmp)
            except OSError:
                pass


# ------------------------------------------------------------------------ loading


def _features(d: str, files, kind: str) -> np.ndarray:
    """(n, 98, 40) float32 unstandardised features, read and transformed _CHUNK clips at a time."""
    out = np.empty((len(files), FRAMES, N_MELS), dtype=np.float32)
    for lo in range(0, len(files), _CHUNK):
        chunk = files[lo: lo + _CHUNK]
        clips = np.stack([read_wav(os.path.join(d, *rel.split("/"))) for rel, _, _ in chunk])
        out[lo: lo + len(chunk)] = extract(clips, kind)
    return out


def _standardise(xtr: np.ndarray, xte: np.ndarray) -> None:
    """In place: (x - mean) / std per feature, both from the training set (over clips and frames).

    Sums run in float64 over chunks of clips, so the full set never needs a float64 copy.
    A feature constant over the training set has std 0 and is only centred.
    """
    n = xtr.shape[0] * xtr.shape[1]
    total = np.zeros(N_MELS)
    for lo in range(0, len(xtr), _CHUNK):
        total += xtr[lo: lo + _CHUNK].sum(axis=(0, 1), dtype=np.float64)
    mean = total / n
    sq = np.zeros(N_MELS)
    for lo in range(0, len(xtr), _CHUNK):
        sq += ((xtr[lo: lo + _CHUNK] - mean) ** 2).sum(axis=(0, 1))
    std = np.sqrt(sq / n)
    std[std == 0] = 1.0
    for x in (xtr, xte):
        for lo in range(0, len(x), _CHUNK):
            x[lo: lo + _CHUNK] = (x[lo: lo + _CHUNK] - mean) / std


def load_speech_commands(opts: SpeechOptions, root: str | None, seed: int) -> Dataset:
    """The keyword subset as (98, 40) feature sequences; labels are indices into ``opts.keywords``.

    The split comes from the archive's list files, so ``seed`` plays no part. Features are
    taken from the cache when one matches the options and the file list (names and sizes).
    """
    d, train, test = list_clips(opts, root)
    path = _cache_path(d, opts, train, test) if opts.cache else None
    got = _read_cache(path, len(train), len(test)) if path else None
    if got is None:
        xtr, xte = _features(d, train, opts.features), _features(d, test, opts.features)
        _standardise(xtr, xte)
        if path:
            _write_cache(path, xtr, xte)
    else:
        xtr, xte = got
    ytr = np.array([lab for _, _, lab in train], dtype=np.int64)
    yte = np.array([lab for _, _, lab in test], dtype=np.int64)
    check_arrays("speech_commands", xtr, ytr, "the training set")
    check_arrays("speech_commands", xte, yte, "the test set")
    return Dataset(name="speech_commands", x_train=xtr, y_train=ytr, x_test=xte, y_test=yte,
                   num_classes=len(opts.keywords), input_shape=(FRAMES, N_MELS))


def load_speech_commands_labels(opts: SpeechOptions, root: str | None, seed: int) -> Dataset:
    """Training labels from the file index alone (no audio read); inputs are zero-stride placeholders."""
    _, train, _ = list_clips(opts, root)
    ytr = np.array([lab for _, _, lab in train], dtype=np.int64)
    return Dataset(name="speech_commands", x_train=np.broadcast_to(np.float32(0), (len(ytr), FRAMES, N_MELS)),
                   y_train=ytr, x_test=np.broadcast_to(np.float32(0), (0, FRAMES, N_MELS)),
                   y_test=np.zeros(0, dtype=np.int64), num_classes=len(opts.keywords),
                   input_shape=(FRAMES, N_MELS))


SPEECH = {
    "speech_commands": DatasetSpec(
        SpeechOptions, load_speech_commands,
        "Google Speech Commands keywords (GIFT KWS): (98, 40) log-mel or MFCC frames from the WAV folders",
        load_speech_commands_labels, files=root_check(
            "speech_commands", "speech_commands_v0.02",
            lambda o, r: _find_dir(r, "testing_list.txt", FOLDERS, "speech_commands")),
    ),
}
