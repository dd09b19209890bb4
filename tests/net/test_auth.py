"""Authentication (JWT) and the pure authorization policy (idempotent/net/auth.py)."""

from __future__ import annotations

import base64
import json
import time
from pathlib import Path
from typing import Any

import jwt
import pytest
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import ec, ed25519, rsa
from hypothesis import given, settings
from hypothesis import strategies as st

import idempotent
from idempotent.broker.broker import BrokerConfig
from idempotent.core.registry import ProducerRecord
from idempotent.errors import AuthenticationError, AuthorizationError, ConfigError
from idempotent.net.auth import (
    ANONYMOUS,
    OPEN,
    Access,
    AccessPolicy,
    AllowAll,
    Authenticator,
    JWTAuthenticator,
    Principal,
    mint_token,
)

SECRET = b"s" * 32
NOW = 1_700_000_000.0


def hs(**options: Any) -> JWTAuthenticator:
    return JWTAuthenticator.from_secret(SECRET, **options)


def token(claims: dict[str, Any], key: Any = SECRET, algorithm: str = "HS256") -> str:
    return jwt.encode(claims, key, algorithm=algorithm)


def claims(**extra: Any) -> dict[str, Any]:
    return {"sub": "alice", "exp": NOW + 600, **extra}


def refused(auth: Authenticator, tok: str | None, now: float = NOW) -> str:
    with pytest.raises(AuthenticationError) as info:
        auth.authenticate(tok, now)
    assert not tok or tok not in str(info.value)  # a token never ends up in a message or log
    return str(info.value)


# -- JWT ---------------------------------------------------------------------------------------


def test_valid_token_gives_its_subject_roles_and_expiry() -> None:
    principal = hs().authenticate(token(claims(roles=["admin", "ops"])), NOW)
    assert principal == Principal("alice", frozenset({"admin", "ops"}), NOW + 600)
    assert principal.authenticated and str(principal) == "alice"
    assert hs().authenticate(token(claims()), NOW).roles == frozenset()


def test_missing_token_is_refused_unless_tokens_are_optional() -> None:
    assert "requires a token" in refused(hs(), None)
    assert "requires a token" in refused(hs(), "")
    assert hs(required=False).authenticate(None, NOW) is ANONYMOUS
    # an optional token that is present must still be valid
    assert "signature" in refused(hs(required=False), token(claims(), b"x" * 32))


def test_bad_signature_and_garbage_are_refused() -> None:
    assert "signature" in refused(hs(), token(claims(), b"another secret that is long enough!"))
    good = token(claims())
    header, _, signature = good.split(".")
    forged = base64.urlsafe_b64encode(json.dumps(claims(sub="mallory")).encode()).rstrip(b"=").decode()
    assert "signature" in refused(hs(), f"{header}.{forged}.{signature}")
    assert "malformed" in refused(hs(), "not-a-token")
    assert "at most" in refused(hs(), "x" * 20_000)


def test_unsigned_and_other_algorithm_tokens_are_refused() -> None:
    unsigned = jwt.encode(claims(), None, algorithm="none")
    assert "algorithm" in refused(hs(), unsigned)
    long_secret = b"L" * 64
    auth = JWTAuthenticator.from_secret(long_secret)
    assert "algorithm" in refused(auth, token(claims(), long_secret, "HS512"))
    both = JWTAuthenticator.from_secret(long_secret, ("HS256", "HS512"))
    assert both.authenticate(token(claims(), long_secret, "HS512"), NOW).name == "alice"


def test_expiry_and_not_before_with_leeway() -> None:
    auth = hs(leeway=30)
    assert auth.authenticate(token(claims(exp=NOW - 29)), NOW).name == "alice"  # inside the leeway
    assert "expired" in refused(auth, token(claims(exp=NOW - 30)))
    assert "expired" in refused(hs(leeway=0), token(claims(exp=NOW)))
    assert auth.authenticate(token(claims(nbf=NOW + 30)), NOW).name == "alice"
    assert "not valid yet" in refused(auth, token(claims(nbf=NOW + 31)))
    assert "future" in refused(auth, token(claims(iat=NOW + 31)))
    assert "must be a number" in refused(auth, token(claims(exp="tomorrow")))
    assert "must be a number" in refused(auth, token(claims(exp=True)))


def test_required_claims() -> None:
    assert "'exp'" in refused(hs(), token({"sub": "alice"}))
    assert hs(require_exp=False).authenticate(token({"sub": "alice"}), NOW).expires_at is None
    assert "'sub'" in refused(hs(), token({"exp": NOW + 60}))
    assert "control" in refused(hs(), token(claims(sub="al\nice")))
    assert "characters" in refused(hs(), token(claims(sub="a" * 257)))


def test_audience_and_issuer() -> None:
    auth = hs(audience="idempotent", issuer="https://issuer.example")
    ok = claims(aud=["other", "idempotent"], iss="https://issuer.example")
    assert auth.authenticate(token(ok), NOW).name == "alice"
    assert "audience" in refused(auth, token({**ok, "aud": "other"}))
    assert "'aud'" in refused(auth, token(claims(iss="https://issuer.example")))
    assert "issuer" in refused(auth, token({**ok, "iss": "https://evil.example"}))
    # a token meant for some audience is refused by a broker that expects none
    assert "audience" in refused(hs(), token(claims(aud="idempotent")))


def test_roles_claim_paths_and_forms() -> None:
    auth = hs(roles_claim="realm_access.roles")
    assert auth.authenticate(token(claims(realm_access={"roles": ["admin"]})), NOW).roles == {"admin"}
    assert auth.authenticate(token(claims(roles=["admin"])), NOW).roles == frozenset()
    assert hs(roles_claim="scope").authenticate(token(claims(scope="read admin")), NOW).roles == {"read", "admin"}
    assert "list of strings" in refused(hs(), token(claims(roles=[1, 2])))
    assert "list of strings" in refused(hs(), token(claims(roles={"admin": True})))


def _pem(private: Any) -> tuple[bytes, bytes]:
    public = private.public_key().public_bytes(
        serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo
    )
    secret = private.private_bytes(
        serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()
    )
    return public, secret


@pytest.mark.parametrize(
    ("make_key", "algorithm"),
    [
        (lambda: rsa.generate_private_key(65537, 2048), "RS256"),
        (lambda: ec.generate_private_key(ec.SECP256R1()), "ES256"),
        (lambda: ed25519.Ed25519PrivateKey.generate(), "EdDSA"),
    ],
)
def test_public_key_tokens(make_key: Any, algorithm: str, tmp_path: Path) -> None:
    public, private = _pem(make_key())
    (tmp_path / "key.pub").write_bytes(public)
    auth = JWTAuthenticator.from_public_key_file(tmp_path / "key.pub")
    assert algorithm in auth.algorithms
    assert auth.authenticate(mint_token(private, "carol", now=NOW, algorithm=algorithm), NOW).name == "carol"
    _, other = _pem(make_key())
    assert "signature" in refused(auth, mint_token(other, "carol", now=NOW, algorithm=algorithm))
    # algorithm confusion: an HMAC token "signed" with the public key text must not pass
    assert "algorithm" in refused(auth, jwt.encode(claims(), b"k" * 32, algorithm="HS256"))


def test_authenticator_configuration_errors(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="at least 32 bytes"):
        JWTAuthenticator.from_secret(b"short")
    with pytest.raises(ConfigError, match="at least 64 bytes"):
        JWTAuthenticator.from_secret(SECRET, ("HS512",))
    with pytest.raises(ConfigError, match="shared secret"):
        JWTAuthenticator.from_secret(SECRET, ("RS256",))
    with pytest.raises(ConfigError, match="algorithms"):
        JWTAuthenticator(SECRET, ("none",))
    with pytest.raises(ConfigError, match="mix"):
        JWTAuthenticator(SECRET, ("HS256", "RS256"))
    with pytest.raises(ConfigError, match="leeway"):
        hs(leeway=-1)
    with pytest.raises(ConfigError, match="cannot read"):
        JWTAuthenticator.from_secret_file(tmp_path / "missing")
    (tmp_path / "secret").write_bytes(SECRET + b"\n")
    assert JWTAuthenticator.from_secret_file(tmp_path / "secret").authenticate(token(claims()), NOW).name == "alice"
    with pytest.raises(ConfigError, match="public key"):
        JWTAuthenticator.from_public_key(b"-----BEGIN PUBLIC KEY-----\nnope\n-----END PUBLIC KEY-----\n")
    public, _ = _pem(ec.generate_private_key(ec.SECP256R1()))
    with pytest.raises(ConfigError, match="verifies only"):
        JWTAuthenticator.from_public_key(public, ("RS256",))


def test_mint_token_round_trip_and_errors() -> None:
    tok = mint_token(SECRET, "dave", now=NOW, ttl=60, roles=["admin"], audience="a", issuer="i", roles_claim="x.roles")
    decoded = jwt.decode(tok, SECRET, algorithms=["HS256"], audience="a", options={"verify_exp": False})
    assert decoded == {
        "sub": "dave",
        "iat": int(NOW),
        "exp": int(NOW + 60),
        "aud": "a",
        "iss": "i",
        "x": {"roles": ["admin"]},
    }
    auth = hs(audience="a", issuer="i", roles_claim="x.roles")
    assert auth.authenticate(tok, NOW + 59) == Principal("dave", frozenset({"admin"}), NOW + 60)
    with pytest.raises(ConfigError):
        mint_token(SECRET, "", now=NOW)
    with pytest.raises(ConfigError):
        mint_token(SECRET, "dave", now=NOW, ttl=0)
    with pytest.raises(ConfigError):
        mint_token(b"not a pem key", "dave", now=NOW, algorithm="RS256")


def test_allow_all_and_protocol() -> None:
    assert AllowAll().authenticate("anything", NOW) is OPEN
    assert isinstance(AllowAll(), Authenticator) and isinstance(hs(), Authenticator)


# -- the policy --------------------------------------------------------------------------------

ALICE = Principal("alice", frozenset())
MALLORY = Principal("mallory", frozenset())
ADMIN = Principal("root", frozenset({"admin"}))
POLICY = AccessPolicy()


def rec(owner: str | None, name: str | None = "job") -> ProducerRecord:
    return ProducerRecord(7, 1, name, principal=owner)  # type: ignore[arg-type]


@pytest.mark.parametrize(
    ("operation", "access"),
    [
        ("topics", Access.ANY),
        ("read", Access.ANY),
        ("ping", Access.ANY),
        ("metadata", Access.ANY),
        ("partitions_for", Access.ANY),
        ("end_offset", Access.ANY),
        ("create_topic", Access.ADMIN),
        ("init_producer", Access.PRODUCER_NAME),
        ("produce", Access.PRODUCER_ID),
        ("last_sequence", Access.PRODUCER_ID),
        ("stats", Access.ADMIN),
        ("set_deduplication", Access.ADMIN),
        ("set_policy", Access.ADMIN),
        ("some_future_operation", Access.ADMIN),
    ],
)
def test_operation_rules(operation: str, access: Access) -> None:
    assert POLICY.access(operation) is access
    assert POLICY.check(ADMIN, operation) is access
    assert POLICY.check(OPEN, operation) is access
    if access is Access.ADMIN:
        for who in (ALICE, ANONYMOUS):
            with pytest.raises(AuthorizationError, match="'admin' role"):
                POLICY.check(who, operation)
    else:
        assert POLICY.check(ALICE, operation) is access and POLICY.check(ANONYMOUS, operation) is access


def test_admin_role_name_and_rules_are_configurable() -> None:
    policy = AccessPolicy({"read": Access.ADMIN}, admin_role="operator")
    with pytest.raises(AuthorizationError):
        policy.check(ADMIN, "read")  # "admin" is not the admin role here
    assert policy.check(Principal("op", frozenset({"operator"})), "read") is Access.ADMIN
    with pytest.raises(AuthorizationError):
        policy.check(ALICE, "topics")  # not listed any more: admin only


@pytest.mark.parametrize(
    ("who", "previous", "adopt", "owner"),
    [
        (ALICE, None, False, "alice"),  # a new name (or anonymous producer) is the caller's
        (ALICE, rec("alice"), False, "alice"),  # re-initialising one's own name
        (MALLORY, rec("alice"), False, AuthorizationError),  # fencing another's producer
        (ALICE, rec(None), False, AuthorizationError),  # unowned legacy name
        (ALICE, rec(None), True, "alice"),  # ... adopted when allowed
        (MALLORY, rec("alice"), True, AuthorizationError),  # adoption is only for unowned names
        (ANONYMOUS, rec(None), False, None),  # anonymous callers share the unowned names
        (ANONYMOUS, rec("alice"), True, AuthorizationError),
        (ANONYMOUS, None, False, None),
        (ADMIN, rec("alice"), False, "alice"),  # the admin may, and the owner stays
        (ADMIN, rec(None), True, None),
        (ADMIN, None, False, "root"),
        (OPEN, rec("alice"), False, "alice"),  # no authentication: nothing refused, nothing changed
        (OPEN, None, False, None),
    ],
)
def test_claim(who: Principal, previous: ProducerRecord | None, adopt: bool, owner: Any) -> None:
    policy = AccessPolicy(adopt_unowned=adopt)
    if owner is AuthorizationError:
        with pytest.raises(AuthorizationError, match="'job'"):
            policy.claim(who, "job", previous)
    else:
        assert policy.claim(who, "job", previous) == owner


@pytest.mark.parametrize(
    ("who", "record", "allowed"),
    [
        (ALICE, rec("alice", None), True),
        (MALLORY, rec("alice", None), False),
        (MALLORY, rec("alice"), False),
        (ALICE, rec(None), False),
        (ANONYMOUS, rec(None), True),
        (ANONYMOUS, rec("alice"), False),
        (ADMIN, rec("alice"), True),
        (OPEN, rec("alice"), True),
        (MALLORY, None, True),  # unknown ids: the broker answers UNKNOWN_PRODUCER itself
    ],
)
def test_check_producer(who: Principal, record: ProducerRecord | None, allowed: bool) -> None:
    if allowed:
        POLICY.check_producer(who, 7, record)
    else:
        with pytest.raises(AuthorizationError, match="producer id 7"):
            POLICY.check_producer(who, 7, record)


def test_claim_through_the_broker_changes_nothing_when_refused() -> None:
    broker = idempotent.connect("memory://")
    try:
        mine = broker.init_producer("job", claim=lambda prev: POLICY.claim(ALICE, "job", prev))
        before = broker.producer_record(mine.producer_id)
        with pytest.raises(AuthorizationError):
            broker.init_producer("job", claim=lambda prev: POLICY.claim(MALLORY, "job", prev))
        assert broker.producer_record(mine.producer_id) == before
        assert broker.backend.load_producers() == [before]
        again = broker.init_producer("job", claim=lambda prev: POLICY.claim(ALICE, "job", prev))
        assert (again.producer_id, again.producer_epoch) == (mine.producer_id, mine.producer_epoch + 1)
        admin = broker.init_producer("job", claim=lambda prev: POLICY.claim(ADMIN, "job", prev))
        record = broker.producer_record(admin.producer_id)
        assert record is not None and before is not None
        assert record.last_used >= before.last_used  # every init marks the producer as used
        assert record == attrs_evolve(before, producer_epoch=mine.producer_epoch + 2, last_used=record.last_used)
    finally:
        broker.close()


def attrs_evolve(record: ProducerRecord | None, **changes: Any) -> ProducerRecord:
    import attrs

    assert record is not None
    return attrs.evolve(record, **changes)


def test_token_command_signs_what_the_authenticator_accepts(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    import time

    from idempotent import cli

    (tmp_path / "secret").write_bytes(SECRET + b"\n")
    argv = ["token", "--secret-file", str(tmp_path / "secret"), "--sub", "ops", "--role", "admin", "--ttl", "120"]
    assert cli.main([*argv, "--audience", "brokers"]) == 0
    tok = capsys.readouterr().out.strip()
    principal = JWTAuthenticator.from_secret_file(tmp_path / "secret", audience="brokers").authenticate(
        tok, time.time()
    )
    assert principal.name == "ops" and principal.roles == {"admin"}
    assert principal.expires_at is not None and 100 < principal.expires_at - time.time() <= 120
    _, private = _pem(ec.generate_private_key(ec.SECP256R1()))
    (tmp_path / "key.pem").write_bytes(private)
    assert cli.main(["token", "--private-key", str(tmp_path / "key.pem"), "--algorithm", "ES256", "--sub", "x"]) == 0
    assert jwt.get_unverified_header(capsys.readouterr().out.strip())["alg"] == "ES256"
    assert cli.main(["token", "--secret-file", str(tmp_path / "secret"), "--sub", "x", "--algorithm", "RS256"]) == 2
    assert cli.main(["token", "--secret-file", str(tmp_path / "missing"), "--sub", "x"]) == 2
    assert cli.main(["token", "--secret-file", str(tmp_path / "secret"), "--sub", ""]) == 2
    assert capsys.readouterr().out == ""


PRINCIPALS = [ALICE, MALLORY, ANONYMOUS, ADMIN]


def model_owner(who: Principal, previous: ProducerRecord | None, adopt: bool) -> str | type[AuthorizationError] | None:
    """What ``claim`` must answer, written out independently of the policy's code."""
    if previous is None:
        return who.name
    if "admin" in who.roles:
        return previous.principal
    if previous.principal == who.name:
        return who.name
    if previous.principal is None and adopt and who.name is not None:
        return who.name
    return AuthorizationError


@settings(max_examples=60, deadline=None)
@given(
    steps=st.lists(
        st.tuples(st.sampled_from(PRINCIPALS), st.sampled_from(["a", "b", None]), st.booleans(), st.integers(0, 50)),
        max_size=25,
    ),
    adopt=st.booleans(),
)
def test_owners_never_change_and_refusals_follow_the_owner(
    steps: list[tuple[Principal, str | None, bool, int]], adopt: bool
) -> None:
    """Against a real broker: a producer's owner is fixed at creation, a non-admin is refused
    exactly when the record belongs to someone else, and a refusal changes nothing."""
    policy = AccessPolicy(adopt_unowned=adopt)
    broker = idempotent.connect("memory://", BrokerConfig(maintenance_interval=0))
    try:
        legacy = broker.init_producer("b")  # unowned, as if created before authentication
        owners: dict[int, str | None] = {legacy.producer_id: None}
        for who, name, produce, pick in steps:
            before = broker.backend.load_producers()
            if produce:
                pid = sorted(owners)[pick % len(owners)]
                allowed = "admin" in who.roles or owners[pid] == who.name
                try:
                    policy.check_producer(who, pid, broker.producer_record(pid))
                    assert allowed
                except AuthorizationError:
                    assert not allowed
                continue
            previous = next((r for r in before if name is not None and r.producer_name == name), None)
            expected = model_owner(who, previous, adopt)
            try:
                session = broker.init_producer(name, claim=lambda prev, w=who, n=name: policy.claim(w, n, prev))
            except AuthorizationError:
                assert expected is AuthorizationError
                assert broker.backend.load_producers() == before
                continue
            record = broker.producer_record(session.producer_id)
            assert record is not None and record.principal == expected
            if previous is not None and previous.principal is not None:
                assert record.principal == previous.principal  # an owner, once set, stays
            owners[session.producer_id] = record.principal
    finally:
        broker.close()


def _guarded_cluster(tmp_path: Path) -> list[Any]:
    """Two broker servers over one in-memory store, with the ``broker`` command's JWT guard."""
    from idempotent import cli
    from idempotent.net.server import BrokerServer
    from idempotent.testing.conformance import cluster_config

    from ..conftest import memory_harness

    (tmp_path / "secret").write_bytes(SECRET)
    args = cli.build_parser().parse_args(
        ["broker", "--backend", "memory://", "--auth-jwt-secret-file", str(tmp_path / "secret")]
    )
    harness = memory_harness()
    servers = []
    for name in ("a", "b"):
        broker = harness.open(cluster_config(name, 30.0))
        server = BrokerServer(broker, "127.0.0.1", 0, **cli.broker.broker_security(args, broker)).start()
        broker.advertise(server.advertised_address)
        servers.append(server)
    return servers


def test_produce_with_another_principals_id_through_another_broker_is_refused(tmp_path: Path) -> None:
    """A producer initialised through one broker of a cluster is owned on every broker: a
    principal producing with its id through another broker is refused, and nothing is written."""
    from idempotent.net.client import RemoteBroker

    a, b = _guarded_cluster(tmp_path)
    try:
        b.broker.create_topic("guarded", 1)
        with RemoteBroker(a.url, token=mint_token(SECRET, "x", now=time.time())) as as_x:
            session = as_x.init_producer("job")
        with (
            RemoteBroker(b.url, token=mint_token(SECRET, "y", now=time.time())) as as_y,
            pytest.raises(AuthorizationError),
        ):
            as_y.produce("guarded", 0, session.producer_id, session.producer_epoch, 0, [b"not yours"])
        assert b.broker.read("guarded", 0) == []
        assert b.broker.end_offset("guarded", 0) == 0
    finally:
        a.close()
        b.close()


def test_owner_may_ask_another_broker_for_its_last_sequence(tmp_path: Path) -> None:
    """Re-initialising a named producer asks the owners of its other partitions for its last
    sequence: its principal may (without the admin role), another principal may not."""
    from idempotent.net.client import RemoteBroker

    a, b = _guarded_cluster(tmp_path)
    try:
        b.broker.create_topic("asked", 1)
        with RemoteBroker(b.url, token=mint_token(SECRET, "x", now=time.time())) as as_x:
            s = as_x.init_producer("job")
            assert (
                as_x.produce("asked", 0, s.producer_id, s.producer_epoch, 0, [b"x"]).outcome
                is idempotent.Outcome.ACCEPTED
            )
            again = as_x.init_producer("job")
            assert as_x.last_sequence("asked", 0, again.producer_id, again.producer_epoch) == 0
        with (
            RemoteBroker(b.url, token=mint_token(SECRET, "y", now=time.time())) as as_y,
            pytest.raises(AuthorizationError),
        ):
            as_y.last_sequence("asked", 0, again.producer_id, again.producer_epoch)
    finally:
        a.close()
        b.close()
