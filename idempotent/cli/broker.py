"""``idempotent broker``: serve a backend to producers over the network (idem:// or idems://)."""

from __future__ import annotations

import argparse
import functools
from typing import Any

from idempotent.broker.broker import Broker, BrokerConfig

from .common import CliError, Subcommands, add_connect_timeout, connect_options, err, float_type, int_type


def add_parser(commands: Subcommands) -> None:
    """Add ``idempotent broker`` to the subcommands."""
    broker = commands.add_parser(
        "broker",
        help="serve a backend to producers over the network (idem:// or idems://)",
        description="Run a broker server: the sequence checker over BACKEND, served over TCP "
        "(TLS with --tls-cert/--tls-key). Clients connect with idem://HOST:PORT (idems:// for "
        "TLS). SIGTERM or Ctrl-C stops accepting, answers what is in flight, and exits.",
    )
    broker.add_argument("--backend", metavar="URL", required=True, help="sqlite:///file.db, kafka://..., pulsar://...")
    broker.add_argument("--listen", metavar="HOST:PORT", default="127.0.0.1:7650", help="default 127.0.0.1:7650")
    broker.add_argument("--advertise", metavar="HOST:PORT", help="address clients should use (default: --listen)")
    broker.add_argument("--tls-cert", metavar="FILE", help="serve TLS with this certificate chain (PEM)")
    broker.add_argument("--tls-key", metavar="FILE", help="private key of --tls-cert (PEM)")
    broker.add_argument("--tls-client-ca", metavar="FILE", help="require client certificates signed by this CA")
    auth = broker.add_argument_group("authentication (see docs/security.md)")
    key = auth.add_mutually_exclusive_group()
    key.add_argument("--auth-jwt-secret-file", metavar="FILE", help="require HMAC-signed JWTs (HS256) with this secret")
    key.add_argument("--auth-jwt-public-key", metavar="FILE", help="require JWTs signed by this PEM public key's owner")
    auth.add_argument(
        "--auth-jwt-algorithm",
        metavar="ALG",
        action="append",
        help="accepted algorithm (repeatable; default HS256 with a secret, every one of the key's type with a key)",
    )
    auth.add_argument("--auth-audience", metavar="AUD", help="tokens must name this audience (aud)")
    auth.add_argument("--auth-issuer", metavar="ISS", help="tokens must come from this issuer (iss)")
    auth.add_argument("--auth-leeway", metavar="S", type=float_type, default=30.0, help="clock skew allowed (30)")
    auth.add_argument("--auth-roles-claim", metavar="CLAIM", default="roles", help="claim holding the roles (roles)")
    auth.add_argument("--auth-admin-role", metavar="ROLE", default="admin", help="role of administrators (admin)")
    auth.add_argument(
        "--auth-optional",
        action="store_true",
        help="let connections without a token in, as the anonymous principal (migration only)",
    )
    auth.add_argument(
        "--auth-adopt-unowned",
        action="store_true",
        help="let a principal take over producer names created before authentication was on",
    )
    broker.add_argument("--max-in-flight", metavar="N", type=int_type(1, "--max-in-flight"), default=64)
    broker.add_argument("--max-frame", metavar="BYTES", type=int_type(1024, "--max-frame"), default=16 * 1024 * 1024)
    broker.add_argument("--idle-timeout", metavar="S", type=float_type, default=300.0)
    broker.add_argument("--ready-file", metavar="PATH", help="write the listening address here once serving")
    broker.add_argument(
        "--broker-id",
        metavar="ID",
        help="run as one of several brokers over one Kafka or Pulsar cluster, each owning some partitions "
        "(docs/clustering.md); unique per broker",
    )
    broker.add_argument(
        "--lease-seconds",
        metavar="S",
        type=float_type,
        default=10.0,
        help="with --broker-id: partitions of a broker silent this long are taken over (default 10)",
    )
    broker.add_argument(
        "--metrics-listen", metavar="HOST:PORT", help="serve Prometheus metrics at http://HOST:PORT/metrics"
    )
    week = 7 * 24 * 3600.0
    broker.add_argument(
        "--producer-expiry",
        metavar="S",
        type=float_type,
        default=week,
        help="forget a producer's sequence state on a partition after S seconds without a write "
        "(default 604800, 7 days); a resend after that is no longer recognised as a duplicate",
    )
    broker.add_argument(
        "--producer-record-retention",
        metavar="S",
        type=float_type,
        default=week,
        help="delete a producer's record (name, id, epoch) after S seconds unused (default 604800, 7 days)",
    )
    add_connect_timeout(broker)
    broker.set_defaults(handler=cmd_broker, default_verbosity=1)  # a server: its INFO lines are its output


def broker_config(args: argparse.Namespace) -> BrokerConfig:
    """The broker's settings from ``idempotent broker``'s options.

    Raises:
        CliError: a bound is zero (``BrokerConfig`` and ``CheckerConfig`` need positive ones).
    """
    from idempotent.core.checker import CheckerConfig

    from ..errors import ConfigError

    cluster: dict[str, Any] = {}
    if args.broker_id is not None:
        cluster = {
            "broker_id": args.broker_id,
            "advertised_address": args.advertise or "",
            "lease_duration": args.lease_seconds,
        }
    try:
        return BrokerConfig(
            checker=CheckerConfig(producer_expiry=args.producer_expiry),
            producer_record_retention=args.producer_record_retention,
            **cluster,
        )
    except ConfigError as exc:
        raise CliError(str(exc)) from None


def cmd_broker(args: argparse.Namespace) -> int:
    """``idempotent broker``: serve a backend over the network until SIGTERM/SIGINT."""
    from idempotent.net.server import BrokerServer, ServerConfig, parse_listen, server_ssl_context

    host, port = parse_listen(args.listen)
    if args.tls_key and not args.tls_cert:
        raise CliError("--tls-key needs --tls-cert")
    jwt_options = ("auth_jwt_algorithm", "auth_audience", "auth_issuer", "auth_optional", "auth_adopt_unowned")
    if not (args.auth_jwt_secret_file or args.auth_jwt_public_key) and any(getattr(args, o) for o in jwt_options):
        raise CliError("the --auth-* options need --auth-jwt-secret-file or --auth-jwt-public-key")
    context = server_ssl_context(args.tls_cert, args.tls_key, args.tls_client_ca) if args.tls_cert else None
    config = ServerConfig(max_frame=args.max_frame, max_in_flight=args.max_in_flight, idle_timeout=args.idle_timeout)
    if args.backend.startswith(("idem://", "idems://")):
        raise CliError("--backend must name a storage backend (sqlite://, kafka://, pulsar://, memory://)")
    from .. import connect

    broker = connect(args.backend, broker_config(args), **connect_options(args.backend, args.connect_timeout))
    assert isinstance(broker, Broker)
    try:
        security = broker_security(args, broker)
    except BaseException:
        broker.close()
        raise
    server = BrokerServer(
        broker, host, port, ssl_context=context, advertised_address=args.advertise, config=config, **security
    )

    def ready(served: BrokerServer) -> None:
        if args.broker_id is not None and not args.advertise:
            broker.advertise(served.advertised_address)  # the port is known once bound
        err(f"serving {broker.url} on {served.url}")
        if security and context is None:
            err("warning: tokens travel in clear text; serve TLS (--tls-cert) when authenticating")
        if args.ready_file:
            with open(args.ready_file, "w") as out:
                out.write(served.address + "\n")

    metrics = None
    if args.metrics_listen:
        from idempotent.broker.metrics import start_metrics_server

        try:
            metrics = start_metrics_server(broker, *parse_listen(args.metrics_listen))
        except BaseException:
            broker.close()
            raise
        err(f"metrics on {metrics.url}")
    try:
        server.run(on_ready=ready)
    finally:
        if metrics is not None:
            metrics.close()
    return 0


def broker_security(args: argparse.Namespace, broker: Broker) -> dict[str, Any]:
    """The server's authenticator, authorizer and claim hooks from the ``--auth-*`` options
    (none without a JWT key: every connection may do everything)."""
    from idempotent.net.auth import AccessPolicy, BrokerGuard, JWTAuthenticator

    if not (args.auth_jwt_secret_file or args.auth_jwt_public_key):
        return {}
    options: dict[str, Any] = {
        "audience": args.auth_audience,
        "issuer": args.auth_issuer,
        "leeway": args.auth_leeway,
        "roles_claim": args.auth_roles_claim,
        "required": not args.auth_optional,
    }
    if args.auth_jwt_secret_file:
        authenticator = JWTAuthenticator.from_secret_file(
            args.auth_jwt_secret_file, args.auth_jwt_algorithm or ("HS256",), **options
        )
    else:
        authenticator = JWTAuthenticator.from_public_key_file(
            args.auth_jwt_public_key, args.auth_jwt_algorithm, **options
        )
    policy = AccessPolicy(admin_role=args.auth_admin_role, adopt_unowned=args.auth_adopt_unowned)
    # refresh: a producer initialised through another broker of the cluster has an owner too
    guard = BrokerGuard(authenticator, policy, functools.partial(broker.producer_record, refresh=True))
    return {"authenticator": guard.authenticate, "authorizer": guard.authorize, "claim": guard.claim}
