"""The machine a suite run measured: GPUs and driver (nvidia-smi), the CUDA runtime, cuDNN and
NCCL the binaries load (asked through ctypes, with the same library path they run with),
PyTorch's versions when it is installed, the commit, the date and the host."""
import ctypes
import datetime
import json
import os
import platform
import subprocess

TORCH_PROBE = r"""
import json, torch
c = torch.cuda.is_available()
print(json.dumps({"pytorch": torch.__version__, "pytorch_cuda": torch.version.cuda,
                  "pytorch_cudnn": str(torch.backends.cudnn.version()) if c else None,
                  "pytorch_nccl": ".".join(map(str, torch.cuda.nccl.version())) if c else None}))
"""


def _run(cmd, timeout=60):
    try:
        p = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout)
        return p.stdout if p.returncode == 0 else None
    except (OSError, subprocess.TimeoutExpired):
        return None


def gpus():
    """[{name, memory_mib, driver}] of the visible GPUs; [] without nvidia-smi or a GPU."""
    out = _run(["nvidia-smi", "--query-gpu=name,memory.total,driver_version", "--format=csv,noheader,nounits"])
    rows = []
    for line in (out or "").strip().splitlines():
        name, mem, driver = [f.strip() for f in line.split(",")]
        rows.append({"name": name, "memory_mib": int(float(mem)), "driver": driver})
    return rows


def _library_version(names, symbol, decode):
    for name in names:
        try:
            lib = ctypes.CDLL(name)
        except OSError:
            continue
        return decode(lib, getattr(lib, symbol))
    return None


def _int_out(fn):
    v = ctypes.c_int(0)
    return v.value if fn(ctypes.byref(v)) == 0 else None


def _dotted(v, major_div, minor_div, minor_mod):
    return None if v is None else f"{v // major_div}.{v // minor_div % minor_mod}.{v % minor_div}"


def cuda_runtime():
    v = _library_version(["libcudart.so", "libcudart.so.13", "libcudart.so.12"], "cudaRuntimeGetVersion",
                         lambda lib, f: _int_out(f))
    return None if v is None else f"{v // 1000}.{v % 1000 // 10}"


def cudnn():
    v = _library_version(["libcudnn.so.9", "libcudnn.so.8", "libcudnn.so"], "cudnnGetVersion",
                         lambda lib, f: int(ctypes.c_size_t(f()).value))
    return _dotted(v, 10000, 100, 100) if v and v >= 10000 else (None if v is None else str(v))


def nccl():
    v = _library_version(["libnccl.so.2", "libnccl.so"], "ncclGetVersion", lambda lib, f: _int_out(f))
    return _dotted(v, 10000, 100, 100) if v else None


def torch_versions():
    out = _run(["python3", "-c", TORCH_PROBE], timeout=120)
    if out:
        return json.loads(out.strip().splitlines()[-1])
    return {"pytorch": None, "pytorch_cuda": None, "pytorch_cudnn": None, "pytorch_nccl": None}


def commit(roots):
    """The commit the binaries were built from: the COMMIT file tools/stage_gpu.sh writes into
    the staged tree (a staged copy may sit in a checkout whose git HEAD is another commit),
    else git's."""
    dirs = [d for d in [os.environ.get("BUILD_WORKSPACE_DIRECTORY"), *roots] if d]
    for d in dirs:
        if os.path.exists(os.path.join(d, "COMMIT")):
            return open(os.path.join(d, "COMMIT")).read().strip()
    for d in dirs:
        if out := _run(["git", "-C", d, "describe", "--always", "--dirty", "--abbrev=12"]):
            return out.strip()
    return "unknown"


def cpu_model():
    try:
        for line in open("/proc/cpuinfo"):
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or "unknown"


def collect(roots):
    """The environment block of results.json; `roots`: where to look for the commit."""
    g = gpus()
    env = {
        "host": platform.node(),
        "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        "commit": commit(roots),
        "python": platform.python_version(),
        "cpu": cpu_model(),
        "cpu_count": os.cpu_count() or 1,
        "gpus": g,
        "driver": g[0]["driver"] if g else None,
        "cuda_runtime": cuda_runtime() if g else None,
        "cudnn": cudnn() if g else None,
        "nccl": nccl() if g else None,
    }
    env.update(torch_versions())
    return env
