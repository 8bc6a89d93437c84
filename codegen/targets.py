"""Target specs (codegen/targets/*.yaml), selected by the ``target`` flag.

Every hardware fact the code generator, tiling, cost model and simulator driver use is read
from the target's file through one ``Target``: the UB's size and alignment block, the vector
repeat, the repeats one instruction may issue, the core counts, the cube unit's buffers
(L1, L0A/L0B/L0C) and alignments, and the cost model's parameters; and how CANN names the
parts (``soc_versions``, the generated CMake's SOC_VERSION) and their AI cores' architecture
(``npu_arch``, the real-header check's recipe). The list of targets is the list of files.
"""

from __future__ import annotations

import functools
import re
from pathlib import Path

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError, model_validator

from graphkernel.errors import ConfigError, did_you_mean

TARGET_DIR = Path(__file__).resolve().parent / "targets"


class Target(BaseModel):
    """One target's facts. The vector unit reads and writes UB in ``ub_align_bytes`` blocks
    (a DataBlock); one repeat of a vector instruction covers ``repeat_bytes``."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    name: str
    soc_versions: list[str] = Field(min_length=1)  # CANN's SOC_VERSION names; the first builds
    npu_arch: int = Field(ge=1)                    # __NPU_ARCH__ (2201: dav-c220)
    aiv_cores: int = Field(ge=1)
    ub_bytes: int = Field(ge=1024)
    ub_align_bytes: int = Field(ge=4)
    repeat_bytes: int = Field(ge=32)
    max_repeats: int = Field(ge=2)
    # the cube unit (Matmul kernels): per AI Cube core
    aic_cores: int = Field(ge=1)
    l1_bytes: int = Field(ge=1024)
    l0a_bytes: int = Field(ge=1024)
    l0b_bytes: int = Field(ge=1024)
    l0c_bytes: int = Field(ge=1024)
    l1_align_bytes: int = Field(ge=1)
    l0ab_align_bytes: int = Field(ge=1)
    l0c_align_bytes: int = Field(ge=1)
    cube_fractal: int = Field(ge=1)
    cube_k_bytes: int = Field(ge=1)
    hbm_gbps: float = Field(gt=0)
    launch_overhead_us: float = Field(ge=0)
    clock_ghz: float = Field(gt=0)
    repeats_per_cycle: float = Field(gt=0)
    scalar_cycles: float = Field(ge=0)
    sync_cycles: float = Field(ge=0)
    cube_tflops: float = Field(gt=0)  # fp16, all AIC together: an estimate

    @model_validator(mode="after")
    def _whole_blocks(self) -> Target:
        for field in ("ub_align_bytes", "repeat_bytes", "l1_align_bytes", "l0ab_align_bytes",
                      "l0c_align_bytes", "cube_fractal", "cube_k_bytes"):
            n = getattr(self, field)
            if n & (n - 1):
                raise ValueError(f"{field} must be a power of two, got {n}")
        for soc in self.soc_versions:
            if not re.fullmatch(r"[a-z0-9_-]{1,40}", soc):
                raise ValueError(f"soc_versions: {soc!r} is not a CANN SOC_VERSION name "
                                 "(lower case letters, digits, '_' and '-', e.g. ascend910b1)")
        if self.repeat_bytes % self.ub_align_bytes or self.ub_bytes % self.ub_align_bytes:
            raise ValueError(f"repeat_bytes ({self.repeat_bytes}) and ub_bytes "
                             f"({self.ub_bytes}) must be whole ub_align_bytes "
                             f"({self.ub_align_bytes}) blocks")
        return self

    @property
    def block_bytes(self) -> int:
        """The UB block: operands start on one, DataCopy moves whole ones."""
        return self.ub_align_bytes

    @property
    def blocks_per_repeat(self) -> int:
        return self.repeat_bytes // self.ub_align_bytes

    def block_elems(self, itemsize: int) -> int:
        """Elements of ``itemsize`` bytes in one block."""
        return self.ub_align_bytes // itemsize

    def repeat_elems(self, itemsize: int) -> int:
        """Elements of ``itemsize`` bytes in one repeat."""
        return self.repeat_bytes // itemsize

    def cube_k_align(self, itemsize: int) -> int:
        """Elements a base tile's K is a multiple of for operands of ``itemsize`` bytes:
        the fractal side, and whole ``cube_k_bytes`` (int8: 32)."""
        return max(self.cube_fractal, self.cube_k_bytes // itemsize)


def available() -> list[str]:
    """The targets: the names of the spec files present."""
    return sorted(p.stem for p in TARGET_DIR.glob("*.yaml"))


@functools.cache
def load(name: str) -> Target:
    """The named target, validated; a missing or malformed spec file is a ConfigError."""
    path = TARGET_DIR / f"{name}.yaml"
    if not path.exists():
        raise ConfigError(f"unknown target {name!r}" + did_you_mean(name, available())
                          + f" (available: {', '.join(available())})")
    return parse(path)


def parse(path: Path) -> Target:
    """A target spec file, validated (its ``name`` must be its file name)."""
    try:
        data = yaml.safe_load(path.read_text())
    except yaml.YAMLError as e:
        raise ConfigError(f"{path}: not valid YAML ({e})") from None
    if not isinstance(data, dict):
        raise ConfigError(f"{path}: a target spec is a mapping of facts (name, aiv_cores, "
                          f"ub_bytes, ...), got {type(data).__name__}")
    try:
        spec = Target.model_validate(data)
    except ValidationError as e:
        err = e.errors()[0]
        where = ".".join(map(str, err["loc"]))
        raise ConfigError(f"{path}: {where + ': ' if where else ''}{err['msg']}") from None
    if spec.name != path.stem:
        raise ConfigError(f"{path}: name {spec.name!r} is not the file's name {path.stem!r}")
    return spec
