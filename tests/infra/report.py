"""What an infra check found: errors (the check fails) and skipped checks (listed with their reasons)."""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass(frozen=True)
class Finding:
    """One problem (or one skipped check): where it is and what it is."""

    file: str
    line: int
    subject: str
    path: str
    message: str

    def __str__(self) -> str:
        where = f"{self.file}:{self.line}" if self.line else self.file
        what = f"{self.subject} {self.path}".strip()
        return f"{where} {what}: {self.message}" if what else f"{where}: {self.message}"


@dataclass
class Report:
    """What a check found: errors (the check fails), skipped checks (visible, with reasons) and counts."""

    errors: list[Finding] = field(default_factory=list)
    skipped: list[Finding] = field(default_factory=list)
    files: int = 0
    resources: int = 0
    properties: int = 0
    reads: int = 0
    modules: int = 0

    @property
    def ok(self) -> bool:
        return not self.errors

    def merge(self, other: Report) -> None:
        self.errors += other.errors
        self.skipped += other.skipped
        self.files += other.files
        self.resources += other.resources
        self.properties += other.properties
        self.reads += other.reads
        self.modules += other.modules

    def summary(self) -> str:
        return (
            f"{self.files} files, {self.resources} resource declarations, {self.modules} module calls, "
            f"{self.properties} values type-checked, {self.reads} property reads resolved, "
            f"{len(self.skipped)} skipped, {len(self.errors)} errors"
        )

    def text(self) -> str:
        lines = [self.summary()]
        lines += [f"  ERROR    {e}" for e in self.errors]
        lines += [f"  skipped  {s}" for s in self.skipped]
        return "\n".join(lines)
