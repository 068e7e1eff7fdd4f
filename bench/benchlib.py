"""Helpers shared by the benchmark scripts in this directory."""
import platform
import subprocess
import sys


def run(cmd, **kw):
    """Runs a command and returns its stdout; exits with its stderr when it fails."""
    r = subprocess.run(cmd, capture_output=True, text=True, **kw)
    if r.returncode != 0:
        sys.exit(f"{' '.join(cmd)} failed:\n{r.stderr}")
    return r.stdout


def cpu_name():
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor()
