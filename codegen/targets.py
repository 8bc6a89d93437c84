"""Target specs (codegen/targets/*.yaml), selected by the ``target`` flag."""

from __future__ import annotations

import functools
from pathlib import Path

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError

from graphkernel.errors import ConfigError, did_you_mean

TARGET_DIR = Path(__file__).resolve().parent / "targets"


class TargetSpec(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    name: str
    aiv_cores: int = Field(ge=1)
    ub_bytes: int = Field(ge=1024)
    ub_align_bytes: int = Field(ge=1)
    repeat_bytes: int = Field(ge=32)
    max_repeats: int = Field(ge=1)
    hbm_gbps: float = Field(gt=0)
    launch_overhead_us: float = Field(ge=0)
    clock_ghz: float = Field(gt=0)
    repeats_per_cycle: float = Field(gt=0)
    scalar_cycles: float = Field(ge=0)
    sync_cycles: float = Field(ge=0)


def available() -> list[str]:
    return sorted(p.stem for p in TARGET_DIR.glob("*.yaml"))


@functools.cache
def load(name: str) -> TargetSpec:
    path = TARGET_DIR / f"{name}.yaml"
    if not path.exists():
        raise ConfigError(f"unknown target {name!r}" + did_you_mean(name, available())
                          + f" (available: {', '.join(available())})")
    try:
        return TargetSpec.model_validate(yaml.safe_load(path.read_text()))
    except ValidationError as e:
        err = e.errors()[0]
        raise ConfigError(f"{path}: {'.'.join(map(str, err['loc']))}: {err['msg']}") from None
