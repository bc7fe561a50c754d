"""Decode attention over each row's own length, from a small C kernel built on first use.

A padded decode step attends every row as far back as the batch's longest row; a paged
attention kernel, as vLLM's, reads each row's own keys and values only. On a CPU that
difference is most of a decode step of the demo model, and in plain torch a ragged batch
costs about what the padding saves (gathering rows, or one call per run of rows), so the
kernel is C, `csrc/ragged_attention.c`, loaded with ctypes.

It is compiled with the machine's C compiler (`$CC`, else `cc`) the first time it is
needed, into a cache directory (`$BATCHSCOPE_CACHE_DIR`, else `$XDG_CACHE_HOME/batchscope`,
else `~/.cache/batchscope`), under a name that hashes the source, the flags, the compiler
and the CPU, so a changed kernel or another machine builds afresh. Without a compiler,
`try_load()` returns None and why, once per process; the demo server then runs padded
attention.
"""

from __future__ import annotations

import ctypes
import hashlib
import os
import platform
import shutil
import subprocess
import tempfile
import threading
from dataclasses import dataclass
from pathlib import Path

import torch

SOURCE = Path(__file__).with_name("csrc") / "ragged_attention.c"
# -march=native: the kernel is built on the machine that runs it (the cache key holds the
# CPU); the plain set is the fallback for a compiler that does not know the CPU.
# The float flags are -ffast-math's that let the reductions vectorise, named one by one:
# -ffast-math itself (or -funsafe-math-optimizations) links crtfastmath.o, which sets the
# CPU's flush-to-zero mode for the whole process when the library loads, so that every
# subnormal float in the server (and in any test run beside it) would become 0.
FAST_FLOAT = (
    "-fno-math-errno",
    "-fno-trapping-math",
    "-fassociative-math",
    "-fno-signed-zeros",
    "-freciprocal-math",
)
FLAG_SETS: tuple[tuple[str, ...], ...] = (
    ("-O3", *FAST_FLOAT, "-march=native", "-fPIC", "-shared"),
    ("-O3", *FAST_FLOAT, "-fPIC", "-shared"),
)
BUILD_TIMEOUT_SECONDS = 120
MAX_HEAD_DIM = 256  # the kernel's accumulator size

_P = ctypes.c_void_p
_I = ctypes.c_int64


class KernelUnavailable(RuntimeError):
    """The C kernel could not be built or loaded; the message says why."""


def cache_dir() -> Path:
    """Where built kernels live."""
    if explicit := os.environ.get("BATCHSCOPE_CACHE_DIR"):
        return Path(explicit)
    base = os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache"
    return Path(base) / "batchscope"


def _cpu_identity() -> str:
    """Model name and flags of the first CPU (what -march=native compiles for)."""
    try:
        text = Path("/proc/cpuinfo").read_text(encoding="utf-8", errors="replace")
    except OSError:
        return platform.processor()
    fields = {}
    for line in text.splitlines():
        if not line.strip():
            break
        key, _, value = line.partition(":")
        fields[key.strip()] = value.strip()
    return f"{fields.get('model name', '')}|{fields.get('flags', '')}"


def _compiler_version(compiler: str) -> str:
    try:
        done = subprocess.run(
            [compiler, "--version"], capture_output=True, text=True, timeout=30, check=False
        )
    except (OSError, subprocess.TimeoutExpired):
        return ""
    return done.stdout


def build(directory: Path | None = None) -> Path:
    """The path of the built kernel, compiling it when no build for this source, compiler
    and CPU exists yet. Raises KernelUnavailable with the compiler's complaint."""
    compiler = os.environ.get("CC") or "cc"
    if shutil.which(compiler) is None:
        raise KernelUnavailable(f"no C compiler: {compiler!r} is not on PATH (set $CC)")
    directory = directory or cache_dir()
    source = SOURCE.read_bytes()
    machine = f"{_compiler_version(compiler)}\0{_cpu_identity()}".encode()

    def target(flags: tuple[str, ...]) -> Path:
        key = hashlib.sha256(b"\0".join([source, " ".join(flags).encode(), machine]))
        return directory / f"ragged_attention-{key.hexdigest()[:16]}.so"

    targets = [target(flags) for flags in FLAG_SETS]
    # A build of any flag set will do: a compiler that refused -march=native once is not
    # asked again in every process.
    for built in targets:
        if built.exists():
            return built
    try:
        directory.mkdir(parents=True, exist_ok=True)
    except OSError as error:
        raise KernelUnavailable(f"cannot create {directory}: {error}") from error
    failures: list[str] = []
    for flags, path in zip(FLAG_SETS, targets, strict=True):
        fd, partial = tempfile.mkstemp(dir=directory, suffix=".so.partial")
        os.close(fd)
        try:
            done = subprocess.run(
                [compiler, *flags, "-o", partial, str(SOURCE), "-lm"],
                capture_output=True,
                text=True,
                timeout=BUILD_TIMEOUT_SECONDS,
                check=False,
            )
            if done.returncode == 0:
                os.replace(partial, path)  # atomic: a concurrent build loses nothing
                return path
            failures.append(f"{compiler} {' '.join(flags)}: {done.stderr.strip()[-500:]}")
        except (OSError, subprocess.TimeoutExpired) as error:
            failures.append(f"{compiler} {' '.join(flags)}: {error}")
        finally:
            Path(partial).unlink(missing_ok=True)
    raise KernelUnavailable("building the ragged attention kernel failed: " + "; ".join(failures))


@dataclass(frozen=True)
class RaggedAttention:
    """The loaded kernel; call it like `attend(q, keys, values, slots, lengths)`."""

    path: Path
    _function: ctypes._CFuncPtr

    def __call__(
        self,
        q: torch.Tensor,
        keys: torch.Tensor,
        values: torch.Tensor,
        slots: torch.Tensor,
        lengths: torch.Tensor,
    ) -> torch.Tensor:
        """Attention of query row r over the first `lengths[r]` positions of cache slot
        `slots[r]`.

        q: [rows, heads, head_dim] float32 on the CPU, last dimension contiguous (a view of
        a fused qkv projection is fine). keys, values: the cache, [slots, heads, max_len,
        head_dim] contiguous float32. slots, lengths: [rows] int64. Returns
        [rows, heads * head_dim], softmax scaled by 1/sqrt(head_dim) as
        scaled_dot_product_attention does. A row with an out-of-range slot or a length
        below 1 gets zeros (the kernel never reads outside the cache).
        """
        rows, heads, head_dim = q.shape
        cache_slots, cache_heads, max_len, cache_dim = keys.shape
        if (cache_heads, cache_dim) != (heads, head_dim) or keys.shape != values.shape:
            raise ValueError(f"q {tuple(q.shape)} does not match the cache {tuple(keys.shape)}")
        if slots.shape != (rows,) or lengths.shape != (rows,):
            raise ValueError(f"{rows} rows need {rows} slots and {rows} lengths")
        for name, tensor in (("q", q), ("keys", keys), ("values", values)):
            if tensor.dtype != torch.float32 or tensor.device.type != "cpu":
                raise ValueError(f"{name} must be float32 on the CPU, got {tensor.dtype}")
        if head_dim > MAX_HEAD_DIM:
            raise ValueError(f"head_dim {head_dim} is above the kernel's {MAX_HEAD_DIM}")
        if q.stride(2) != 1 or not keys.is_contiguous() or not values.is_contiguous():
            raise ValueError("q's last dimension and the whole cache must be contiguous")
        slots = slots.to(torch.int64).contiguous()
        lengths = lengths.to(torch.int64).contiguous()
        out = torch.empty(rows, heads, head_dim)
        scratch = torch.empty(max_len)
        self._function(
            q.data_ptr(),
            q.stride(0),
            q.stride(1),
            keys.data_ptr(),
            values.data_ptr(),
            cache_slots,
            slots.data_ptr(),
            lengths.data_ptr(),
            out.data_ptr(),
            scratch.data_ptr(),
            rows,
            heads,
            max_len,
            head_dim,
            head_dim**-0.5,
        )
        return out.view(rows, heads * head_dim)


def _load(path: Path) -> RaggedAttention:
    try:
        library = ctypes.CDLL(str(path))
    except OSError as error:
        raise KernelUnavailable(f"cannot load {path}: {error}") from error
    function = library.ragged_decode_attention
    function.argtypes = [_P, _I, _I, _P, _P, _I, _P, _P, _P, _P, _I, _I, _I, _I, ctypes.c_float]
    function.restype = None
    return RaggedAttention(path, function)


_outcome: tuple[RaggedAttention | None, str] | None = None
_outcome_lock = threading.Lock()


def try_load() -> tuple[RaggedAttention | None, str]:
    """The kernel and "", or None and why it is unavailable. Built at most once per
    process: the outcome, a failure included, is kept."""
    global _outcome
    with _outcome_lock:
        if _outcome is None:
            try:
                _outcome = (_load(build()), "")
            except KernelUnavailable as error:
                _outcome = (None, str(error))
        return _outcome


if (
    __name__ == "__main__"
):  # `python -m batchscope.demo_server.generation.ragged`: build ahead of the first use
    kernel, why = try_load()
    print(kernel.path if kernel else f"unavailable: {why}")
    raise SystemExit(0 if kernel else 1)
