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


def print_table(lines, markdown=None):
    """Prints a Markdown table (a list of lines) and, given a path, writes it there too."""
    table = "\n".join(lines) + "\n"
    print(table)
    if markdown:
        with open(markdown, "w") as f:
            f.write(table)


def tts_profile(backend, threads):
    """A profile for one backend without fallback (CPU: with a thread count)."""
    text = f'[backend]\nprefer = ["{backend}"]\nfallback = false\n'
    if backend == "cpu":
        text += f"[backends.cpu]\nthreads = {threads}\n"
    return text


def gpu_name():
    """The first NVIDIA GPU's name, if nvidia-smi answers."""
    try:
        r = subprocess.run(["nvidia-smi", "--query-gpu=name,driver_version", "--format=csv,noheader"], capture_output=True, text=True)
        return r.stdout.strip().splitlines()[0] if r.returncode == 0 and r.stdout.strip() else None
    except OSError:
        return None


def cpu_name():
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor()
