"""A broker server with TLS, token authentication and the access policy: every refusal, and
that a refusal changes nothing while the server keeps serving everyone else."""

from __future__ import annotations

import logging
import os
import random
import socket
import string
import subprocess
import sys
import time
import traceback
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import jwt
import msgpack
import pytest

import idempotent
from idempotent import Outcome, Producer
from idempotent.broker.broker import Broker, BrokerConfig
from idempotent.core import protocol as wire
from idempotent.errors import (
    AuthenticationError,
    AuthorizationError,
    BrokerConnectionError,
    ConfigError,
    ProducerError,
)
from idempotent.net.auth import AccessPolicy, BrokerGuard, JWTAuthenticator, mint_token
from idempotent.net.client import RemoteBroker
from idempotent.net.server import BrokerServer
from idempotent.net.tls import client_context, server_context
from idempotent.testing.certs import CertFiles, make_certs

from ..conftest import memory_harness

SECRET = b"0123456789abcdef0123456789abcdef"
AUDIENCE = "idempotent-test"


def tok(sub: str, *roles: str, secret: bytes = SECRET, ttl: float = 300, now: float | None = None, **kw: Any) -> str:
    return mint_token(secret, sub, now=time.time() if now is None else now, ttl=ttl, roles=roles, **kw)


# Minted when the module is imported, long before some tests run in a slow suite: valid for a
# day (the expiry refusal uses a token of its own).
ALICE = tok("alice", audience=AUDIENCE, ttl=86_400)
MALLORY = tok("mallory", audience=AUDIENCE, ttl=86_400)
ROOT = tok("root", "admin", audience=AUDIENCE, ttl=86_400)


@pytest.fixture(scope="module")
def certs(tmp_path_factory: pytest.TempPathFactory) -> CertFiles:
    return make_certs(tmp_path_factory.mktemp("certs"))


def secure_server(certs: CertFiles, *, required: bool = True, client_ca: bool = False) -> BrokerServer:
    broker = memory_harness().open(BrokerConfig(maintenance_interval=0))
    guard = BrokerGuard(
        JWTAuthenticator.from_secret(SECRET, audience=AUDIENCE, required=required),
        AccessPolicy(),
        broker.producer_record,
    )
    context = server_context(certs.server_cert, certs.server_key, client_ca=certs.ca_cert if client_ca else None)
    return BrokerServer(
        broker, ssl_context=context, authenticator=guard.authenticate, authorizer=guard.authorize, claim=guard.claim
    ).start()


@pytest.fixture
def server(certs: CertFiles) -> Iterator[BrokerServer]:
    srv = secure_server(certs)
    try:
        yield srv
    finally:
        srv.close()


def connect(server: BrokerServer, certs: CertFiles, token: str | None, **kw: Any) -> RemoteBroker:
    return RemoteBroker(server.url, token=token, cafile=str(certs.ca_cert), **{"connect_timeout": 1, **kw})


def state(broker: Broker) -> Any:
    """Everything a request could change: registry, topics, stored records, settings."""
    backend = broker.backend
    topics = backend.list_topics()
    ends = {(t, p): backend.end_offset(t, p) for t, n in topics.items() for p in range(n)}
    producers = sorted(backend.load_producers(), key=lambda r: r.producer_id)
    return producers, topics, ends, backend.load_settings()


@pytest.fixture
def alice(server: BrokerServer, certs: CertFiles) -> Iterator[RemoteBroker]:
    with connect(server, certs, ALICE) as client:
        yield client


# -- authentication ----------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("token", "message"),
    [
        (None, "requires a token"),
        (tok("alice", secret=b"x" * 32, audience=AUDIENCE, ttl=86_400), "signature"),
        (tok("alice", audience=AUDIENCE, ttl=60, now=time.time() - 3600), "expired"),
        (tok("alice", audience="another-service", ttl=86_400), "audience"),
        (tok("alice", ttl=86_400), "'aud'"),  # no audience at all
        ("garbage", "malformed"),
    ],
    ids=["no-token", "bad-signature", "expired", "wrong-audience", "no-audience", "garbage"],
)
def test_connection_without_a_valid_token_is_refused(
    server: BrokerServer, certs: CertFiles, alice: RemoteBroker, token: str | None, message: str
) -> None:
    session = alice.init_producer("alice-job")  # an authenticated connection stays open across the refusals
    before = state(server.broker)
    with pytest.raises(AuthenticationError, match=message):
        connect(server, certs, token)
    assert state(server.broker) == before
    assert alice.produce("t", 0, session.producer_id, session.producer_epoch, 0, [b"x"]).outcome is Outcome.ACCEPTED
    assert alice.server_info["principal"] == "alice"


def test_requests_pipelined_behind_a_refused_hello_never_run(server: BrokerServer, certs: CertFiles) -> None:
    before = state(server.broker)
    hello = {"version": wire.PROTOCOL_VERSION, "token": "forged", "client": "raw"}
    frames = [
        wire.encode_request(1, "hello", hello),
        wire.encode_request(2, "create_topic", {"name": "sneaky", "partitions": 3}),
        wire.encode_request(3, "init_producer", {"producer_name": "sneaky"}),
        wire.encode_request(4, "set_deduplication", {"enabled": False}),
    ]
    context = client_context(certs.ca_cert)
    with (
        socket.create_connection(("127.0.0.1", server.port), timeout=5) as raw,
        context.wrap_socket(raw, server_hostname="127.0.0.1") as conn,
    ):
        conn.sendall(b"".join(frames))
        received = b""
        while chunk := conn.recv(65536):
            received += chunk
    decoder = wire.FrameDecoder()
    answers = [msgpack.unpackb(body) for body in decoder.feed(received)]
    assert len(answers) == 1 and answers[0][:2] == [wire.ERROR, 1]
    assert isinstance(wire.error_from_wire(answers[0][2]), AuthenticationError)
    assert state(server.broker) == before


def test_optional_tokens_let_anonymous_callers_use_only_unowned_producers(certs: CertFiles) -> None:
    server = secure_server(certs, required=False)
    try:
        legacy = server.broker.init_producer("legacy")  # created in-process: unowned
        with connect(server, certs, None) as anonymous, connect(server, certs, ALICE) as alice:
            assert anonymous.server_info["principal"] is None
            again = anonymous.init_producer("legacy")
            assert again.producer_epoch == legacy.producer_epoch + 1
            mine = alice.init_producer("alice-job")
            with pytest.raises(AuthorizationError):
                anonymous.init_producer("alice-job")
            with pytest.raises(AuthorizationError):
                anonymous.produce("t", 0, mine.producer_id, mine.producer_epoch, 0, [b"x"])
            with pytest.raises(AuthorizationError):
                alice.init_producer("legacy")  # unowned names are not adopted unless the broker allows it
            with pytest.raises(AuthorizationError):
                anonymous.set_deduplication(False)
            with pytest.raises(AuthenticationError, match="signature"):
                connect(server, certs, tok("alice", secret=b"y" * 32, audience=AUDIENCE))
    finally:
        server.close()


# -- producer names and ids --------------------------------------------------------------------


def test_another_principals_producer_name_cannot_be_initialised_or_fenced(
    server: BrokerServer, certs: CertFiles, alice: RemoteBroker
) -> None:
    mine = alice.init_producer("orders")
    assert alice.produce("t", 0, mine.producer_id, mine.producer_epoch, 0, [b"a"]).outcome is Outcome.ACCEPTED
    before = state(server.broker)
    with connect(server, certs, MALLORY) as mallory:
        with pytest.raises(AuthorizationError, match="'orders'"):
            mallory.init_producer("orders")
        assert state(server.broker) == before
        # alice was not fenced: her instance goes on with the same epoch
        assert alice.produce("t", 0, mine.producer_id, mine.producer_epoch, 1, [b"b"]).outcome is Outcome.ACCEPTED
        theirs = mallory.init_producer("mallory-orders")
        assert (r := server.broker.producer_record(theirs.producer_id)) is not None and r.principal == "mallory"
    record = server.broker.producer_record(mine.producer_id)
    assert record is not None and (record.principal, record.producer_epoch) == ("alice", mine.producer_epoch)
    again = alice.init_producer("orders")  # the owner may re-initialise (and so fence itself)
    assert again.producer_epoch == mine.producer_epoch + 1 and dict(again.last_sequences) == {("t", 0): 1}


def test_another_principals_producer_id_cannot_produce(
    server: BrokerServer, certs: CertFiles, alice: RemoteBroker
) -> None:
    named = alice.init_producer("alice-job")
    anonymous = alice.init_producer()
    alice.produce("t", 0, named.producer_id, named.producer_epoch, 0, [b"a"])
    before = state(server.broker)
    with connect(server, certs, MALLORY) as mallory:
        for session in (named, anonymous):
            for epoch, sequence in ((session.producer_epoch, 0), (session.producer_epoch, 1), (0, 5)):
                with pytest.raises(AuthorizationError, match=f"producer id {session.producer_id}"):
                    mallory.produce("t", 0, session.producer_id, epoch, sequence, [b"forged"])
        unknown = mallory.produce("t", 0, 10**9, 0, 0, [b"x"])
        assert unknown.outcome is Outcome.UNKNOWN_PRODUCER
        assert state(server.broker) == before
    assert alice.produce("t", 0, anonymous.producer_id, 0, 0, [b"b"]).outcome is Outcome.ACCEPTED
    assert [r.value for r in alice.read("t", 0)] == [b"a", b"b"]


def test_admin_may_use_every_producer_and_the_owner_stays(
    server: BrokerServer, certs: CertFiles, alice: RemoteBroker
) -> None:
    mine = alice.init_producer("orders")
    with connect(server, certs, ROOT) as root:
        took = root.init_producer("orders")  # e.g. to fence a runaway instance
        assert took.producer_id == mine.producer_id and took.producer_epoch == mine.producer_epoch + 1
        assert root.produce("t", 0, took.producer_id, took.producer_epoch, 0, [b"r"]).outcome is Outcome.ACCEPTED
        own = root.init_producer()
    assert alice.produce("t", 0, mine.producer_id, mine.producer_epoch, 0, [b"x"]).outcome is Outcome.FENCED
    assert (r := server.broker.producer_record(mine.producer_id)) is not None and r.principal == "alice"
    assert (r := server.broker.producer_record(own.producer_id)) is not None and r.principal == "root"


# -- admin operations --------------------------------------------------------------------------


def test_admin_operations_need_the_admin_role(server: BrokerServer, certs: CertFiles, alice: RemoteBroker) -> None:
    alice.partitions_for("t")  # auto-creation with the default count is open to everyone
    before = state(server.broker)
    refusals = [
        lambda: alice.set_deduplication(False, topic="t"),
        lambda: alice.set_deduplication(False),
        lambda: alice.set_policy("monotonic", namespace="default"),
        lambda: alice.stats(),
        lambda: alice.stats("t"),
        lambda: alice.create_topic("big", 64),
    ]
    for refused in refusals:
        with pytest.raises(AuthorizationError, match="'admin' role"):
            refused()
    assert state(server.broker) == before
    assert alice.topics() == {"t": 1} and alice.end_offset("t", 0) == 0  # the rest is open
    with connect(server, certs, ROOT) as root:
        root.set_deduplication(False, topic="t")
        root.set_policy("monotonic", topic="t")
        root.create_topic("big", 4)
        assert [s.topic for s in root.stats()] == ["big"] * 4 + ["t"]
    assert server.broker.deduplication_enabled("t") is False


# -- end to end --------------------------------------------------------------------------------


def test_producer_over_tls_with_a_token_resumes_and_is_refused_to_others(
    server: BrokerServer, certs: CertFiles
) -> None:
    with connect(server, certs, ALICE) as link, Producer(link, producer_name="copy-job") as producer:
        metas = [producer.send("events", f"v{i}".encode(), partition=0).result(10) for i in range(5)]
    assert [m.offset for m in metas] == list(range(5))
    with connect(server, certs, ALICE) as link, Producer(link, producer_name="copy-job") as producer:
        assert producer.last_sequence("events", 0) == 4
    with connect(server, certs, MALLORY) as link, pytest.raises(AuthorizationError):
        Producer(link, producer_name="copy-job")


# -- TLS ---------------------------------------------------------------------------------------


def test_plain_and_tls_mismatches_fail_cleanly(server: BrokerServer, certs: CertFiles, alice: RemoteBroker) -> None:
    with pytest.raises(BrokerConnectionError):
        RemoteBroker(f"idem://{server.address}", token=ALICE, connect_timeout=0.3)
    with BrokerServer(memory_harness().open()) as plain:
        with pytest.raises(ConfigError, match="does not speak TLS"):
            RemoteBroker(f"idems://{plain.address}", cafile=str(certs.ca_cert), connect_timeout=5)
        with RemoteBroker(plain.url) as ok:
            assert ok.topics() == {}
    with pytest.raises(ConfigError, match="TLS verification"):
        RemoteBroker(server.url, token=ALICE, connect_timeout=1)  # the system store does not know the test CA
    assert alice.topics() == {}


def test_client_certificates_when_the_server_requires_them(certs: CertFiles) -> None:
    server = secure_server(certs, client_ca=True)
    try:
        with connect(server, certs, ALICE, certfile=str(certs.client_cert), keyfile=str(certs.client_key)) as ok:
            assert ok.server_info["principal"] == "alice"
        with pytest.raises(BrokerConnectionError):
            connect(server, certs, ALICE, connect_timeout=0.3)
    finally:
        server.close()


# -- command line ------------------------------------------------------------------------------


def test_broker_command_serves_tls_with_token_authentication(certs: CertFiles, tmp_path: Path) -> None:
    (tmp_path / "secret").write_bytes(SECRET + b"\n")
    ready = tmp_path / "ready"
    root = Path(__file__).resolve().parents[2]
    command = [
        sys.executable,
        "-m",
        "idempotent",
        "broker",
        "--backend",
        f"sqlite:///{tmp_path / 'log.db'}",
        "--listen",
        "127.0.0.1:0",
        "--tls-cert",
        str(certs.server_cert),
        "--tls-key",
        str(certs.server_key),
        "--auth-jwt-secret-file",
        str(tmp_path / "secret"),
        "--auth-audience",
        AUDIENCE,
        "--ready-file",
        str(ready),
    ]
    env = {**os.environ, "PYTHONPATH": f"{root}{os.pathsep}{os.environ.get('PYTHONPATH', '')}"}
    proc = subprocess.Popen(command, env=env, stderr=subprocess.PIPE, text=True)
    try:
        deadline = time.monotonic() + 30
        while not (ready.exists() and ready.read_text().endswith("\n")):
            assert proc.poll() is None, proc.stderr.read() if proc.stderr else ""
            assert time.monotonic() < deadline
            time.sleep(0.05)
        url = f"idems://{ready.read_text().strip()}"
        with RemoteBroker(url, token=ALICE, cafile=str(certs.ca_cert)) as alice:
            session = alice.init_producer("cli-job")
            assert (
                alice.produce("t", 0, session.producer_id, session.producer_epoch, 0, [b"x"]).outcome
                is Outcome.ACCEPTED
            )
            with pytest.raises(AuthorizationError):
                alice.stats()
        with pytest.raises(AuthenticationError):
            RemoteBroker(url, cafile=str(certs.ca_cert))
        with RemoteBroker(url, token=MALLORY, cafile=str(certs.ca_cert)) as mallory, pytest.raises(AuthorizationError):
            mallory.init_producer("cli-job")
    finally:
        proc.terminate()
        proc.wait(30)
    with idempotent.connect(f"sqlite:///{tmp_path / 'log.db'}") as broker:
        assert [(r.producer_name, r.principal) for r in broker.backend.load_producers()] == [("cli-job", "alice")]


def test_broker_command_auth_options_need_a_key(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    from idempotent import cli

    url = f"sqlite:///{tmp_path / 'log.db'}"
    assert cli.main(["broker", "--backend", url, "--auth-optional"]) == 2
    assert "--auth-jwt-secret-file" in capsys.readouterr().err
    (tmp_path / "short").write_bytes(b"short")
    assert cli.main(["broker", "--backend", url, "--auth-jwt-secret-file", str(tmp_path / "short")]) == 2
    assert "at least 32 bytes" in capsys.readouterr().err


def test_clients_take_token_and_tls_files_from_the_environment(
    server: BrokerServer, certs: CertFiles, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("IDEMPOTENT_TLS_CA", str(certs.ca_cert))
    (tmp_path / "token").write_text(ROOT + "\n")
    monkeypatch.setenv("IDEMPOTENT_TOKEN_FILE", str(tmp_path / "token"))
    with idempotent.connect(server.url) as root:
        assert root.server_info["principal"] == "root"  # type: ignore[attr-defined]
        assert root.stats() == []
    monkeypatch.setenv("IDEMPOTENT_TOKEN", ALICE)  # wins over the file
    with Producer(server.url, producer_name="env-job") as producer:
        assert producer.send("events", b"x", partition=0).result(10).offset == 0
    assert (r := server.broker.producer_record(0)) is not None and r.principal == "alice"
    monkeypatch.delenv("IDEMPOTENT_TOKEN")
    monkeypatch.setenv("IDEMPOTENT_TOKEN_FILE", str(tmp_path / "missing"))
    with pytest.raises(ConfigError, match="IDEMPOTENT_TOKEN_FILE"):
        RemoteBroker(server.url)
    monkeypatch.delenv("IDEMPOTENT_TOKEN_FILE")
    with pytest.raises(AuthenticationError):
        RemoteBroker(server.url, connect_timeout=1)


def test_admin_command_needs_an_admin_token(
    server: BrokerServer, certs: CertFiles, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    from idempotent import cli

    server.broker.create_topic("t", 1)
    monkeypatch.setenv("IDEMPOTENT_TLS_CA", str(certs.ca_cert))
    monkeypatch.setenv("IDEMPOTENT_TOKEN", ALICE)
    before = state(server.broker)
    assert cli.main(["admin", "--url", server.url, "set-deduplication", "t", "--disable"]) == 1
    assert cli.main(["admin", "--url", server.url, "stats", "t"]) == 1
    assert "'admin' role" in capsys.readouterr().err
    assert state(server.broker) == before
    monkeypatch.setenv("IDEMPOTENT_TOKEN", ROOT)
    assert cli.main(["admin", "--url", server.url, "set-deduplication", "t", "--disable"]) == 0
    assert server.broker.deduplication_enabled("t") is False


# -- long tokens, and refusals that never show a credential ------------------------------------


def groups_token(size: int, sub: str = "alice", **kw: Any) -> str:
    """A valid token of about ``size`` characters: an identity provider's token with many groups."""
    roles = [f"group-{i:05d}-{'x' * 20}" for i in range(size // 44)]
    return tok(sub, *roles, audience=AUDIENCE, ttl=86_400, **kw)


@pytest.mark.parametrize("size", [5_000, 7_000, 15_000])
def test_a_valid_token_longer_than_4096_characters_logs_in(server: BrokerServer, certs: CertFiles, size: int) -> None:
    """Regression: the hello argument check applied the generic 4,096-character string limit
    to the token, so such a token could never log in (docs/security.md allows 16 KiB)."""
    token = groups_token(size)
    assert 4096 < len(token) <= 16 * 1024
    with connect(server, certs, token) as client:
        assert client.server_info["principal"] == "alice"
        assert client.init_producer("alice-groups").producer_epoch == 0


def _traces_of(token: str) -> list[str]:
    """Pieces of ``token`` that must not appear anywhere: its start, and a window of 24
    characters every 12 (so any echo of 24 characters or more is found)."""
    return [token[:24], *(token[i : i + 24] for i in range(0, max(1, len(token) - 23), 12))]


def _assert_never_shown(token: str, texts: list[str]) -> None:
    pieces = _traces_of(token)
    for text in texts:
        for piece in pieces:
            assert piece not in text, f"the token shows in {text[:200]!r}"


def _refusal_texts(exc: BaseException) -> list[str]:
    """Everything an exception could show: its message, repr, args and the whole chain."""
    return [str(exc), repr(exc), *map(repr, exc.args), "".join(traceback.format_exception(exc))]


def _noise(length: int) -> str:
    return "".join(random.Random(length).choices(string.ascii_letters + string.digits, k=length))


IN_A_DAY = time.time() + 86_400

#: every refusal of a token that can be triggered: (token, what the message says). Minted at
#: import, so every token that is not meant to expire is valid for a day, as ALICE is.
REFUSED_TOKENS = [
    (tok("alice", secret=b"y" * 32, audience=AUDIENCE, ttl=86_400), "signature"),
    (tok("alice", audience=AUDIENCE, ttl=60, now=time.time() - 3600), "expired"),
    (tok("alice", audience="another-service", ttl=86_400), "audience"),
    (tok("alice", ttl=86_400), "'aud'"),
    (jwt.encode({"sub": "alice", "aud": AUDIENCE, "exp": IN_A_DAY}, None, algorithm="none"), "algorithm"),
    (jwt.encode({"aud": AUDIENCE, "exp": IN_A_DAY}, SECRET, algorithm="HS256"), "'sub'"),
    (jwt.encode({"sub": "alice", "aud": AUDIENCE}, SECRET, algorithm="HS256"), "'exp'"),
    (jwt.encode({"sub": "al\nice", "aud": AUDIENCE, "exp": IN_A_DAY}, SECRET, algorithm="HS256"), "control"),
    (jwt.encode({"sub": "alice", "aud": AUDIENCE, "exp": IN_A_DAY, "nbf": time.time() + 3600}, SECRET), "yet"),
    (
        jwt.encode({"sub": "alice", "aud": AUDIENCE, "exp": IN_A_DAY, "iat": time.time() + 3600}, SECRET),
        "future",
    ),
    (jwt.encode({"sub": "alice", "aud": AUDIENCE, "exp": IN_A_DAY, "roles": [1]}, SECRET), "list of strings"),
    (jwt.encode({"sub": "alice", "aud": AUDIENCE, "exp": "tomorrow"}, SECRET, algorithm="HS256"), "number"),
    ("garbage-" + _noise(200), "malformed"),
    (groups_token(17_000), "16384"),  # validly signed, and longer than any token is taken
    ("x" + _noise(5_000), "malformed"),  # longer than 4,096: the generic string limit echoed 77 characters
]


def test_no_refusal_shows_the_token_in_process_or_over_the_wire(
    server: BrokerServer, certs: CertFiles, caplog: pytest.LogCaptureFixture
) -> None:
    """Regression: the refusal of a token longer than 4,096 characters repeated its first 77
    characters (docs/security.md: a refusal never contains the token). Every refusal that
    can be triggered, through the authenticator in process and through the broker server,
    with every message, repr, traceback and log line scanned for the token."""
    caplog.set_level(logging.DEBUG)
    authenticator = JWTAuthenticator.from_secret(SECRET, audience=AUDIENCE)
    guard = BrokerGuard(authenticator, AccessPolicy(), server.broker.producer_record)
    texts: dict[str, list[str]] = {}
    refusals: list[tuple[str, BaseException]] = []
    for token, message in REFUSED_TOKENS:
        for refuse in (
            lambda t: authenticator.authenticate(t, time.time()),
            guard.authenticate,
            lambda t: connect(server, certs, t),
        ):
            with pytest.raises(ProducerError) as info:
                refuse(token)
            texts.setdefault(token, []).extend(_refusal_texts(info.value))
            refusals.append((message, info.value))
    logged = [
        r.getMessage() + (logging.Formatter().formatException(r.exc_info) if r.exc_info else "") for r in caplog.records
    ]
    for token, shown in texts.items():
        _assert_never_shown(token, shown + logged)
    for message, error in refusals:
        assert isinstance(error, AuthenticationError) and message in str(error), (message, error)


@pytest.mark.parametrize("kind", [bytes, list, dict])
def test_a_token_of_the_wrong_type_is_refused_without_showing_it(
    server: BrokerServer, certs: CertFiles, kind: type, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.DEBUG)
    secret = ALICE
    value: object = {
        bytes: secret.encode(),
        list: [secret],
        dict: {secret: secret},
    }[kind]
    hello = {"version": wire.PROTOCOL_VERSION, "token": value, "client": "raw"}
    context = client_context(certs.ca_cert)
    with (
        socket.create_connection(("127.0.0.1", server.port), timeout=5) as raw,
        context.wrap_socket(raw, server_hostname="127.0.0.1") as conn,
    ):
        conn.sendall(wire.encode_request(1, "hello", hello))
        received = b""
        while chunk := conn.recv(65536):
            received += chunk
    [answer] = [msgpack.unpackb(body) for body in wire.FrameDecoder().feed(received)]
    error = wire.error_from_wire(answer[2])
    shown = [*_refusal_texts(error), *(r.getMessage() for r in caplog.records)]
    _assert_never_shown(secret, shown)
    assert isinstance(error, AuthenticationError) and "token" in str(error)


def test_an_authenticator_that_fails_unexpectedly_does_not_show_the_token(caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.DEBUG)

    def authenticate(token: str | None) -> object:
        raise ValueError(f"no such token: {token}")  # a custom hook that repeats what it got

    broker = memory_harness().open(BrokerConfig(maintenance_interval=0))
    with BrokerServer(broker, authenticator=authenticate) as srv, pytest.raises(AuthenticationError) as info:
        RemoteBroker(srv.url, token=ALICE, connect_timeout=1)
    shown = [*_refusal_texts(info.value), *(r.getMessage() for r in caplog.records)]
    _assert_never_shown(ALICE, shown)
    assert "ValueError" in str(info.value)
    # the hook's failure is a bug: logged at ERROR, by its type only
    assert any(r.levelno == logging.ERROR and "ValueError" in r.getMessage() for r in caplog.records)
