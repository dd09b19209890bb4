"""Who is calling (authentication) and what they may do (authorization).

A broker server authenticates each connection once, at its handshake, and keeps the
resulting :class:`Principal` for the connection's life. Every request is then checked
against an :class:`AccessPolicy`, a pure set of rules:

* **Producer names are bound to principals.** Every producer record carries the principal
  that owns it (``ProducerRecord.principal``), stored with the record in the backend. The
  principal that initialises a new name (or an anonymous producer) becomes its owner; only
  that principal may initialise the name again (which bumps its epoch and fences the running
  instance) and only the owner may produce with the producer's id. The owner never changes:
  it is carried to every later epoch, and to the fresh id a name moves to after its last
  epoch. Because the owner is part of the persisted record, the binding survives broker
  restarts and is the same on every broker that loads the registry.
* **Admin role.** A principal holding the admin role (``"admin"`` by default) may do
  everything: create topics with a chosen partition count, change deduplication and policy
  settings, read every producer's state (``stats``), and initialise or produce as any
  producer (the owner stays the same).
* Everything else (``ping``, ``metadata``, ``topics``, ``partitions_for``, ``read``,
  ``end_offset``) is open to every principal that passed authentication; ``metadata`` and
  ``partitions_for`` may create an unknown topic with the broker's default partition count,
  as a producer's first send does. Operations the policy does not know are for admins only.

Two authenticators:

* :class:`AllowAll` (no security): every connection is the anonymous principal holding the
  admin role, so nothing is refused, and new producers are unowned.
* :class:`JWTAuthenticator`: a signed JSON Web Token (PyJWT), HMAC with a shared secret
  (HS256/384/512) or a public key (RS*, PS*, ES*, EdDSA). The principal's name is the
  ``sub`` claim and its roles come from a configurable claim. With ``required=False``, a
  connection without a token is the anonymous principal without roles: it may use only
  unowned producers (a migration mode).

:class:`BrokerGuard` binds an authenticator and a policy to a broker's registry and
provides the hooks :class:`~idempotent.net.server.BrokerServer` calls.

Time is an argument (``now``, seconds since the epoch), so the rules run in tests without a
clock.
"""

from __future__ import annotations

import enum
import math
import time
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from types import MappingProxyType
from typing import Any, Protocol, runtime_checkable

import attrs

from idempotent.core.protocol import MAX_TOKEN_LENGTH as MAX_TOKEN_LENGTH  # longest token accepted, in characters
from idempotent.core.registry import ProducerRecord
from idempotent.errors import AuthenticationError, AuthorizationError, ConfigError

#: the default name of the role that may do everything
ADMIN_ROLE = "admin"
#: longest principal name (the ``sub`` claim) accepted
MAX_PRINCIPAL_LENGTH = 256
#: shortest HMAC secret accepted, in bytes (RFC 7518 section 3.2: at least the hash size,
#: so 48 for HS384 and 64 for HS512)
MIN_SECRET_BYTES = 32
#: default allowance for clock differences when checking ``exp``, ``nbf`` and ``iat``
DEFAULT_LEEWAY = 30.0

HMAC_ALGORITHMS = ("HS256", "HS384", "HS512")
RSA_ALGORITHMS = ("RS256", "RS384", "RS512", "PS256", "PS384", "PS512")
EC_ALGORITHMS = ("ES256", "ES384", "ES512")
EDDSA_ALGORITHMS = ("EdDSA",)


@attrs.frozen
class Principal:
    """An authenticated caller. ``name`` is None for the anonymous principal (no token)."""

    name: str | None
    roles: frozenset[str] = frozenset()
    #: when the credentials expire (seconds since the epoch), None when they do not
    expires_at: float | None = None

    @property
    def authenticated(self) -> bool:
        """True when the caller proved an identity (a token)."""
        return self.name is not None

    def __str__(self) -> str:
        return self.name if self.name is not None else "<anonymous>"


#: the caller of a broker without authentication: anonymous, and allowed everything
OPEN = Principal(None, frozenset({ADMIN_ROLE}))
#: a caller without a token on a broker whose tokens are optional: no roles
ANONYMOUS = Principal(None)


@runtime_checkable
class Authenticator(Protocol):
    """Turns a connection's credentials into a :class:`Principal`."""

    def authenticate(self, token: str | None, now: float) -> Principal:
        """The principal ``token`` proves at time ``now`` (``token`` None: none was sent).

        Raises:
            AuthenticationError: the credentials are missing, invalid or expired.
        """
        ...


class AllowAll:
    """No authentication: every caller is :data:`OPEN` (tokens are ignored)."""

    def authenticate(self, token: str | None, now: float) -> Principal:
        return OPEN


def validate_principal_name(name: object) -> str:
    """Return ``name`` if it can name a principal (1..256 characters, no control characters).

    Raises:
        AuthenticationError: it cannot.
    """
    if not isinstance(name, str) or not name or len(name) > MAX_PRINCIPAL_LENGTH:
        raise AuthenticationError(f"token subject must be a string of 1 to {MAX_PRINCIPAL_LENGTH} characters")
    if any(ord(c) < 32 or ord(c) == 127 for c in name):
        raise AuthenticationError("token subject must not contain control characters")
    return name


def _claim_at(claims: Mapping[str, Any], path: str) -> Any:
    """The value at a dotted claim path (``realm_access.roles``), or None."""
    value: Any = claims
    for part in path.split("."):
        if not isinstance(value, Mapping) or part not in value:
            return None
        value = value[part]
    return value


def _roles_of(value: Any, path: str) -> frozenset[str]:
    if value is None:
        return frozenset()
    if isinstance(value, str):
        return frozenset(value.split())
    if isinstance(value, list) and all(isinstance(role, str) for role in value):
        return frozenset(value)
    raise AuthenticationError(f"token claim {path!r} must be a list of strings or a space-separated string")


def _number(claims: Mapping[str, Any], name: str) -> float | None:
    value = claims.get(name)
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value):
        raise AuthenticationError(f"token claim {name!r} must be a number (seconds since the epoch)")
    return float(value)


class JWTAuthenticator:
    """Validates signed JSON Web Tokens (RFC 7519) with PyJWT.

    A token is accepted when its signature verifies with ``key`` under one of
    ``algorithms``; its ``aud`` contains ``audience`` (when configured; a token with an
    ``aud`` claim is refused when no audience is configured); its ``iss`` is ``issuer`` (when
    configured); it has a ``sub`` claim (the principal's name) and, when ``require_exp``, an
    ``exp`` claim; and, with ``leeway`` seconds of allowance, ``exp`` has not passed, and
    ``nbf`` and ``iat`` are not in the future. Roles come from the claim ``roles_claim`` (a
    dotted path into nested objects), a list of strings or a space-separated string.

    Use :meth:`from_secret_file` or :meth:`from_public_key_file` to build one from files.
    """

    def __init__(
        self,
        key: Any,
        algorithms: Sequence[str],
        *,
        audience: str | None = None,
        issuer: str | None = None,
        leeway: float = DEFAULT_LEEWAY,
        roles_claim: str = "roles",
        require_exp: bool = True,
        required: bool = True,
    ) -> None:
        """Raises:
        ConfigError: no or unknown algorithms, ``none``, or a negative leeway.
        """
        algorithms = tuple(algorithms)
        known = HMAC_ALGORITHMS + RSA_ALGORITHMS + EC_ALGORITHMS + EDDSA_ALGORITHMS
        if not algorithms or any(a not in known for a in algorithms):
            raise ConfigError(f"JWT algorithms must be some of {', '.join(known)}; got {list(algorithms)}")
        hmac = {a in HMAC_ALGORITHMS for a in algorithms}
        if len(hmac) > 1:
            raise ConfigError("do not mix HMAC (HS*) and public-key JWT algorithms for one key")
        if not (leeway >= 0 and math.isfinite(leeway)):
            raise ConfigError(f"leeway must be a finite number >= 0, got {leeway}")
        if not roles_claim:
            raise ConfigError("roles_claim must not be empty")
        self._key = key
        self.algorithms = algorithms
        self.audience = audience
        self.issuer = issuer
        self.leeway = float(leeway)
        self.roles_claim = roles_claim
        self.require_exp = require_exp
        self.required = required

    @classmethod
    def from_secret(cls, secret: bytes, algorithms: Sequence[str] = ("HS256",), **options: Any) -> JWTAuthenticator:
        """HMAC tokens signed with a shared ``secret`` (at least as many bytes as the hash:
        32 for HS256, 48 for HS384, 64 for HS512).

        Raises:
            ConfigError: the secret is too short, or ``algorithms`` are not HS256/384/512.
        """
        if not algorithms or any(a not in HMAC_ALGORITHMS for a in algorithms):
            raise ConfigError(f"a shared secret signs only {', '.join(HMAC_ALGORITHMS)}")
        needed = max(MIN_SECRET_BYTES, *(int(a[2:]) // 8 for a in algorithms))
        if len(secret) < needed:
            raise ConfigError(f"the JWT secret must be at least {needed} bytes long for {', '.join(algorithms)}")
        return cls(secret, algorithms, **options)

    @classmethod
    def from_secret_file(
        cls, path: str | Path, algorithms: Sequence[str] = ("HS256",), **options: Any
    ) -> JWTAuthenticator:
        """Like :meth:`from_secret`, the secret being the file's bytes (a final newline dropped).

        Raises:
            ConfigError: the file cannot be read, or as :meth:`from_secret`.
        """
        return cls.from_secret(_read(path).rstrip(b"\r\n"), algorithms, **options)

    @classmethod
    def from_public_key(cls, pem: bytes, algorithms: Sequence[str] | None = None, **options: Any) -> JWTAuthenticator:
        """Tokens signed with the private key of the PEM public key ``pem`` (RSA, EC or
        Ed25519/Ed448). ``algorithms`` defaults to every algorithm of the key's type.

        Raises:
            ConfigError: the key cannot be parsed, the ``cryptography`` package is missing,
                or ``algorithms`` do not fit the key.
        """
        try:
            from cryptography.hazmat.primitives.asymmetric import ec, ed448, ed25519, rsa
            from cryptography.hazmat.primitives.serialization import load_pem_public_key
        except ImportError:
            raise ConfigError("public-key JWT validation needs the 'cryptography' package") from None
        try:
            key = load_pem_public_key(pem)
        except (ValueError, TypeError) as exc:
            raise ConfigError(f"cannot read the JWT public key: {exc}") from None
        if isinstance(key, rsa.RSAPublicKey):
            fitting: tuple[str, ...] = RSA_ALGORITHMS
        elif isinstance(key, ec.EllipticCurvePublicKey):
            fitting = EC_ALGORITHMS
        elif isinstance(key, ed25519.Ed25519PublicKey | ed448.Ed448PublicKey):
            fitting = EDDSA_ALGORITHMS
        else:
            raise ConfigError(f"unsupported JWT public key type {type(key).__name__}")
        chosen = tuple(algorithms) if algorithms is not None else fitting
        if not chosen or any(a not in fitting for a in chosen):
            raise ConfigError(f"this public key verifies only {', '.join(fitting)}; got {list(chosen)}")
        return cls(key, chosen, **options)

    @classmethod
    def from_public_key_file(
        cls, path: str | Path, algorithms: Sequence[str] | None = None, **options: Any
    ) -> JWTAuthenticator:
        """Like :meth:`from_public_key`, reading the PEM file at ``path``.

        Raises:
            ConfigError: the file cannot be read, or as :meth:`from_public_key`.
        """
        return cls.from_public_key(_read(path), algorithms, **options)

    def authenticate(self, token: str | None, now: float) -> Principal:
        """The principal the token proves at ``now``; :data:`ANONYMOUS` for no token when
        tokens are optional.

        Raises:
            AuthenticationError: no token (when required), or one that is malformed, wrongly
                signed, for another audience or issuer, expired, not yet valid, or has an
                unusable ``sub`` or roles claim. The message never contains the token.
        """
        import jwt

        if token is None or token == "":
            if self.required:
                raise AuthenticationError("this broker requires a token")
            return ANONYMOUS
        if not isinstance(token, str) or len(token) > MAX_TOKEN_LENGTH:
            raise AuthenticationError(f"a token must be a string of at most {MAX_TOKEN_LENGTH} characters")
        required = ["sub", *(["exp"] if self.require_exp else [])]
        try:
            claims: dict[str, Any] = jwt.decode(
                token,
                self._key,
                algorithms=list(self.algorithms),
                audience=self.audience,
                issuer=self.issuer,
                options={
                    "verify_signature": True,
                    "verify_aud": True,
                    "verify_iss": True,
                    "verify_exp": False,  # checked below against ``now``
                    "verify_nbf": False,
                    "verify_iat": False,
                    "require": required,
                },
            )
        except jwt.InvalidSignatureError:
            raise AuthenticationError("the token's signature is not valid") from None
        except jwt.InvalidAlgorithmError:
            raise AuthenticationError(f"the token's algorithm is not one of {', '.join(self.algorithms)}") from None
        except jwt.InvalidAudienceError:
            raise AuthenticationError("the token is not meant for this broker (audience)") from None
        except jwt.InvalidIssuerError:
            raise AuthenticationError("the token's issuer is not accepted") from None
        except jwt.MissingRequiredClaimError as exc:
            raise AuthenticationError(f"the token has no {exc.claim!r} claim") from None
        except jwt.DecodeError:
            raise AuthenticationError("the token is malformed") from None
        except jwt.PyJWTError as exc:
            raise AuthenticationError(f"the token is not valid ({type(exc).__name__})") from None
        expires_at = _number(claims, "exp")
        if expires_at is not None and expires_at <= now - self.leeway:
            raise AuthenticationError("the token has expired")
        not_before = _number(claims, "nbf")
        if not_before is not None and not_before > now + self.leeway:
            raise AuthenticationError("the token is not valid yet (nbf)")
        issued_at = _number(claims, "iat")
        if issued_at is not None and issued_at > now + self.leeway:
            raise AuthenticationError("the token was issued in the future (iat)")
        name = validate_principal_name(claims.get("sub"))
        roles = _roles_of(_claim_at(claims, self.roles_claim), self.roles_claim)
        return Principal(name, roles, expires_at)


def mint_token(
    key: Any,
    subject: str,
    *,
    now: float,
    ttl: float = 3600.0,
    roles: Sequence[str] = (),
    algorithm: str = "HS256",
    audience: str | None = None,
    issuer: str | None = None,
    roles_claim: str = "roles",
) -> str:
    """A signed token for ``subject`` valid from ``now`` for ``ttl`` seconds, for tests and
    operators (``idempotent token``). ``key`` is the HMAC secret (bytes) or a PEM private key.
    ``roles`` go to the (dotted) ``roles_claim`` as a list; nothing is added when empty.

    Raises:
        ConfigError: an empty or unusable subject, a ttl <= 0, or a key that does not fit
            ``algorithm``.
    """
    import jwt

    try:
        validate_principal_name(subject)
    except AuthenticationError as exc:
        raise ConfigError(exc.message) from None
    if not (ttl > 0 and math.isfinite(ttl)):
        raise ConfigError(f"ttl must be a finite number > 0, got {ttl}")
    claims: dict[str, Any] = {"sub": subject, "iat": int(now), "exp": int(now + ttl)}
    if audience is not None:
        claims["aud"] = audience
    if issuer is not None:
        claims["iss"] = issuer
    if roles:
        *parents, leaf = roles_claim.split(".")
        node = claims
        for part in parents:
            node = node.setdefault(part, {})
        node[leaf] = list(roles)
    try:
        return jwt.encode(claims, key, algorithm=algorithm)
    except (jwt.PyJWTError, ValueError, TypeError, NotImplementedError) as exc:
        raise ConfigError(f"cannot sign a token with {algorithm}: {exc}") from None


def _read(path: str | Path) -> bytes:
    try:
        return Path(path).read_bytes()
    except OSError as exc:
        raise ConfigError(f"cannot read {str(path)!r}: {exc.strerror}") from None


# -- authorization ---------------------------------------------------------------------------


class Access(enum.Enum):
    """Who may carry out an operation."""

    #: every principal that passed authentication (anonymous too, where tokens are optional)
    ANY = "any"
    #: principals holding the admin role
    ADMIN = "admin"
    #: decided per producer name by :meth:`AccessPolicy.claim` (``init_producer``)
    PRODUCER_NAME = "producer_name"
    #: decided per producer id by :meth:`AccessPolicy.check_producer` (``produce``)
    PRODUCER_ID = "producer_id"


#: the access rule of every broker operation; operations not listed need the admin role
DEFAULT_RULES: Mapping[str, Access] = MappingProxyType(
    {
        "ping": Access.ANY,
        "metadata": Access.ANY,
        "topics": Access.ANY,
        "partitions_for": Access.ANY,
        "read": Access.ANY,
        "end_offset": Access.ANY,
        "init_producer": Access.PRODUCER_NAME,
        "produce": Access.PRODUCER_ID,
        "submit_produce": Access.PRODUCER_ID,
        "last_sequence": Access.PRODUCER_ID,
        "create_topic": Access.ADMIN,
        "delete_topic": Access.ADMIN,
        "stats": Access.ADMIN,
        "set_deduplication": Access.ADMIN,
        "set_policy": Access.ADMIN,
    }
)


def _frozen_rules(rules: Mapping[str, Access]) -> Mapping[str, Access]:
    return MappingProxyType(dict(rules))


@attrs.frozen(eq=False)
class AccessPolicy:
    """The authorization rules, as pure functions of a principal and the records involved.

    ``adopt_unowned`` lets a principal with a name take over an unowned producer name
    (created by a broker without authentication) by initialising it; without it only an
    admin or the anonymous principal may use unowned names.
    """

    rules: Mapping[str, Access] = attrs.field(default=DEFAULT_RULES, converter=_frozen_rules)
    admin_role: str = ADMIN_ROLE
    adopt_unowned: bool = False

    def is_admin(self, principal: Principal) -> bool:
        """True when ``principal`` holds the admin role."""
        return self.admin_role in principal.roles

    def access(self, operation: str) -> Access:
        """The rule for ``operation`` (ADMIN for operations not listed)."""
        return self.rules.get(operation, Access.ADMIN)

    def check(self, principal: Principal, operation: str) -> Access:
        """Refuse ``operation`` when it needs the admin role ``principal`` lacks. Returns the
        rule, so the caller knows whether :meth:`claim` or :meth:`check_producer` applies.

        Raises:
            AuthorizationError: an admin operation and ``principal`` is not an admin.
        """
        access = self.access(operation)
        if access is Access.ADMIN and not self.is_admin(principal):
            raise AuthorizationError(f"{operation} needs the {self.admin_role!r} role; {principal} does not hold it")
        return access

    def claim(self, principal: Principal, producer_name: str | None, previous: ProducerRecord | None) -> str | None:
        """Decide whether ``principal`` may initialise ``producer_name`` (None: an anonymous
        producer), whose current record is ``previous`` (None when new), and return the
        owner the initialised record gets. Pass it as ``Broker.init_producer(claim=...)`` so
        that it runs under the broker lock.

        * admin: allowed; an existing record keeps its owner, a new one is the admin's;
        * a new name or an anonymous producer: allowed, owned by ``principal``;
        * a name owned by ``principal``: allowed;
        * an unowned name: allowed to the anonymous principal, and to any principal when
          ``adopt_unowned`` (who then owns it);
        * otherwise refused.

        Raises:
            AuthorizationError: the name belongs to another principal, or is unowned and may
                not be adopted.
        """
        if self.is_admin(principal):
            return previous.principal if previous is not None else principal.name
        if previous is None or previous.principal == principal.name:
            return principal.name
        if previous.principal is None:
            if self.adopt_unowned:
                return principal.name
            raise AuthorizationError(
                f"producer name {producer_name!r} has no owner (it was created without authentication); "
                "an admin may use it, or the broker may let principals adopt unowned names"
            )
        raise AuthorizationError(f"producer name {producer_name!r} belongs to another principal than {principal}")

    def check_producer(self, principal: Principal, producer_id: int, record: ProducerRecord | None) -> None:
        """Refuse a produce request with ``producer_id`` (whose registry record is
        ``record``, None when unknown) unless ``principal`` owns it or is an admin. An
        unknown id passes: the broker answers it UNKNOWN_PRODUCER without changing anything.

        Raises:
            AuthorizationError: the producer belongs to another principal (or is unowned and
                ``principal`` has a name).
        """
        if record is None or self.is_admin(principal) or record.principal == principal.name:
            return
        if record.principal is None:
            raise AuthorizationError(
                f"producer id {producer_id} has no owner (it was created without authentication); "
                "initialise a producer of your own"
            )
        raise AuthorizationError(f"producer id {producer_id} belongs to another principal than {principal}")


class BrokerGuard:
    """The security hooks of a broker server: an :class:`Authenticator` and an
    :class:`AccessPolicy` applied to one broker's registry. An I/O shell: it reads the clock
    and looks producer records up; the decisions are the policy's.

    Pass ``authenticator=guard.authenticate, authorizer=guard.authorize, claim=guard.claim``
    to :class:`~idempotent.net.server.BrokerServer`.
    """

    def __init__(
        self,
        authenticator: Authenticator,
        policy: AccessPolicy,
        lookup: Callable[[int], ProducerRecord | None],
        clock: Callable[[], float] = time.time,
    ) -> None:
        self.authenticator = authenticator
        self.policy = policy
        self._lookup = lookup
        self._clock = clock

    def authenticate(self, token: str | None) -> Principal:
        """The connection's principal.

        Raises:
            AuthenticationError: see :meth:`Authenticator.authenticate`.
        """
        return self.authenticator.authenticate(token, self._clock())

    def authorize(self, principal: object, operation: str, args: Mapping[str, Any]) -> None:
        """Refuse a request ``principal`` may not make (before it runs; nothing changes).
        ``init_producer`` is decided later, by :meth:`claim`, under the broker lock.

        Raises:
            AuthorizationError: an admin operation without the admin role, or a produce
                request with another principal's producer id.
        """
        if not isinstance(principal, Principal):
            raise AuthorizationError("the connection has no principal")
        if self.policy.check(principal, operation) is Access.PRODUCER_ID:
            producer_id = args["producer_id"]
            self.policy.check_producer(principal, producer_id, self._lookup(producer_id))

    def claim(self, principal: object, producer_name: str | None, previous: ProducerRecord | None) -> str | None:
        """:meth:`AccessPolicy.claim` for the connection's principal.

        Raises:
            AuthorizationError: see :meth:`AccessPolicy.claim`.
        """
        if not isinstance(principal, Principal):
            raise AuthorizationError("the connection has no principal")
        return self.policy.claim(principal, producer_name, previous)


__all__ = [
    "ADMIN_ROLE",
    "ANONYMOUS",
    "DEFAULT_RULES",
    "OPEN",
    "Access",
    "AccessPolicy",
    "AllowAll",
    "Authenticator",
    "BrokerGuard",
    "JWTAuthenticator",
    "Principal",
    "mint_token",
    "validate_principal_name",
]
