"""Where the demo server's models run: CPU, CUDA, or a simulated H200.

`sim:h200` runs the real tiny models on the CPU (so outputs are real) and pads each
forward's wall time up to what the same batch costs on an H200, from the curve measured
in `anchors/h200-batch-cost.json` (numbers copied below so an installed package does not
need the anchor file). It is a laptop's way to show GPU batching economics, and it says
it is simulated wherever it is on: `describe()`, the startup log, `/health` and
`/metrics` all carry `simulated`.

A CPU too slow or too loaded to finish a forward within the H200's time shows its own
costs instead (each such forward counts an overrun). `slowdown` N simulates a device N
times slower than the H200, every simulated cost times N, so that the pace, and with it
the batching economics and the server's capacity, stay the simulated device's.
"""

from __future__ import annotations

import bisect
import logging
import threading
import time
from dataclasses import dataclass, field
from typing import Literal

import torch

log = logging.getLogger(__name__)

Kind = Literal["decode", "encoder"]
SPIN_SECONDS = 0.0005  # the last stretch of a simulated forward is waited out in a yield loop
DEVICE_CHOICES = ("auto", "cpu", "cuda", "sim:h200")

# Measured on one NVIDIA H200 (torch 2.11, CUDA 13), anchors/h200-batch-cost.json.
# Decode: one step of a ~0.95B bf16 decoder replayed as a CUDA graph (`graph_ms`);
# eager PyTorch is launch-bound (3.5 ms at batch 1), so a real server captures graphs.
H200_DECODE_GRAPH_MS: tuple[tuple[int, float], ...] = (
    (1, 0.9354937744140625),
    (8, 1.0397657775878906),
    (32, 1.4529997253417968),
    (64, 1.9633229064941407),
    (128, 2.944376220703125),
    (256, 4.963761291503906),
)
# Encoder: a 6-layer d=384 transformer (MiniLM-sized), seq 128, fp16, per forward.
H200_ENCODER_MS: tuple[tuple[int, float], ...] = (
    (1, 1.6741440296173096),
    (2, 1.9188159704208374),
    (4, 1.8659199476242065),
    (8, 2.0804800987243652),
    (16, 2.1112959384918213),
    (32, 1.962623953819275),
    (64, 2.096735954284668),
    (128, 1.9457279443740845),
    (256, 2.6701760292053223),
    (512, 4.958176136016846),
)


def interpolate_ms(curve: tuple[tuple[int, float], ...], batch_size: float) -> float:
    """Cost in ms at `batch_size`: linear between measured sizes, the first point below the
    smallest, and the last segment's slope beyond the largest (cost keeps growing)."""
    sizes = [b for b, _ in curve]
    if batch_size <= sizes[0]:
        return curve[0][1]
    i = bisect.bisect_left(sizes, batch_size)
    if i == len(sizes):
        i -= 1
    (b0, ms0), (b1, ms1) = curve[i - 1], curve[i]
    return ms0 + (ms1 - ms0) * (batch_size - b0) / (b1 - b0)


SIMULATED_CURVES: dict[str, dict[Kind, tuple[tuple[int, float], ...]]] = {
    "h200": {"decode": H200_DECODE_GRAPH_MS, "encoder": H200_ENCODER_MS},
}

# Parameters of the decoder behind H200_DECODE_GRAPH_MS (the anchor's `decoder_params`).
H200_DECODER_PARAMS = 953_155_584


def h200_prefill_ms_per_token() -> float:
    """What one prefill token of the anchor's decoder costs on an H200, in ms.

    The decode curve's slope is not it: beyond 64 rows each decode row adds about 16 us,
    the time to read its 512-token KV cache, while a prefill token is compute-bound. The
    anchors hold one compute-bound measurement: the encoder at batch 512 x seq 128 (65,536
    tokens of a 6-layer d=384 encoder: 24 d^2 matmul FLOPs per layer and token, plus
    4 x seq x d for attention) in 4.96 ms, about 296 TFLOP/s. At that rate a prefill token
    of the decoder, 2 FLOPs per parameter, costs about 6.4 us. A larger model's matmuls run
    at least as fast, so this errs towards expensive prefill.
    """
    d_model, layers, seq, batch = 384, 6, 128, 512
    flops_per_token = layers * (24 * d_model * d_model + 4 * seq * d_model)
    batch_ms = interpolate_ms(H200_ENCODER_MS, batch)
    flops_per_ms = batch * seq * flops_per_token / batch_ms
    return 2 * H200_DECODER_PARAMS / flops_per_ms


SIMULATED_PREFILL_MS_PER_TOKEN: dict[str, float] = {"h200": h200_prefill_ms_per_token()}


@dataclass
class Device:
    """A place to run forwards. `pace` makes a simulated device cost what the real one would.

    `torch_device` is where tensors live (CPU for a simulated device). `slowdown`: each
    simulated cost is the measured one times this. `overruns` counts, by kind, forwards
    whose real CPU compute already exceeded the simulated cost, so the simulation was
    slower than the device it imitates.
    """

    name: str
    torch_device: torch.device
    simulated: bool = False
    curves: dict[Kind, tuple[tuple[int, float], ...]] = field(default_factory=dict)
    prefill_ms_per_token: float = 0.0
    slowdown: float = 1.0
    overruns: dict[Kind, int] = field(default_factory=lambda: {"decode": 0, "encoder": 0})
    _lock: threading.Lock = field(default_factory=threading.Lock, repr=False)

    def simulated_ms(self, kind: Kind, batch_size: float) -> float:
        """The simulated cost of one forward of `batch_size` rows (tokens for decode)."""
        return interpolate_ms(self.curves[kind], batch_size) * self.slowdown

    def decode_step_ms(self, rows: int, prefill_tokens: int) -> float:
        """The simulated cost of one generation step: `rows` decode rows on the decode curve,
        plus `prefill_tokens` prompt tokens riding along at the compute-bound prefill rate."""
        prefill_ms = prefill_tokens * self.prefill_ms_per_token * self.slowdown
        return self.simulated_ms("decode", rows) + prefill_ms

    def pace(self, kind: Kind, batch_size: float, started_at: float) -> None:
        """On a simulated device, sleep until `started_at` (a `time.perf_counter()` reading)
        plus the simulated cost of a `batch_size` forward; elsewhere return at once."""
        if self.simulated:
            self.pace_ms(kind, self.simulated_ms(kind, batch_size), started_at)

    def pace_decode(self, rows: int, prefill_tokens: int, started_at: float) -> None:
        """`pace` for a generation step (see `decode_step_ms`)."""
        if self.simulated:
            self.pace_ms("decode", self.decode_step_ms(rows, prefill_tokens), started_at)

    def pace_ms(self, kind: Kind, cost_ms: float, started_at: float) -> None:
        """Wait until `started_at` plus `cost_ms`. Counts an overrun when the real compute
        already took longer than the simulated cost.

        time.sleep wakes up to a few hundred microseconds late, a fifth of a simulated
        step, so it sleeps to SPIN_SECONDS before the deadline and yields in a loop from there."""
        deadline = started_at + cost_ms / 1000
        remaining = deadline - time.perf_counter()
        if remaining <= 0:
            with self._lock:
                self.overruns[kind] += 1
            return
        if remaining > SPIN_SECONDS:
            time.sleep(remaining - SPIN_SECONDS)
        while time.perf_counter() < deadline:
            time.sleep(0)  # gives up the GIL, so the server's other threads run meanwhile

    def describe(self) -> dict[str, object]:
        """Plain-data description for /health and logs."""
        return {
            "device": self.name,
            "simulated": self.simulated,
            **({"simulated_slowdown": self.slowdown} if self.simulated else {}),
            "torch_device": str(self.torch_device),
            "simulated_overruns": dict(self.overruns),
        }


def select_device(spec: str, slowdown: float = 1.0) -> Device:
    """The device named by `--device`: auto (CUDA when available, else CPU), cpu, cuda, or
    sim:h200, a simulated device `slowdown` times slower than the one measured. Raises
    ValueError for an unknown name, for cuda without a GPU, and for a slowdown below 1 or
    on a device that is not simulated."""
    if not slowdown >= 1:
        raise ValueError(f"--sim-slowdown must be at least 1, got {slowdown:g}")
    if slowdown != 1 and not spec.startswith("sim:"):
        raise ValueError(f"--sim-slowdown slows a simulated device; --device is {spec}")
    if spec == "auto":
        spec = "cuda" if torch.cuda.is_available() else "cpu"
    if spec == "cpu":
        device = Device("cpu", torch.device("cpu"))
    elif spec == "cuda":
        if not torch.cuda.is_available():
            raise ValueError(
                "--device cuda: torch sees no CUDA device (this torch build is CPU-only?)"
            )
        device = Device("cuda", torch.device("cuda"))
    elif spec.startswith("sim:") and spec[4:] in SIMULATED_CURVES:
        device = Device(
            spec,
            torch.device("cpu"),
            simulated=True,
            curves=SIMULATED_CURVES[spec[4:]],
            prefill_ms_per_token=SIMULATED_PREFILL_MS_PER_TOKEN[spec[4:]],
            slowdown=slowdown,
        )
    else:
        raise ValueError(f"--device must be one of {', '.join(DEVICE_CHOICES)}, got {spec!r}")
    if device.simulated:
        log.warning(
            "device %s is SIMULATED: models run on the CPU, each forward is padded to %s the "
            "measured H200 cost for its batch size (prefill tokens at the H200's compute rate)",
            device.name,
            "the" if device.slowdown == 1 else f"{device.slowdown:g} times",
        )
    else:
        log.info("device %s", device.name)
    return device
