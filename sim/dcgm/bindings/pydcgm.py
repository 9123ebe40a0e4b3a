"""Handle, system, group and field-group classes (what DCGM's `pydcgm` brings into one namespace)."""

import dcgm_agent
import dcgm_field_helpers
import dcgm_structs
from DcgmFieldGroup import DcgmFieldGroup  # noqa: F401  (re-exported, as in the real pydcgm)


class DcgmException(Exception):
    pass


class DcgmHandle:
    """No address: an embedded host engine. `ipAddress` ("host[:port]") or `unixSocketPath`: a
    standalone nv-hostengine."""

    def __init__(
        self,
        handle=None,
        ipAddress=None,
        opMode=dcgm_structs.DCGM_OPERATION_MODE_AUTO,
        persistAfterDisconnect=False,
        unixSocketPath=None,
        timeoutMs=0,
    ):
        self._handleCreated = False
        if handle is not None:
            self.handle = handle
            return
        self._ipAddress = ipAddress
        if ipAddress is not None and unixSocketPath is not None:
            raise dcgm_structs.dcgmExceptionClass(dcgm_structs.DCGM_ST_BADPARAM)()
        dcgm_structs._dcgmInit()
        dcgm_agent.dcgmInit()
        if ipAddress is None and unixSocketPath is None:
            self.handle = dcgm_agent.dcgmStartEmbedded(opMode)
            self.isEmbedded = True
            self._handleCreated = True
            return
        params = dcgm_structs.c_dcgmConnectV2Params_v2()
        params.version = dcgm_structs.c_dcgmConnectV2Params_version
        params.timeoutMs = timeoutMs
        params.persistAfterDisconnect = 1 if persistAfterDisconnect else 0
        params.addressIsUnixSocket = 0 if ipAddress is not None else 1
        self.handle = dcgm_agent.dcgmConnect_v2(
            ipAddress if ipAddress is not None else unixSocketPath, params
        )
        self.isEmbedded = False
        self._handleCreated = True

    def GetSystem(self):
        return DcgmSystem(self)

    def Shutdown(self):
        if not self._handleCreated:
            return
        if self.isEmbedded:
            dcgm_agent.dcgmStopEmbedded(self.handle)
        else:
            dcgm_agent.dcgmDisconnect(self.handle)
        self._handleCreated = False
        self.handle = None

    def GetIpAddress(self):
        return self._ipAddress


class DcgmSystemDiscovery:
    def __init__(self, dcgmHandle):
        self._dcgmHandle = dcgmHandle

    def GetAllGpuIds(self):
        return dcgm_agent.dcgmGetAllDevices(self._dcgmHandle.handle)

    def GetAllSupportedGpuIds(self):
        return dcgm_agent.dcgmGetAllSupportedDevices(self._dcgmHandle.handle)

    def GetGpuAttributes(self, gpuId):
        return dcgm_agent.dcgmGetDeviceAttributes(self._dcgmHandle.handle, gpuId)

    def GetEntityGroupEntities(self, entityGroupId, onlySupported):
        flags = dcgm_structs.DCGM_GEGE_FLAG_ONLY_SUPPORTED if onlySupported else 0
        return dcgm_agent.dcgmGetEntityGroupEntities(self._dcgmHandle.handle, entityGroupId, flags)


class DcgmSystem:
    def __init__(self, dcgmHandle):
        self._dcgmHandle = dcgmHandle
        self.discovery = DcgmSystemDiscovery(dcgmHandle)

    def UpdateAllFields(self, waitForUpdate):
        dcgm_structs._dcgmCheckReturn(dcgm_agent.dcgmUpdateAllFields(self._dcgmHandle.handle, waitForUpdate))

    def GetEmptyGroup(self, groupName):
        return DcgmGroup(self._dcgmHandle, groupName=groupName)

    def GetGroupWithGpuIds(self, groupName, gpuIds):
        group = DcgmGroup(self._dcgmHandle, groupName=groupName)
        for gpuId in gpuIds:
            group.AddGpu(gpuId)
        return group

    def GetGroupWithEntities(self, groupName, entities):
        group = DcgmGroup(self._dcgmHandle, groupName=groupName)
        for entity in entities:
            group.AddEntity(entity.entityGroupId, entity.entityId)
        return group


class DcgmGroupSamples:
    def __init__(self, dcgmHandle, groupId):
        self._dcgmHandle = dcgmHandle
        self._groupId = groupId

    def WatchFields(self, fieldGroup, updateFreq, maxKeepAge, maxKeepSamples):
        ret = dcgm_agent.dcgmWatchFields(
            self._dcgmHandle.handle,
            self._groupId,
            fieldGroup.fieldGroupId,
            updateFreq,
            maxKeepAge,
            maxKeepSamples,
        )
        dcgm_structs._dcgmCheckReturn(ret)

    def UnwatchFields(self, fieldGroup):
        ret = dcgm_agent.dcgmUnwatchFields(self._dcgmHandle.handle, self._groupId, fieldGroup.fieldGroupId)
        dcgm_structs._dcgmCheckReturn(ret)

    def GetLatest_v2(self, fieldGroup):
        collection = dcgm_field_helpers.DcgmFieldValueEntityCollection(self._dcgmHandle.handle, self._groupId)
        collection.GetLatestValues(fieldGroup)
        return collection


class DcgmGroup:
    def __init__(self, dcgmHandle, groupId=None, groupName=None, groupType=dcgm_structs.DCGM_GROUP_EMPTY):
        self._dcgmHandle = dcgmHandle
        if groupId is None:
            groupId = dcgm_agent.dcgmGroupCreate(dcgmHandle.handle, groupType, groupName)
        self._groupId = groupId
        self.samples = DcgmGroupSamples(dcgmHandle, groupId)

    def AddGpu(self, gpuId):
        dcgm_agent.dcgmGroupAddDevice(self._dcgmHandle.handle, self._groupId, gpuId)

    def AddEntity(self, entityGroupId, entityId):
        dcgm_agent.dcgmGroupAddEntity(self._dcgmHandle.handle, self._groupId, entityGroupId, entityId)

    def GetId(self):
        return self._groupId

    def Delete(self):
        if self._groupId is not None:
            dcgm_agent.dcgmGroupDestroy(self._dcgmHandle.handle, self._groupId)
        self._groupId = None
