"""On-disk loaders: CIFAR pickle batches, IDX (plain and gzip), EMNIST, npz; error paths."""

import collections
import gzip
import os
import pickle
import re
import struct

import numpy as np
import pytest

from hpcfl.config import options
from hpcfl.data import dataset_options, load_dataset
from hpcfl.data.cifar import read_pickle
from hpcfl.data.idx import read_idx
from hpcfl.errors import ConfigError, DataError

# ------------------------------------------------------------ writers in the real formats


def _py2_str(b: bytes) -> bytes:
    """A Python 2 ``str`` as cPickle protocol 2 writes it (loads as bytes in Python 3)."""
    if len(b) < 256:
        return b"U" + bytes([len(b)]) + b
    return b"T" + struct.pack("<I", len(b)) + b


def _py2_int(v: int) -> bytes:
    return b"J" + struct.pack("<i", v)


def py2_cifar_pickle(d: dict) -> bytes:
    """Bytes like the distributed CIFAR batches: Python 2 cPickle protocol 2 of a dict with
    str keys, int lists, str lists and a uint8 ndarray (numpy.core.multiarray._reconstruct)."""
    out = [b"\x80\x02}("]
    for key, val in d.items():
        out.append(_py2_str(key.encode()))
        if isinstance(val, np.ndarray):
            out.append(b"cnumpy.core.multiarray\n_reconstruct\ncnumpy\nndarray\n"
                       + _py2_int(0) + b"\x85" + _py2_str(b"b") + b"\x87R(" + _py2_int(1)
                       + _py2_int(val.shape[0]) + _py2_int(val.shape[1]) + b"\x86"
                       + b"cnumpy\ndtype\n" + _py2_str(b"u1") + _py2_int(0) + _py2_int(1) + b"\x87R("
                       + _py2_int(3) + _py2_str(b"|") + b"NNN" + _py2_int(-1) + _py2_int(-1) + _py2_int(0)
                       + b"tb\x89" + _py2_str(val.tobytes()) + b"tb")
        elif isinstance(val, list):
            out.append(b"](")
            out += [_py2_int(v) if isinstance(v, int) else _py2_str(v) for v in val]
            out.append(b"e")
        else:
            out.append(_py2_str(val))
    out.append(b"u.")
    return b"".join(out)


def write_cifar10(root, n_per_batch=6, n_test=5, py2=True):
    d = os.path.join(root, "cifar-10-batches-py")
    os.makedirs(d)
    rng = np.random.default_rng(0)
    for name, n in [(f"data_batch_{i}", n_per_batch) for i in range(1, 6)] + [("test_batch", n_test)]:
        data = rng.integers(0, 256, (n, 3072), dtype=np.uint8)
        labels = rng.integers(0, 10, n).tolist()
        entry = {"batch_label": b"training batch", "labels": labels, "data": data}
        blob = py2_cifar_pickle(entry) if py2 else pickle.dumps({k.encode(): v for k, v in entry.items()})
        with open(os.path.join(d, name), "wb") as f:
            f.write(blob)
    with open(os.path.join(d, "batches.meta"), "wb") as f:
        f.write(py2_cifar_pickle({"label_names": [b"airplane"] * 10, "num_vis": b"3072"}))
    return d


def idx_bytes(arr: np.ndarray, code=0x08) -> bytes:
    return bytes([0, 0, code, arr.ndim]) + struct.pack(f">{arr.ndim}I", *arr.shape) + arr.tobytes()


def write_idx(path, arr, gz):
    blob = idx_bytes(arr)
    with open(path + (".gz" if gz else ""), "wb") as f:
        f.write(gzip.compress(blob) if gz else blob)


def write_mnist(root, prefix="", gz=False, n=7, m=3, label_max=10):
    rng = np.random.default_rng(1)
    for split, k in (("train", n), ("t10k" if not prefix else "test", m)):
        stem = f"{prefix}{split}" if prefix else split
        write_idx(os.path.join(root, f"{stem}-images-idx3-ubyte"), rng.integers(0, 256, (k, 28, 28), dtype=np.uint8), gz)
        write_idx(os.path.join(root, f"{stem}-labels-idx1-ubyte"), rng.integers(0, label_max, k, dtype=np.uint8), gz)


def build(name, table=None):
    return options.build(dataset_options(name), table, f"data.{name}")


# ------------------------------------------------------------------------------ CIFAR


@pytest.mark.parametrize("py2", [True, False])
def test_cifar10_roundtrip(tmp_path, py2):
    d = write_cifar10(str(tmp_path), py2=py2)
    ds = load_dataset("cifar10", build("cifar10"), str(tmp_path), 0)
    raw = read_pickle(os.path.join(d, "data_batch_1"), "x")
    assert ds.x_train.shape == (30, 3, 32, 32) and ds.x_train.dtype == np.float32
    assert ds.x_test.shape == (5, 3, 32, 32) and ds.y_test.dtype == np.int64
    assert ds.num_classes == 10 and ds.input_shape == (3, 32, 32) and ds.augment
    assert ds.y_train[:6].tolist() == list(raw["labels"])
    px = raw["data"][0].reshape(3, 32, 32)  # rows are 1024 R, then G, then B
    want = (px / 255.0 - np.array([0.4914, 0.4822, 0.4465])[:, None, None]) / np.array([0.2023, 0.1994, 0.2010])[:, None, None]
    np.testing.assert_allclose(ds.x_train[0], want, rtol=1e-5, atol=1e-5)
    none = load_dataset("cifar10", build("cifar10", {"normalize": "none", "augment": False}), str(tmp_path), 0)
    np.testing.assert_allclose(none.x_train[0], px / 255.0, atol=1e-6)
    assert not none.augment


def test_cifar10_root_may_be_the_batch_dir_itself(tmp_path):
    d = write_cifar10(str(tmp_path))
    assert load_dataset("cifar10", None, d, 0).x_train.shape[0] == 30


def test_cifar100_fine_and_coarse(tmp_path):
    d = tmp_path / "cifar-100-python"
    d.mkdir()
    rng = np.random.default_rng(2)
    for name, n in (("train", 8), ("test", 4)):
        entry = {"filenames": [b"a.png"] * n, "fine_labels": rng.integers(0, 100, n).tolist(),
                 "coarse_labels": rng.integers(0, 20, n).tolist(), "data": rng.integers(0, 256, (n, 3072), dtype=np.uint8)}
        (d / name).write_bytes(py2_cifar_pickle(entry))
        if name == "train":
            fine, coarse = entry["fine_labels"], entry["coarse_labels"]
    fine_ds = load_dataset("cifar100", None, str(tmp_path), 0)
    assert fine_ds.num_classes == 100 and fine_ds.y_train.tolist() == fine
    coarse_ds = load_dataset("cifar100", build("cifar100", {"labels": "coarse"}), str(tmp_path), 0)
    assert coarse_ds.num_classes == 20 and coarse_ds.y_train.tolist() == coarse


def test_cifar_truncated_and_inconsistent(tmp_path):
    d = write_cifar10(str(tmp_path))
    path = os.path.join(d, "data_batch_3")
    blob = open(path, "rb").read()
    open(path, "wb").write(blob[: len(blob) // 2])
    with pytest.raises(DataError, match="data_batch_3 is truncated or not a CIFAR-10 python batch"):
        load_dataset("cifar10", None, str(tmp_path), 0)
    # 6 labels but 5 images
    data = np.zeros((5, 3072), np.uint8)
    open(path, "wb").write(py2_cifar_pickle({"labels": [0] * 6, "data": data}))
    with pytest.raises(DataError, match=r"data_batch_3: expected 6 images of 3072 bytes \(18432 bytes\), found 15360"):
        load_dataset("cifar10", None, str(tmp_path), 0)
    os.remove(path)
    with pytest.raises(DataError, match="missing file .*data_batch_3"):
        load_dataset("cifar10", None, str(tmp_path), 0)


# --------------------------------------------------- restricted unpickler: what it refuses
#
# Hand-made pickles use the opcodes of pickletools: c GLOBAL, R REDUCE, b BUILD, ( MARK,
# t TUPLE, ) EMPTY_TUPLE, } EMPTY_DICT, ] EMPTY_LIST, u SETITEMS, e APPENDS, i INST, V UNICODE
# (protocol 0), X BINUNICODE, B BINBYTES, J BININT, \x85/\x86/\x87 TUPLE1-3, \x88/\x89 True/False,
# \x81 NEWOBJ, \x82 EXT1, P/Q PERSID/BINPERSID, \x8f/\x90 EMPTY_SET/ADDITEMS.


def _g(module: str, name: str) -> bytes:
    return f"c{module}\n{name}\n".encode()


def _u(s: str) -> bytes:
    return b"X" + struct.pack("<I", len(s.encode())) + s.encode()


def _b(b: bytes) -> bytes:
    return b"B" + struct.pack("<I", len(b)) + b  # BINBYTES


def _i(v: int) -> bytes:
    return b"J" + struct.pack("<i", v)


def _tuple(*items: bytes) -> bytes:
    return b"(" + b"".join(items) + b"t"


_DTYPE_STATE = (3, "|", None, None, None, -1, -1, 0)


def _val(v) -> bytes:
    if v is None:
        return b"N"
    if isinstance(v, int):
        return _i(v)
    if isinstance(v, tuple):
        return _tuple(*map(_val, v))
    if isinstance(v, dict):
        return b"}(" + b"".join(_val(k) + _val(x) for k, x in v.items()) + b"u"
    return _u(v)


def _state(st) -> bytes:
    return _val(tuple(st))


def _dtype(spec="u1", state=_DTYPE_STATE) -> bytes:
    return _g("numpy", "dtype") + _u(spec) + b"\x89\x88\x87R" + (_state(state) + b"b" if state else b"")


def _array(shape=(2, 3), dtype=None, raw=None, raw_op=None, subtype=None, reconstruct="numpy._core.multiarray",
           args=None, state=None) -> bytes:
    """numpy's own protocol-2..4 layout: _reconstruct(ndarray, (0,), b'b') BUILD (1, shape, dtype, False, raw).

    Each keyword replaces one part with other opcodes (raw_op: the opcodes of the data item)."""
    raw_op = raw_op or _b(bytes(int(np.prod(shape))) if raw is None else raw)
    args = args if args is not None else (subtype or _g("numpy", "ndarray")) + _i(0) + b"\x85" + _b(b"b") + b"\x87"
    st = state if state is not None else _tuple(_i(1), _tuple(*map(_i, shape)), dtype or _dtype(), b"\x89", raw_op)
    return _g(reconstruct, "_reconstruct") + args + b"R" + st + b"b"


def _batch(data: bytes, labels=b"]") -> bytes:
    """A protocol-4 CIFAR-10 dict {b'batch_label', b'labels', b'data'} around a hand-made value."""
    return (b"\x80\x04}(" + _b(b"batch_label") + _b(b"crafted") + _b(b"labels") + labels
            + _b(b"data") + data + b"u.")


def _refused(tmp_path, blob: bytes, what: str):
    path = tmp_path / "crafted_batch"
    path.write_bytes(blob)
    with pytest.raises(DataError, match=rf"crafted_batch: refusing to load {what}") as e:
        read_pickle(str(path), "a CIFAR-10 python batch")
    return str(e.value)


def test_handmade_pickles_are_numpy_layout(tmp_path):
    """The crafting helpers above make what numpy makes: a clean one loads (the refusals
    below then differ from it in the one thing they test)."""
    p = tmp_path / "b"
    p.write_bytes(_batch(_array((2, 3), raw=bytes(range(6))), labels=b"](" + _i(4) + _i(7) + b"e"))
    d = read_pickle(str(p), "x")
    assert d["batch_label"] == b"crafted" and d["labels"] == [4, 7]
    assert d["data"].dtype == np.uint8 and d["data"].tolist() == [[0, 1, 2], [3, 4, 5]]
    p.write_bytes(_batch(_array((2,), dtype=_dtype("i4", (3, ">", None, None, None, -1, -1, 0)),
                                raw=b"\x00\x00\x00\x05\xff\xff\xff\xfe")))
    assert read_pickle(str(p), "x")["data"].tolist() == [5, -2]
    p.write_bytes(_batch(_array((2, 3), reconstruct="numpy.core.multiarray", raw=bytes(6))))
    assert read_pickle(str(p), "x")["data"].shape == (2, 3)


class Evil:
    def __init__(self, fn, *args):
        self.fn, self.args = fn, args

    def __reduce__(self):
        return (self.fn, self.args)


def _code_payloads(marker: str):
    import subprocess

    touch = f"touch {marker}"
    yield "os.system, protocol 0", b"cos\nsystem\n(V" + touch.encode() + b"\ntR.", r"the global os\.system"
    yield "os.system via INST", b"(V" + touch.encode() + b"\nios\nsystem\n.", r"the global os\.system"
    yield "posix.system in a batch", pickle.dumps({b"data": Evil(os.system, touch), b"labels": []}, protocol=2), \
        r"the global (posix|os)\.system"
    yield "builtins.eval", b"c__builtin__\neval\n(V" + f"open({marker!r}, 'w').close()".encode() + b"\ntR.", \
        r"the global __builtin__\.eval"
    yield "builtins.exec, protocol 4", pickle.dumps(Evil(exec, f"open({marker!r}, 'w').close()"), protocol=4), \
        r"the global builtins\.exec"
    yield "subprocess.call, protocol 5", pickle.dumps(Evil(subprocess.call, ["touch", marker]), protocol=5), \
        r"the global subprocess\.call"
    yield "os.system after a valid array", pickle.dumps(
        {b"data": np.zeros((1, 3072), np.uint8), b"labels": [0], b"x": Evil(os.system, touch)}, protocol=2), \
        r"the global (posix|os)\.system"


@pytest.mark.parametrize("case", [c[0] for c in _code_payloads("m")])
def test_refuses_code_execution(tmp_path, case):
    marker = str(tmp_path / "marker")
    blob, what = {c[0]: c[1:] for c in _code_payloads(marker)}[case]
    pickle.loads(blob)  # the payload is live: a plain unpickler runs it
    assert os.path.exists(marker)
    os.remove(marker)
    _refused(tmp_path, blob, what)
    assert not os.path.exists(marker)


def test_refuses_code_execution_in_a_cifar_dir(tmp_path):
    d = write_cifar10(str(tmp_path))
    marker = tmp_path / "marker"
    with open(os.path.join(d, "test_batch"), "wb") as f:
        f.write(pickle.dumps({b"data": Evil(os.system, f"touch {marker}"), b"labels": []}))
    with pytest.raises(DataError, match=r"test_batch: refusing to load the global (posix|os)\.system; "
                                        r"expected a CIFAR-10 python batch"):
        load_dataset("cifar10", None, str(tmp_path), 0)
    assert not marker.exists()


class Plain:
    pass


@pytest.mark.parametrize("blob, what", [
    (pickle.dumps({b"data": collections.OrderedDict(a=1)}, protocol=2), r"the global collections\.OrderedDict"),
    (pickle.dumps(collections.OrderedDict(a=1), protocol=5), r"the global collections\.OrderedDict"),
    (pickle.dumps({b"labels": [np.int64(3)]}, protocol=2), r"the global numpy\.(_)?core\.multiarray\.scalar"),
    (pickle.dumps(Plain(), protocol=0), r"the global copy_reg\._reconstructor"),
    (pickle.dumps(Plain(), protocol=4), r"the global \S*test_data_files\.Plain"),
    (_g("numpy", "load") + _tuple(_u("/etc/passwd")) + b"R.", r"the global numpy\.load"),
    (_g("numpy", "frombuffer") + _tuple(_b(bytes(8)), _u("O")) + b"R.", r"the global numpy\.frombuffer"),
    (_g("numpy.core.multiarray", "scalar") + _tuple(_dtype("u1"), _b(b"\x01")) + b"R.", r"the global numpy\.core"),
    (_g("builtins", "getattr") + _tuple(_g("numpy", "dtype"), _u("__init__")) + b"R.", r"the global builtins\.getattr"),
    # what the allowed globals will not do: bytes() with data, _codecs.encode to anything but latin1,
    # BUILD on a global (setting its attributes), a global or dtype left as a value, a set
    (_g("builtins", "bytes") + _tuple(_i(5)) + b"R.", r"bytes with 1 positional"),
    (_g("_codecs", "encode") + _tuple(_u("x"), _u("rot13")) + b"R.", r"a _codecs\.encode call other than"),
    (_g("numpy", "dtype") + b"}(" + _u("__defaults__") + _tuple(_u("O8")) + b"ub.", r"BUILD on numpy\.dtype"),
    (b"}(" + _b(b"data") + _g("numpy", "dtype") + b"u.", r"the global numpy\.dtype as a value"),
    (b"}(" + _b(b"data") + _dtype("u1") + b"u.", r"a numpy dtype as a value"),
    (b"\x80\x04\x8f(" + _i(1) + b"\x90.", r"an object of type set"),
    (b"\x80\x02P" + b"os.system\n.", r"a persistent id 'os.system'"),
    (b"\x80\x02" + _u("x") + b"Q.", r"a persistent id 'x'"),
], ids=["OrderedDict-p2", "OrderedDict-p5", "numpy-scalar", "copyreg", "plain-class", "numpy.load",
        "numpy.frombuffer", "numpy-scalar-crafted", "getattr", "bytes-args", "codecs-rot13",
        "build-on-global", "global-as-value", "dtype-as-value", "set", "persid", "binpersid"])
def test_refuses_other_objects(tmp_path, blob, what):
    _refused(tmp_path, blob, what)


@pytest.mark.parametrize("protocol", [0, 2, 4, 5])
def test_refuses_object_arrays(tmp_path, protocol):
    arr = np.array([1, "x", None], dtype=object)
    _refused(tmp_path, pickle.dumps({b"data": arr, b"labels": [0]}, protocol=protocol), r"numpy dtype 'O8'")


@pytest.mark.parametrize("blob, what", [
    # a uint8 dtype whose BUILD state sets the object flags (63) as numpy writes them for 'O8'
    (_batch(_array(dtype=_dtype("u1", (3, "|", None, None, None, -1, -1, 63)))), r"numpy dtype 'u1' with state"),
    # a valid dtype with object data: a list instead of bytes, as numpy writes for object arrays
    (_batch(_array((2,), raw_op=b"](" + _g("os", "getcwd") + b"e")), r"the global os\.getcwd"),
    (_batch(_array((2,), raw_op=b"](" + _i(1) + _i(2) + b"e")), r"numpy array data of type list \(object arrays"),
    (_batch(_array((1,), dtype=_dtype("O8", (3, "|", None, None, None, -1, -1, 63)))), r"numpy dtype 'O8'"),
    (_batch(_array((1,), dtype=_dtype("O4"))), r"numpy dtype 'O4'"),
], ids=["object-flags", "object-data-global", "object-data-list", "O8", "O4"])
def test_refuses_object_arrays_crafted(tmp_path, blob, what):
    _refused(tmp_path, blob, what)


@pytest.mark.parametrize("protocol", [2, 5])
@pytest.mark.parametrize("dtype", [
    [("a", "u1"), ("b", "<f4")], [("a", "u1", (2,))], "V4", "S3", "U2", "M8[s]", "m8[D]", "c8", "f16",
], ids=["struct", "struct-subarray", "void", "bytes", "unicode", "datetime", "timedelta", "complex", "longdouble"])
def test_refuses_structured_and_other_dtypes(tmp_path, protocol, dtype):
    arr = np.zeros(2, dtype=dtype)
    _refused(tmp_path, pickle.dumps({b"data": arr, b"labels": [0, 1]}, protocol=protocol), r"numpy dtype '")


@pytest.mark.parametrize("state, what", [
    ((3, "|", None, ("a",), {"a": 1}, 2, 1, 16), "state"),           # names, fields
    ((3, "|", ("x",), None, None, -1, -1, 0), "state"),                # subarray
    ((3, "|", None, None, None, 8, 1, 0), "state"),                    # elsize
    ((4, "|", None, None, None, -1, -1, 0, "meta"), "state"),          # metadata
    ((2, "|", None, None, None, -1, -1, 0), "state"),                  # unknown version
    ((3, "!", None, None, None, -1, -1, 0), "byte order '!'"),
    ("not a tuple", "state"),
])
def test_refuses_crafted_dtype_state(tmp_path, state, what):
    blob = _batch(_array(dtype=_g("numpy", "dtype") + _u("u1") + b"\x89\x88\x87R"
                         + (_state(state) if isinstance(state, tuple) else _u(state)) + b"b"))
    _refused(tmp_path, blob, rf"numpy dtype .*{what}")


@pytest.mark.parametrize("blob, what", [
    # numpy.ndarray called directly, as __reduce__ tricks would: ndarray((2,), 'O') and with a buffer
    (_batch(_g("numpy", "ndarray") + _tuple(_tuple(_i(2)), _u("O")) + b"R"), r"a call of numpy\.ndarray"),
    (pickle.dumps({b"data": Evil(np.ndarray, (2,), "O")}, protocol=2), r"a call of numpy\.ndarray"),
    (pickle.dumps({b"data": Evil(np.ndarray, (2,), np.dtype(object))}, protocol=5), r"numpy dtype 'O8'"),
    (pickle.dumps({b"data": Evil(np.ndarray, (2,), "u1", b"ab")}, protocol=4), r"a call of numpy\.ndarray"),
    (_batch(_g("numpy", "ndarray") + _tuple(_i(1)) + b"b"), r"BUILD on numpy\.ndarray"),
    (b"}(" + _b(b"data") + _g("numpy", "ndarray") + b"u.", r"numpy\.ndarray as a value"),
    # _reconstruct with another subtype or other arguments than numpy's (0,), b'b'
    (_batch(_array(subtype=_g("numpy", "dtype"))), r"_reconstruct of a _Global"),
    (_batch(_array(args=_g("numpy", "ndarray") + _i(5) + b"\x85" + _u("O") + b"\x87")), r"_reconstruct arguments"),
    (_batch(_array(args=_tuple(_g("numpy", "ndarray")))), r"_reconstruct with 1 positional"),
    # BUILD states that are not (1, shape, dtype, is_fortran, bytes), a dtype used before its
    # BUILD, a second BUILD, an array never built
    (_batch(_array(state=_tuple(_i(1), _tuple(_i(-3)), _dtype(), b"\x89", _b(b"")))), r"numpy array shape"),
    (_batch(_array(state=_tuple(_i(1), _u("2"), _dtype(), b"\x89", _b(b"ab")))), r"numpy array shape"),
    (_batch(_array(state=_tuple(_i(1), _tuple(*[_i(1)] * 40), _dtype(), b"\x89", _b(b"a")))), r"numpy array shape"),
    (_batch(_array(state=_tuple(_i(1), _tuple(_i(2)), _u("u1"), b"\x89", _b(b"ab")))), r"str where a numpy dtype"),
    (_batch(_array(state=_tuple(_i(1), _tuple(_i(2)), _dtype(), _u("yes"), _b(b"ab")))),
     r"numpy array is_fortran 'yes'"),
    (_batch(_array(state=_tuple(_i(2), _tuple(_i(2)), _dtype(), b"\x89", _b(b"ab")))), r"numpy array state"),
    (_batch(_array(state=_i(0))), r"numpy array state of type int"),
    (_batch(_array((2,), dtype=_dtype(state=None))), r"numpy dtype 'u1' without its BUILD state"),
    (_batch(_array((2,), raw=bytes(2)) + _tuple(_i(1), _tuple(_i(2)), _dtype(), b"\x89", _b(b"ab")) + b"b"),
     r"a second BUILD on a numpy array"),
    (_batch(_dtype() + _state(_DTYPE_STATE) + b"b"), r"a second BUILD on a numpy dtype"),
    (_batch(_g("numpy._core.multiarray", "_reconstruct") + _g("numpy", "ndarray") + _i(0) + b"\x85" + _b(b"b")
            + b"\x87R"), r"a numpy array without its BUILD state"),
    # protocol 5 _frombuffer: only bytes, a checked dtype, C or F order
    (_batch(_g("numpy._core.numeric", "_frombuffer") + _tuple(_b(bytes(2)), _dtype("O8"), _tuple(_i(2)), _u("C"))
            + b"R"), r"numpy dtype 'O8'"),
    (_batch(_g("numpy._core.numeric", "_frombuffer") + _tuple(b"](e", _dtype(), _tuple(_i(2)), _u("C"))
            + b"R"), r"numpy array data of type list"),
    (_batch(_g("numpy._core.numeric", "_frombuffer") + _tuple(_b(bytes(2)), _dtype(), _tuple(_i(2)), _u("K"))
            + b"R"), r"_frombuffer order 'K'"),
    (_batch(_g("numpy._core.numeric", "_frombuffer") + _tuple(_b(bytes(2)), _dtype(), _tuple(_i(2)), _u("C"))
            + b"R" + _tuple(_i(1), _tuple(_i(2)), _dtype(), b"\x89", _b(b"ab")) + b"b"),
     r"a second BUILD on a numpy array"),
], ids=["ndarray-call", "ndarray-reduce-str-O", "ndarray-reduce-dtype-O", "ndarray-reduce-buffer", "ndarray-build",
        "ndarray-value", "reconstruct-subtype", "reconstruct-args", "reconstruct-arity", "shape-negative",
        "shape-str", "shape-40-dims", "dtype-str", "fortran-str", "state-version", "state-int",
        "dtype-unbuilt", "array-build-twice", "dtype-build-twice", "array-unbuilt", "frombuffer-object",
        "frombuffer-list", "frombuffer-order", "frombuffer-build"])
def test_refuses_ndarray_tricks(tmp_path, blob, what):
    _refused(tmp_path, blob, what)


@pytest.mark.parametrize("blob, what", [
    (_batch(_g("numpy", "ndarray") + b")\x81"), r"NEWOBJ class argument must be a type, not _NdarrayToken"),
    (_batch(_g("numpy", "dtype") + _tuple(_u("O8")) + b"\x81"), r"NEWOBJ class argument must be a type"),
    (b"\x80\x02\x82\x01.", r"unregistered extension code 1"),
], ids=["newobj-ndarray", "newobj-dtype", "ext1"])
def test_unpickler_level_rejections_are_data_errors(tmp_path, blob, what):
    """Opcodes that never reach find_class (NEWOBJ, extension codes) fail in
    the unpickler itself; they are data errors too."""
    p = tmp_path / "crafted_batch"
    p.write_bytes(blob)
    with pytest.raises(DataError, match=rf"crafted_batch is truncated or not x .*({what})"):
        read_pickle(str(p), "x")


def test_wrong_size_is_a_data_error_and_refusals_leave_no_trace(tmp_path):
    p = tmp_path / "b"
    p.write_bytes(_batch(_array((2, 3), raw=bytes(5))))
    with pytest.raises(DataError, match=r"b is truncated or not x .*needs 6 bytes, found 5"):
        read_pickle(str(p), "x")
    # BUILD on numpy.dtype was refused above; the allowed globals are unchanged and still work
    _refused(tmp_path, _g("numpy", "dtype") + b"}(" + _u("__defaults__") + _tuple(_u("O8")) + b"ub.", "BUILD")
    p.write_bytes(pickle.dumps({b"data": np.arange(4, dtype=np.uint8)}, protocol=2))
    assert read_pickle(str(p), "x")["data"].tolist() == [0, 1, 2, 3]


# -------------------------------------------------- restricted unpickler: what it accepts


@pytest.mark.parametrize("protocol", [0, 1, 2, 3, 4, 5])
def test_numpy_arrays_of_plain_dtypes_roundtrip(tmp_path, protocol):
    arrays = {
        b"data": np.random.default_rng(0).integers(0, 256, (4, 3072), dtype=np.uint8),
        b"i8": np.arange(-3, 3, dtype=np.int64),
        b"be": np.arange(6, dtype=">i4").reshape(2, 3),
        b"f4F": np.asfortranarray(np.linspace(0, 1, 12, dtype=np.float32).reshape(3, 4)),
        b"f2": np.array([0.5, -2], dtype=np.float16),
        b"bool": np.array([True, False, True]),
        b"0d": np.array(7, dtype=np.uint16),
        b"empty": np.zeros((0, 3072), dtype=np.uint8),
    }
    p = tmp_path / "b"
    p.write_bytes(pickle.dumps({**arrays, b"labels": [1, 2, 3, 4], b"batch_label": b"", b"meta": ("x", 1.5, None)},
                               protocol=protocol))
    d = read_pickle(str(p), "x")
    for k, a in arrays.items():
        got = d[k.decode()]
        assert type(got) is np.ndarray and got.dtype == a.dtype and got.shape == a.shape, k
        assert np.array_equal(got, a), k
        assert got.flags.writeable
    assert d["f4F"].flags.f_contiguous and d["labels"] == [1, 2, 3, 4] and d["meta"] == ("x", 1.5, None)
    assert d["batch_label"] == b""


@pytest.mark.parametrize("protocol", [2, 4, 5])
def test_cifar10_and_cifar100_from_python3_pickles(tmp_path, protocol):
    """Batches as ``pickle.dumps`` writes them from real numpy arrays (py2 cPickle files are
    covered by the roundtrip tests above, loaded with encoding='bytes')."""
    rng = np.random.default_rng(protocol)
    d10 = tmp_path / "c10" / "cifar-10-batches-py"
    d10.mkdir(parents=True)
    want10 = []
    for name in [f"data_batch_{i}" for i in range(1, 6)] + ["test_batch"]:
        data, labels = rng.integers(0, 256, (3, 3072), dtype=np.uint8), rng.integers(0, 10, 3).tolist()
        want10.append((data, labels))
        (d10 / name).write_bytes(pickle.dumps({b"batch_label": b"batch", b"labels": labels, b"data": data,
                                               b"filenames": [b"x.png"] * 3}, protocol=protocol))
    (d10 / "batches.meta").write_bytes(pickle.dumps({b"label_names": [b"cat"] * 10, b"num_cases_per_batch": 3,
                                                     b"num_vis": 3072}, protocol=protocol))
    ds = load_dataset("cifar10", build("cifar10", {"normalize": "none"}), str(tmp_path / "c10"), 0)
    assert ds.y_train.tolist() == sum((lab for _, lab in want10[:5]), [])
    assert ds.y_test.tolist() == want10[5][1]
    np.testing.assert_allclose(ds.x_train.reshape(15, 3072), np.concatenate([x for x, _ in want10[:5]]) / 255.0,
                               atol=1e-6)

    d100 = tmp_path / "c100" / "cifar-100-python"
    d100.mkdir(parents=True)
    want100 = {}
    for name, n in (("train", 5), ("test", 2)):
        entry = {b"filenames": [b"a.png"] * n, b"batch_label": b"training batch 1 of 1",
                 b"fine_labels": rng.integers(0, 100, n).tolist(), b"coarse_labels": rng.integers(0, 20, n).tolist(),
                 b"data": rng.integers(0, 256, (n, 3072), dtype=np.uint8)}
        want100[name] = entry
        (d100 / name).write_bytes(pickle.dumps(entry, protocol=protocol))
    (d100 / "meta").write_bytes(pickle.dumps({b"fine_label_names": [b"f"] * 100,
                                              b"coarse_label_names": [b"c"] * 20}, protocol=protocol))
    fine = load_dataset("cifar100", build("cifar100", {"normalize": "none"}), str(tmp_path / "c100"), 0)
    assert fine.num_classes == 100 and fine.y_train.tolist() == want100["train"][b"fine_labels"]
    assert fine.y_test.tolist() == want100["test"][b"fine_labels"]
    np.testing.assert_allclose(fine.x_test.reshape(2, 3072), want100["test"][b"data"] / 255.0, atol=1e-6)
    coarse = load_dataset("cifar100", build("cifar100", {"labels": "coarse"}), str(tmp_path / "c100"), 0)
    assert coarse.num_classes == 20 and coarse.y_train.tolist() == want100["train"][b"coarse_labels"]


def test_missing_root():
    with pytest.raises(ConfigError, match="data.root is not set"):
        load_dataset("cifar10", None, None, 0)
    with pytest.raises(DataError, match="not a directory"):
        load_dataset("mnist", None, "/nonexistent/dir", 0)


# -------------------------------------------------------------------------------- IDX


@pytest.mark.parametrize("gz", [False, True])
def test_mnist_idx_roundtrip(tmp_path, gz):
    write_mnist(str(tmp_path), gz=gz)
    raw = read_idx(str(tmp_path / ("train-images-idx3-ubyte" + (".gz" if gz else ""))))
    ds = load_dataset("mnist", None, str(tmp_path), 0)
    assert ds.x_train.shape == (7, 1, 28, 28) and ds.x_test.shape == (3, 1, 28, 28)
    np.testing.assert_allclose(ds.x_train[:, 0], (raw / 255.0 - 0.1307) / 0.3081, atol=1e-5)
    half = load_dataset("fashion_mnist", build("fashion_mnist", {"normalize": "half"}), str(tmp_path), 0)
    np.testing.assert_allclose(half.x_train[:, 0], (raw / 255.0 - 0.5) / 0.5, atol=1e-5)


def test_idx_header_dtypes(tmp_path):
    arr = np.arange(12, dtype=">i4").reshape(3, 4)
    p = tmp_path / "x.idx"
    p.write_bytes(idx_bytes(arr, 0x0C))
    out = read_idx(str(p))
    assert out.dtype == np.int32 and out.tolist() == arr.tolist()


def test_idx_truncated_and_wrong_magic(tmp_path):
    write_mnist(str(tmp_path), n=10000, m=2)
    p = tmp_path / "train-images-idx3-ubyte"
    p.write_bytes(p.read_bytes()[:1250])
    with pytest.raises(DataError, match=r"train-images-idx3-ubyte: expected 10000 images of 784 bytes "
                                        r"\(7840000 bytes after the header\), found 1234 bytes"):
        load_dataset("mnist", None, str(tmp_path), 0)
    p.write_bytes(b"\x12\x34\x56\x78" + b"\x00" * 100)
    with pytest.raises(DataError, match=r"train-images-idx3-ubyte: not an IDX file \(magic bytes 12345678"):
        load_dataset("mnist", None, str(tmp_path), 0)
    write_mnist(str(tmp_path), gz=True, n=5, m=2)
    os.remove(p)
    g = tmp_path / "train-images-idx3-ubyte.gz"
    g.write_bytes(g.read_bytes()[:-20])
    with pytest.raises(DataError, match=r"train-images-idx3-ubyte\.gz: truncated or corrupt gzip"):
        load_dataset("mnist", None, str(tmp_path), 0)


def test_idx_label_out_of_range(tmp_path):
    write_mnist(str(tmp_path), label_max=12)
    with pytest.raises(DataError, match="labels outside 0..9"):
        load_dataset("mnist", None, str(tmp_path), 0)


def test_emnist_split_names_transpose_and_letters(tmp_path):
    gzdir = tmp_path / "gzip"
    gzdir.mkdir()
    write_mnist(str(gzdir), prefix="emnist-letters-", gz=True, label_max=27)
    raw_x = read_idx(str(gzdir / "emnist-letters-train-images-idx3-ubyte.gz"))
    raw_y = read_idx(str(gzdir / "emnist-letters-train-labels-idx1-ubyte.gz"))
    raw_y = np.maximum(raw_y, 1)  # letters are 1..26
    with gzip.open(gzdir / "emnist-letters-train-labels-idx1-ubyte.gz", "wb") as f:
        f.write(idx_bytes(raw_y.astype(np.uint8)))
    ds = load_dataset("emnist", build("emnist", {"split": "letters", "normalize": "none"}), str(tmp_path), 0)
    assert ds.num_classes == 26 and ds.y_train.tolist() == (raw_y.astype(int) - 1).tolist()
    np.testing.assert_allclose(ds.x_train[0, 0], raw_x[0].T / 255.0, atol=1e-6)
    with pytest.raises(DataError, match="emnist-balanced-train-images-idx3-ubyte"):
        load_dataset("emnist", None, str(tmp_path), 0)


# -------------------------------------------------------------------------------- npz


def test_npz_with_and_without_test_split(tmp_path):
    x = np.random.default_rng(0).normal(size=(50, 4)).astype(np.float64)
    y = np.arange(50) % 3
    np.savez(tmp_path / "a.npz", x=x, y=y)
    ds = load_dataset("npz", build("npz", {"file": "a.npz", "test_fraction": 0.2}), str(tmp_path), 5)
    assert ds.x_train.shape == (40, 4) and ds.x_test.shape == (10, 4) and ds.num_classes == 3
    assert ds.x_train.dtype == np.float32 and ds.y_train.dtype == np.int64
    both = np.concatenate([ds.x_train, ds.x_test])
    assert sorted(map(tuple, both.round(5))) == sorted(map(tuple, x.astype(np.float32).round(5)))
    again = load_dataset("npz", build("npz", {"file": "a.npz"}), str(tmp_path), 5)
    assert np.array_equal(again.y_test, ds.y_test)
    np.savez(tmp_path / "b.npz", x=x, y=y, x_test=x[:7], y_test=y[:7])
    ds = load_dataset("npz", build("npz", {"file": str(tmp_path / "b.npz")}), None, 0)
    assert ds.x_train.shape == (50, 4) and ds.x_test.shape == (7, 4)


def test_npz_errors(tmp_path):
    np.savez(tmp_path / "a.npz", x=np.zeros((3, 2)))
    with pytest.raises(DataError, match=r"a\.npz lacks y"):
        load_dataset("npz", build("npz", {"file": "a.npz"}), str(tmp_path), 0)
    blob = open(tmp_path / "a.npz", "rb").read()
    (tmp_path / "c.npz").write_bytes(blob[:30])
    with pytest.raises(DataError, match=r"c\.npz is truncated or not an \.npz"):
        load_dataset("npz", build("npz", {"file": "c.npz"}), str(tmp_path), 0)
    with pytest.raises(DataError, match=r"missing file .*nope\.npz"):
        load_dataset("npz", build("npz", {"file": "nope.npz"}), str(tmp_path), 0)


@pytest.mark.timeout(60)   # before the fix a FIFO blocked here for good
@pytest.mark.parametrize("kind", ["a FIFO (named pipe)", "a folder", "a character device"])
def test_a_data_file_that_is_not_a_regular_file_is_refused_without_blocking(tmp_path, kind):
    """A FIFO as data.npz.file hung start-up, deaf to SIGTERM (issue 37.3): open() waits for a
    writer. Every data file is now checked to be a regular file before it is read."""
    import time

    path = tmp_path / "d.npz"
    if kind.startswith("a FIFO"):
        os.mkfifo(path)
    elif kind == "a folder":
        path.mkdir()
    else:
        path.symlink_to("/dev/zero")           # reads forever, never ends: no data file either
    t = time.monotonic()
    with pytest.raises(DataError, match=re.escape(f"cannot read {path}: not a regular file but {kind}")):
        load_dataset("npz", build("npz", {"file": "d.npz"}), str(tmp_path), 0)
    with pytest.raises(DataError, match="not a regular file"):   # the other formats share the open path
        read_idx(str(path))
    assert time.monotonic() - t < 10


def test_open_regular_reads_a_regular_file_in_blocking_mode(tmp_path):
    from hpcfl.inputs import open_regular

    (tmp_path / "a.txt").write_text("héllo\n")
    with open_regular(tmp_path / "a.txt", "r", encoding="utf-8") as f:
        assert f.read() == "héllo\n" and os.get_blocking(f.fileno())   # O_NONBLOCK only for the check
    with open_regular(tmp_path / "a.txt") as f:
        assert f.read() == "héllo\n".encode()


def test_open_regular_never_waits_for_a_fifos_writer(tmp_path):
    """The open itself must not block on a FIFO (O_NONBLOCK): tried in a thread with a 5 s deadline,
    so that a regression fails here at once instead of hanging the suite until its timeout."""
    import threading

    from hpcfl.inputs import open_regular

    path = tmp_path / "in.npz"
    os.mkfifo(path)
    got = []

    def attempt():
        try:
            open_regular(path).close()
            got.append("opened")
        except OSError as err:
            got.append(err)

    t = threading.Thread(target=attempt, daemon=True)
    t.start()
    t.join(5.0)
    waited = t.is_alive()
    if waited:   # release the blocked open (a writer appears), so that no thread is left behind
        fd = os.open(path, os.O_WRONLY | os.O_NONBLOCK)
        t.join(5.0)
        os.close(fd)
    assert not waited, "open_regular blocked on a FIFO waiting for a writer"
    assert isinstance(got[0], OSError) and "not a regular file but a FIFO (named pipe)" in str(got[0])
