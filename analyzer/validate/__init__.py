"""Validators for every file `emit` writes, from the consuming tools' own rules.

Each module checks one tool's format the way that tool reads it (rules restated from reading the
tools' sources and documentation, not copied): `device_plugin` (NVIDIA k8s-device-plugin config
and the ConfigMap its config-manager reads), `mig_parted` (NVIDIA mig-parted `v1` spec, with the
catalog's MIG tables) and `slurm` (`gres.conf` and the MPS/shard requests placed against it).
A validator returns every problem it finds; `emit` changes what a tool cannot express and then
refuses to return anything a validator still rejects.
"""

from __future__ import annotations

from dataclasses import dataclass

from gpulens.analyzer.errors import AnalyzerError


@dataclass(frozen=True)
class Problem:
    """One rule an emitted file breaks: which file, where in it, and what the tool expects."""

    file: str
    where: str
    message: str

    def __str__(self) -> str:
        return f"{self.file}: {self.where}: {self.message}" if self.where else f"{self.file}: {self.message}"


class InvalidConfig(AnalyzerError):
    """Raised when an emitted file still breaks its tool's rules (a bug in emit, never input)."""

    def __init__(self, problems: list[Problem]) -> None:
        self.problems = problems
        more = f" (and {len(problems) - 1} more)" if len(problems) > 1 else ""
        super().__init__(f"generated configuration is invalid: {problems[0]}{more}")
