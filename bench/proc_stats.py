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


def mem_available() -> int:
    """MemAvailable from /proc/meminfo, in bytes."""
    with open("/proc/meminfo") as f:
        return next((int(line.split()[1]) * 1024 for line in f if line.startswith("MemAvailable:")), 0)


def run_json_child(script: str, cfg: dict) -> dict:
    """Runs `python script --child <cfg as JSON>` and returns the JSON object its last line
    prints, or {"error": <its last line of output>} when it fails."""
    import json
    import subprocess
    import sys

    p = subprocess.run([sys.executable, script, "--child", json.dumps(cfg)], capture_output=True, text=True)
    if p.returncode != 0:
        tail = (p.stderr or p.stdout).strip().splitlines()
        return {"error": tail[-1] if tail else f"exit {p.returncode}"}
    return json.loads(p.stdout.strip().splitlines()[-1])
