"""A restricted unpickler for CIFAR's "python version" batches.

Only dicts, lists, tuples, str, bytes, numbers, None and bool/integer/float numpy arrays
can come out of :func:`load`; any other global, call or dtype raises :class:`Refused`
(an ``UnpicklingError``), so a crafted file can neither run code nor build objects.
"""

from __future__ import annotations

import pickle
import re

import numpy as np

#
# A CIFAR "python version" file is a pickled dict of bytes/str keys, int lists, bytes lists
# and one uint8 (n, 3072) ndarray. A numpy array pickles as
#
#   protocol 0-4: _reconstruct(ndarray, (0,), b'b'), then BUILD (1, shape, dtype, fortran, raw)
#   protocol 5:   _frombuffer(raw, dtype, shape, order)
#
# where dtype is numpy.dtype('u1', False, True) followed by BUILD (3, '|', None, None, None,
# -1, -1, 0), and (protocol < 3, written by Python 3) bytes come as _codecs.encode(s, 'latin1')
# (b'' as bytes()).
# Those are the only globals find_class hands out, and never the real objects: each is a
# _Global that validates its arguments, numpy.ndarray is a token that only _reconstruct
# accepts, and dtypes and arrays are proxies whose __setstate__ checks the BUILD state. No
# numpy __setstate__ ever runs on pickle data; arrays are made by np.frombuffer from a
# validated (bytes, dtype, shape, order). After load the proxies are swapped for the arrays,
# and anything else that is not a dict, list, tuple, str, bytes, number or None is refused.

_DTYPE_SPECS = re.compile(r"[ui][1248]|f[248]|b1")  # bool, integer and float dtypes only
_BYTEORDERS = ("<", ">", "|", "=")
_MAX_DIMS = 32
_MAX_DEPTH = 32
_SCALARS = (str, bytes, bytearray, int, float, bool, type(None))


class Refused(pickle.UnpicklingError):
    """The pickle asks for something a CIFAR file never holds."""


def _text(v, what: str) -> str:
    """A str, or bytes as a Python 2 ``str`` loads with encoding='bytes'."""
    if type(v) is bytes:
        return v.decode("latin1")
    if type(v) is not str:
        raise Refused(f"{what} of type {type(v).__name__}")
    return v


def _short(v) -> str:
    r = repr(v)
    return r if len(r) <= 80 else r[:77] + "..."


def _is_int(v, *allowed) -> bool:
    return type(v) is int and (not allowed or v in allowed)


def _flag(v, what: str) -> bool:
    if type(v) is bool or _is_int(v, 0, 1):
        return bool(v)
    raise Refused(f"{what} {_short(v)}")


def _shape(v) -> tuple:
    if type(v) is not tuple or len(v) > _MAX_DIMS or not all(_is_int(d) and d >= 0 for d in v):
        raise Refused(f"numpy array shape {_short(v)} (expected a tuple of non-negative ints)")
    return v


class _Global:
    """What find_class returns: validates arguments; BUILD on it is refused."""

    __slots__ = ("name", "fn", "nargs")
    __hash__ = None  # cannot hide in a set, frozenset or dict key

    def __init__(self, name, fn, nargs):
        self.name, self.fn, self.nargs = name, fn, nargs

    def __call__(self, *args, **kwargs):
        if kwargs or len(args) not in self.nargs:
            raise Refused(f"{self.name} with {len(args)} positional and {len(kwargs)} keyword arguments")
        return self.fn(*args)

    def __setstate__(self, state):
        raise Refused(f"BUILD on {self.name}")


class _DtypeProxy:
    """``numpy.dtype(spec, align, copy)`` as pickled; resolved once its BUILD state is checked."""

    __slots__ = ("spec", "order")
    __hash__ = None

    def __init__(self, spec: str):
        self.spec, self.order = spec, None

    def __setstate__(self, st):
        if self.order is not None:
            raise Refused("a second BUILD on a numpy dtype")
        # version 3: (3, byteorder, subarray, names, fields, elsize, alignment, flags);
        # version 4 appends metadata. Plain numeric dtypes have no subarray, names, fields,
        # metadata or flags (flags would mark object fields), and elsize = alignment = -1.
        if (type(st) is not tuple or len(st) not in (8, 9) or not _is_int(st[0], len(st) - 5)
                or st[2:5] != (None, None, None) or not _is_int(st[5], -1) or not _is_int(st[6], -1)
                or not _is_int(st[7], 0) or (len(st) == 9 and st[8] is not None)):
            raise Refused(f"numpy dtype {self.spec!r} with state {_short(st)} (structured, subarray, "
                           "object or metadata dtypes are not allowed)")
        order = _text(st[1], "numpy dtype byte order")
        if order not in _BYTEORDERS:
            raise Refused(f"numpy dtype byte order {order!r}")
        self.order = order

    def resolve(self) -> np.dtype:
        if self.order is None:
            raise Refused(f"numpy dtype {self.spec!r} without its BUILD state")
        return np.dtype(self.spec).newbyteorder(self.order)


def _dtype_of(v) -> np.dtype:
    if type(v) is not _DtypeProxy:
        raise Refused(f"{type(v).__name__} where a numpy dtype belongs")
    return v.resolve()


def _make_array(raw, dtype, shape: tuple, order: str) -> np.ndarray:
    if type(raw) not in (bytes, bytearray):
        raise Refused(f"numpy array data of type {type(raw).__name__} (object arrays are not allowed)")
    n = 1
    for d in shape:
        n *= d
    if len(raw) != n * dtype.itemsize:
        raise pickle.UnpicklingError(f"numpy array of shape {shape} and dtype {dtype} needs "
                                     f"{n * dtype.itemsize} bytes, found {len(raw)}")
    if n == 0:
        return np.empty(shape, dtype, order=order)
    a = np.frombuffer(raw, dtype=dtype).reshape(shape, order=order)
    return a if a.flags.writeable else a.copy(order="K")


class _ArrayProxy:
    """``_reconstruct(ndarray, (0,), b'b')``; its BUILD state makes the array."""

    __slots__ = ("array",)
    __hash__ = None

    def __init__(self, array=None):
        self.array = array

    def __setstate__(self, st):
        if self.array is not None:
            raise Refused("a second BUILD on a numpy array")
        if type(st) is not tuple or len(st) != 5 or not _is_int(st[0], 1):
            raise Refused(f"numpy array state of type {type(st).__name__} "
                           "(expected (1, shape, dtype, is_fortran, data))")
        _, shape, dtype, fortran, raw = st
        shape, dtype = _shape(shape), _dtype_of(dtype)
        order = "F" if _flag(fortran, "numpy array is_fortran") else "C"
        self.array = _make_array(raw, dtype, shape, order)


class _NdarrayToken:
    """``numpy.ndarray``: only the subtype argument of _reconstruct, never called or built."""

    __slots__ = ()
    __hash__ = None

    def __call__(self, *args, **kwargs):
        raise Refused("a call of numpy.ndarray (only _reconstruct may use it)")

    def __setstate__(self, state):
        raise Refused("BUILD on numpy.ndarray")


_NDARRAY = _NdarrayToken()


def _np_reconstruct(subtype, shape, dtype):
    if subtype is not _NDARRAY:
        raise Refused(f"_reconstruct of a {type(subtype).__name__} (only numpy.ndarray)")
    if type(shape) is not tuple or len(shape) != 1 or not _is_int(shape[0], 0) \
            or _text(dtype, "_reconstruct dtype") != "b":
        raise Refused(f"_reconstruct arguments {_short(shape)}, {_short(dtype)} (numpy writes (0,), b'b')")
    return _ArrayProxy()


def _np_frombuffer(buf, dtype, shape, order):
    order = _text(order, "_frombuffer order")
    if order not in ("C", "F"):
        raise Refused(f"_frombuffer order {order!r}")
    return _ArrayProxy(_make_array(buf, _dtype_of(dtype), _shape(shape), order))


def _np_dtype(spec, align=False, copy=True):
    spec = _text(spec, "numpy dtype")
    if not _DTYPE_SPECS.fullmatch(spec):
        raise Refused(f"numpy dtype {spec!r} (only bool b1, integer u/i 1-8 and float f2/f4/f8)")
    _flag(align, "numpy dtype align")
    _flag(copy, "numpy dtype copy")
    return _DtypeProxy(spec)


def _codecs_encode(text, encoding):
    if type(text) is not str or encoding != "latin1":
        raise Refused("a _codecs.encode call other than (str, 'latin1')")
    return text.encode("latin1")


def _empty_bytes():
    return b""  # how protocol 2 writes b'' (e.g. the data of a zero-size array)


_G = _Global
_ALLOWED = {
    ("numpy.core.multiarray", "_reconstruct"): _G("_reconstruct", _np_reconstruct, (3,)),
    ("numpy._core.multiarray", "_reconstruct"): _G("_reconstruct", _np_reconstruct, (3,)),
    ("numpy.core.numeric", "_frombuffer"): _G("_frombuffer", _np_frombuffer, (4,)),
    ("numpy._core.numeric", "_frombuffer"): _G("_frombuffer", _np_frombuffer, (4,)),
    ("numpy", "ndarray"): _NDARRAY,
    ("numpy", "dtype"): _G("numpy.dtype", _np_dtype, (1, 2, 3)),
    ("_codecs", "encode"): _G("_codecs.encode", _codecs_encode, (2,)),
    ("__builtin__", "bytes"): _G("bytes", _empty_bytes, (0,)),
    ("builtins", "bytes"): _G("bytes", _empty_bytes, (0,)),
}


class _SafeUnpickler(pickle.Unpickler):
    def find_class(self, module, name):
        try:
            return _ALLOWED[(module, name)]
        except (KeyError, TypeError):
            raise Refused(f"the global {module}.{name}") from None

    def persistent_load(self, pid):
        raise Refused(f"a persistent id {_short(pid)}")


def _finish(obj, depth: int = 0, seen: set | None = None):
    """Swap array proxies for their arrays; refuse every other non-plain object."""
    if seen is None:
        seen = set()
    if depth > _MAX_DEPTH:
        raise Refused(f"containers nested more than {_MAX_DEPTH} deep")
    t = type(obj)
    if t in _SCALARS:
        return obj
    if t is _ArrayProxy:
        if obj.array is None:
            raise Refused("a numpy array without its BUILD state")
        return obj.array
    if t is tuple:
        return tuple(_finish(v, depth + 1, seen) for v in obj)
    if t is list or t is dict:
        if id(obj) not in seen:  # shared or self-referencing containers are fixed once, in place
            seen.add(id(obj))
            if t is list:
                obj[:] = [_finish(v, depth + 1, seen) for v in obj]
            else:
                for k in obj:  # keys are hashable, so never proxies; still refuse odd ones
                    if type(k) not in _SCALARS:
                        _finish(k, depth + 1, seen)
                for k, v in obj.items():
                    obj[k] = _finish(v, depth + 1, seen)
        return obj
    name = {_Global: "the global {0.name} as a value", _DtypeProxy: "a numpy dtype as a value",
            _NdarrayToken: "numpy.ndarray as a value"}.get(t, "an object of type {1}")
    raise Refused(name.format(obj, t.__name__))


def load(f):
    """Unpickle the open binary file ``f`` (``encoding='bytes'``, as Python 2 batches need).

    Raises
    ------
    Refused
        The stream asks for something a CIFAR file never holds.
    """
    return _finish(_SafeUnpickler(f, encoding="bytes").load())
