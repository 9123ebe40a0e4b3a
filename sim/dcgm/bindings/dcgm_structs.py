"""Return codes, DCGMError and the structs gpulens uses (subset of DCGM's `dcgm_structs.py`).

As in the real module, every `DCGM_ST_*` code gets a generated `DCGMError_<CamelCase>` subclass and
`DCGMError(code)` returns an instance of that subclass, so `except DCGMError_ConnectionNotValid`
catches what the engine raises. `_dcgmInit` fails with DCGMError_LibraryNotFound when no simulated
engine is installed, as the real one does without libdcgm.
"""

import ctypes
import string
import sys

from gpulens.sim.dcgm import hostengine

DCGM_ST_OK = 0
DCGM_ST_BADPARAM = -1
DCGM_ST_GENERIC_ERROR = -3
DCGM_ST_MEMORY = -4
DCGM_ST_NOT_CONFIGURED = -5
DCGM_ST_NOT_SUPPORTED = -6
DCGM_ST_INIT_ERROR = -7
DCGM_ST_NVML_ERROR = -8
DCGM_ST_PENDING = -9
DCGM_ST_UNINITIALIZED = -10
DCGM_ST_TIMEOUT = -11
DCGM_ST_VER_MISMATCH = -12
DCGM_ST_UNKNOWN_FIELD = -13
DCGM_ST_NO_DATA = -14
DCGM_ST_STALE_DATA = -15
DCGM_ST_NOT_WATCHED = -16
DCGM_ST_NO_PERMISSION = -17
DCGM_ST_GPU_IS_LOST = -18
DCGM_ST_RESET_REQUIRED = -19
DCGM_ST_FUNCTION_NOT_FOUND = -20
DCGM_ST_CONNECTION_NOT_VALID = -21
DCGM_ST_GPU_NOT_SUPPORTED = -22
DCGM_ST_GROUP_INCOMPATIBLE = -23
DCGM_ST_MAX_LIMIT = -24
DCGM_ST_LIBRARY_NOT_FOUND = -25
DCGM_ST_DUPLICATE_KEY = -26
DCGM_ST_REQUIRES_ROOT = -29
DCGM_ST_INSUFFICIENT_SIZE = -31
DCGM_ST_FIELD_UNSUPPORTED_BY_API = -32
DCGM_ST_MODULE_NOT_LOADED = -33
DCGM_ST_IN_USE = -34
DCGM_ST_GROUP_IS_EMPTY = -35
DCGM_ST_PROFILING_NOT_SUPPORTED = -36
DCGM_ST_PROFILING_LIBRARY_ERROR = -37
DCGM_ST_PROFILING_MULTI_PASS = -38
DCGM_ST_INSTANCE_NOT_FOUND = -45

DCGM_OPERATION_MODE_AUTO = 1
DCGM_OPERATION_MODE_MANUAL = 2

DCGM_GROUP_DEFAULT = 0
DCGM_GROUP_EMPTY = 1
DCGM_GROUP_ALL_GPUS = 0x7FFFFFFF
DCGM_GEGE_FLAG_ONLY_SUPPORTED = 0x00000001

DCGM_MAX_NUM_DEVICES = 32
DCGM_MAX_TOTAL_INSTANCES = 14
DCGM_MAX_HIERARCHY_INFO = DCGM_MAX_NUM_DEVICES * DCGM_MAX_TOTAL_INSTANCES
DCGM_HE_PORT_NUMBER = 5555

_MESSAGES = {
    DCGM_ST_BADPARAM: "Bad parameter passed to function",
    DCGM_ST_NOT_SUPPORTED: "Feature not supported",
    DCGM_ST_NO_DATA: "No data is available",
    DCGM_ST_NOT_WATCHED: "Field is not being updated",
    DCGM_ST_CONNECTION_NOT_VALID: "The connection to the host engine is not valid any longer",
    DCGM_ST_LIBRARY_NOT_FOUND: "DCGM library could not be found",
    DCGM_ST_DUPLICATE_KEY: "Duplicate key passed to function",
    DCGM_ST_MODULE_NOT_LOADED: "This request is serviced by a module of DCGM that is not currently loaded",
    DCGM_ST_PROFILING_NOT_SUPPORTED: "Profiling is not supported for this group of GPUs or GPU",
}


class DCGMError(Exception):
    """A DCGM return code; `DCGMError(code)` is an instance of the code's generated subclass."""

    _valClassMapping = {}

    def __new__(typ, value):
        if typ == DCGMError:
            typ = DCGMError._valClassMapping.get(value, typ)
        obj = Exception.__new__(typ)
        obj.info = None
        obj.value = value
        return obj

    def __init__(self, *args):
        super().__init__(*args)

    def __str__(self):
        msg = _MESSAGES.get(self.value, f"DCGM Error with code {self.value}")
        if self.info is not None:
            msg += f": '{self.info}'"
        return msg

    def __eq__(self, other):
        return isinstance(other, DCGMError) and self.value == other.value

    def __hash__(self):
        return hash(self.value)

    def SetAdditionalInfo(self, msg):
        self.info = msg


def dcgmExceptionClass(error_code):
    return DCGMError._valClassMapping.get(error_code)


def _extract_errors_as_classes():
    module = sys.modules[__name__]
    for name in [n for n in dir(module) if n.startswith("DCGM_ST_")]:
        class_name = "DCGMError_" + string.capwords(name.replace("DCGM_ST_", ""), "_").replace("_", "")
        value = getattr(module, name)

        def gen_new(val):
            def new(typ, *args):
                return DCGMError.__new__(typ, val)

            return new

        cls = type(class_name, (DCGMError,), {"__new__": gen_new(value)})
        cls.__module__ = __name__
        setattr(module, class_name, cls)
        DCGMError._valClassMapping[value] = cls


_extract_errors_as_classes()


def _dcgmCheckReturn(ret):
    if ret != DCGM_ST_OK:
        raise DCGMError(ret)
    return ret


def _dcgmInit(libDcgmPath=None):
    """Load libdcgm: here, find the installed simulated engine."""
    if hostengine.current() is None:
        raise DCGMError(DCGM_ST_LIBRARY_NOT_FOUND)


class _DcgmStructure(ctypes.Structure):
    """Like the real bindings: char arrays read back as str."""

    def __getattribute__(self, key):
        value = super().__getattribute__(key)
        if isinstance(value, bytes):
            return value.decode("utf-8")
        return value


class c_dcgmGroupEntityPair_t(_DcgmStructure):
    _fields_ = [("entityGroupId", ctypes.c_uint32), ("entityId", ctypes.c_uint32)]


class c_dcgmMigEntityInfo_t(_DcgmStructure):
    _fields_ = [
        ("gpuUuid", ctypes.c_char * 128),
        ("nvmlGpuIndex", ctypes.c_uint),
        ("nvmlInstanceId", ctypes.c_uint),
        ("nvmlComputeInstanceId", ctypes.c_uint),
        ("nvmlMigProfileId", ctypes.c_uint),
        ("nvmlProfileSlices", ctypes.c_uint),
    ]


class c_dcgmMigHierarchyInfo_v2(_DcgmStructure):
    _fields_ = [
        ("entity", c_dcgmGroupEntityPair_t),
        ("parent", c_dcgmGroupEntityPair_t),
        ("info", c_dcgmMigEntityInfo_t),
    ]


class c_dcgmMigHierarchy_v2(_DcgmStructure):
    _fields_ = [
        ("version", ctypes.c_uint32),
        ("count", ctypes.c_uint32),
        ("entityList", c_dcgmMigHierarchyInfo_v2 * DCGM_MAX_HIERARCHY_INFO),
    ]


c_dcgmMigHierarchy_version2 = ctypes.sizeof(c_dcgmMigHierarchy_v2) | (2 << 24)


class c_dcgmDeviceIdentifiers_t(_DcgmStructure):
    _fields_ = [
        ("brandName", ctypes.c_char * 256),
        ("deviceName", ctypes.c_char * 256),
        ("pciBusId", ctypes.c_char * 256),
        ("serial", ctypes.c_char * 256),
        ("uuid", ctypes.c_char * 256),
        ("vbios", ctypes.c_char * 256),
        ("inforomImageVersion", ctypes.c_char * 256),
        ("pciDeviceId", ctypes.c_uint32),
        ("pciSubSystemId", ctypes.c_uint32),
        ("driverVersion", ctypes.c_char * 256),
        ("virtualizationMode", ctypes.c_uint32),
    ]


class c_dcgmDeviceAttributes_v3(_DcgmStructure):
    _fields_ = [("version", ctypes.c_uint32), ("identifiers", c_dcgmDeviceIdentifiers_t)]


class c_dcgmConnectV2Params_v2(_DcgmStructure):
    _fields_ = [
        ("version", ctypes.c_uint),
        ("persistAfterDisconnect", ctypes.c_uint),
        ("timeoutMs", ctypes.c_uint),
        ("addressIsUnixSocket", ctypes.c_uint),
    ]


c_dcgmConnectV2Params_version = ctypes.sizeof(c_dcgmConnectV2Params_v2) | (2 << 24)
