"""batchscope.exporter.config (settings, values, fleet_file): every accepted form, every rejected
one with its exact message."""

from __future__ import annotations

import argparse
import base64
import json
import re
from pathlib import Path

import pytest

from batchscope.exporter.config.file_sd import expand_file_sd
from batchscope.exporter.config.flags import add_arguments, settings_from_args
from batchscope.exporter.config.fleet_file import load_config, load_file_sd
from batchscope.exporter.config.settings import Auth, ConfigError, Settings, Target
from batchscope.exporter.scrape.fetch import authorization_header
from tests.support.paths import REPO

SECRET = "s3cr3t-t0ken-value"


def write(directory: Path, name: str, text: str) -> Path:
    path = directory / name
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text, encoding="utf-8")
    return path


def parse_flags(*argv: str) -> Settings:
    parser = argparse.ArgumentParser()
    add_arguments(parser)
    return settings_from_args(parser.parse_args(list(argv)))


def config_error(path: Path, text: str) -> str:
    write(path.parent, path.name, text)
    with pytest.raises(ConfigError) as caught:
        load_config(path)
    return str(caught.value)


# ---------------------------------------------------------------- command line


def test_quick_command_line_builds_one_target():
    settings = parse_flags(
        "--target",
        "http://10.0.0.5:8000/metrics",
        "--name",
        "llm",
        "--engine",
        "vllm",
        "--cap",
        "256",
        "--budget-seconds",
        "0.1",
        "--listen",
        "127.0.0.1:9500",
        "--interval",
        "5",
    )
    assert settings == Settings(
        targets=(
            Target(
                name="llm",
                url="http://10.0.0.5:8000/metrics",
                engine="vllm",
                cap=256.0,
                budget_seconds=0.1,
            ),
        ),
        listen="127.0.0.1:9500",
        interval_seconds=5.0,
        timeout_seconds=10.0,
    )


def test_quick_defaults_name_from_host_port_and_path_metrics():
    settings = parse_flags("--target", "http://gpu-3:8000")
    assert settings.targets == (Target(name="gpu-3:8000", url="http://gpu-3:8000/metrics"),)
    assert settings.listen == "127.0.0.1:9500"
    assert settings.listen_host_port() == ("127.0.0.1", 9500)
    assert settings.interval_seconds == 5.0
    assert settings.window_seconds == 60.0
    assert settings.saturation_threshold == 0.95
    assert settings.hold_seconds == 60.0
    assert settings.timeout_seconds == 10.0
    assert settings.max_response_bytes == 8 * 1024 * 1024
    assert settings.history_points == 720
    assert settings.file_sd == ()


def test_every_flag_is_applied():
    settings = parse_flags(
        "--target",
        "https://h:1/m",
        "--quantile",
        "0.9",
        "--histogram",
        "ttft",
        "--window-seconds",
        "120",
        "--saturation-threshold",
        "1.2",
        "--hold-seconds",
        "0",
        "--timeout-seconds",
        "2.5",
        "--max-response-bytes",
        "1024",
        "--history-points",
        "10",
        "--interval",
        "3",
    )
    assert settings == Settings(
        targets=(Target(name="h:1", url="https://h:1/m", quantile=0.9, histogram="ttft"),),
        interval_seconds=3.0,
        window_seconds=120.0,
        saturation_threshold=1.2,
        hold_seconds=0.0,
        timeout_seconds=2.5,
        max_response_bytes=1024,
        history_points=10,
    )


def test_flags_default_to_none_so_not_given_is_visible():
    parser = argparse.ArgumentParser()
    add_arguments(parser)
    args = vars(parser.parse_args([]))
    # 16, --alertmanager-url, --token-cap, 6 for the exporter's endpoints,
    # --max-num-batched-tokens, 3 for the SLO, --model and 3 for the replica count
    assert len(args) == 33  # and --replica-count
    assert set(args.values()) == {None}


def test_timeout_defaults_to_ten_seconds_whatever_the_interval():
    # A loaded vLLM's /metrics takes seconds (docs/benchmarks.md): 0.8 x a 1 s interval
    # turned those scrapes into gaps.
    assert parse_flags("--target", "http://h:1", "--interval", "2").timeout_seconds == 10.0
    assert parse_flags("--target", "http://h:1", "--interval", "30").timeout_seconds == 10.0
    assert Settings(targets=(), interval_seconds=1.0).timeout_seconds == 10.0


def test_a_timeout_longer_than_the_interval_is_accepted(tmp_path):
    # Scrapes of one target never overlap: a slow one delays that target's next scrape.
    assert parse_flags("--target", "http://h:1", "--timeout-seconds", "6").timeout_seconds == 6.0
    path = tmp_path / "fleet.yaml"
    path.write_text("targets:\n  - url: http://h:1\ninterval_seconds: 2\ntimeout_seconds: 3\n")
    assert parse_flags("--config", str(path)).timeout_seconds == 3.0


@pytest.mark.parametrize(
    ("listen", "stored", "bound"),
    [
        (":9600", "127.0.0.1:9600", ("127.0.0.1", 9600)),
        ("0.0.0.0:9500", "0.0.0.0:9500", ("0.0.0.0", 9500)),
        ("[::1]:9500", "[::1]:9500", ("::1", 9500)),
        ("localhost:0", "localhost:0", ("localhost", 0)),
    ],
)
def test_listen_forms(listen, stored, bound):
    settings = parse_flags("--target", "http://h:1", "--listen", listen)
    assert settings.listen == stored
    assert settings.listen_host_port() == bound


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        ((), "no target: give --target URL or --config FILE"),
        (("--cap", "8"), "--cap: describes --target URL, which is missing"),
        (("--target", "h:8000"), "--target: must be an http:// or https:// URL (got 'h:8000')"),
        (("--target", "http://h:1", "--cap", "0"), "--cap: must be > 0 (got 0.0)"),
        (("--target", "http://h:1", "--cap", "nan"), "--cap: must be a finite number (got nan)"),
        (
            ("--target", "http://h:1", "--budget-seconds", "-1"),
            "--budget-seconds: must be > 0 (got -1.0)",
        ),
        (
            ("--target", "http://h:1", "--quantile", "1"),
            "--quantile: must be between 0 and 1, both excluded (got 1.0)",
        ),
        (("--target", "http://h:1", "--name", " "), "--name: must not be empty"),
        (("--target", "http://h:1", "--interval", "0"), "--interval: must be > 0 (got 0.0)"),
        (
            ("--target", "http://h:1", "--interval", "90"),
            "--interval: must be <= window_seconds (60, the default) (got 90)",
        ),
        (
            ("--target", "http://h:1", "--window-seconds", "4"),
            "--window-seconds: must be >= interval_seconds (5), a window holds at least one scrape "
            "(got 4)",
        ),
        (
            ("--target", "http://h:1", "--saturation-threshold", "0"),
            "--saturation-threshold: must be > 0 and <= 10 (got 0.0)",
        ),
        (
            ("--target", "http://h:1", "--saturation-threshold", "10.5"),
            "--saturation-threshold: must be > 0 and <= 10 (got 10.5)",
        ),
        (
            ("--target", "http://h:1", "--hold-seconds", "-1"),
            "--hold-seconds: must be >= 0 (got -1.0)",
        ),
        (
            ("--target", "http://h:1", "--max-response-bytes", "0"),
            "--max-response-bytes: must be >= 1 (got 0)",
        ),
        (
            ("--target", "http://h:1", "--history-points", "0"),
            "--history-points: must be >= 1 (got 0)",
        ),
        (
            ("--target", "http://h:1", "--min-replicas", "0"),
            "--min-replicas: must be >= 1: a model scaled to zero has no pods, so no series "
            "to scale it back up (got 0)",
        ),
        (
            ("--target", "http://h:1", "--listen", "9500"),
            "--listen: must be HOST:PORT, e.g. 127.0.0.1:9500 (got '9500')",
        ),
        (
            ("--target", "http://h:1", "--listen", "::1:9500"),
            "--listen: needs brackets around an IPv6 address, e.g. [::1]:9500 (got '::1:9500')",
        ),
        (
            ("--target", "http://h:1", "--listen", "h:70000"),
            "--listen: needs a port from 0 to 65535 (got 'h:70000')",
        ),
        (
            ("--target", "http://h:1", "--listen", "[zz]:1"),
            "--listen: has an invalid IPv6 address in brackets (got '[zz]:1')",
        ),
    ],
)
def test_command_line_errors_name_the_flag(argv, message):
    with pytest.raises(ConfigError) as caught:
        parse_flags(*argv)
    assert str(caught.value) == message


@pytest.mark.parametrize(
    ("url", "message"),
    [
        (
            "ftp://h:1/metrics",
            "--target: must be an http:// or https:// URL (got 'ftp://h:1/metrics')",
        ),
        ("http://:8000/metrics", "--target: has no host (got 'http://:8000/metrics')"),
        ("http://h:99999/metrics", "--target: is not a valid URL (got 'http://h:99999/metrics')"),
        ("http://h:1/a b", "--target: must not contain spaces (got 'http://h:1/a b')"),
    ],
)
def test_target_url_must_be_http_with_host(url, message):
    with pytest.raises(ConfigError) as caught:
        parse_flags("--target", url)
    assert str(caught.value) == message


@pytest.mark.parametrize("url", [f"http://admin:{SECRET}@h:1/metrics", f"admin:{SECRET}@h:1"])
def test_credentials_in_url_are_rejected_without_echo(url):
    with pytest.raises(ConfigError) as caught:
        parse_flags("--target", url)
    assert SECRET not in str(caught.value)
    assert str(caught.value).startswith("--target: ")


# ---------------------------------------------------------------- YAML fleet

FLEET = """\
listen: 0.0.0.0:9600
interval_seconds: 10
window_seconds: 120
saturation_threshold: 1
hold_seconds: 30
timeout_seconds: 3
max_response_bytes: 65536
history_points: 100
targets:
  - name: llm-a
    url: http://10.0.0.1:8000/metrics
    engine: vllm
    cap: 256
    budget_seconds: 0.1
  - name: embed
    url: https://embed.internal:9000
    engine: inhouse
    quantile: 0.95
    histogram: queue
    labels: {team: search, tier: gold}
"""


def test_yaml_fleet(tmp_path):
    settings = load_config(write(tmp_path, "fleet.yaml", FLEET))
    assert settings == Settings(
        targets=(
            Target(
                name="llm-a",
                url="http://10.0.0.1:8000/metrics",
                engine="vllm",
                cap=256.0,
                budget_seconds=0.1,
            ),
            Target(
                name="embed",
                url="https://embed.internal:9000/metrics",
                engine="inhouse",
                quantile=0.95,
                histogram="queue",
                labels=(("team", "search"), ("tier", "gold")),
            ),
        ),
        listen="0.0.0.0:9600",
        interval_seconds=10.0,
        window_seconds=120.0,
        saturation_threshold=1.0,
        hold_seconds=30.0,
        timeout_seconds=3.0,
        max_response_bytes=65536,
        history_points=100,
    )
    assert isinstance(settings.targets[0].cap, float)


def test_yaml_targets_share_settings_through_merge_keys(tmp_path):
    path = write(
        tmp_path,
        "fleet.yaml",
        """\
targets:
  - &vllm {name: a, url: "http://a:8000/metrics", engine: vllm, cap: 64}
  - <<: *vllm
    name: b
    url: http://b:8000/metrics
""",
    )
    assert load_config(path).targets == (
        Target(name="a", url="http://a:8000/metrics", engine="vllm", cap=64.0),
        Target(name="b", url="http://b:8000/metrics", engine="vllm", cap=64.0),
    )


def test_flags_override_the_files_top_level_values(tmp_path):
    path = write(tmp_path, "fleet.yaml", FLEET)
    settings = parse_flags("--config", str(path), "--interval", "20", "--listen", ":9700")
    assert settings.interval_seconds == 20.0
    assert settings.listen == "127.0.0.1:9700"
    assert settings.window_seconds == 120.0
    assert settings.timeout_seconds == 3.0
    assert [t.name for t in settings.targets] == ["llm-a", "embed"]


def test_override_that_conflicts_with_the_file_names_the_file_line(tmp_path):
    path = write(tmp_path, "fleet.yaml", FLEET)
    with pytest.raises(ConfigError) as caught:
        parse_flags("--config", str(path), "--interval", "200")
    assert str(caught.value) == (
        f"{path}:3: window_seconds: must be >= interval_seconds (200), "
        "a window holds at least one scrape (got 120)"
    )


def test_target_flags_are_refused_beside_config(tmp_path):
    path = write(tmp_path, "fleet.yaml", FLEET)
    with pytest.raises(ConfigError) as caught:
        parse_flags("--config", str(path), "--cap", "8")
    assert str(caught.value) == (
        f"--cap: cannot be combined with --config; set cap on each target in {path}"
    )


def test_load_config_overrides_ignore_none_and_reject_unknown_keys(tmp_path):
    path = write(tmp_path, "fleet.yaml", FLEET)
    assert load_config(path, {"interval_seconds": None}).interval_seconds == 10.0
    with pytest.raises(ValueError, match="unknown override 'interval'"):
        load_config(path, {"interval": 3})


T = "targets:\n  - name: a\n    url: http://a:1/metrics\n"


@pytest.mark.parametrize(
    ("text", "where_what"),
    [
        (
            T + "    budget_second: 0.1\n",
            "4: targets[0].budget_second: unknown key; did you mean 'budget_seconds'?",
        ),
        (
            "intervall_seconds: 5\n" + T,
            "1: intervall_seconds: unknown key; did you mean 'interval_seconds'?",
        ),
        (T + "    cap: 0\n", "4: targets[0].cap: must be > 0 (got 0)"),
        (T + "    cap: '256'\n", "4: targets[0].cap: must be a number, not a string (got '256')"),
        (T + "    cap: true\n", "4: targets[0].cap: must be a number, not a boolean (got true)"),
        (T + "    cap: [1]\n", "4: targets[0].cap: must be a number, not a list"),
        (T + "    cap:\n", "4: targets[0].cap: must be a number, not null (got null)"),
        (T + "    budget_seconds: -0.5\n", "4: targets[0].budget_seconds: must be > 0 (got -0.5)"),
        (
            T + "    budget_seconds: .inf\n",
            "4: targets[0].budget_seconds: must be a finite number (got inf)",
        ),
        (
            T + "    quantile: 0\n",
            "4: targets[0].quantile: must be between 0 and 1, both excluded (got 0)",
        ),
        (
            T + "    histogram: p99\n",
            "4: targets[0].histogram: must be one of e2e, ttft, queue, inference, tpot, itl (got 'p99')",
        ),
        (
            T + "    engine: VLLM\n",
            "4: targets[0].engine: must be one of auto, vllm, inhouse, sglang, tgi, trtllm, "
            "triton, rayserve, llamacpp (got 'VLLM')",
        ),
        (T + "    name: b\n", "4: targets[0].name: duplicate key (first at line 2)"),
        (
            T + "  - name: b\n    url: ftp://b/metrics\n",
            "5: targets[1].url: must be an http:// or https:// URL (got 'ftp://b/metrics')",
        ),
        (
            T + "  - name: b\n    url: http:///metrics\n",
            "5: targets[1].url: has no host (got 'http:///metrics')",
        ),
        (T + "  - name: b\n    cap: 4\n", "4: targets[1]: missing required key 'url'"),
        (
            T + "  - name: a\n    url: http://b:1/metrics\n",
            "4: targets[1]: duplicate target name 'a' (first at line 2)",
        ),
        (
            T + "  - url: http://a:1/metrics\n  - url: http://a:1\n",
            "5: targets[2]: duplicate target name 'a:1' (first at line 4)",
        ),
        (
            T + "  - http://b:1/metrics\n",
            "4: targets[1]: must be a mapping, not a string (got 'http://b:1/metrics')",
        ),
        (T + "    name2: x\n", "4: targets[0].name2: unknown key; did you mean 'name'?"),
        (
            T + "    labels: {target: x}\n",
            "4: targets[0].labels.target: the exporter sets this label itself; reserved are "
            "target, bound, histogram, kind, le, limit, quantile, reason, speed, state, window, application, batcher, "
            "deployment, engine, "
            "function_name, model, model_name, version and names starting with __",
        ),
        (
            T + "    labels: {9lives: x}\n",
            "4: targets[0].labels.9lives: label names are letters, digits and _, not a digit first",
        ),
        (
            T + "    labels: {team: 7}\n",
            "4: targets[0].labels.team: must be a string, not an integer (got 7)",
        ),
        ("targets: {a: 1}\n", "1: targets: must be a list of targets, not a mapping"),
        ("targets: []\n", "1: no targets: list some under targets: or file_sd:"),
        ("listen: 127.0.0.1:9500\n", "1: no targets: list some under targets: or file_sd:"),
        ("- a\n", "1: (top level): must be a mapping, not a list"),
        ("1: x\n" + T, "1: (top level): keys must be strings"),
        (
            T + "interval_seconds: 5s\n",
            "4: interval_seconds: must be a number, not a string (got '5s')",
        ),
        (T + "interval_seconds: 0\n", "4: interval_seconds: must be > 0 (got 0)"),
        (
            T + "window_seconds: 2\n",
            "4: window_seconds: must be >= interval_seconds (5), a window holds at least one "
            "scrape (got 2)",
        ),
        (T + "saturation_threshold: 0\n", "4: saturation_threshold: must be > 0 and <= 10 (got 0)"),
        (T + "hold_seconds: -1\n", "4: hold_seconds: must be >= 0 (got -1)"),
        (
            T + "max_response_bytes: 1.5\n",
            "4: max_response_bytes: must be a whole number, not a number (got 1.5)",
        ),
        (T + "history_points: 0\n", "4: history_points: must be >= 1 (got 0)"),
        (T + "listen: 9500\n", "4: listen: must be a string, not an integer (got 9500)"),
        (T + "listen: 'h:x'\n", "4: listen: needs a port from 0 to 65535 (got 'h:x')"),
        (
            T + "file_sd: sd.json\n",
            "4: file_sd: must be a list of paths or globs, not a string (got 'sd.json')",
        ),
        (T + "file_sd: ['']\n", "4: file_sd[0]: must not be empty"),
        (
            T + "  - name: [b\n",
            "5: invalid YAML: while parsing a flow sequence, expected ',' or ']', but got '<stream "
            "end>'",
        ),
        (
            T + "    cap: !!python/name:os.system\n",
            "4: invalid YAML: could not determine a constructor for the tag "
            "'tag:yaml.org,2002:python/name:os.system'",
        ),
        (
            T + "---\nb: 1\n",
            "4: invalid YAML: expected a single document in the stream, but found another document",
        ),
    ],
)
def test_yaml_errors_name_file_line_and_key(tmp_path, text, where_what):
    path = tmp_path / "fleet.yaml"
    assert config_error(path, text) == f"{path}:{where_what}"


def test_missing_and_empty_files_are_config_errors(tmp_path):
    missing = tmp_path / "nope.yaml"
    with pytest.raises(ConfigError) as caught:
        load_config(missing)
    assert str(caught.value) == f"{missing}: cannot read the file: No such file or directory"
    empty = tmp_path / "empty.yaml"
    assert config_error(empty, "# nothing\n") == (
        f"{empty}:1: the file is empty; it needs targets: or file_sd:"
    )
    binary = tmp_path / "bin.yaml"
    binary.write_bytes(b"\xff\xfe\x00")
    with pytest.raises(ConfigError) as caught:
        load_config(binary)
    assert str(caught.value) == f"{binary}: not UTF-8 text"


def test_a_json_config_file_is_read_as_json(tmp_path):
    path = write(
        tmp_path,
        "fleet.json",
        '{\n\t"targets": [\n\t\t{"name": "a", "url": "http://a:1/metrics", "cap": 0}\n\t]\n}\n',
    )
    with pytest.raises(ConfigError) as caught:
        load_config(path)
    assert str(caught.value) == f"{path}:3: targets[0].cap: must be > 0 (got 0)"


# ---------------------------------------------------------------- auth


def test_bearer_token_from_environment(tmp_path, monkeypatch):
    path = write(
        tmp_path,
        "fleet.yaml",
        T + "    auth:\n      type: bearer\n      token_env: VLLM_TOKEN\n",
    )
    target = load_config(path).targets[0]
    assert target.auth == Auth(type="bearer", token_env="VLLM_TOKEN")
    monkeypatch.setenv("VLLM_TOKEN", SECRET)
    assert authorization_header(target.auth) == f"Bearer {SECRET}"
    monkeypatch.setenv("VLLM_TOKEN", "rotated")
    assert authorization_header(target.auth) == "Bearer rotated"


def test_bearer_token_file_is_relative_to_the_config_and_stripped(tmp_path):
    write(tmp_path, "secrets/token", f"{SECRET}\n")
    path = write(
        tmp_path, "fleet.yaml", T + "    auth: {type: bearer, token_file: secrets/token}\n"
    )
    auth = load_config(path).targets[0].auth
    assert auth == Auth(type="bearer", token_file=str(tmp_path / "secrets/token"))
    assert authorization_header(auth) == f"Bearer {SECRET}"


def test_basic_auth_from_environment_and_file(tmp_path, monkeypatch):
    write(tmp_path, "pw", SECRET)
    path = write(
        tmp_path,
        "fleet.yaml",
        T
        + "    auth: {type: basic, username: scraper, password_env: PW}\n"
        + "  - name: b\n    url: http://b:1/metrics\n"
        + f"    auth: {{type: basic, username: scraper, password_file: {tmp_path / 'pw'}}}\n",
    )
    a, b = load_config(path).targets
    monkeypatch.setenv("PW", SECRET)
    expected = "Basic " + base64.b64encode(f"scraper:{SECRET}".encode()).decode()
    assert authorization_header(a.auth) == expected
    assert authorization_header(b.auth) == expected


A = T + "    auth:\n"


@pytest.mark.parametrize(
    ("text", "where_what"),
    [
        (
            A + "      type: bearer\n      token: " + SECRET + "\n",
            "6: targets[0].auth.token: secrets are not allowed in the configuration; use auth: "
            "with "
            "token_env or password_env (an environment variable's name) or token_file or "
            "password_file (a file's path)",
        ),
        (
            A + "      type: basic\n      username: u\n      password: " + SECRET + "\n",
            "7: targets[0].auth.password: secrets are not allowed in the configuration; use auth: "
            "with "
            "token_env or password_env (an environment variable's name) or token_file or "
            "password_file (a file's path)",
        ),
        (
            T + "    bearer_token: " + SECRET + "\n",
            "4: targets[0].bearer_token: secrets are not allowed in the configuration; use auth: "
            "with "
            "token_env or password_env (an environment variable's name) or token_file or "
            "password_file (a file's path)",
        ),
        (
            A + "      type: bearer\n      token_env: " + SECRET + "-not-a-name\n",
            "6: targets[0].auth.token_env: must be the name of an environment variable "
            "(letters, digits, _), not the secret",
        ),
        (A + "      token_env: T\n", "5: targets[0].auth: missing key 'type' (bearer or basic)"),
        (
            A + "      type: oauth\n",
            "5: targets[0].auth.type: must be one of bearer, basic (got 'oauth')",
        ),
        (
            A + "      type: bearer\n      token_env: T\n      token_file: /t\n",
            "5: targets[0].auth: type bearer needs exactly one of token_env or token_file",
        ),
        (
            A + "      type: bearer\n",
            "5: targets[0].auth: type bearer needs exactly one of token_env or token_file",
        ),
        (
            A + "      type: bearer\n      token_env: T\n      username: u\n",
            "7: targets[0].auth.username: not used by type bearer",
        ),
        (
            A + "      type: basic\n      token_env: T\n",
            "6: targets[0].auth.token_env: not used by type basic",
        ),
        (
            A + "      type: basic\n      password_env: P\n",
            "5: targets[0].auth: type basic needs a username",
        ),
        (
            A + "      type: basic\n      username: 'a:b'\n      password_env: P\n",
            "6: targets[0].auth.username: must not contain ':' (basic auth separates it from the "
            "password there) (got 'a:b')",
        ),
        (
            A + "      type: bearer\n      tokn_env: T\n",
            "6: targets[0].auth.tokn_env: unknown key; did you mean 'token_env'?",
        ),
    ],
)
def test_auth_errors(tmp_path, text, where_what):
    path = tmp_path / "fleet.yaml"
    message = config_error(path, text)
    assert message == f"{path}:{where_what}"
    assert SECRET not in message


def test_missing_environment_variable_is_named(monkeypatch):
    monkeypatch.delenv("NO_SUCH_TOKEN", raising=False)
    with pytest.raises(ConfigError) as caught:
        authorization_header(Auth(type="bearer", token_env="NO_SUCH_TOKEN"))
    assert str(caught.value) == (
        "auth: environment variable NO_SUCH_TOKEN (the token) is not set or empty"
    )
    monkeypatch.setenv("NO_SUCH_TOKEN", "  ")
    with pytest.raises(ConfigError, match="NO_SUCH_TOKEN"):
        authorization_header(Auth(type="bearer", token_env="NO_SUCH_TOKEN"))


def test_unreadable_and_empty_secret_files_are_named(tmp_path):
    missing = tmp_path / "missing"
    with pytest.raises(ConfigError) as caught:
        authorization_header(Auth(type="basic", username="u", password_file=str(missing)))
    assert str(caught.value) == (
        f"auth: cannot read password file {missing}: No such file or directory"
    )
    empty = write(tmp_path, "empty", "\n")
    with pytest.raises(ConfigError) as caught:
        authorization_header(Auth(type="bearer", token_file=str(empty)))
    assert str(caught.value) == f"auth: token file {empty} is empty"


def test_a_secret_with_a_line_break_is_refused_without_showing_it(tmp_path, monkeypatch):
    monkeypatch.setenv("TWO_LINES", f"{SECRET}\nX-Injected: 1")
    with pytest.raises(ConfigError) as caught:
        authorization_header(Auth(type="bearer", token_env="TWO_LINES"))
    assert str(caught.value) == (
        "auth: the token in environment variable TWO_LINES contains a line break"
    )


def test_credentials_never_reach_repr_or_str(tmp_path, monkeypatch):
    write(tmp_path, "token", SECRET)
    path = write(
        tmp_path,
        "fleet.yaml",
        T
        + "    auth: {type: bearer, token_file: token}\n"
        + "  - name: b\n    url: http://b:1/metrics\n"
        + "    auth: {type: basic, username: u, password_env: PW}\n",
    )
    monkeypatch.setenv("PW", SECRET)
    settings = load_config(path)
    basic = base64.b64encode(f"u:{SECRET}".encode()).decode()
    assert [authorization_header(t.auth) for t in settings.targets] == [
        f"Bearer {SECRET}",
        f"Basic {basic}",
    ]
    shown = [repr(settings), str(settings), *(repr(t) for t in settings.targets)]
    shown += [str(t.auth) for t in settings.targets]
    assert [text for text in shown if SECRET in text or basic in text] == []
    assert repr(settings.targets[1].auth) == "Auth(type='basic', username='u', password_env='PW')"


# ---------------------------------------------------------------- file_sd

SD = """\
[
\t{
\t\t"targets": ["10.0.0.1:8000", "10.0.0.2:8000"],
\t\t"labels": {"engine": "vllm", "cap": "256", "budget_seconds": "0.25", "env": "prod",
\t\t           "__meta_consul_dc": "eu"}
\t},
\t{
\t\t"targets": ["[fd00::7]:9000"],
\t\t"labels": {"batchscope_name": "embed", "__scheme__": "https",
\t\t           "__metrics_path__": "/batcher/metrics", "__param_format": "text",
\t\t           "quantile": "0.9", "histogram": "queue"}
\t}
]
"""


def test_file_sd_targets_from_groups_and_labels(tmp_path):
    targets = load_file_sd(write(tmp_path, "sd.json", SD))
    prod = (("env", "prod"),)
    assert targets == [
        Target(
            "10.0.0.1:8000",
            "http://10.0.0.1:8000/metrics",
            engine="vllm",
            cap=256.0,
            budget_seconds=0.25,
            labels=prod,
        ),
        Target(
            "10.0.0.2:8000",
            "http://10.0.0.2:8000/metrics",
            engine="vllm",
            cap=256.0,
            budget_seconds=0.25,
            labels=prod,
        ),
        Target(
            name="embed",
            url="https://[fd00::7]:9000/batcher/metrics?format=text",
            quantile=0.9,
            histogram="queue",
        ),
    ]


def test_file_sd_in_yaml_and_name_label(tmp_path):
    path = write(tmp_path, "sd.yml", "- targets: [gpu-1:8000]\n  labels: {name: big}\n")
    assert load_file_sd(path) == [Target(name="big", url="http://gpu-1:8000/metrics")]
    assert load_file_sd(write(tmp_path, "none.json", "[]")) == []


def test_config_with_file_sd_resolves_paths_against_the_config(tmp_path):
    write(tmp_path, "sd/a.json", '[{"targets": ["a:1"]}]')
    write(tmp_path, "sd/b.json", '[{"targets": ["b:1"]}]')
    path = write(tmp_path, "fleet.yaml", "file_sd: ['sd/*.json', 'later/*.json']\n")
    settings = load_config(path)
    assert settings.targets == ()
    assert settings.file_sd == (str(tmp_path / "sd/*.json"), str(tmp_path / "later/*.json"))
    assert expand_file_sd(settings.file_sd) == [tmp_path / "sd/a.json", tmp_path / "sd/b.json"]


def test_a_missing_plain_file_sd_path_fails_at_start(tmp_path):
    path = write(tmp_path, "fleet.yaml", "file_sd: [sd.json]\n")
    with pytest.raises(ConfigError) as caught:
        load_config(path)
    assert str(caught.value) == (
        f"{tmp_path / 'sd.json'}: cannot read the file: No such file or directory"
    )


def test_file_sd_name_clashing_with_a_config_target_names_both_files(tmp_path):
    sd = write(tmp_path, "sd.json", '[\n  {"targets": ["a:1"], "labels": {"name": "a"}}\n]')
    path = write(tmp_path, "fleet.yaml", T + "file_sd: [sd.json]\n")
    with pytest.raises(ConfigError) as caught:
        load_config(path)
    assert str(caught.value) == (
        f"{sd}:2: [0].targets[0]: duplicate target name 'a' (first at {path}:2)"
    )


@pytest.mark.parametrize(
    ("text", "where_what"),
    [
        (
            '[\n  {"targets": ["a:1"], "labels": {"cap": "lots"}}\n]',
            "2: [0].labels.cap: must be a number (got 'lots')",
        ),
        (
            '[\n  {"targets": ["a:1"], "labels": {"cap": "-4"}}\n]',
            "2: [0].labels.cap: must be > 0 (got -4.0)",
        ),
        (
            '[\n  {"targets": ["a:1"], "labels": {"budget_seconds": "NaN"}}\n]',
            "2: [0].labels.budget_seconds: must be a finite number (got nan)",
        ),
        (
            '[\n  {"targets": ["a:1"], "labels": {"engine": "llama"}}\n]',
            "2: [0].labels.engine: must be one of auto, vllm, inhouse, sglang, tgi, trtllm, "
            "triton, rayserve, llamacpp (got 'llama')",
        ),
        (
            '[\n  {"targets": ["a:1"], "labels": {"cap": 4}}\n]',
            "2: [0].labels.cap: must be a string, not an integer (got 4)",
        ),
        (
            '[\n  {"targets": ["a:1"],\n   "labels": {"__scheme__": "ftp"}}\n]',
            "3: [0].labels.__scheme__: must be http or https (got 'ftp')",
        ),
        (
            '[\n  {"targets": ["a:1"], "labels": {"__metrics_path__": "metrics"}}\n]',
            "2: [0].labels.__metrics_path__: must start with / (got 'metrics')",
        ),
        (
            '[\n  {"targets": ["a:1"], "labels": {"model_name": "x"}}\n]',
            "2: [0].labels.model_name: the exporter sets this label itself; reserved are "
            "target, bound, histogram, kind, le, limit, quantile, reason, speed, state, window, application, batcher, "
            "deployment, engine, "
            "function_name, model, model_name, version and names starting with __",
        ),
        (
            '[\n  {"targets": ["a:1",\n     "b"]}\n]',
            "3: [0].targets[1]: must be HOST:PORT, e.g. 127.0.0.1:9500 (got 'b')",
        ),
        (
            '[\n  {"targets": [":80"]}\n]',
            "2: [0].targets[0]: must be host:port with a port from 1 to 65535 (got ':80')",
        ),
        (
            '[\n  {"targets": ["a:1", "a:1"]}\n]',
            "2: [0].targets[1]: duplicate target name 'a:1' (first at line 2)",
        ),
        (
            '[\n  {"targets": ["a:1", "b:1"], "labels": {"name": "x"}}\n]',
            "2: [0].targets[1]: duplicate target name 'x' (first at line 2)",
        ),
        ('[\n  {"labels": {}}\n]', "2: [0]: missing required key 'targets'"),
        (
            '[\n  {"targets": [], "label": {}}\n]',
            "2: [0].label: unknown key; did you mean 'labels'?",
        ),
        (
            '[\n  {"targets": [], "targets": []}\n]',
            "2: [0].targets: duplicate key (first at line 2)",
        ),
        ('{"targets": []}', "1: (top level): must be a list of target groups, not a mapping"),
        (
            '[\n  {"targets": ["a:1"],}\n]',
            "2: invalid JSON: Expecting property name enclosed in double quotes",
        ),
        ("", "1: invalid JSON: Expecting value"),
    ],
)
def test_file_sd_errors(tmp_path, text, where_what):
    path = write(tmp_path, "sd.json", text)
    with pytest.raises(ConfigError) as caught:
        load_file_sd(path)
    assert str(caught.value) == f"{path}:{where_what}"


def test_file_sd_json_with_long_keys_and_odd_characters(tmp_path):
    long_label = "k" * 2000
    path = write(
        tmp_path,
        "sd.json",
        '[{"targets": ["a:1"], "labels": {"' + long_label + '": "\\ud83d\\ude00", "raw": "\x80"}}]',
    )
    (target,) = load_file_sd(path)
    assert target.labels == ((long_label, "\U0001f600"), ("raw", "\x80"))


def test_glob_matching_nothing_is_no_files(tmp_path):
    assert expand_file_sd([str(tmp_path / "*.json")]) == []
    assert expand_file_sd([str(tmp_path / "x.json")]) == [tmp_path / "x.json"]


DOCS = REPO / "docs" / "configuration.md"


def test_the_documented_fleet_and_file_sd_examples_load(tmp_path):
    blocks = re.findall(r"```(yaml|json)\n(.*?)```", DOCS.read_text(), re.S)
    fleet = next(text for kind, text in blocks if kind == "yaml" and "file_sd:" in text)
    file_sd = next(text for kind, text in blocks if kind == "json")
    write(tmp_path, "sd/fleet.json", file_sd)
    settings = load_config(write(tmp_path, "fleet.yaml", fleet))
    assert [t.name for t in settings.targets] == ["llama-a", "llama-b", "embedder"]
    assert settings.targets[1].auth == Auth(type="bearer", token_env="LLAMA_B_TOKEN")
    assert [(t.name, t.url) for t in load_file_sd(tmp_path / "sd/fleet.json")] == [
        ("10.0.0.11:8000", "http://10.0.0.11:8000/metrics"),
        ("10.0.0.12:8000", "http://10.0.0.12:8000/metrics"),
        ("reranker", "https://10.0.0.21:9000/batcher/metrics"),
    ]


def test_alertmanager_url_is_kept_as_given_and_checked_like_a_target_url(tmp_path):
    path = tmp_path / "fleet.yaml"
    path.write_text(
        "alertmanager_url: http://127.0.0.1:9093\ntargets:\n  - url: http://127.0.0.1:8000\n"
    )
    assert load_config(path).alertmanager_url == "http://127.0.0.1:9093"
    path.write_text("alertmanager_url: ftp://am\ntargets:\n  - url: http://127.0.0.1:8000\n")
    with pytest.raises(ConfigError, match=r"fleet.yaml:1: alertmanager_url: must be an http"):
        load_config(path)


# ---------------------------------------------------------------- one registry of fields

# A value each configurable target field accepts, as YAML, a flag and a file_sd label
# would give it; a field added to Target without a value here fails the test below.
_GIVEN = {
    "name": "llm",
    "url": "http://127.0.0.1:8000/metrics",
    "engine": "vllm",
    "cap": 16,
    "token_cap": 4096,
    "max_num_batched_tokens": 2048,
    "budget_seconds": 1.5,
    "quantile": 0.9,
    "histogram": "ttft",
    "slo_objective": 0.99,
    "model": "llama",
}


def test_every_target_field_reaches_yaml_flags_file_sd_and_the_api(tmp_path):
    from batchscope.exporter.config.settings import TARGET_FLAGS, config_fields
    from batchscope.exporter.serve.api_json import targets_response

    specs = config_fields(Target)
    assert set(specs) == set(_GIVEN), "give the new field a value in _GIVEN"
    expected = {key: float(v) if isinstance(v, int) else v for key, v in _GIVEN.items()}

    # YAML
    lines = ["targets:", f"  - url: {_GIVEN['url']}"]
    lines += [f"    {key}: {value}" for key, value in _GIVEN.items() if key != "url"]
    (tmp_path / "fleet.yaml").write_text("\n".join(lines) + "\n")
    [from_yaml] = load_config(tmp_path / "fleet.yaml").targets
    # Flags
    parser = argparse.ArgumentParser()
    add_arguments(parser)
    argv = [arg for key, value in _GIVEN.items() for arg in (TARGET_FLAGS[key], str(value))]
    [from_flags] = settings_from_args(parser.parse_args(argv)).targets
    # file_sd: the labels that configure a target are the fields marked file_sd
    labels = {key: str(value) for key, value in _GIVEN.items() if specs[key].file_sd}
    assert set(labels) == set(_GIVEN) - {"name", "url"}
    (tmp_path / "sd.json").write_text(
        f'[{{"targets": ["127.0.0.1:8000"], "labels": {json.dumps(labels | {"name": "llm"})}}}]'
    )
    [from_sd] = load_file_sd(tmp_path / "sd.json")

    for target in (from_yaml, from_flags, from_sd):
        assert {key: getattr(target, key) for key in specs} == expected
    [shown] = targets_response([from_flags], 5.0, 60.0)["targets"]
    assert shown == expected | {"labels": {}}
    # Each field's flag is in --help, with its help text
    help_text = parser.format_help()
    for spec in specs.values():
        assert spec.flag in help_text


def test_every_setting_has_a_flag_and_a_yaml_key(tmp_path):
    from batchscope.exporter.config.settings import SETTINGS_FLAGS, config_fields

    specs = config_fields(Settings)
    assert set(SETTINGS_FLAGS) == set(specs)
    assert len(set(SETTINGS_FLAGS.values())) == len(specs)
    (tmp_path / "fleet.yaml").write_text(
        "targets: [{url: 'http://127.0.0.1:8000'}]\nhold_seconds: 120\ninterval_seconds: 2\n"
    )
    settings = load_config(tmp_path / "fleet.yaml")
    assert (settings.hold_seconds, settings.interval_seconds) == (120.0, 2.0)


def test_slo_settings_are_checked_and_reach_the_signal_settings(tmp_path):
    from batchscope.exporter.scrape.loop import signal_settings

    path = tmp_path / "fleet.yaml"
    path.write_text(
        "slo_period_days: 7\nslo_window_scale: 0.01\n"
        "targets:\n  - url: http://127.0.0.1:8000\n    slo_objective: 0.995\n"
    )
    settings = load_config(path)
    signals = signal_settings(settings.targets[0], settings)
    assert (signals.slo_objective, signals.slo_window_scale) == (0.995, 0.01)
    assert signals.slo_period_seconds == 7 * 86400
    # Off by default: no objective, the standard windows, 30 days.
    default = signal_settings(Target("a", "http://a/metrics"), Settings(targets=()))
    assert (default.slo_objective, default.slo_window_scale) == (None, 1.0)
    assert default.slo_period_seconds == 30 * 86400
    for text, error in (
        (
            "targets:\n  - url: http://a:1\n    slo_objective: 1\n",
            "targets[0].slo_objective: must be between 0 and 1, both excluded (got 1)",
        ),
        (
            "slo_window_scale: 2\ntargets:\n  - url: http://a:1\n",
            "slo_window_scale: must be > 0 and <= 1 (got 2)",
        ),
        ("slo_period_days: 0\ntargets:\n  - url: http://a:1\n", "slo_period_days: must be > 0"),
    ):
        path.write_text(text)
        with pytest.raises(ConfigError, match=re.escape(error)):
            load_config(path)


def test_the_staleness_default_is_derived_once_from_the_hold_and_the_interval():
    from batchscope.exporter.alerts.book import STALE_SECONDS
    from batchscope.exporter.core.signals import SignalSettings, staleness
    from batchscope.exporter.scrape.loop import stale_seconds

    defaults = Settings(targets=())
    assert stale_seconds(defaults) == SignalSettings().stale_seconds == STALE_SECONDS == 60.0
    assert staleness(defaults.hold_seconds, defaults.interval_seconds) == 60.0
    # A short hold at a slow interval: two intervals
    assert stale_seconds(Settings(targets=(), hold_seconds=10, interval_seconds=15)) == 30.0


def test_a_target_takes_its_settings_by_keyword_only() -> None:
    # A field added among the settings can never shift a positional argument's meaning.
    with pytest.raises(TypeError, match="positional"):
        Target("llm", "http://127.0.0.1:8000/metrics", "vllm", 8.0)  # type: ignore[misc]
    target = Target("llm", "http://127.0.0.1:8000/metrics", engine="vllm", cap=8.0)
    assert (target.name, target.engine, target.cap) == ("llm", "vllm", 8.0)
