"""batchscope-static-util: input formats, bad lines, output, bounded memory."""

from __future__ import annotations

import gzip
import io
import json
import subprocess
import sys
import time
from pathlib import Path

import pytest

from batchscope.exporter.static_util_cli import main
from tests.support.paths import REPO

SEED_EXAMPLE = [3, 5, 8, 11, 4, 14, 6, 16]
SEED_UTILIZATION = 0.5234375


def run_json(capsys, *argv: str) -> dict | list:
    return run_json_with_stderr(capsys, *argv)[0]


def run_json_with_stderr(capsys, *argv: str) -> tuple[dict | list, str]:
    assert main([*argv, "--json"]) == 0
    captured = capsys.readouterr()
    return json.loads(captured.out), captured.err


def write(tmp_path: Path, name: str, text: str) -> str:
    path = tmp_path / name
    path.write_text(text)
    return str(path)


def vllm_bench_result(output_lens: list[int], errors: list[str]) -> dict:
    """A `vllm bench serve --save-result --save-detailed` result, trimmed to its shape."""
    completed = sum(1 for e in errors if not e)
    return {
        "date": "20250101-120000",
        "backend": "vllm",
        "model_id": "/tmp/tinyllama",
        "tokenizer_id": "/tmp/tinyllama",
        "num_prompts": len(output_lens),
        "request_rate": "inf",
        "burstiness": 1.0,
        "max_concurrency": None,
        "duration": 12.5,
        "completed": completed,
        "total_input_tokens": 50 * completed,
        "total_output_tokens": sum(output_lens),
        "request_throughput": completed / 12.5,
        "output_throughput": sum(output_lens) / 12.5,
        "mean_ttft_ms": 41.0,
        "input_lens": [50] * len(output_lens),
        "output_lens": output_lens,
        "ttfts": [0.04] * len(output_lens),
        "itls": [[0.01] * max(n - 1, 0) for n in output_lens],
        "generated_texts": ["x" * n for n in output_lens],
        "errors": errors,
    }


# --- formats ---


def test_plain_numbers_give_the_seed_example(tmp_path, capsys):
    path = write(tmp_path, "lengths.txt", "\n".join(map(str, SEED_EXAMPLE)) + "\n")
    out = run_json(capsys, path, "--batch-size", "8")
    assert out["requests"] == 8
    assert out["static_utilization"] == SEED_UTILIZATION
    assert out["continuous_batching_gain"] == 128 / 67
    assert out["idle_slot_steps"] == 61
    assert out["bad_lines"] == 0
    assert out["files"] == [{"name": path, "format": "plain numbers", "field": None}]


def test_several_batch_sizes_give_a_list(tmp_path, capsys):
    path = write(tmp_path, "lengths.txt", "\n".join(map(str, SEED_EXAMPLE)))
    out = run_json(capsys, path, "-b", "8", "-b", "3", "-b", "8")
    assert [row["batch_size"] for row in out] == [8, 3]
    # B=3: groups [3,5,8] [11,4,14] [6,16] run 8, 14 and 16 steps on 3 slots.
    assert out[1]["total_slot_steps"] == 3 * (8 + 14 + 16)
    assert out[1]["partial_group_requests"] == 2


def test_csv_named_column_is_found(tmp_path, capsys):
    rows = "".join(f"{i},req-{i},{n}\n" for i, n in enumerate(SEED_EXAMPLE))
    path = write(tmp_path, "log.csv", "id,request,completion_tokens\n" + rows)
    out = run_json(capsys, path, "-b", "8")
    assert out["static_utilization"] == SEED_UTILIZATION
    assert out["files"][0]["field"] == "completion_tokens"


def test_csv_other_column_is_chosen_with_field(tmp_path, capsys):
    rows = "".join(f"{n}\t999\n" for n in SEED_EXAMPLE)
    path = write(tmp_path, "log.tsv", "gen_tokens\toutput_tokens\n" + rows)
    out = run_json(capsys, path, "-b", "8", "--field", "gen_tokens")
    assert out["static_utilization"] == SEED_UTILIZATION
    assert out["files"][0] == {"name": path, "format": "TSV", "field": "gen_tokens"}


def test_csv_without_a_length_column_is_an_error(tmp_path, capsys):
    path = write(tmp_path, "log.csv", "id,latency_ms\n1,20\n")
    assert main([path, "-b", "8"]) == 2
    err = capsys.readouterr().err
    assert "no output-length column" in err
    assert "id, latency_ms" in err
    assert "--field" in err


def test_json_lines_with_known_and_nested_fields(tmp_path, capsys):
    first = "".join(json.dumps({"id": i, "output_len": n}) + "\n" for i, n in enumerate([3, 5]))
    nested = "".join(
        json.dumps({"id": i, "usage": {"prompt_tokens": 9, "completion_tokens": n}}) + "\n"
        for i, n in enumerate(SEED_EXAMPLE[2:])
    )
    a = write(tmp_path, "a.jsonl", first)
    b = write(tmp_path, "b.jsonl", nested)
    # Files are one log in the order given: the group of 8 spans both.
    out = run_json(capsys, a, b, "-b", "8")
    assert out["groups"] == 1
    assert out["static_utilization"] == SEED_UTILIZATION
    assert [f["field"] for f in out["files"]] == ["output_len", "usage.completion_tokens"]


def test_json_lines_custom_field(tmp_path, capsys):
    lines = "".join(json.dumps({"tokens_out": n, "output_tokens": 1}) + "\n" for n in SEED_EXAMPLE)
    path = write(tmp_path, "log.jsonl", lines)
    out = run_json(capsys, path, "-b", "8", "--field", "tokens_out")
    assert out["static_utilization"] == SEED_UTILIZATION


def test_vllm_bench_result_skips_failed_requests(tmp_path, capsys):
    lens = [*SEED_EXAMPLE[:4], 0, *SEED_EXAMPLE[4:]]
    errors = ["", "", "", "", "Bad Request", "", "", "", ""]
    path = write(tmp_path, "vllm-bench.json", json.dumps(vllm_bench_result(lens, errors)))
    out, err = run_json_with_stderr(capsys, path, "-b", "8")
    assert out["requests"] == 8
    assert out["failed_requests"] == 1
    assert out["static_utilization"] == SEED_UTILIZATION
    assert out["files"][0] == {"name": path, "format": "vLLM bench result", "field": "output_lens"}
    assert "skipped 1 failed request" in err


def test_vllm_bench_appended_results_are_read_one_per_line(tmp_path, capsys):
    # --append-result writes one JSON object per line.
    text = "\n".join(
        json.dumps(vllm_bench_result(half, [""] * 4))
        for half in (SEED_EXAMPLE[:4], SEED_EXAMPLE[4:])
    )
    out = run_json(capsys, write(tmp_path, "bench.json", text), "-b", "8")
    assert out["requests"] == 8
    assert out["static_utilization"] == SEED_UTILIZATION


def test_vllm_bench_result_without_detail_says_how_to_rerun(tmp_path, capsys):
    result = vllm_bench_result(SEED_EXAMPLE, [""] * 8)
    for key in ("input_lens", "output_lens", "ttfts", "itls", "generated_texts", "errors"):
        del result[key]
    assert main([write(tmp_path, "bench.json", json.dumps(result)), "-b", "8"]) == 2
    assert "--save-detailed" in capsys.readouterr().err


def test_pretty_printed_json_documents(tmp_path, capsys):
    records = json.dumps([{"output_tokens": n} for n in SEED_EXAMPLE], indent=1)
    out = run_json(capsys, write(tmp_path, "records.json", records), "-b", "8")
    assert out["static_utilization"] == SEED_UTILIZATION
    assert out["files"][0]["format"] == "JSON document"
    bench = json.dumps(vllm_bench_result(SEED_EXAMPLE, [""] * 8), indent=4)
    out = run_json(capsys, write(tmp_path, "bench.json", bench), "-b", "8")
    assert out["static_utilization"] == SEED_UTILIZATION
    assert out["files"][0]["format"] == "vLLM bench result"


def test_stdin_and_gzip(tmp_path, capsys, monkeypatch):
    text = "\n".join(map(str, SEED_EXAMPLE))
    monkeypatch.setattr(sys, "stdin", io.StringIO(text))
    assert run_json(capsys, "-", "-b", "8")["static_utilization"] == SEED_UTILIZATION
    path = tmp_path / "lengths.txt.gz"
    path.write_bytes(gzip.compress(text.encode()))
    assert run_json(capsys, str(path), "-b", "8")["static_utilization"] == SEED_UTILIZATION


# --- bad input ---


def test_bad_plain_lines_are_counted_with_their_numbers(tmp_path, capsys):
    text = "# output tokens\n3\n5\nabc\n8\n-2\n11\n\n4\n2.5\n14\n6\n16.0\n"
    path = write(tmp_path, "lengths.txt", text)
    out, err = run_json_with_stderr(capsys, path, "-b", "8")
    assert out["requests"] == 8
    assert out["bad_lines"] == 3
    assert out["static_utilization"] == SEED_UTILIZATION
    assert f"{path}: skipped 3 bad line(s)" in err
    assert "line 4: 'abc' is not a number" in err
    assert "line 6: -2 is negative" in err
    assert "line 10: 2.5 is not a whole number" in err


def test_bad_first_line_does_not_hide_a_plain_file(tmp_path, capsys):
    path = write(tmp_path, "lengths.txt", "tokens\n" + "\n".join(map(str, SEED_EXAMPLE)))
    out, err = run_json_with_stderr(capsys, path, "-b", "8")
    assert (out["bad_lines"], out["static_utilization"]) == (1, SEED_UTILIZATION)
    assert "line 1: 'tokens' is not a number" in err


def test_bad_json_lines_are_counted_with_their_numbers(tmp_path, capsys):
    lines = [json.dumps({"output_tokens": n}) for n in SEED_EXAMPLE]
    lines[2:2] = ['{"output_tokens": ', '{"prompt_tokens": 4}', '{"output_tokens": null}']
    path = write(tmp_path, "log.jsonl", "\n".join(lines))
    out, err = run_json_with_stderr(capsys, path, "-b", "8")
    assert (out["requests"], out["bad_lines"]) == (8, 3)
    assert "line 3: not valid JSON" in err
    assert "line 4: no field 'output_tokens'" in err
    assert "line 5: None is not a number" in err


def test_short_csv_row_is_a_bad_line(tmp_path, capsys):
    rows = "".join(f"r{i},{n}\n" for i, n in enumerate(SEED_EXAMPLE))
    path = write(tmp_path, "log.csv", "id,output_tokens\n" + rows + "r9\n")
    out, err = run_json_with_stderr(capsys, path, "-b", "8")
    assert (out["requests"], out["bad_lines"]) == (8, 1)
    assert "line 10: no 'output_tokens' column in this row" in err


def test_only_the_first_five_bad_lines_are_shown(tmp_path, capsys):
    path = write(tmp_path, "lengths.txt", "x\n" * 20 + "7\n")
    out, err = run_json_with_stderr(capsys, path, "-b", "8")
    assert out["bad_lines"] == 20
    assert "line 5:" in err and "line 6:" not in err


def test_empty_file_is_an_error(tmp_path, capsys):
    assert main([write(tmp_path, "empty.txt", ""), "-b", "8"]) == 2
    assert "no valid output length" in capsys.readouterr().err


def test_file_of_only_bad_lines_is_an_error_that_shows_them(tmp_path, capsys):
    assert main([write(tmp_path, "junk.txt", "1.5\nfoo\n"), "-b", "8"]) == 2
    err = capsys.readouterr().err
    assert "skipped 2 bad line(s)" in err
    assert "no valid output length" in err


def test_all_zero_lengths_are_an_error(tmp_path, capsys):
    assert main([write(tmp_path, "zeros.txt", "0\n0\n"), "-b", "8"]) == 2
    assert "no request produced a token" in capsys.readouterr().err


def test_missing_file_is_an_error(tmp_path, capsys):
    assert main([str(tmp_path / "nope.txt"), "-b", "8"]) == 2
    assert "No such file" in capsys.readouterr().err


def test_batch_size_must_be_positive(tmp_path, capsys):
    with pytest.raises(SystemExit) as exit_info:
        main([write(tmp_path, "a.txt", "1\n"), "-b", "0"])
    assert exit_info.value.code == 2
    assert "must be at least 1" in capsys.readouterr().err


# --- output ---


def test_table_shows_utilization_and_gain(tmp_path, capsys):
    path = write(tmp_path, "lengths.txt", "\n".join(map(str, [*SEED_EXAMPLE, 1, 1, 2])))
    assert main([path, "-b", "8"]) == 0
    out = capsys.readouterr().out
    assert f"{path}: 11 requests (plain numbers)" in out
    row = next(line for line in out.splitlines() if line.strip().startswith("8 "))
    # 71 useful of 8 * (16 + 2) slot-steps.
    assert row.split() == ["8", "2", "0.4931", "2.03x", "71", "73"]
    assert "the last group holds 3 of 8 requests" in out


def test_help_names_the_formats_and_fields(capsys):
    with pytest.raises(SystemExit) as exit_info:
        main(["--help"])
    assert exit_info.value.code == 0
    out = capsys.readouterr().out
    for word in ("--save-detailed", "output_lens", "completion_tokens", "--field", "CSV"):
        assert word in out


# --- scale ---


def _vm_hwm_kb(pid: int) -> int:
    """Peak resident set of a running process in kB (0 once it has exited)."""
    try:
        with open(f"/proc/{pid}/status") as f:
            for line in f:
                if line.startswith("VmHWM:"):
                    return int(line.split()[1])
    except OSError:
        pass
    return 0


@pytest.mark.integration
def test_ten_million_lines_run_in_bounded_memory(tmp_path):
    path = tmp_path / "lengths.txt"
    # 1..1000 repeated: exact answer known without reading the file back.
    block = "".join(f"{n}\n" for n in range(1, 1001)).encode()
    with open(path, "wb") as f:
        for _ in range(10_000):
            f.write(block)
    start = time.monotonic()
    process = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "batchscope.exporter.static_util_cli",
            str(path),
            "-b",
            "8",
            "--json",
        ],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        cwd=REPO,
    )
    # The child's own peak: VmHWM of its process after exec. (getrusage and wait4 report
    # at least the parent's high-water mark at fork time, hundreds of MB once a test in
    # this process has loaded torch.) Output is a few hundred bytes: no pipe can fill.
    peak_kb = 0
    while process.poll() is None:
        peak_kb = max(peak_kb, _vm_hwm_kb(process.pid))
        time.sleep(0.05)
    status = process.returncode
    elapsed = time.monotonic() - start
    out, err = process.stdout.read(), process.stderr.read()
    process.stdout.close()
    process.stderr.close()
    assert status == 0, err.decode()
    result = json.loads(out)
    assert result["requests"] == 10_000_000
    # Each group of 8 runs to its last value; 125 groups per block of 1000.
    assert result["total_slot_steps"] == 8 * sum(range(8, 1001, 8)) * 10_000
    assert result["useful_slot_steps"] == 500_500 * 10_000
    assert elapsed < 120
    assert 0 < peak_kb < 100 * 1024
