"""The demo server's decode step on a CUDA GPU: cost by batch size, eager and as CUDA graphs.

For each model shape (`--shapes`: `demo`, the demo server's own TinyDecoder; `anchor`, a
decoder of the anchor's shape, d_model 2048, 16 heads, 16 layers, 512 positions, about
0.8B parameters, float32 as the demo server runs it) and each batch size, one decode step
as the scheduler runs it on a GPU: `TinyDecoder.decode` eagerly, and replayed through
`CudaGraphDecode` (the scheduler's path on CUDA). Each timed with CUDA events over
`--reps` steps after a warm-up; medians. Each batch's graph logits are held to the eager
step's (the same rows, positions and cache): a graph that reads the wrong buffers or
pads wrongly differs. The memory floor of a step: the weights and the KV cache it reads
(attention padded to the whole cache, as the graph runs it) over the copy bandwidth
measured first.

The anchor (`--anchor`, a JSON of forward cost by batch size measured on an H200 with
a bf16 decoder of that shape) is compared by shape: each step's cost against its
batch-1 cost, ours and the anchor's, since our float32 step moves twice the bytes.

    python3 scripts/gpu_step_cost.py --out DIR [--anchor anchors/h200-batch-cost.json]

Needs a CUDA GPU; on a machine without one it says so and exits 2.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import statistics
import sys
import time
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from batchscope.demo_server.generation.decoder import (  # noqa: E402
    VOCAB_SIZE,
    CudaGraphDecode,
    KVCache,
    ModelConfig,
    TinyDecoder,
)

SHAPES = {
    "demo": ModelConfig(),
    "anchor": ModelConfig(d_model=2048, n_heads=16, n_layers=16, max_model_len=512),
}
SIZES = {"demo": CudaGraphDecode.SIZES, "anchor": (1, 8, 32, 64, 128, 256)}


def copy_bandwidth(device: torch.device) -> float:
    """Bytes a second a device-to-device copy of 2 GiB moves (read + written)."""
    source = torch.empty(2**29, dtype=torch.float32, device=device)
    target = torch.empty_like(source)
    for _ in range(3):
        target.copy_(source)
    torch.cuda.synchronize()
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    for _ in range(10):
        target.copy_(source)
    end.record()
    torch.cuda.synchronize()
    seconds = start.elapsed_time(end) / 1e3 / 10
    return 2 * source.numel() * 4 / seconds


def timed_ms(step, reps: int) -> float:
    """Median milliseconds of `step()` over `reps` runs, by CUDA events."""
    for _ in range(3):
        step()
    torch.cuda.synchronize()
    times = []
    for _ in range(reps):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        step()
        end.record()
        end.synchronize()
        times.append(start.elapsed_time(end))
    return statistics.median(times)


@torch.no_grad()
def measure(shape: str, reps: int, bandwidth: float, device: torch.device) -> dict:
    config = SHAPES[shape]
    sizes = SIZES[shape]
    started = time.monotonic()
    model = TinyDecoder(config).to(device).eval()
    params = sum(p.numel() for p in model.parameters())
    # A slot for every row of the largest graph, as `Scheduler._physical_slots` gives it.
    cache = KVCache(config, max(sizes), device)
    graphed = CudaGraphDecode(model, cache)
    span = config.max_model_len
    generator = torch.Generator(device="cpu").manual_seed(0)
    rows = []
    for size in sizes:
        tokens = torch.randint(0, VOCAB_SIZE, (size,), generator=generator).to(device)
        # Rows at different positions, none at the scratch position the padding feeds.
        positions = torch.randint(0, span - 1, (size,), generator=generator).to(device)
        eager_logits = model.decode(tokens, positions, span, cache).clone()
        graph_logits = graphed(tokens, positions).clone()
        difference = (graph_logits - eager_logits).abs().max().item()
        eager_ms = timed_ms(lambda t=tokens, p=positions: model.decode(t, p, span, cache), reps)
        graph_ms = timed_ms(lambda t=tokens, p=positions: graphed(t, p), reps)
        kv_bytes = 2 * config.n_layers * size * span * config.d_model * 4
        floor_ms = (params * 4 + kv_bytes) / bandwidth * 1e3
        rows.append(
            {
                "batch": size,
                "eager_ms": eager_ms,
                "graph_ms": graph_ms,
                "floor_ms": floor_ms,
                "max_abs_logit_difference": difference,
            }
        )
        print(
            f"{shape} B={size}: eager {eager_ms:.3f} ms, graph {graph_ms:.3f} ms, "
            f"floor {floor_ms:.3f} ms, |graph - eager| {difference:.2e}",
            flush=True,
        )
    return {
        "shape": shape,
        "config": dataclasses.asdict(config),
        "parameters": params,
        "rows": rows,
        "seconds": time.monotonic() - started,
    }


def against_anchor(result: dict, anchor: dict) -> list[dict]:
    """Each batch's cost over its batch-1 cost, ours (graph) and the anchor's (graph)."""
    theirs = {r["batch"]: r["graph_ms"] for r in anchor["decode_cuda_graph"]["rows"]}
    ours = {r["batch"]: r["graph_ms"] for r in result["rows"]}
    return [
        {
            "batch": b,
            "ours_vs_b1": ours[b] / ours[1],
            "anchor_vs_b1": theirs[b] / theirs[1],
            "ours_ms": ours[b],
            "anchor_ms": theirs[b],
        }
        for b in sorted(ours)
        if b in theirs and 1 in theirs
    ]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", type=Path, required=True, help="folder for results.json")
    parser.add_argument("--anchor", type=Path, help="an anchor JSON to compare with")
    parser.add_argument("--shapes", nargs="+", default=list(SHAPES), choices=list(SHAPES))
    parser.add_argument("--reps", type=int, default=50)
    args = parser.parse_args(argv)
    if not torch.cuda.is_available():
        print("gpu_step_cost: torch sees no CUDA device", file=sys.stderr)
        return 2
    device = torch.device("cuda")
    args.out.mkdir(parents=True, exist_ok=True)
    bandwidth = copy_bandwidth(device)
    report = {
        "gpu": torch.cuda.get_device_name(0),
        "torch": torch.__version__,
        "copy_bytes_per_second": bandwidth,
        "shapes": [],
    }
    print(f"{report['gpu']}, torch {report['torch']}, copy {bandwidth / 1e12:.2f} TB/s")
    anchor = json.loads(args.anchor.read_text()) if args.anchor else None
    for shape in args.shapes:
        try:
            result = measure(shape, args.reps, bandwidth, device)
        except Exception as error:  # one shape failing still reports the others
            result = {"shape": shape, "error": f"{type(error).__name__}: {error}"}
            print(f"{shape}: {result['error']}", flush=True)
        torch.cuda.empty_cache()  # the shape's model and cache are gone with `measure`
        if anchor is not None and shape == "anchor" and "rows" in result:
            result["against_anchor"] = against_anchor(result, anchor)
            for row in result["against_anchor"]:
                print(
                    f"anchor shape B={row['batch']}: ours {row['ours_vs_b1']:.2f}x B=1, "
                    f"anchor {row['anchor_vs_b1']:.2f}x B=1",
                    flush=True,
                )
        report["shapes"].append(result)
        (args.out / "gpu_step_cost.json").write_text(json.dumps(report, indent=1))
    failed = [s for s in report["shapes"] if "error" in s]
    worst = max(
        (r["max_abs_logit_difference"] for s in report["shapes"] for r in s.get("rows", [])),
        default=0.0,
    )
    print(f"largest |graph - eager| logit difference: {worst:.2e}")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
