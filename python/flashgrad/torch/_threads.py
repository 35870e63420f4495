"""flashgrad's tasks on PyTorch's OpenMP threads.

After each parallel operator, PyTorch's OpenMP threads spin for a while before they sleep
(libgomp's default); on a machine with as many threads as cores, flashgrad's own workers
then share cores with them. Run on the same threads instead, the tasks start at once on
threads that are already awake. FLASHGRAD_TORCH_OPENMP=0 keeps flashgrad's own pool.
"""
from __future__ import annotations

import os

import flashgrad

_NAMES = ("libgomp", "libiomp5")


def torch_openmp_runtime(torch_module) -> str:
    """The path of the OpenMP runtime this process loaded for torch ("" if none): the first
    libgomp or libiomp5 in torch's own lib directory, else the first mapped anywhere."""
    torch_lib = os.path.join(os.path.dirname(os.path.abspath(torch_module.__file__)), "lib")
    found = []
    try:
        with open("/proc/self/maps") as f:
            for line in f:
                path = line.split()[-1] if line.strip() else ""
                if os.path.basename(path).startswith(_NAMES) and path not in found:
                    found.append(path)
    except OSError:
        return ""
    ours = [p for p in found if os.path.dirname(p) == torch_lib]
    return (ours or found or [""])[0]


def use_torch_openmp(torch_module) -> None:
    if os.environ.get("FLASHGRAD_TORCH_OPENMP", "1") == "0":
        return
    library = torch_openmp_runtime(torch_module)
    if library:
        flashgrad.use_openmp_runtime(library)
