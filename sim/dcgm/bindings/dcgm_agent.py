"""The agent API (subset of DCGM's `dcgm_agent.py`), served by the simulated host engine.

Handles, group ids and field group ids are `ctypes.c_void_p`, as the real functions return.
Functions that return a status in the real bindings (dcgmWatchFields, dcgmUpdateAllFields,
dcgmGetLatestValues_v2) return it here too and leave the check to the caller; the others raise.
"""

import ctypes

import dcgm_structs

from gpulens.sim.dcgm import hostengine


def _engine():
    engine = hostengine.current()
    if engine is None:
        raise dcgm_structs.DCGMError(dcgm_structs.DCGM_ST_UNINITIALIZED)
    return engine


def _id(value):
    return value.value if isinstance(value, ctypes.c_void_p) else int(value)


def _raising(fn, *args):
    try:
        return fn(*args)
    except hostengine.EngineError as exc:
        raise dcgm_structs.DCGMError(exc.code) from None


def _status(fn, *args):
    try:
        fn(*args)
    except hostengine.EngineError as exc:
        return exc.code
    return dcgm_structs.DCGM_ST_OK


def dcgmInit():
    dcgm_structs._dcgmInit()
    return dcgm_structs.DCGM_ST_OK


def dcgmShutdown():
    return dcgm_structs.DCGM_ST_OK


def dcgmStartEmbedded(opMode):
    return ctypes.c_void_p(_raising(_engine().connect, None))


def dcgmStopEmbedded(dcgm_handle):
    _engine().disconnect(_id(dcgm_handle))
    return dcgm_structs.DCGM_ST_OK


def dcgmConnect_v2(ip_address, connectParams, version=None):
    address = ip_address
    if connectParams is not None and connectParams.addressIsUnixSocket:
        address = "unix://" + ip_address
    return ctypes.c_void_p(_raising(_engine().connect, address))


def dcgmDisconnect(dcgm_handle):
    _engine().disconnect(_id(dcgm_handle))
    return dcgm_structs.DCGM_ST_OK


def dcgmGetAllSupportedDevices(dcgm_handle):
    return _raising(_engine().gpu_ids, _id(dcgm_handle))


def dcgmGetAllDevices(dcgm_handle):
    return _raising(_engine().gpu_ids, _id(dcgm_handle))


def dcgmGetDeviceAttributes(dcgm_handle, gpuId, version=3):
    uuid, pci_bus_id, name = _raising(_engine().gpu_identity, _id(dcgm_handle), gpuId)
    attributes = dcgm_structs.c_dcgmDeviceAttributes_v3()
    attributes.identifiers.uuid = uuid.encode()
    attributes.identifiers.pciBusId = pci_bus_id.encode()
    attributes.identifiers.deviceName = name.encode()
    return attributes


def dcgmGetEntityGroupEntities(dcgm_handle, entityGroup, flags):
    return _raising(_engine().entities, _id(dcgm_handle), entityGroup)


def dcgmGetGpuInstanceHierarchy(dcgm_handle):
    entries = _raising(_engine().hierarchy, _id(dcgm_handle))
    hierarchy = dcgm_structs.c_dcgmMigHierarchy_v2()
    hierarchy.version = dcgm_structs.c_dcgmMigHierarchy_version2
    hierarchy.count = len(entries)
    for i, entry in enumerate(entries):
        item = hierarchy.entityList[i]
        item.entity.entityGroupId = hostengine.FE_GPU_I
        item.entity.entityId = entry.entity_id
        item.parent.entityGroupId = hostengine.FE_GPU
        item.parent.entityId = entry.parent_gpu_id
        item.info.gpuUuid = entry.gpu_uuid.encode()
        item.info.nvmlGpuIndex = entry.nvml_gpu_index
        item.info.nvmlInstanceId = entry.nvml_instance_id
        item.info.nvmlComputeInstanceId = entry.nvml_compute_instance_id
        item.info.nvmlMigProfileId = entry.nvml_profile_id
        item.info.nvmlProfileSlices = entry.profile_slices
    return hierarchy


def dcgmGroupCreate(dcgm_handle, type, groupName):
    return ctypes.c_void_p(_raising(_engine().group_create, _id(dcgm_handle), groupName))


def dcgmGroupDestroy(dcgm_handle, group_id):
    _raising(_engine().group_destroy, _id(dcgm_handle), _id(group_id))
    return dcgm_structs.DCGM_ST_OK


def dcgmGroupAddDevice(dcgm_handle, group_id, gpu_id):
    _raising(_engine().group_add_entity, _id(dcgm_handle), _id(group_id), hostengine.FE_GPU, gpu_id)
    return dcgm_structs.DCGM_ST_OK


def dcgmGroupAddEntity(dcgm_handle, group_id, entityGroupId, entityId):
    _raising(_engine().group_add_entity, _id(dcgm_handle), _id(group_id), entityGroupId, entityId)
    return dcgm_structs.DCGM_ST_OK


def dcgmFieldGroupCreate(dcgm_handle, fieldIds, fieldGroupName):
    return ctypes.c_void_p(_raising(_engine().field_group_create, _id(dcgm_handle), fieldIds, fieldGroupName))


def dcgmFieldGroupDestroy(dcgm_handle, fieldGroupId):
    _raising(_engine().field_group_destroy, _id(dcgm_handle), _id(fieldGroupId))
    return dcgm_structs.DCGM_ST_OK


def dcgmWatchFields(dcgm_handle, groupId, fieldGroupId, updateFreq, maxKeepAge, maxKeepSamples):
    return _status(_engine().watch, _id(dcgm_handle), _id(groupId), _id(fieldGroupId), int(updateFreq))


def dcgmUnwatchFields(dcgm_handle, groupId, fieldGroupId):
    return _status(_engine().unwatch, _id(dcgm_handle), _id(groupId), _id(fieldGroupId))


def dcgmUpdateAllFields(dcgm_handle, waitForUpdate):
    return _status(_engine().gpu_ids, _id(dcgm_handle))


class _RawValue:
    """What a `c_dcgmFieldValue_v1` carries, for `dcgm_field_helpers.DcgmFieldValue`."""

    def __init__(self, fieldId, ts, value):
        self.fieldId = fieldId
        self.fieldType = ord("d")
        self.status = dcgm_structs.DCGM_ST_OK
        self.ts = ts
        self.value = value


def dcgmGetLatestValues_v2(dcgm_handle, groupId, fieldGroupId, callback, userData):
    """Calls `callback(entityGroupId, entityId, values, numValues, userData)` per entity."""
    try:
        rows = _engine().latest(_id(dcgm_handle), _id(groupId), _id(fieldGroupId))
    except hostengine.EngineError as exc:
        return exc.code
    per_entity = {}
    for entity_group, entity_id, field_id, ts, value in rows:
        per_entity.setdefault((entity_group, entity_id), []).append(_RawValue(field_id, ts, value))
    for (entity_group, entity_id), values in per_entity.items():
        callback(entity_group, entity_id, values, len(values), userData)
    return dcgm_structs.DCGM_ST_OK
