"""The parts of goldens/<unit>/unit.toml (docs/UNIT.md) that the oracle needs for `capture`."""

from __future__ import annotations

import json
import tomllib
from dataclasses import dataclass, field
from pathlib import Path


class UnitError(Exception):
    pass


@dataclass
class Unit:
    path: Path
    name: str
    model: Path
    prompts: list[dict]
    max_tokens: int
    ignore_eos: bool
    backend: str
    device: str
    dtype: str
    options: dict = field(default_factory=dict)
    goldens: list[dict] = field(default_factory=list)

    def golden_for(self, device: str, dtype: str) -> Path:
        """The first [[golden]] whose device (cpu/cuda) and dtype match (docs/UNIT.md)."""
        kind = "cuda" if device.startswith("cuda") else device
        for g in self.goldens:
            if g.get("device") == kind and g.get("dtype") == dtype:
                return self.path.parent / g["file"]
        raise UnitError(f"{self.path}: no [[golden]] entry for device {kind!r} dtype {dtype!r}; fix: add one "
                        "(file, device, dtype) or pass --golden FILE")


def load_unit(path: str) -> Unit:
    p = Path(path)
    try:
        doc = tomllib.loads(p.read_text())
    except FileNotFoundError:
        raise UnitError(f"unit file {path} does not exist") from None
    except tomllib.TOMLDecodeError as e:
        raise UnitError(f"{path} is not valid TOML: {e}") from None
    base = p.parent
    try:
        battery, oracle = doc["battery"], doc["oracle"]
        prompts_path = base / battery["prompts"]
        unit = Unit(
            path=p,
            name=doc["name"],
            model=base / doc["model"],
            prompts=json.loads(prompts_path.read_text())["prompts"],
            max_tokens=int(battery.get("max_tokens", 32)),
            ignore_eos=bool(battery.get("ignore_eos", True)),
            backend=oracle.get("backend", "transformers"),
            device=oracle.get("device", "cpu" if oracle.get("backend", "transformers") == "transformers" else "cuda"),
            dtype=oracle.get("dtype", "float32"),
            options=dict(oracle.get("options", {})),
            goldens=list(doc.get("golden", [])),
        )
    except KeyError as e:
        raise UnitError(f"{path}: missing required key {e}; see docs/UNIT.md") from None
    except (OSError, json.JSONDecodeError) as e:
        raise UnitError(f"{path}: cannot read its prompts: {e}") from None
    return unit
