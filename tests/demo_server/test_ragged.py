"""The ragged decode attention kernel: same numbers as padded torch attention, safe on bad
rows, built once per source, and a clear fallback when it cannot be built."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F

from batchscope.demo_server.devices import select_device
from batchscope.demo_server.generation import ragged
from batchscope.demo_server.generation.decoder import TinyDecoder
from batchscope.demo_server.generation.scheduler import Scheduler, SchedulerConfig
from tests.support.paths import REPO

ROOT = REPO


@pytest.fixture(scope="module")
def kernel() -> ragged.RaggedAttention:
    attend, why = ragged.try_load()
    assert attend is not None, why  # gcc is on every machine of this kind, CI included
    return attend


def padded_reference(
    q: torch.Tensor,
    keys: torch.Tensor,
    values: torch.Tensor,
    slots: torch.Tensor,
    lengths: torch.Tensor,
) -> torch.Tensor:
    """scaled_dot_product_attention over each row's slot, masked beyond its length."""
    span = int(lengths.max())
    mask = (torch.arange(span)[None, :] < lengths[:, None])[:, None, None, :]
    out = F.scaled_dot_product_attention(
        q.unsqueeze(2), keys[slots, :, :span], values[slots, :, :span], attn_mask=mask
    )
    return out.reshape(q.shape[0], -1)


@pytest.mark.parametrize("head_dim", [16, 8, 32])
def test_kernel_matches_padded_attention_row_by_row(
    kernel: ragged.RaggedAttention, head_dim: int
) -> None:
    generator = torch.Generator().manual_seed(head_dim)
    slots_in_cache, heads, max_len, rows = 6, 4, 300, 11
    keys = torch.randn(slots_in_cache, heads, max_len, head_dim, generator=generator)
    values = torch.randn(slots_in_cache, heads, max_len, head_dim, generator=generator)
    fused = torch.randn(rows, 3, heads, head_dim, generator=generator)  # a qkv projection
    q = fused[:, 0]  # strided, as the model passes it
    slots = torch.randint(0, slots_in_cache, (rows,), generator=generator)
    lengths = torch.randint(1, max_len + 1, (rows,), generator=generator)
    lengths[0], lengths[1] = 1, max_len
    got = kernel(q, keys, values, slots, lengths)
    expected = padded_reference(q, keys, values, slots, lengths)
    assert got.shape == (rows, heads * head_dim)
    assert (got - expected).abs().max().item() < 2e-5


def test_rows_with_bad_slots_or_lengths_get_zeros_and_the_rest_is_right(
    kernel: ragged.RaggedAttention,
) -> None:
    generator = torch.Generator().manual_seed(0)
    keys = torch.randn(2, 4, 64, 16, generator=generator)
    values = torch.randn(2, 4, 64, 16, generator=generator)
    q = torch.randn(4, 4, 16, generator=generator)
    slots = torch.tensor([0, 7, -1, 1])
    lengths = torch.tensor([10, 10, 10, 0])
    got = kernel(q, keys, values, slots, lengths)
    assert torch.equal(got[1:], torch.zeros(3, 64))
    expected = padded_reference(q[:1], keys, values, slots[:1], lengths[:1])
    assert torch.allclose(got[:1], expected, atol=2e-5)
    # A length past the cache is clipped to it, never read beyond.
    long = kernel(q[:1], keys, values, torch.tensor([0]), torch.tensor([10_000]))
    assert torch.allclose(
        long, padded_reference(q[:1], keys, values, slots[:1], torch.tensor([64])), atol=2e-5
    )


def test_kernel_refuses_mismatched_shapes_and_dtypes(kernel: ragged.RaggedAttention) -> None:
    keys = torch.zeros(2, 4, 8, 16)
    with pytest.raises(ValueError, match="does not match the cache"):
        kernel(torch.zeros(1, 2, 16), keys, keys, torch.tensor([0]), torch.tensor([1]))
    with pytest.raises(ValueError, match="float32"):
        kernel(
            torch.zeros(1, 4, 16, dtype=torch.float64),
            keys,
            keys,
            torch.tensor([0]),
            torch.tensor([1]),
        )
    with pytest.raises(ValueError, match="2 rows need 2 slots"):
        kernel(torch.zeros(2, 4, 16), keys, keys, torch.tensor([0]), torch.tensor([1, 1]))


@pytest.mark.integration
def test_build_is_cached_per_source_and_rebuilt_when_it_changes(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    first = ragged.build(tmp_path)
    assert first.parent == tmp_path and first.stat().st_size > 0
    built_at = first.stat().st_mtime_ns
    assert ragged.build(tmp_path) == first and first.stat().st_mtime_ns == built_at
    changed = tmp_path / "changed.c"
    changed.write_text(ragged.SOURCE.read_text() + "\n/* a change */\n")
    monkeypatch.setattr(ragged, "SOURCE", changed)
    second = ragged.build(tmp_path)
    assert second != first and second.exists()
    assert not list(tmp_path.glob("*.partial"))  # nothing half-written left behind


@pytest.mark.integration
def test_loading_the_kernel_leaves_subnormal_floats_alone(tmp_path: Path) -> None:
    """A library built with -ffast-math sets flush-to-zero for the whole process when it
    loads: the smallest float / 2 became 0 in the server and in every test after it. A
    fresh process, since that mode, once set, stays."""
    probe = (
        "import sys; from pathlib import Path; from batchscope.demo_server.generation import ragged; "
        "tiny = sys.float_info.min; before = tiny / 2; "
        f"ragged._load(ragged.build(Path({str(tmp_path)!r}))); "
        "print(before > 0, tiny / 2 > 0, tiny / 2 == before)"
    )
    done = subprocess.run(
        [sys.executable, "-c", probe],
        capture_output=True,
        text=True,
        cwd=ROOT,
        timeout=300,
        check=True,
    )
    assert done.stdout.split() == ["True", "True", "True"], done.stdout + done.stderr


@pytest.mark.integration
def test_build_without_a_compiler_says_why(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("CC", "no-such-compiler-xyz")
    with pytest.raises(ragged.KernelUnavailable, match="no-such-compiler-xyz"):
        ragged.build(tmp_path)
    broken = tmp_path / "broken.c"
    broken.write_text("this is not C\n")
    monkeypatch.setenv("CC", "cc")
    monkeypatch.setattr(ragged, "SOURCE", broken)
    with pytest.raises(
        ragged.KernelUnavailable, match="building the ragged attention kernel failed"
    ):
        ragged.build(tmp_path / "cache")
    assert not list((tmp_path / "cache").glob("*"))


@pytest.mark.integration
def test_scheduler_falls_back_to_padded_attention_and_ragged_on_demand_refuses(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(
        "batchscope.demo_server.generation.scheduler.try_load",
        lambda: (None, "no C compiler: 'cc'"),
    )
    device = select_device("cpu")
    scheduler = Scheduler(TinyDecoder(), device, SchedulerConfig(attention="auto"))
    assert scheduler.attention == "padded" and scheduler.model.ragged is None
    with pytest.raises(ValueError, match="--attention ragged: no C compiler"):
        Scheduler(TinyDecoder(), device, SchedulerConfig(attention="ragged"))
    with pytest.raises(ValueError, match="attention must be one of"):
        SchedulerConfig(attention="paged")  # type: ignore[arg-type]


@pytest.mark.integration
def test_scheduler_runs_ragged_by_default_and_padded_when_asked(
    kernel: ragged.RaggedAttention,
) -> None:
    device = select_device("cpu")
    assert Scheduler(TinyDecoder(), device, SchedulerConfig()).attention == "ragged"
    padded = Scheduler(TinyDecoder(), device, SchedulerConfig(attention="padded"))
    assert padded.attention == "padded" and padded.model.ragged is None
