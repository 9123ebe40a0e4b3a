"""NVIDIA mig-parted `v1` spec, checked as mig-parted parses it and against the catalog's MIG tables.

From mig-parted's spec parser (api/spec/v1): the document has exactly `version` (`v1`) and
`mig-configs`; `mig-configs` and each named config are not empty; an entry has `devices`
(`all` or a list of GPU indices) and `mig-enabled` (both required), optionally `device-filter`
(a PCI device id such as `0x233010DE`, or a list of them) and `mig-devices` (profile -> count),
and nothing else. `mig-devices` is required when MIG is enabled and must be empty when it is
not; counts are not negative and at least one is positive; profile names have the form
`[<c>c.]<g>g.<size>gb[+attribute...]`.

What mig-parted leaves to the driver (it would fail at apply time), checked here with the catalog:
the profile exists on the GPU model the entry applies to, no profile exceeds its instance limit,
compute slices fit, and the instances can be placed on the memory slices together.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Any

import yaml

from gpulens.analyzer.validate import Problem
from gpulens.catalog import CatalogError, GpuModel, model_for_pci_device_id
from gpulens.migplacement import place_mig_layout

VERSION = "v1"
ENTRY_KEYS = frozenset({"device-filter", "devices", "mig-enabled", "mig-devices"})
_PROFILE = re.compile(r"^(?:[1-9]\d*c\.)?[1-9]\d*g\.[1-9]\d*gb(?:(?:\+|-)[a-z]+(?:\.[a-z]+)*)*$")
_PCI_ID = re.compile(r"^0x[0-9A-Fa-f]{8}$")


def _is_int(value: object) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _filters(value: object) -> list[str] | None:
    if isinstance(value, str):
        return [value]
    if isinstance(value, list) and all(isinstance(v, str) for v in value):
        return list(value)
    return None


def _entry(
    entry: object,
    file: str,
    where: str,
    model: GpuModel | None,
    gpu_count: int | None,
) -> tuple[list[Problem], set[int] | None]:
    """Problems of one entry and the device indices it covers (None: all)."""
    if not isinstance(entry, Mapping):
        return [Problem(file, where, "an entry must be a mapping")], set()
    problems = [Problem(file, f"{where}.{k}", "unexpected field") for k in sorted(set(entry) - ENTRY_KEYS)]
    for key in ("devices", "mig-enabled"):
        if key not in entry:
            problems.append(Problem(file, f"{where}.{key}", "missing required field"))
    devices = entry.get("devices")
    covered: set[int] | None = set()
    if devices == "all":
        covered = None
    elif isinstance(devices, list) and all(_is_int(d) and d >= 0 for d in devices):
        covered = set(devices)
        if len(covered) != len(devices):
            problems.append(Problem(file, f"{where}.devices", "lists a device twice"))
        if gpu_count is not None and any(d >= gpu_count for d in devices):
            problems.append(
                Problem(file, f"{where}.devices", f"index out of range: the node has {gpu_count} GPU(s)")
            )
    elif "devices" in entry:
        problems.append(Problem(file, f"{where}.devices", "must be 'all' or a list of GPU indices"))
    if "device-filter" in entry:
        filters = _filters(entry["device-filter"])
        if filters is None or not filters or not all(_PCI_ID.match(f) for f in filters):
            problems.append(
                Problem(
                    file,
                    f"{where}.device-filter",
                    "must be a PCI device id like 0x233010DE or a list of them",
                )
            )
        elif model is None:
            found = {m.key for f in filters if (m := model_for_pci_device_id(int(f, 16))) is not None}
            if len(found) == 1:
                model = model_for_pci_device_id(int(filters[0], 16))
    enabled = entry.get("mig-enabled")
    if "mig-enabled" in entry and not isinstance(enabled, bool):
        problems.append(Problem(file, f"{where}.mig-enabled", "must be true or false"))
    devices_map = entry.get("mig-devices")
    if enabled is True and devices_map is None:
        problems.append(Problem(file, f"{where}.mig-devices", "required when 'mig-enabled' is true"))
    if enabled is False and devices_map:
        problems.append(
            Problem(file, f"{where}.mig-devices", "MIG devices included when 'mig-enabled' is false")
        )
    if devices_map is None or enabled is not True:
        return problems, covered
    if not isinstance(devices_map, Mapping):
        return [*problems, Problem(file, f"{where}.mig-devices", "must map profiles to counts")], covered
    requests: list[tuple[str, int | None]] = []
    for profile, count in devices_map.items():
        at = f"{where}.mig-devices.{profile}"
        if not isinstance(profile, str) or not _PROFILE.match(profile):
            problems.append(Problem(file, at, "not a MIG profile name like 3g.40gb or 1g.10gb+me"))
            continue
        if not _is_int(count) or count < 0:
            problems.append(Problem(file, at, f"count must be a non-negative integer, got {count!r}"))
            continue
        requests += [(profile, None)] * count
    if devices_map and not requests and not problems:
        problems.append(Problem(file, f"{where}.mig-devices", "all counts for all MIG profiles are 0"))
    if model is not None and requests and not problems:
        try:
            place_mig_layout(model, requests)
        except CatalogError as exc:
            problems.append(Problem(file, f"{where}.mig-devices", str(exc)))
    return problems, covered


def validate_spec(
    spec: object,
    file: str,
    models: Mapping[str, GpuModel] | None = None,
    gpu_counts: Mapping[str, int] | None = None,
) -> list[Problem]:
    """Every rule a mig-parted spec breaks.

    `models` / `gpu_counts`: config name -> the GPU model / number of GPUs of the node that will
    select it (from the inventory); entries with a `device-filter` name their model themselves.
    """
    if not isinstance(spec, Mapping):
        return [Problem(file, "", "a mig-parted spec must be a mapping")]
    problems: list[Problem] = []
    if "version" not in spec:
        problems.append(Problem(file, "version", "missing 'version' field"))
    elif spec["version"] != VERSION:
        problems.append(Problem(file, "version", f"unknown version {spec['version']!r}; expected v1"))
    problems += [Problem(file, k, "unexpected field") for k in sorted(set(spec) - {"version", "mig-configs"})]
    configs = spec.get("mig-configs")
    if not isinstance(configs, Mapping) or not configs:
        return [*problems, Problem(file, "mig-configs", "at least one config is required")]
    for name, entries in configs.items():
        where = f"mig-configs.{name}"
        if not isinstance(entries, list) or not entries:
            problems.append(Problem(file, where, "at least one entry is required"))
            continue
        model = (models or {}).get(str(name))
        count = (gpu_counts or {}).get(str(name))
        seen: set[int] = set()
        everything = False
        for i, entry in enumerate(entries):
            found, covered = _entry(entry, file, f"{where}[{i}]", model, count)
            problems += found
            unfiltered = isinstance(entry, Mapping) and "device-filter" not in entry
            if unfiltered and (everything or (covered is None and seen) or (covered and covered & seen)):
                problems.append(
                    Problem(file, f"{where}[{i}].devices", "a device is configured by two entries")
                )
            if unfiltered:
                everything = everything or covered is None
                seen |= covered or set()
    return problems


def validate_text(text: str, file: str, **context: Any) -> list[Problem]:
    """`validate_spec` of a YAML document."""
    try:
        spec = yaml.safe_load(text)
    except yaml.YAMLError as exc:
        return [Problem(file, "", f"not YAML: {str(exc).splitlines()[0]}")]
    return validate_spec(spec, file, **context)
