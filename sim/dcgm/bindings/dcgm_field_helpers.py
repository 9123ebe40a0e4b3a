"""Python-friendly field values (subset of DCGM's `dcgm_field_helpers.py`)."""

import dcgm_agent
import dcgm_fields
import dcgm_structs
import dcgmvalue


class DcgmFieldValue:
    """One field value: `.ts` (µs), `.fieldId`, `.fieldType`, `.value`, `.isBlank`."""

    def __init__(self, rawValue):
        self.ts = rawValue.ts
        self.fieldId = rawValue.fieldId
        self.fieldType = chr(rawValue.fieldType)
        self.isBlank = False
        self.value = None
        if rawValue.status != dcgm_structs.DCGM_ST_OK:
            self.isBlank = True
            return
        if self.fieldType == dcgm_fields.DCGM_FT_DOUBLE:
            self.value = float(rawValue.value)
            self.isBlank = dcgmvalue.DCGM_FP64_IS_BLANK(self.value)
        elif self.fieldType in (dcgm_fields.DCGM_FT_INT64, dcgm_fields.DCGM_FT_TIMESTAMP):
            self.value = int(rawValue.value)
            self.isBlank = dcgmvalue.DCGM_INT64_IS_BLANK(self.value)
        else:
            self.value = str(rawValue.value)
            self.isBlank = dcgmvalue.DCGM_STR_IS_BLANK(self.value)


class DcgmFieldValueTimeSeries:
    def __init__(self):
        self.values = []

    def __len__(self):
        return len(self.values)

    def __getitem__(self, key):
        return self.values[key]

    def InsertValue(self, value):
        self.values.append(value)
        self.values.sort(key=lambda v: v.ts)


def _entity_callback(entityGroupId, entityId, values, numValues, userData):
    userData._ProcessValues(entityGroupId, entityId, values[0:numValues])
    return 0


class DcgmFieldValueEntityCollection:
    """`.values[entityGroupId][entityId][fieldId]` -> DcgmFieldValueTimeSeries."""

    def __init__(self, handle, groupId):
        self.values = {}
        self._handle = handle
        self._groupId = groupId

    def _ProcessValues(self, entityGroupId, entityId, values):
        fields = self.values.setdefault(entityGroupId, {}).setdefault(entityId, {})
        for rawValue in values:
            value = DcgmFieldValue(rawValue)
            fields.setdefault(value.fieldId, DcgmFieldValueTimeSeries()).InsertValue(value)

    def GetLatestValues(self, fieldGroup):
        ret = dcgm_agent.dcgmGetLatestValues_v2(
            self._handle, self._groupId, fieldGroup.fieldGroupId, _entity_callback, self
        )
        dcgm_structs._dcgmCheckReturn(ret)

    def EmptyValues(self):
        self.values = {}
