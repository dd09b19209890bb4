"""The ``idempotent`` entry point: --version, help, and one-line errors with exit code 2."""

from __future__ import annotations

import re
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

import idempotent
from idempotent.net.server import BrokerServer
from idempotent.net.tls import server_context
from idempotent.testing.certs import make_certs

from ..cli_helpers import run


def test_version(capsys: pytest.CaptureFixture[str]) -> None:
    code, out, _ = run(capsys, "--version")
    assert code == 0
    assert out.strip() == f"idempotent {idempotent.__version__}"


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["produce", "sqlite:///{db}", "t", "--file", "{tmp}/missing.txt"], "no such file"),
        (["produce", "sqlite:///{db}", "t", "--file", "-"], "not supported"),
        (["produce", "ftp://host/x", "t", "--generate", "5"], "unknown URL scheme 'ftp'"),
        (["produce", "sqlite:///{tmp}/no/dir.db", "t", "--generate", "5"], "does not exist"),
        (["produce", "sqlite:///{db}", "t", "--generate", "lots"], "'lots' is not an integer"),
        (["produce", "sqlite:///{db}", "t", "--generate", "-1"], "at least 0"),
        (["produce", "sqlite:///{db}", "t", "--generate", "5", "--size", "3"], "at least 19"),
        (["produce", "sqlite:///{db}", "t"], "one of the arguments --file --generate is required"),
        (["produce", "sqlite:///{db}", "bad topic", "--generate", "5"], "invalid topic name"),
        (["produce", "sqlite:///{db}", "t", "--generate", "5", "--max-in-flight", "9999"], "max_in_flight"),
        (["tail", "sqlite:///{db}", "unknown"], "unknown topic 'unknown'"),
        (["tail", "sqlite:///{tmp}/nothing.db", "t"], "no database file"),
        (["tail", "sqlite:///{db}", "t", "--partition", "7"], "partitions 0..0"),
        (["tail", "sqlite:///{db}", "t", "--offset", "1", "--from-beginning"], "not allowed with"),
        (["stats", "sqlite:///{db}", "unknown"], "unknown topic 'unknown'"),
        (["stats", "kafka"], "no URL scheme in 'kafka': use sqlite:///"),
        (["frobnicate"], "invalid choice"),
    ],
)
def test_errors_are_one_line_with_exit_code_2(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], argv: list[str], message: str
) -> None:
    db = tmp_path / "log.db"
    with idempotent.connect(f"sqlite:///{db}") as broker:
        broker.create_topic("t", 1)
    code, out, err = run(capsys, *(a.format(db=db, tmp=tmp_path) for a in argv))
    assert code == 2
    assert out == ""
    assert len(err.strip().splitlines()) == 1, err
    assert message in err
    assert "Traceback" not in err
    assert not (tmp_path / "nothing.db").exists()


def test_no_command_prints_help(capsys: pytest.CaptureFixture[str]) -> None:
    code, _, err = run(capsys)
    assert code == 2
    assert "produce" in err and "tail" in err and "stats" in err


# -- URLs --------------------------------------------------------------------------------------


def _commands(url: str, topic: str) -> list[list[str]]:
    """Every command that takes a broker URL, reading or writing ``topic`` through ``url``."""
    return [
        ["produce", url, topic, "--generate", "5", "--quiet"],
        ["tail", url, topic, "--from-beginning"],
        ["stats", url, topic],
        ["stats", url],
        ["admin", "--url", url, "stats", topic],
        ["admin", "--url", url, "describe-producers", topic],
        ["admin", "--url", url, "set-deduplication", topic, "--policy", "strict"],
    ]


@pytest.mark.parametrize("tls", [False, True], ids=["idem", "idems"])
def test_every_command_accepts_a_broker_server_url(
    tls: bool, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    context = None
    if tls:
        certs = make_certs(tmp_path / "certs")
        context = server_context(certs.server_cert, certs.server_key)
        monkeypatch.setenv("IDEMPOTENT_TLS_CA", str(certs.ca_cert))
    broker = idempotent.connect(f"sqlite:///{tmp_path / 'log.db'}")
    assert isinstance(broker, idempotent.Broker)
    with BrokerServer(broker, ssl_context=context) as server:
        assert server.url.startswith("idems://" if tls else "idem://")
        for argv in _commands(server.url, "t"):
            code, _, err = run(capsys, *argv)
            assert code == 0, (argv, err)
        assert run(capsys, "tail", server.url, "t", "--from-beginning", "--format", "json")[1].count("\n") == 5


@pytest.mark.parametrize("spelling", ["sqlite:/x.db", "sqlite:x.db", "sqlite://x.db"])
def test_a_sqlite_url_without_three_slashes_is_refused(
    spelling: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.chdir(tmp_path)
    for argv in _commands(spelling, "t"):
        code, out, err = run(capsys, *argv)
        assert (code, out) == (2, ""), (argv, err)
        assert "sqlite:///x.db (three slashes)" in err and "sqlite:////x.db (four)" in err, err
    with pytest.raises(idempotent.ConfigError, match="not a SQLite URL"):
        idempotent.connect(spelling)
    assert list(tmp_path.iterdir()) == []  # nothing was created, neither x.db nor /x.db's lock


# -- errors that say what to do ----------------------------------------------------------------


@pytest.mark.parametrize("command", [["stats"], ["tail", "{url}", "t"], ["produce", "{url}", "t", "--generate", "1"]])
def test_an_unknown_scheme_lists_every_url_the_cli_takes(
    command: list[str], capsys: pytest.CaptureFixture[str]
) -> None:
    argv = [a.format(url="ftp://host/x") for a in command]
    code, out, err = run(capsys, *argv, *([] if len(argv) > 1 else ["ftp://host/x"]))
    assert (code, out) == (2, "")
    (line,) = err.strip().splitlines()
    assert "unknown URL scheme 'ftp' in 'ftp://host/x': use " in line
    for form in ("sqlite:///", "memory://", "kafka://", "pulsar://", "idem://", "idems://"):
        assert form in line, form
    for form in ("kafka+native://", "pulsar+native://"):  # what mirror and tail read besides
        assert form in line, form


def _closed_port() -> int:
    """A port on 127.0.0.1 where nothing listens (bound once, then released)."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def _run_cli(*argv: str, timeout: float = 120) -> tuple[int, str, str, float]:
    started = time.monotonic()
    done = subprocess.run([sys.executable, "-m", "idempotent", *argv], capture_output=True, text=True, timeout=timeout)
    return done.returncode, done.stdout, done.stderr, time.monotonic() - started


def test_an_unreachable_pulsar_fails_within_the_default_connect_timeout_and_says_so() -> None:
    url = f"pulsar://127.0.0.1:{_closed_port()}?admin_url=http://127.0.0.1:{_closed_port()}"
    code, out, err, elapsed = _run_cli("stats", url)
    assert (code, out) == (1, "")
    (line,) = err.strip().splitlines()  # one line, and no line of the Pulsar client's own
    assert line.startswith("error: pulsar: cannot connect to 127.0.0.1:")
    assert "within the connect timeout of 10 s (Connection refused)" in line and "--connect-timeout" in line
    assert elapsed < 10 + 5  # 10 s of retries, the rest is starting Python


@pytest.mark.parametrize("scheme", ["kafka", "pulsar", "idem"])
def test_an_unreachable_broker_fails_within_the_connect_timeout_given(scheme: str) -> None:
    port = _closed_port()
    url = f"{scheme}://127.0.0.1:{port}"
    if scheme == "pulsar":
        url += f"?admin_url=http://127.0.0.1:{_closed_port()}"
    for argv in (["stats", url], ["produce", url, "t", "--generate", "1"], ["admin", "--url", url, "stats", "t"]):
        code, out, err, elapsed = _run_cli(*argv, "--connect-timeout", "1.5")
        assert (code, out) == (1, ""), (argv, err)
        (line,) = err.strip().splitlines()
        assert line.startswith("error: "), line
        assert f"cannot connect to {'idem://' if scheme == 'idem' else ''}127.0.0.1:{port}" in line, line
        assert "connect timeout of 1.5 s" in line and "Connection refused" in line, line
        assert elapsed < 1.5 + 5, (argv, elapsed)


# -- the docs name commands and options as they are --------------------------------------------

_DOCS = ("README.md", "docs/operations.md", "docs/backends.md", "docs/migration.md", "docs/mirror.md")


def _documented_command_lines() -> list[tuple[str, list[str]]]:
    """``idempotent ...`` command lines written in the docs: inline code spans and lines of
    code blocks, as (where, tokens after ``idempotent``)."""
    import shlex

    root = Path(__file__).parents[2]
    found = []
    for name in _DOCS:
        text = (root / name).read_text()
        spans = re.findall(r"`(idempotent [^`\n]+)`", text)
        for block in re.findall(r"^```[a-z]*\n(.*?)^```", text, re.MULTILINE | re.DOTALL):
            spans += re.findall(r"^(?:\$ )?(idempotent [^\n`]+)$", block, re.MULTILINE)
        for span in spans:
            cleaned = re.sub(r"\.\.\.|[\[\]()|]", " ", span.split("#")[0].split("&&")[0])
            try:
                tokens = shlex.split(cleaned)
            except ValueError:
                tokens = cleaned.split()
            found.append((f"{name}: {span}", tokens[1:]))
    return found


def test_the_docs_name_every_command_verb_and_option_as_it_is() -> None:
    import argparse

    from idempotent import cli

    parser = cli.build_parser()
    (commands,) = [a for a in parser._actions if isinstance(a, argparse._SubParsersAction)]
    checked = 0
    for where, tokens in _documented_command_lines():
        if not tokens or tokens[0].startswith("-"):
            continue
        command = tokens[0]
        if command in ("broker", "mirror", "services", "compare", "token") and command in commands.choices:
            continue  # own argument styles; their options are checked by their own modules' tests
        assert command in commands.choices, f"{where}: no command {command!r}"
        sub = commands.choices[command]
        verbs = [a for a in sub._actions if isinstance(a, argparse._SubParsersAction)]
        parsers = [sub]
        if verbs:
            words = [t for t in tokens[1:] if re.fullmatch(r"[a-z][a-z-]*", t) and t not in ("or",)]
            named = [w for w in words if w in verbs[0].choices]  # "list|describe|..." names several
            first_word = next(iter(words), None)
            assert first_word is None or first_word in named, f"{where}: {command} has no verb {first_word!r}"
            parsers = [verbs[0].choices[v] for v in named] if named else list(verbs[0].choices.values())
            parsers.append(sub)
        options = {o for p in parsers for a in p._actions for o in a.option_strings}
        for token in tokens[1:]:
            if token.startswith("--"):
                option = token.split("=", 1)[0]
                assert option in options, f"{where}: {command} has no option {option}"
        checked += 1
    assert checked >= 20
