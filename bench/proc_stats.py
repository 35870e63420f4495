"""What the Python benchmarks read about their own process and machine (Linux /proc)."""


def vmhwm() -> int:
    """This process's peak resident memory so far, in bytes (VmHWM)."""
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) * 1024
    return 0


def reset_vmhwm() -> None:
    """Sets VmHWM back to the current resident memory (clear_refs 5)."""
    with open("/proc/self/clear_refs", "w") as f:
        f.write("5")


def cpu_model() -> str:
    try:
        with open("/proc/cpuinfo") as f:
            return next((line.split(":", 1)[1].strip() for line in f if line.startswith("model name")), "unknown CPU")
    except OSError:
        return "unknown CPU"
