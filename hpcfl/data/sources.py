"""Where each dataset comes from: official URLs, sizes and checksums (``hpcfl data list``).

One :class:`Source` per dataset that reads files. The facts are the publishers' own: the
URL of the official download, the size in bytes and the checksum the source (or the
widely used loaders that cite it, torchvision, torchaudio and TensorFlow Datasets) gives: the
source's md5 where that is what is published, sha256 where one is known. Every URL is
``https://`` (the publisher's own copy over https where its first address is plain http), and
every file has its size: a download stops there (:mod:`hpcfl.data.transfer`). ``hpcfl data get`` (:mod:`hpcfl.data.fetch`)
downloads, verifies and unpacks them so that ``data.root = DIR`` finds them.

``HPCFL_DATA_MIRROR`` (or ``hpcfl data get --mirror URL``) replaces the folder part of every URL:
a file is then fetched from ``<mirror>/<file name>`` (a site-local mirror, or the tests' local
server); the checksums stay the same.

Datasets that hpcfl generates need no download; :data:`STAND_INS` names the generated
dataset a job can run on a CPU in place of each downloaded one. :data:`ELSEWHERE` says, as text
only, where the naturally partitioned benchmarks that ``leaf`` and ``tff`` read come from: the
field's own scripts and archives, which publish no checksum to verify a download against, so
``hpcfl data get`` does not fetch them.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Remote:
    """One file at the source.

    ``size`` in bytes, as published (a download reads no further); ``md5`` / ``sha256``: hex
    digests (at least one); ``unpack``: ``"tar"`` or ``"zip"`` for an archive unpacked into the
    dataset's folder, None for a file kept as it is (MNIST's gzipped IDX files are read as they are).
    """

    name: str
    url: str
    size: int
    md5: str | None = None
    sha256: str | None = None
    unpack: str | None = None


@dataclass(frozen=True)
class Source:
    """A downloadable dataset: its files and the folder under ``--root`` they make.

    ``folder`` is where the loader looks under ``data.root`` (``cifar-10-batches-py``); an
    archive whose members already sit in that one folder is unpacked as it is, otherwise into it.
    """

    needs: str
    homepage: str
    folder: str
    files: tuple[Remote, ...]


_KRIZ = "https://www.cs.toronto.edu/~kriz/"
_MNIST = "https://ossci-datasets.s3.amazonaws.com/mnist/"     # torchvision's mirror of yann.lecun.com/exdb/mnist
# Zalando's S3 website (http://fashion-mnist.s3-website.eu-central-1.amazonaws.com/) is plain http
# only; the same files are in the dataset's own repository, served over https
_FASHION = "https://raw.githubusercontent.com/zalandoresearch/fashion-mnist/master/data/fashion/"
_EMNIST = "https://biometrics.nist.gov/cs_links/EMNIST/"
# http://download.tensorflow.org/data/ is a Google Cloud Storage bucket of that name: the same object over https
_SPEECH = "https://storage.googleapis.com/download.tensorflow.org/data/"


def _idx(base: str, sizes_md5: tuple[tuple[str, int, str], ...]) -> tuple[Remote, ...]:
    return tuple(Remote(name, base + name, size, md5=md5) for name, size, md5 in sizes_md5)


SOURCES: dict[str, Source] = {
    "cifar10": Source(
        "the CIFAR-10 python batches: data_batch_1..5, test_batch, batches.meta",
        "https://www.cs.toronto.edu/~kriz/cifar.html", "cifar-10-batches-py",
        (Remote("cifar-10-python.tar.gz", _KRIZ + "cifar-10-python.tar.gz", 170498071,
                md5="c58f30108f718f92721af3b95e74349a", unpack="tar"),)),
    "cifar100": Source(
        "the CIFAR-100 python files: train, test, meta",
        "https://www.cs.toronto.edu/~kriz/cifar.html", "cifar-100-python",
        (Remote("cifar-100-python.tar.gz", _KRIZ + "cifar-100-python.tar.gz", 169001437,
                md5="eb9058c3a382ffc7106e4002c42a8d85", unpack="tar"),)),
    "mnist": Source(
        "four gzipped IDX files: train-/t10k-images-idx3-ubyte.gz, train-/t10k-labels-idx1-ubyte.gz",
        "http://yann.lecun.com/exdb/mnist/", "mnist",
        _idx(_MNIST, (("train-images-idx3-ubyte.gz", 9912422, "f68b3c2dcbeaaa9fbdd348bbdeb94873"),
                      ("train-labels-idx1-ubyte.gz", 28881, "d53e105ee54ea40749a09fcbcd1e9432"),
                      ("t10k-images-idx3-ubyte.gz", 1648877, "9fb629c4189551a2d022fa330f9573f3"),
                      ("t10k-labels-idx1-ubyte.gz", 4542, "ec29112dd5afa0611ce80d1b7f02629c")))),
    "fashion_mnist": Source(
        "four gzipped IDX files, named as MNIST's",
        "https://github.com/zalandoresearch/fashion-mnist", "fashion_mnist",
        _idx(_FASHION, (("train-images-idx3-ubyte.gz", 26421880, "8d4fb7e6c68d591d4c3dfef9ec88bf0d"),
                        ("train-labels-idx1-ubyte.gz", 29515, "25c81989df183df01b3e8a0aad5dffbe"),
                        ("t10k-images-idx3-ubyte.gz", 4422102, "bef4ecab320f06d8554ea6380940ec79"),
                        ("t10k-labels-idx1-ubyte.gz", 5148, "bb300cfdad3c16e7a12a480ee83cd310")))),
    "emnist": Source(
        "gzipped IDX files of every split, emnist-<split>-{train,test}-{images-idx3,labels-idx1}-ubyte.gz, "
        "in gzip/",
        "https://www.nist.gov/itl/products-and-services/emnist-dataset", "gzip",
        # the size as TensorFlow Datasets' checksums list it (NIST publishes none)
        (Remote("gzip.zip", _EMNIST + "gzip.zip", 561753746, md5="58c8d27c78d21e728a6bc7b3cc06412e",
                unpack="zip"),)),
    "speech_commands": Source(
        "Speech Commands v0.02: one folder of 16 kHz WAV clips per word, validation_list.txt, testing_list.txt",
        "https://www.tensorflow.org/datasets/catalog/speech_commands", "speech_commands_v0.02",
        # the size as TensorFlow Datasets' checksums list it, beside the same sha256
        (Remote("speech_commands_v0.02.tar.gz", _SPEECH + "speech_commands_v0.02.tar.gz", 2428923189,
                md5="6b74f3901214cb2c2934e98196829835",
                sha256="af14739ee7dc311471de98f5f9d2c9191b18aedfe957f4a6ff791c709868ff58", unpack="tar"),)),
}

# The generated dataset a paper job can run on a CPU in minutes in place of the real one, and
# what it changes; every dataset not in SOURCES (except npz, the user's own file) is generated.
STAND_INS: dict[str, str] = {
    "cifar10": "--set data.dataset=synthetic_images (CIFAR-shaped class-mean images plus noise, 10 classes)",
    "cifar100": "--set data.dataset=synthetic_images --set data.synthetic_images.num_classes=100",
    "mnist": "--set data.dataset=synthetic_images --set 'data.synthetic_images.image_shape=[1,28,28]'",
    "fashion_mnist": "--set data.dataset=synthetic_images --set 'data.synthetic_images.image_shape=[1,28,28]'",
    "emnist": "--set data.dataset=synthetic_images --set 'data.synthetic_images.image_shape=[1,28,28]' "
              "--set data.synthetic_images.num_classes=47 (balanced)",
    "speech_commands": "--set data.dataset=synthetic_images --set 'data.synthetic_images.image_shape=[98,40]' "
                       "(98 frames x 40 features)",
}


_TFF = "https://storage.googleapis.com/tff-datasets-public/"

# Where the files of the naturally partitioned datasets come from, in words (hpcfl data list).
ELSEWHERE: dict[str, tuple[str, ...]] = {
    "leaf": (
        "made by LEAF's scripts (Caldas et al. 2018), https://github.com/TalwalkarLab/leaf: in data/femnist or "
        "data/shakespeare run ./preprocess.sh (e.g. -s niid --sf 1.0 -k 0 -t sample); the JSON lands in "
        "data/<name>/data/train and .../test: data.leaf.train, data.leaf.test",
        "FEMNIST: data.leaf.image_shape = [1, 28, 28]; Shakespeare: data.leaf.features = 'chars', model char_lstm; "
        "Sent140 (data/sent140): features = 'tokens' with vocab_file = GloVe's glove.6B.300d.txt "
        "(https://nlp.stanford.edu/projects/glove/, LEAF's models/sent140/get_embs.sh)",
    ),
    "tff": (
        "TensorFlow Federated's HDF5 archives (older TFF releases; newer ones ship SQLite, not read here), "
        "unpacked with tar xjf:",
        f"{_TFF}fed_emnist.tar.bz2: fed_emnist_train.h5, fed_emnist_test.h5 (EMNIST-62, 3,400 writers; the defaults)",
        f"{_TFF}shakespeare.tar.bz2: shakespeare_train.h5, shakespeare_test.h5 (data.tff.features = 'chars')",
        f"{_TFF}stackoverflow.tar.bz2: tokens, title, tags (word-level: not read yet)",
    ),
    "npz": (
        "your own file (data.npz.file); with client (and client_test) arrays it holds natural clients",
        "e.g. FLAIR (Song et al. 2022): Apple's pfl-research, https://github.com/apple/pfl-research "
        "(benchmarks/dataset/flair), makes its per-user HDF5; it is multi-label: write one label per image, and "
        "each image's user as client, to an .npz",
    ),
}


def get_hint(name: str) -> str:
    """The words a missing-data message ends with: the command that downloads ``name``, and its stand-in."""
    if name not in SOURCES:
        return ""
    return (f"; to download it: hpcfl data get {name} --root DIR, then data.root = DIR (hpcfl data list shows "
            f"the sources); to run without it on a CPU: {STAND_INS[name].split(' (')[0]}")
