"""Speech Commands loader on a fake archive written with the ``wave`` module.

The tree has three keywords, each a sine tone at an FFT bin frequency (yes 468.75 Hz,
no 1000 Hz, up 3000 Hz), five clips each: clips 0-2 train, 3 in validation_list.txt,
4 in testing_list.txt; plus an unselected keyword ``bed`` (listed too) and
``_background_noise_``, which must both be ignored.
"""

import os
import wave

import numpy as np
import pytest
from mpi4py import MPI

from hpcfl.config import options
from hpcfl.data import dataset_options, load_dataset, load_labels, speech
from hpcfl.errors import ConfigError, DataError
from runner import job, run_memory

SR = 16000
TONES = {"yes": 468.75, "no": 1000.0, "up": 3000.0}   # FFT bins 15, 32, 96 (bin width 16000 / 512 = 31.25 Hz)
KW = list(TONES)


def write_wav(path, samples, rate=SR, channels=1, width=2):
    os.makedirs(os.path.dirname(path), exist_ok=True)
    with wave.open(str(path), "wb") as w:
        w.setnchannels(channels)
        w.setsampwidth(width)
        w.setframerate(rate)
        w.writeframes(np.asarray(samples, dtype=f"<i{width}").tobytes())


def tone(freq, amp, n=SR, phase=0.0):
    """int16 sine, amplitude ``amp`` of full scale."""
    t = np.arange(n) / SR
    return np.round(amp * 32767 * np.sin(2 * np.pi * freq * t + phase)).astype(np.int16)


def make_tree(base, sub="speech_commands_v0.02"):
    """Write the fake archive under base/sub; returns that folder."""
    d = os.path.join(base, sub) if sub else str(base)
    rng = np.random.default_rng(0)
    val, test = [], []
    for kw, f in list(TONES.items()) + [("bed", 200.0)]:
        for i in range(5):
            n = SR // 2 if (kw, i) == ("yes", 1) else SR   # yes clip 1 is half a second long
            x = tone(f, 0.2 + 0.1 * i, n, phase=i) + rng.integers(-30, 31, n).astype(np.int16)
            rel = f"{kw}/{i:08x}_nohash_0.wav"
            write_wav(os.path.join(d, rel), x)
            (val if i == 3 else test if i == 4 else []).append(rel)
    write_wav(os.path.join(d, "_background_noise_", "white.wav"), rng.integers(-900, 900, SR))
    for name, rows in (("validation_list.txt", val), ("testing_list.txt", test)):
        with open(os.path.join(d, name), "w") as fh:
            fh.write("\n".join(rows) + "\n")
    return d


def opts(**kw):
    return options.build(dataset_options("speech_commands"), {"keywords": KW, **kw}, "data.speech_commands")


def raw(d, rels, kind="logmel"):
    """Unstandardised features of the named clips."""
    return speech.extract(np.stack([speech.read_wav(os.path.join(d, r)) for r in rels]), kind)


def test_split_assignment_and_labels(tmp_path):
    """Train = files of a chosen keyword in neither list; test = testing list (or validation list with
    test_split). Labels are the positions in ``keywords``: reordering the keywords relabels the clips."""
    d = make_tree(tmp_path)
    found, train, test = speech.list_clips(opts(), str(tmp_path))
    assert found == d
    names = [f"{i:08x}_nohash_0.wav" for i in range(5)]
    assert [(r, lab) for r, _, lab in train] == [(f"{k}/{names[i]}", j) for j, k in enumerate(KW) for i in range(3)]
    assert [(r, lab) for r, _, lab in test] == [(f"{k}/{names[4]}", j) for j, k in enumerate(KW)]
    assert train[0][1] == 44 + 2 * SR and train[1][1] == 44 + SR   # sizes: header + 2 bytes a sample
    _, _, val = speech.list_clips(opts(test_split="validation"), str(tmp_path))
    assert [r for r, _, _ in val] == [f"{k}/{names[3]}" for k in KW]
    ds = load_dataset("speech_commands", opts(keywords=["up", "yes", "no"], cache=False), str(tmp_path), 0)
    assert ds.y_train.tolist() == [0, 0, 0, 1, 1, 1, 2, 2, 2] and ds.y_test.tolist() == [0, 1, 2]
    assert ds.num_classes == 3 and ds.name == "speech_commands"
    assert np.array_equal(load_labels("speech_commands", opts(), str(tmp_path), 0).y_train,
                          [0, 0, 0, 1, 1, 1, 2, 2, 2])


def test_shape_dtype_and_default_keywords(tmp_path):
    """1 s at a 160-sample hop with 400-sample windows and no centre padding is 1 + (16000 - 400) // 160 = 98
    frames of 40 mel features; the default class list is the 10 GIFT keywords."""
    make_tree(tmp_path)
    ds = load_dataset("speech_commands", opts(cache=False), str(tmp_path), 0)
    assert ds.input_shape == (98, 40)
    assert ds.x_train.shape == (9, 98, 40) and ds.x_test.shape == (3, 98, 40)
    assert ds.x_train.dtype == np.float32 and ds.y_train.dtype == np.int64
    assert dataset_options("speech_commands")().keywords == (
        "yes", "no", "up", "down", "left", "right", "on", "off", "stop", "go")
    with pytest.raises(ConfigError, match="keywords lists yes more than once"):
        opts(keywords=["yes", "no", "yes"])


def test_short_clip_is_zero_padded_and_long_clip_cut(tmp_path):
    """yes clip 1 holds 8000 samples: samples 8000.. read as 0, so every frame starting at or after
    sample 8000 (frame t starts at 160 t, t >= 50) is silent and its log-mel is log(0 + 1e-6) exactly.
    A 1.5 s clip keeps exactly its first 16000 samples, scaled by 1/32768."""
    d = make_tree(tmp_path)
    x = speech.read_wav(os.path.join(d, "yes", "00000001_nohash_0.wav"))
    assert x.shape == (SR,) and np.all(x[8000:] == 0) and np.any(x[:8000] != 0)
    f = speech.extract(x[None])[0]
    assert np.all(f[50:] == np.log(1e-6)) and np.all(f[49] > np.log(1e-6))
    long = tone(1000.0, 0.5, SR * 3 // 2)
    write_wav(tmp_path / "long.wav", long)
    assert np.array_equal(speech.read_wav(str(tmp_path / "long.wav")), long[:SR] / 32768.0)


def test_tone_peaks_in_its_mel_band():
    """HTK mel: m(f) = 2595 log10(1 + f/700); m(20) = 31.748 and m(8000) = 2840.023, so the 42 filter
    edges are 68.4945 mel apart and filter j peaks at edge j + 1. By hand: 468.75 Hz = 577.71 mel lies at
    edge (577.71 - 31.748) / 68.4945 = 7.97, next to the peak of filter 7; 1000 Hz = 999.99 mel at edge
    14.14, peak of filter 13 (0.86 of it, filter 14 gets 0.14); 3000 Hz = 1876.45 mel at edge 26.93, peak
    of filter 26. Each tone sits on an FFT bin, so nearly all its energy falls in that one filter."""
    for f, band in ((468.75, 7), (1000.0, 13), (3000.0, 26)):
        feats = speech.extract((tone(f, 0.5) / 32768.0)[None])[0]
        assert np.all(np.argmax(feats, axis=1) == band), f


def test_logmel_matches_a_direct_dft_reference():
    """Frames 0, 40 and 97 of a random clip against the definition written out here: samples 160 t ..
    160 t + 399 times the periodic Hann window 0.5 - 0.5 cos(2 pi n / 400), a direct 512-point DFT (cos/sin
    sums, no FFT), |X_k|^2 for k = 0..256, triangles between HTK-mel-spaced edges at f_k = 31.25 k Hz."""
    clip = np.random.default_rng(1).uniform(-0.5, 0.5, SR)
    got = speech.extract(clip[None])[0]
    mel = lambda f: 2595 * np.log10(1 + f / 700)                  # noqa: E731
    edges = 700 * (10 ** (np.linspace(mel(20.0), mel(8000.0), 42) / 2595) - 1)
    fk = 31.25 * np.arange(257)
    fb = np.zeros((40, 257))
    for j in range(40):
        for k in range(257):
            lo, c, hi = edges[j], edges[j + 1], edges[j + 2]
            if lo < fk[k] <= c:
                fb[j, k] = (fk[k] - lo) / (c - lo)
            elif c < fk[k] < hi:
                fb[j, k] = (hi - fk[k]) / (hi - c)
    n = np.arange(400)
    win = 0.5 - 0.5 * np.cos(2 * np.pi * n / 400)
    ang = 2 * np.pi * np.outer(np.arange(257), n) / 512
    for t in (0, 40, 97):
        seg = clip[160 * t: 160 * t + 400] * win
        power = (np.cos(ang) @ seg) ** 2 + (np.sin(ang) @ seg) ** 2
        np.testing.assert_allclose(got[t], np.log(fb @ power + 1e-6), rtol=1e-10, atol=1e-10)


def test_mfcc_is_the_orthonormal_dct_of_logmel():
    """mfcc_k = sum_i s_k cos(pi k (2 i + 1) / 80) logmel_i with s_0 = sqrt(1/40), s_k = sqrt(2/40): the
    DCT-II with orthonormal scaling (that matrix times its transpose is the identity)."""
    clips = np.random.default_rng(2).uniform(-0.3, 0.3, (2, SR))
    dct = np.array([[np.sqrt((1 if k == 0 else 2) / 40) * np.cos(np.pi * k * (2 * i + 1) / 80)
                     for i in range(40)] for k in range(40)])
    np.testing.assert_allclose(dct @ dct.T, np.eye(40), atol=1e-12)
    logmel, mfcc = speech.extract(clips, "logmel"), speech.extract(clips, "mfcc")
    np.testing.assert_allclose(mfcc, logmel @ dct.T, rtol=1e-12, atol=1e-10)


def test_standardisation_uses_training_statistics_only(tmp_path):
    """x = (raw - m) / s with m, s the per-feature mean and std over every training clip and frame:
    the training set has mean 0 and std 1 per feature, the test set is mapped with the same m and s,
    and making a test clip louder changes no training value."""
    d = make_tree(tmp_path)
    _, train, test = speech.list_clips(opts(), str(tmp_path))
    rtr, rte = raw(d, [r for r, _, _ in train]), raw(d, [r for r, _, _ in test])
    m, s = rtr.mean(axis=(0, 1)), rtr.std(axis=(0, 1))
    ds = load_dataset("speech_commands", opts(cache=False), str(tmp_path), 0)
    np.testing.assert_allclose(ds.x_train, (rtr - m) / s, rtol=1e-4, atol=1e-4)
    np.testing.assert_allclose(ds.x_test, (rte - m) / s, rtol=1e-4, atol=1e-4)
    np.testing.assert_allclose(ds.x_train.mean(axis=(0, 1)), 0, atol=1e-5)
    np.testing.assert_allclose(ds.x_train.std(axis=(0, 1)), 1, atol=1e-5)
    write_wav(os.path.join(d, test[0][0]), tone(TONES["yes"], 0.9))
    louder = load_dataset("speech_commands", opts(cache=False), str(tmp_path), 0)
    assert np.array_equal(louder.x_train, ds.x_train) and not np.array_equal(louder.x_test, ds.x_test)


def test_cache_written_reused_and_keyed_by_file_list(tmp_path, monkeypatch):
    """The first load writes one .npz (no temp file left); a second load reads it without computing any
    feature; adding a training clip changes the key, so features are computed again into a second file.
    cache = false writes nothing, and a .hpcfl_cache that is a plain file only disables caching."""
    d = make_tree(tmp_path)
    first = load_dataset("speech_commands", opts(), str(tmp_path), 0)
    cache = os.path.join(d, ".hpcfl_cache")
    assert len(os.listdir(cache)) == 1 and os.listdir(cache)[0].endswith(".npz")

    def boom(*a, **k):
        raise AssertionError("features recomputed")

    monkeypatch.setattr(speech, "extract", boom)
    again = load_dataset("speech_commands", opts(), str(tmp_path), 0)
    assert np.array_equal(again.x_train, first.x_train) and np.array_equal(again.x_test, first.x_test)
    write_wav(os.path.join(d, "no", "00000009_nohash_0.wav"), tone(TONES["no"], 0.3))
    with pytest.raises(AssertionError, match="recomputed"):
        load_dataset("speech_commands", opts(), str(tmp_path), 0)
    monkeypatch.undo()
    more = load_dataset("speech_commands", opts(), str(tmp_path), 0)
    assert len(more.y_train) == 10 and len(os.listdir(cache)) == 2

    other = tmp_path / "b"
    d2 = make_tree(other)
    load_dataset("speech_commands", opts(cache=False), str(other), 0)
    assert not os.path.exists(os.path.join(d2, ".hpcfl_cache"))
    open(os.path.join(d2, ".hpcfl_cache"), "w").close()
    blocked = load_dataset("speech_commands", opts(), str(other), 0)
    assert np.array_equal(blocked.x_train, first.x_train)


def test_bad_wav_format_names_the_file(tmp_path):
    """An 8 kHz clip or a stereo clip is a DataError naming the file and what was found."""
    d = make_tree(tmp_path)
    bad = os.path.join(d, "up", "00000001_nohash_0.wav")
    write_wav(bad, tone(1000.0, 0.5, 8000), rate=8000)
    with pytest.raises(DataError, match=r"00000001_nohash_0\.wav: found 1 channel\(s\), 16-bit, 8000 Hz"):
        load_dataset("speech_commands", opts(cache=False), str(tmp_path), 0)
    write_wav(bad, np.zeros(2 * SR), channels=2)
    with pytest.raises(DataError, match=r"found 2 channel\(s\).*expected 16-bit mono PCM WAV at 16000 Hz"):
        speech.read_wav(bad)


def test_missing_folders_say_where_they_looked(tmp_path):
    """A root without the archive names testing_list.txt, every folder tried and the fix; a root that is
    not a directory says so; a keyword without a folder names it."""
    with pytest.raises(DataError) as e:
        load_dataset("speech_commands", opts(), str(tmp_path), 0)
    msg = str(e.value)
    assert "no testing_list.txt found in any of" in msg and "set data.root" in msg
    assert os.path.join(str(tmp_path), "speech_commands_v0.01") in msg
    with pytest.raises(DataError, match="is not a directory"):
        load_dataset("speech_commands", opts(), str(tmp_path / "nope"), 0)
    d = make_tree(tmp_path, sub="")
    with pytest.raises(DataError, match=r"no folder .*left for keyword 'left'"):
        speech.list_clips(opts(keywords=["yes", "left"]), d)


def test_kws_lstm_two_rounds_in_memory(tmp_path):
    """kws_lstm trains on the loaded set through the engine: 2 rounds, 2 clients, finite metrics."""
    make_tree(tmp_path)
    table = job(**{"data.dataset": "speech_commands", "data.root": str(tmp_path), "data.partition": "iid",
                   "data.num_clients": 2, "data.speech_commands.keywords": KW, "model.name": "kws_lstm",
                   "model.kws_lstm.hidden": 8, "model.kws_lstm.layers": 1, "run.rounds": 2,
                   "algorithm.clients_per_round": 2, "algorithm.batch_size": 4, "algorithm.local_steps": 2})
    table["data"].pop("dirichlet", None), table["model"].pop("mlp", None)   # other components' tables
    x, metrics, _ = run_memory(table, MPI.COMM_SELF)
    assert len(metrics) == 2 and np.all(np.isfinite(x))
    assert all(np.isfinite(m["test_loss"]) for m in metrics)


@pytest.mark.timeout(60)   # a FIFO blocked open() for good
def test_a_fifo_among_the_speech_files_is_refused_without_blocking(tmp_path):
    fifo = tmp_path / "clip.wav"
    os.mkfifo(fifo)
    with pytest.raises(DataError, match="not a regular file but a FIFO"):
        speech.read_wav(str(fifo))
    with pytest.raises(DataError, match="not a regular file but a FIFO"):
        speech._read_list(str(fifo))
    assert speech._read_cache(str(fifo), 1, 1) is None   # the feature cache: recomputed, never waited on
