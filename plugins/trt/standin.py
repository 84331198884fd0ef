"""TensorRT 10.3's Python plugin API surface as plain Python, for driving the project's IPluginV3 plugins where
TensorRT cannot be installed: the names `plugins.trt.plugins.define_plugins` reads from a `tensorrt` module (enums,
tensor descriptors, shape expressions, field collections, the V3 interface classes, the creator and a registry), and
the ILogger base a build's capturing logger subclasses (export.trt.log).
It computes nothing TensorRT computes; plugins.trt.conformance plays TensorRT's part (which method is called when,
and what the 10.3 wrapper does where a method is missing).

Written from NVIDIA/TensorRT v10.3.0, python/src/infer/pyPlugin.cpp (the bindings at its end: class names, property
names, the DimsExprs constructors) and include/NvInferRuntime.h. As in the wrapper, the interface classes define
none of the plugin's callbacks (the bindings' `def`s there are documentation stubs that pybind11's get_override
skips), and a property read before it is set raises AttributeError "<name> not initialized".

Every refusal is marked in a comment or docstring: "10.3:" with the source line that makes it TensorRT 10.3's rule,
or "PROJECT RULE:" where the stand-in is stricter than 10.3, saying what 10.3 does instead."""

import ctypes
import enum
import weakref

import numpy as np

__version__ = "10.3.0"


class DataType(enum.Enum):
    """nvinfer1::DataType (the values TensorRT 10.3 has); `itemsize` in bytes (INT4 packs two per byte)."""

    FLOAT = "float32"
    HALF = "float16"
    INT8 = "int8"
    INT32 = "int32"
    BOOL = "bool"
    UINT8 = "uint8"
    FP8 = "fp8"
    BF16 = "bfloat16"
    INT64 = "int64"
    INT4 = "int4"


def nptype(t: DataType):
    """numpy type of a DataType (tensorrt.nptype). 10.3: TypeError where numpy has none, FP8, BF16 and INT4
    (python/packaging/bindings_wheel/tensorrt/__init__.py v10.3.0 lines 151-173)."""
    if t in (DataType.FP8, DataType.BF16, DataType.INT4):
        raise TypeError(f"{t} has no numpy type")
    return np.dtype(t.value).type


TensorFormat = enum.Enum("TensorFormat", "LINEAR CHW2 HWC8 CHW4 CHW16 CHW32 DHWC8 CDHW32 HWC DLA_LINEAR DLA_HWC4 "
                                         "HWC16 DHWC")
TensorRTPhase = enum.Enum("TensorRTPhase", "BUILD RUNTIME")
PluginCapabilityType = enum.Enum("PluginCapabilityType", "CORE BUILD RUNTIME")
DimensionOperation = enum.Enum("DimensionOperation", "SUM PROD MAX MIN SUB EQUAL LESS FLOOR_DIV CEIL_DIV")
PluginFieldType = enum.Enum("PluginFieldType", "FLOAT16 FLOAT32 FLOAT64 INT8 INT16 INT32 CHAR DIMS UNKNOWN BF16 INT64 "
                                               "FP8 INT4")
PreviewFeature = enum.Enum("PreviewFeature", "PROFILE_SHARING_0806 ALIASED_PLUGIN_IO_10_03")


class ILogger:
    """A logger TensorRT calls with (severity, message); a Python subclass overrides `log` (pyCore.cpp v10.3.0, the
    ILogger binding, and pyCoreDoc.h's MyLogger example). Severity values are exported on the class, as there."""

    Severity = enum.Enum("Severity", "INTERNAL_ERROR ERROR WARNING INFO VERBOSE")

    def __init__(self):
        pass



class Dims(tuple):
    """A tensor's dimensions (tensorrt.Dims: len, index, iterate)."""


class PluginTensorDesc:
    """One plugin I/O tensor at run time: dims, type, format, scale."""

    def __init__(self, dims=(), type=DataType.FLOAT, format=TensorFormat.LINEAR, scale=-1.0):
        self.dims, self.type, self.format, self.scale = Dims(dims), type, format, scale


class DynamicPluginTensorDesc:
    """One plugin I/O tensor at build time: `desc` plus the profile's min / opt / max dims."""

    def __init__(self, desc: PluginTensorDesc, min=None, opt=None, max=None):
        self.desc = desc
        self.min, self.opt, self.max = (Dims(desc.dims if d is None else d) for d in (min, opt, max))


class IDimensionExpr:
    """A dimension expression. 10.3: it has is_constant, get_constant_value and is_size_tensor and nothing else
    (pyPlugin.cpp v10.3.0 lines 2341-2345; no `value`: TensorRT keeps a non-constant dimension symbolic while
    building), and get_constant_value of a non-constant is int64's minimum (NvInferRuntime.h v10.3.0 line 243). What it
    evaluates to at the profile's min (= opt, the shapes the driver was given) and at its max is private to the
    driver (`evaluated`, `evaluated_max`)."""

    def __init__(self, value: int, constant: bool = False, top: int | None = None):
        self._evaluated, self._constant = int(value), constant
        self._max = self._evaluated if top is None else int(top)

    def is_constant(self) -> bool:
        return self._constant

    def get_constant_value(self) -> int:
        return self._evaluated if self._constant else -(2 ** 63)

    def is_size_tensor(self) -> bool:
        return False


_OPS = {DimensionOperation.SUM: lambda a, b: a + b, DimensionOperation.PROD: lambda a, b: a * b,
        DimensionOperation.MAX: max, DimensionOperation.MIN: min, DimensionOperation.SUB: lambda a, b: a - b,
        DimensionOperation.EQUAL: lambda a, b: int(a == b), DimensionOperation.LESS: lambda a, b: int(a < b),
        DimensionOperation.FLOOR_DIV: lambda a, b: a // b, DimensionOperation.CEIL_DIV: lambda a, b: -(-a // b)}


class IExprBuilder:
    """Builds dimension expressions (constant, operation), each evaluated at the profile's min and at its max."""

    def constant(self, value: int) -> IDimensionExpr:
        return IDimensionExpr(value, True)

    def operation(self, op: DimensionOperation, first: IDimensionExpr, second: IDimensionExpr) -> IDimensionExpr:
        return IDimensionExpr(_OPS[op](evaluated(first), evaluated(second)),
                              first.is_constant() and second.is_constant(),
                              _OPS[op](evaluated_max(first), evaluated_max(second)))


def evaluated(expr: IDimensionExpr) -> int:
    """The driver's value of a dimension expression at the profile's min (and opt): the shapes it was given."""
    return expr._evaluated


def evaluated_max(expr: IDimensionExpr) -> int:
    """The driver's value of a dimension expression at the profile's max."""
    return expr._max


class DimsExprs:
    """A shape as dimension expressions: DimsExprs(n) (n unset entries) or DimsExprs(sequence of expressions). 10.3:
    entries are IDimensionExpr, anything else a TypeError (the constructors and __setitem__ take IDimensionExpr const*,
    pyPlugin.cpp v10.3.0 lines 2070-2110, bound at 2347-2356); unset entries are null pointers there (line 2091)."""

    def __init__(self, arg=0):
        self._d = [None] * arg if isinstance(arg, int) else list(arg)
        if any(e is not None and not isinstance(e, IDimensionExpr) for e in self._d):
            raise TypeError("DimsExprs holds IDimensionExpr entries")

    def __len__(self):
        return len(self._d)

    def __getitem__(self, i):
        return self._d[i]

    def __setitem__(self, i, e):
        if not isinstance(e, IDimensionExpr):
            raise TypeError("DimsExprs holds IDimensionExpr entries")
        self._d[i] = e


# The C type each PluginFieldType is read as (NvInferRuntimePlugin.h v10.3.0 lines 833-860, the enum; the binding's
# `data` getter, pyPlugin.cpp v10.3.0 lines 2421-2431: py::array(self.length, static_cast<T const*>(self.data)),
# kUNKNOWN and kINT8 as int8_t, kCHAR as char). The getter has no conversion for these (lines 2432-2438:
# AttributeError):
FIELD_DTYPES = {PluginFieldType.FLOAT16: np.float16, PluginFieldType.FLOAT32: np.float32,
                PluginFieldType.FLOAT64: np.float64, PluginFieldType.INT8: np.int8, PluginFieldType.INT16: np.int16,
                PluginFieldType.INT32: np.int32, PluginFieldType.CHAR: np.int8, PluginFieldType.INT64: np.int64,
                PluginFieldType.UNKNOWN: np.int8}
NO_DATA_GETTER = (PluginFieldType.INT4, PluginFieldType.FLOAT16, PluginFieldType.BF16, PluginFieldType.DIMS,
                  PluginFieldType.FP8)


class FieldFreed(RuntimeError):
    """A field's buffer was freed (or its memory moved) before TensorRT read it: 10.3 would read freed memory."""


def _check_buffer(name, data, type) -> None:
    """The buffer a PluginField is made over. 10.3: it is a buffer (the constructor takes py::buffer, pyPlugin.cpp
    v10.3.0 line 1949: a list is pybind11's TypeError). PROJECT RULES, stricter than 10.3, which takes any buffer
    (bytes, memoryview, array.array) and reads `info.size` (the buffer's own element count) values of the declared
    type at `info.ptr` (line 1952), strides ignored, never checking the buffer against the type: here it must be a
    numpy array, C-contiguous, of the declared type's numpy dtype (kUNKNOWN: one-byte items, its length being bytes:
    NvInferRuntime.h v10.3.0 lines 1089-1090), and of a type this stand-in reads (not kBF16, kFP8, kINT4, kDIMS).
    Each would make 10.3 serialize bytes other than the values meant."""
    if not isinstance(data, np.ndarray):
        raise TypeError(f"PluginField {name!r}: data must be a buffer (a numpy array of the declared type), "
                        f"not {data.__class__.__name__}")
    want = FIELD_DTYPES.get(type)
    if want is None:
        raise TypeError(f"PluginField {name!r}: the stand-in reads no {type.name} field")
    if data.dtype != want and not (type == PluginFieldType.UNKNOWN and data.dtype.itemsize == 1):
        raise TypeError(f"PluginField {name!r}: a {type.name} field's buffer must hold {np.dtype(want)}, "
                        f"not {data.dtype}")
    if not data.flags.c_contiguous:
        raise TypeError(f"PluginField {name!r}: the buffer must be contiguous (10.3 reads it from its first address)")


class _Address:
    """A buffer's address as the C struct holds it (`info.ptr`, pyPlugin.cpp v10.3.0 line 1952): it keeps nothing
    alive. The array owning that memory is referenced weakly (numpy then refuses to resize it in place), so a read
    after the owner is gone raises FieldFreed where 10.3 would read freed or reused memory, and a read past the
    owner's end (a `size` larger than the buffer set later) raises it too. (An owner that is not an ndarray, e.g. the
    bytes under np.frombuffer, is tracked through the last ndarray over it: stricter than 10.3, a project rule.)"""

    def __init__(self, data: np.ndarray):
        owner = data
        while isinstance(owner.base, np.ndarray):
            owner = owner.base
        self.ptr = int(data.__array_interface__["data"][0])
        self._owner = weakref.ref(owner)

    def read(self, nbytes: int, what: str) -> bytes:
        owner = self._owner()
        if owner is None:
            raise FieldFreed(f"{what}: its buffer was freed before TensorRT read it (10.3 reads the address the C "
                             "struct holds; keep the buffer alive on the plugin)")
        lo = int(owner.__array_interface__["data"][0])
        if not lo <= self.ptr <= self.ptr + nbytes <= lo + owner.nbytes:
            raise FieldFreed(f"{what}: its buffer holds fewer than the {nbytes} bytes read at the field's address "
                             "(its size is past the buffer's end)")
        return ctypes.string_at(self.ptr, nbytes)            # the owner is alive and holds these bytes


class PluginField:
    """tensorrt.PluginField: the C struct nvinfer1::PluginField (name, the buffer's address, type, size) and, made over
    a buffer, that buffer kept alive as long as this Python object lives (pyPlugin.cpp v10.3.0 lines 2413-2414,
    keep_alive<1, 3>). `data` reads `size` values of the declared type at the address into a new array (lines
    2419-2444); setting it changes the address only, not `size` (lines 2445-2450). A PluginFieldCollection holds copies
    of the struct that keep nothing alive."""

    def __init__(self, name="", data=None, type=PluginFieldType.UNKNOWN):
        self.name, self.type, self.size, self._address, self._kept = name, type, 0, None, None
        if data is not None:
            _check_buffer(name, data, type)
            self.size, self._address, self._kept = int(data.size), _Address(data), data

    @property
    def data(self) -> np.ndarray:
        if self.type in NO_DATA_GETTER:
            raise AttributeError("No known conversion for returning data from PluginField")
        dtype = np.dtype(FIELD_DTYPES[self.type])
        return np.frombuffer(self.raw(), dtype).copy()

    @data.setter
    def data(self, buffer) -> None:
        _check_buffer(self.name, buffer, self.type)
        self._address, self._kept = _Address(buffer), buffer

    def raw(self) -> bytes:
        """The `size` values' bytes at the field's address, as TensorRT reads them (FieldFreed where they are gone)."""
        if self._address is None:
            return b""
        return self._address.read(self.size * np.dtype(FIELD_DTYPES[self.type]).itemsize, f"field {self.name!r}")


def _struct_copy(field) -> PluginField:
    """`h.cast<PluginField>()`: the C struct copied (name, address, type, size), keeping nothing alive; a non-field
    fails the cast (pybind11's cast_error, a RuntimeError)."""
    if not isinstance(field, PluginField):
        raise RuntimeError(f"Unable to cast Python instance of type {type(field).__name__} to C++ type "
                           "'nvinfer1::PluginField'")
    copy = PluginField.__new__(PluginField)
    copy.name, copy.type, copy.size = field.name, field.type, field.size
    copy._address, copy._kept = field._address, None
    return copy


class PluginFieldCollection(list):
    """tensorrt.PluginFieldCollection: a std::vector<PluginField> (pyTensorRT.cpp v10.3.0 line 48, py::bind_vector;
    opaque, include/ForwardDeclarations.h lines 41-44). Made from an iterable of PluginField it holds COPIES of their C
    structs (pybind11 v2.13.1 stl_bind.h lines 152-159: `v->push_back(h.cast<T>())`; append, extend, insert and item
    assignment copy too), so it keeps neither the Python PluginField objects nor their buffers alive: a buffer lives
    as long as the PluginField made over it, or whatever else holds it. Indexing returns the element itself."""

    def __init__(self, fields=()):
        super().__init__(_struct_copy(f) for f in fields)

    def append(self, field):
        super().append(_struct_copy(field))

    def extend(self, fields):
        super().extend(_struct_copy(f) for f in fields)

    def insert(self, index, field):
        super().insert(index, _struct_copy(field))

    def __setitem__(self, index, value):
        super().__setitem__(index, [_struct_copy(f) for f in value] if isinstance(index, slice) else
                            _struct_copy(value))


def engine_copy(collection: PluginFieldCollection) -> list[PluginField]:
    """What the engine file stores for the collection get_fields_to_serialize returned: each field's name, type and
    bytes, read through its address (FieldFreed where its buffer is gone), as fields over buffers of the engine's own
    (keep the list: the fields keep those buffers alive)."""
    return [PluginField(f.name, np.frombuffer(f.raw(), FIELD_DTYPES[f.type]).copy(), f.type) for f in collection]


_UNSET = object()


class _Settable:
    """Properties the wrapper stores on the C++ side. 10.3: reading plugin_name, plugin_version, plugin_namespace,
    num_outputs or a creator's name, plugin_version, plugin_namespace, field_names before it is set raises
    AttributeError "<name> not initialized" (pyPlugin.cpp v10.3.0 lines 976, 1632, 1647, 1663, 1716, 1731, 1746,
    1787); timing_cache_id and metadata_string read unset are None (nullptr, lines 1271-1274, 1286-1289) and
    format_combination_limit is DEFAULT_FORMAT_COMBINATION_LIMIT (lines 1301-1304)."""

    def _get(self, name, default=_UNSET):
        try:
            return self.__dict__["_trt_" + name]
        except KeyError:
            if default is not _UNSET:
                return default
            raise AttributeError(f"{name} not initialized") from None


def _prop(name, default=_UNSET):
    return property(lambda self: self._get(name, default),
                    lambda self, v: self.__dict__.__setitem__("_trt_" + name, v))


class _Bound(type):
    """10.3 (pybind11's rule for a Python class derived from bound classes): every bound base whose C++ object the
    instance holds must have had its __init__ called, else making the instance raises TypeError "<base>.__init__()
    must be called when overriding __init__" (pybind11 v2.13.1 detail/class.h lines 191-197, the metaclass __call__;
    10.3's interfaces are py::class_ with py::init<>(), pyPlugin.cpp v10.3.0 lines 2549, 2563, 2588, 2596)."""

    def __call__(cls, *args, **kwargs):
        obj = super().__call__(*args, **kwargs)
        done = obj.__dict__.get("_trt_initialised", set())
        for base in cls.__mro__:
            if base.__module__ == __name__ and "__init__" in base.__dict__ and base.__name__ not in done:
                raise TypeError(f"tensorrt.{base.__name__}.__init__() must be called when overriding __init__")
        return obj


def _bound_init(name: str):
    def __init__(self):
        self.__dict__.setdefault("_trt_initialised", set()).add(name)
    return __init__


class IPluginCapability(metaclass=_Bound):
    """Base of the capability interfaces."""


class IPluginV3(metaclass=_Bound):
    """A V3 plugin; the Python class must override get_capability_interface and clone (destroy is optional)."""

    __init__ = _bound_init("IPluginV3")


class IPluginV3OneCore(IPluginCapability, _Settable):
    plugin_name, plugin_version, plugin_namespace = _prop("plugin_name"), _prop("plugin_version"), \
        _prop("plugin_namespace")
    __init__ = _bound_init("IPluginV3OneCore")


class IPluginV3OneBuild(IPluginCapability, _Settable):
    DEFAULT_FORMAT_COMBINATION_LIMIT = 100
    num_outputs = _prop("num_outputs")
    timing_cache_id, metadata_string = _prop("timing_cache_id", None), _prop("metadata_string", None)
    format_combination_limit = _prop("format_combination_limit", DEFAULT_FORMAT_COMBINATION_LIMIT)
    __init__ = _bound_init("IPluginV3OneBuild")


class IPluginV3OneBuildV2(IPluginV3OneBuild):
    """The build interface with get_aliased_input (PreviewFeature.ALIASED_PLUGIN_IO_10_03); its __init__ makes the
    IPluginV3OneBuild part too."""


class IPluginV3OneRuntime(IPluginCapability):
    __init__ = _bound_init("IPluginV3OneRuntime")


class IPluginResourceContext:
    """What attach_to_context receives (no allocator nor error recorder here)."""

    gpu_allocator = None
    error_recorder = None


class IPluginCreatorV3One(_Settable, metaclass=_Bound):
    name, plugin_version, plugin_namespace = _prop("name"), _prop("plugin_version"), _prop("plugin_namespace")
    field_names = _prop("field_names")
    __init__ = _bound_init("IPluginCreatorV3One")


class IPluginRegistry:
    """Creators by (name, version, namespace). 10.3: register_creator returns False "if a plugin creator with the same
    type is already registered" (include/NvInferRuntimeCommon.h v10.3.0 lines 219-220)."""

    def __init__(self):
        self.creators = {}

    def register_creator(self, creator, plugin_namespace: str = "") -> bool:
        key = (creator.name, creator.plugin_version, plugin_namespace)
        if key in self.creators:
            return False
        self.creators[key] = creator
        return True

    def get_creator(self, type: str, version: str, plugin_namespace: str = ""):
        return self.creators.get((type, version, plugin_namespace))

    @property
    def all_creators(self):
        return list(self.creators.values())


_registry = IPluginRegistry()


def get_plugin_registry() -> IPluginRegistry:
    return _registry


# The interface classes: plugins.trt.conformance finds a plugin's overrides below these, as get_override does.
INTERFACES = (IPluginV3, IPluginCapability, IPluginV3OneCore, IPluginV3OneBuild, IPluginV3OneBuildV2,
              IPluginV3OneRuntime, IPluginCreatorV3One, _Settable, object)
