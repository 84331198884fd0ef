"""TensorRT 10.3's Python plugin API surface as plain Python, for driving the project's IPluginV3 plugins where
TensorRT cannot be installed: the names `plugins.trt_plugins.define_plugins` reads from a `tensorrt` module (enums,
tensor descriptors, shape expressions, field collections, the V3 interface classes, the creator and a registry), and
the ILogger base a build's capturing logger subclasses (export.trt_log).
It computes nothing TensorRT computes; plugins.trt_conformance plays TensorRT's part (which method is called when,
and what the 10.3 wrapper does where a method is missing).

Written from NVIDIA/TensorRT v10.3.0, python/src/infer/pyPlugin.cpp (the bindings at its end: class names, property
names, the DimsExprs constructors) and include/NvInferRuntime.h. As in the wrapper, the interface classes define
none of the plugin's callbacks (the bindings' `def`s there are documentation stubs that pybind11's get_override
skips), and a property read before it is set raises AttributeError "<name> not initialized"."""

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
    """numpy type of a DataType (tensorrt.nptype); TypeError where numpy has none."""
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
    """A dimension expression: is_constant, get_constant_value and is_size_tensor, as 10.3 binds it (pyPlugin.cpp's
    IDimensionExpr class; it has no `value`: TensorRT keeps a non-constant dimension symbolic while building). What it
    evaluates to for the shapes the driver chose is private to the driver (`evaluated`)."""

    def __init__(self, value: int, constant: bool = False):
        self._evaluated, self._constant = int(value), constant

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
    """Builds dimension expressions (constant, operation)."""

    def constant(self, value: int) -> IDimensionExpr:
        return IDimensionExpr(value, True)

    def operation(self, op: DimensionOperation, first: IDimensionExpr, second: IDimensionExpr) -> IDimensionExpr:
        return IDimensionExpr(_OPS[op](evaluated(first), evaluated(second)),
                              first.is_constant() and second.is_constant())


def evaluated(expr: IDimensionExpr) -> int:
    """The driver's value of a dimension expression for the shapes it chose (no plugin may read it)."""
    return expr._evaluated


class DimsExprs:
    """A shape as dimension expressions: DimsExprs(n) (n unset entries) or DimsExprs(sequence of expressions)."""

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


# the numpy type a field's buffer holds, by its declared type (NvInferRuntimeBase.h's PluginFieldType; the 10.3
# binding's `data` getter reads each type through that C type, pyPlugin.cpp's PluginField binding)
FIELD_DTYPES = {PluginFieldType.FLOAT16: np.float16, PluginFieldType.FLOAT32: np.float32,
                PluginFieldType.FLOAT64: np.float64, PluginFieldType.INT8: np.int8, PluginFieldType.INT16: np.int16,
                PluginFieldType.INT32: np.int32, PluginFieldType.CHAR: np.int8, PluginFieldType.INT64: np.int64}


class PluginField:
    """tensorrt.PluginField(name, data, type): `data` is bound as py::buffer (pyPlugin.cpp's PluginField binding:
    plugin_field_constructor with keep_alive<1, 3>, the field keeps its buffer alive as long as the field lives), so a
    Python list is a TypeError; TensorRT reads `size` elements of the declared type from the buffer's address, so a
    buffer of another dtype is refused here (10.3 would read its bytes as the declared type)."""

    def __init__(self, name="", data=None, type=PluginFieldType.UNKNOWN):
        if data is not None:
            if not isinstance(data, np.ndarray):
                raise TypeError(f"PluginField {name!r}: data must be a buffer (a numpy array of the declared type), "
                                f"not {data.__class__.__name__}")
            want = FIELD_DTYPES.get(type)
            if want is not None and data.dtype != want:
                raise TypeError(f"PluginField {name!r}: a {type.name} field's buffer must hold {np.dtype(want)}, "
                                f"not {data.dtype}")
        self.name, self.data, self.type = name, data, type
        self.size = 0 if data is None else int(data.size)


class PluginFieldCollection(list):
    """A list of PluginField (tensorrt.PluginFieldCollection accepts any iterable of them; the collection keeps that
    iterable, and so its fields, alive: keep_alive<1, 2> on its constructor)."""


class FieldFreed(RuntimeError):
    """A serialized field's buffer was freed before TensorRT read it."""


class FieldStruct:
    """nvinfer1::PluginField as TensorRT holds it once get_fields_to_serialize has returned: the wrapper copies the
    collection's C structs (name, address, type, size) and lets the Python collection go, so nothing keeps the buffer
    alive but the plugin itself (the address is a weak reference here: reading a freed one raises FieldFreed)."""

    def __init__(self, field: PluginField):
        self.name, self.type, self.size = field.name, field.type, field.size
        self._data = None if field.data is None else weakref.ref(field.data)

    def read(self) -> np.ndarray:
        """The field's values as the engine file stores them (a copy)."""
        if self._data is None:
            return np.zeros(0, FIELD_DTYPES.get(self.type, np.int8))
        data = self._data()
        if data is None:
            raise FieldFreed(f"field {self.name!r} was freed before TensorRT serialized it: keep its buffer on the "
                             "plugin (10.3's wrapper copies the collection's C structs and drops the Python objects)")
        return data.copy()


def serialize_fields(structs: list[FieldStruct]) -> PluginFieldCollection:
    """What create_plugin(RUNTIME) receives for the structs copied from what get_fields_to_serialize returned (the
    caller has let the Python collection go): each buffer read once garbage is collected, fresh fields made from it."""
    import gc
    gc.collect()
    read = [(s.name, s.read(), s.type) for s in structs]
    return PluginFieldCollection(PluginField(name, data, kind) for name, data, kind in read)


class _Settable:
    """Properties the wrapper stores on the C++ side: reading one before it is set is an error."""

    def _get(self, name):
        try:
            return self.__dict__["_trt_" + name]
        except KeyError:
            raise AttributeError(f"{name} not initialized") from None


def _prop(name):
    return property(lambda self: self._get(name), lambda self, v: self.__dict__.__setitem__("_trt_" + name, v))


class _Bound(type):
    """pybind11's rule for a Python class derived from bound classes: every bound base whose C++ object the instance
    holds must have had its __init__ called, else making the instance raises TypeError "<base>.__init__() must be
    called when overriding __init__" (pybind11's metaclass __call__; 10.3's interfaces are py::class_ with
    py::init<>())."""

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
    timing_cache_id, metadata_string = _prop("timing_cache_id"), _prop("metadata_string")
    format_combination_limit = _prop("format_combination_limit")
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
    """Creators by (name, version, namespace); register_creator refuses a key already present (returns False)."""

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


# The interface classes: plugins.trt_conformance finds a plugin's overrides below these, as get_override does.
INTERFACES = (IPluginV3, IPluginCapability, IPluginV3OneCore, IPluginV3OneBuild, IPluginV3OneBuildV2,
              IPluginV3OneRuntime, IPluginCreatorV3One, _Settable, object)
