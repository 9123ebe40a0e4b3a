"""Slurm `gres.conf`, the `Gres=` of slurm.conf node lines, and the MPS/shard requests placed on them.

Rules restated from Slurm's gres.conf and GRES documentation (22.05+):

- a line is `Key=Value` parameters (names case-insensitive, `#` starts a comment); node-scoped
  lines start with `NodeName=` and name real nodes (a host list such as `gpu[1-4]` expands);
- `File=` names device files (`/dev/nvidia[0-3]` expands); a GPU index must exist on the node;
- `Name=mps Count=N File=D` gives GPU D N MPS shares; a job's `--gres=mps:X` is served from one
  GPU and gets X*100/N percent of it, so the requests placed on one GPU sum to at most N
  (Count 100: at most 100 percent); MPS and shard counts need a GPU declared for that `File`
  (or `AutoDetect=nvml`), and MPS is not used on MIG GPUs;
- `Name=shard Count=N File=D`: at most N jobs share GPU D at once;
- the slurm.conf `Gres=` of a node totals what gres.conf declares for it (`gpu:type:n`,
  `mps:total`, `shard:total`); a node whose counts disagree is drained by Slurm.

The `# job J on HOST DEVICE: --gres=...` comment lines `emit` writes are the requests checked.
"""

from __future__ import annotations

import re
from collections import Counter
from collections.abc import Mapping

from gpulens.analyzer.validate import Problem

MPS_COUNT_PER_GPU = 100
KNOWN_KEYS = frozenset(
    {"nodename", "name", "type", "file", "count", "cores", "links", "flags", "autodetect", "multiplefiles"}
)
AUTODETECT = frozenset({"nvml", "off", "rsmi", "oneapi", "nrt", "nvidia"})
GRES_NAMES = frozenset({"gpu", "mps", "shard"})
_HOSTNAME = re.compile(r"^[A-Za-z0-9]([A-Za-z0-9_.-]*[A-Za-z0-9])?$")
_RANGE = re.compile(r"^(?P<prefix>[^\[\]]*)\[(?P<body>[0-9,\-]+)\](?P<suffix>[^\[\]]*)$")
_JOB = re.compile(r"^# job (?P<job>\S+) on (?P<host>\S+) (?P<file>\S+): --gres=(?P<gres>\S+)")
_NVIDIA = re.compile(r"^/dev/nvidia(?P<index>\d+)$")


def expand(expression: str) -> list[str]:
    """`a[1-3,5]` -> a1 a2 a3 a5 (one bracket range, as emit and most gres.conf files use); plain
    names and comma lists pass through. Raises ValueError on a malformed range."""
    out: list[str] = []
    for part in _split_outside_brackets(expression):
        match = _RANGE.match(part)
        if not match:
            if "[" in part or "]" in part:
                raise ValueError(f"malformed range {part!r}")
            out.append(part)
            continue
        for piece in match["body"].split(","):
            low, _, high = piece.partition("-")
            if not low.isdigit() or (high and not high.isdigit()):
                raise ValueError(f"malformed range {part!r}")
            width = len(low)
            stop = int(high) if high else int(low)
            if stop < int(low) or stop - int(low) > 100_000:
                raise ValueError(f"malformed range {part!r}")
            out += [f"{match['prefix']}{n:0{width}d}{match['suffix']}" for n in range(int(low), stop + 1)]
    return out


def _split_outside_brackets(text: str) -> list[str]:
    parts, depth, current = [], 0, ""
    for char in text:
        depth += char == "["
        depth -= char == "]"
        if char == "," and depth == 0:
            parts.append(current)
            current = ""
        else:
            current += char
    parts.append(current)
    return [p for p in parts if p]


def parse_line(line: str) -> dict[str, str]:
    """`Key=Value ...` -> {lower-case key: value}; raises ValueError on a token without '='."""
    params: dict[str, str] = {}
    for token in line.split("#", 1)[0].split():
        key, sep, value = token.partition("=")
        if not sep or not key:
            raise ValueError(f"{token!r} is not Key=Value")
        params[key.lower()] = value
    return params


def _gpu_index(file: str) -> int | None:
    match = _NVIDIA.match(file)
    return int(match["index"]) if match else None


def _params(raw: str, file: str, at: str, problems: list[Problem]) -> dict[str, str] | None:
    """A line's parameters; None for a blank or comment line, or for one that does not parse
    (then a problem says why)."""
    if not raw.split("#", 1)[0].strip():
        return None
    try:
        return parse_line(raw)
    except ValueError as exc:
        problems.append(Problem(file, at, str(exc)))
        return None


def _expanded(value: str, key: str, file: str, at: str, problems: list[Problem]) -> list[str] | None:
    """A host list or device range expanded; None when it does not expand (a problem says why)."""
    try:
        return expand(value)
    except ValueError as exc:
        problems.append(Problem(file, at, f"{key}: {exc}"))
        return None


def validate(gres_text: str, nodes_text: str, gpus_per_host: Mapping[str, int]) -> list[Problem]:
    """Problems of a gres.conf, its slurm.conf node lines and the job requests in its comments.

    `gpus_per_host`: the hosts of the inventory and how many GPUs each has.
    """
    file = "gres.conf"
    problems: list[Problem] = []
    gpu_files: dict[str, set[int]] = {}
    autodetect: set[str] = set()
    mps: dict[tuple[str, int], int] = {}
    shard: dict[tuple[str, int], int] = {}
    types: dict[str, Counter[str]] = {}
    requests: list[tuple[int, str, str, int, str]] = []
    for number, raw in enumerate(gres_text.splitlines(), start=1):
        at = f"line {number}"
        job = _JOB.match(raw)
        if job:
            index = _gpu_index(job["file"])
            if index is None:
                problems.append(Problem(file, at, f"{job['file']} is not a /dev/nvidiaN device"))
                continue
            requests.append((number, job["job"], job["host"], index, job["gres"]))
            continue
        params = _params(raw, file, at, problems)
        if params is None:
            continue
        unknown = sorted(set(params) - KNOWN_KEYS)
        if unknown:
            problems.append(Problem(file, at, f"unknown parameter(s) {', '.join(unknown)}"))
        if "nodename" not in params:
            problems.append(
                Problem(file, at, "every line emitted for a plan starts with NodeName= a real host")
            )
            continue
        hosts = _expanded(params["nodename"], "NodeName", file, at, problems)
        if hosts is None:
            continue
        for host in hosts:
            if not _HOSTNAME.match(host):
                problems.append(Problem(file, at, f"NodeName {host!r} is not a host name"))
            elif host not in gpus_per_host:
                problems.append(Problem(file, at, f"NodeName {host!r} is not a host in the inventory"))
        if "autodetect" in params:
            if params["autodetect"].lower() not in AUTODETECT:
                problems.append(
                    Problem(file, at, f"AutoDetect={params['autodetect']} is not a detection mode")
                )
            autodetect.update(hosts)
            if "name" not in params:
                continue
        name = params.get("name", "").lower()
        if name not in GRES_NAMES:
            problems.append(
                Problem(file, at, f"Name={params.get('name', '')!r}: emit declares gpu, mps or shard")
            )
            continue
        files: list[int] = []
        if "file" in params:
            paths = _expanded(params["file"], "File", file, at, problems)
            if paths is None:
                continue
            for path in paths:
                index = _gpu_index(path)
                if index is None:
                    problems.append(Problem(file, at, f"File={path} is not a /dev/nvidiaN device"))
                    continue
                for host in hosts:
                    if host in gpus_per_host and index >= gpus_per_host[host]:
                        problems.append(
                            Problem(
                                file,
                                at,
                                f"{path}: {host} has {gpus_per_host[host]} GPU(s)",
                            )
                        )
                files.append(index)
        count_text = params.get("count")
        if count_text is not None and not count_text.isdigit():
            problems.append(Problem(file, at, f"Count={count_text} is not a non-negative integer"))
            continue
        count = int(count_text) if count_text is not None else None
        for host in hosts:
            if name == "gpu":
                declared = gpu_files.setdefault(host, set())
                for index in files:
                    if index in declared:
                        problems.append(Problem(file, at, f"{host} /dev/nvidia{index} is declared twice"))
                    declared.add(index)
                types.setdefault(host, Counter())[params.get("type", "")] += len(files) or (count or 0)
                continue
            if not files:
                problems.append(
                    Problem(file, at, f"Name={name} lines give a File= so that each GPU has its own count")
                )
                continue
            if count is None:
                problems.append(Problem(file, at, f"Name={name} needs Count="))
                continue
            table = mps if name == "mps" else shard
            for index in files:
                if index not in gpu_files.get(host, set()) and host not in autodetect:
                    problems.append(
                        Problem(
                            file,
                            at,
                            f"{name} on {host} /dev/nvidia{index}, but no Name=gpu line declares that GPU",
                        )
                    )
                if (host, index) in table:
                    problems.append(
                        Problem(file, at, f"{name} count of {host} /dev/nvidia{index} given twice")
                    )
                table[(host, index)] = count
    for host, index in set(mps) & set(shard):
        problems.append(Problem(file, host, f"/dev/nvidia{index} has both mps and shard counts"))
    problems += _requests(file, requests, mps, shard)
    problems += _nodes(nodes_text, gpu_files, autodetect, mps, shard, types, gpus_per_host)
    return problems


def _requests(
    file: str,
    requests: list[tuple[int, str, str, int, str]],
    mps: Mapping[tuple[str, int], int],
    shard: Mapping[tuple[str, int], int],
) -> list[Problem]:
    problems: list[Problem] = []
    mps_sum: Counter[tuple[str, int]] = Counter()
    shards: Counter[tuple[str, int]] = Counter()
    whole: set[tuple[str, int]] = set()
    for number, job, host, index, gres in requests:
        at = f"line {number}"
        kind, _, rest = gres.partition(":")
        key = (host, index)
        if kind == "mps":
            if not rest.isdigit() or int(rest) < 1:
                problems.append(Problem(file, at, f"job {job}: --gres=mps:{rest} needs a positive share"))
                continue
            if key not in mps:
                problems.append(Problem(file, at, f"job {job}: {host} /dev/nvidia{index} has no mps count"))
                continue
            mps_sum[key] += int(rest)
        elif kind == "shard":
            if key not in shard:
                problems.append(Problem(file, at, f"job {job}: {host} /dev/nvidia{index} has no shard count"))
                continue
            shards[key] += 1
        elif kind == "gpu":
            whole.add(key)
        else:
            problems.append(Problem(file, at, f"job {job}: --gres={gres} is not gpu, mps or shard"))
    for key, total in sorted(mps_sum.items()):
        if total > mps[key]:
            problems.append(
                Problem(
                    file,
                    f"{key[0]} /dev/nvidia{key[1]}",
                    f"MPS requests sum to {total}, past the GPU's mps Count of {mps[key]}: Slurm will not "
                    "place these jobs together",
                )
            )
    for key, jobs in sorted(shards.items()):
        if jobs > shard[key]:
            problems.append(
                Problem(
                    file,
                    f"{key[0]} /dev/nvidia{key[1]}",
                    f"{jobs} jobs share it but its shard Count is {shard[key]}",
                )
            )
    for key in sorted(whole & (set(mps_sum) | set(shards))):
        problems.append(
            Problem(
                file,
                f"{key[0]} /dev/nvidia{key[1]}",
                "requested as a whole GPU and as mps/shard: Slurm allocates one or the other",
            )
        )
    return problems


def _nodes(
    text: str,
    gpu_files: Mapping[str, set[int]],
    autodetect: set[str],
    mps: Mapping[tuple[str, int], int],
    shard: Mapping[tuple[str, int], int],
    types: Mapping[str, Counter[str]],
    gpus_per_host: Mapping[str, int],
) -> list[Problem]:
    file = "slurm-nodes.conf"
    problems: list[Problem] = []
    described = set(gpu_files) | autodetect
    seen: set[str] = set()
    for number, raw in enumerate(text.splitlines(), start=1):
        at = f"line {number}"
        params = _params(raw, file, at, problems)
        if params is None:
            continue
        host = params.get("nodename", "")
        if host not in gpus_per_host:
            problems.append(Problem(file, at, f"NodeName {host!r} is not a host in the inventory"))
            continue
        seen.add(host)
        totals: Counter[str] = Counter()
        gpu_types: Counter[str] = Counter()
        for item in params.get("gres", "").split(","):
            fields = item.split(":")
            if len(fields) not in (2, 3) or not fields[-1].isdigit():
                problems.append(Problem(file, at, f"Gres item {item!r} is not name[:type]:count"))
                continue
            totals[fields[0]] += int(fields[-1])
            if fields[0] == "gpu" and len(fields) == 3:
                gpu_types[fields[1]] += int(fields[-1])
        want_mps = sum(c for (h, _), c in mps.items() if h == host)
        want_shard = sum(c for (h, _), c in shard.items() if h == host)
        if totals["mps"] != want_mps:
            problems.append(Problem(file, at, f"mps:{totals['mps']} but gres.conf gives {host} {want_mps}"))
        if totals["shard"] != want_shard:
            problems.append(
                Problem(file, at, f"shard:{totals['shard']} but gres.conf gives {host} {want_shard}")
            )
        if host in gpu_files and host not in autodetect:
            declared = +types.get(host, Counter())
            if gpu_types != declared:
                problems.append(
                    Problem(
                        file,
                        at,
                        f"gpu types {dict(gpu_types)} differ from gres.conf's {dict(declared)} for {host}",
                    )
                )
    for host in sorted(described - seen):
        problems.append(
            Problem(file, host, "gres.conf describes this node but slurm.conf gets no Gres= for it")
        )
    return problems
