"""``idempotent token``: sign an access token for a broker server (docs/security.md)."""

from __future__ import annotations

import argparse
import time

from .common import CliError, Subcommands, float_type


def add_parser(commands: Subcommands) -> None:
    """Add ``idempotent token`` to the subcommands."""
    token = commands.add_parser(
        "token",
        help="sign an access token for a broker server",
        description="Print a signed JWT for a broker server that authenticates with tokens (see docs/security.md).",
    )
    key = token.add_mutually_exclusive_group(required=True)
    key.add_argument("--secret-file", metavar="F", help="HMAC secret shared with the broker (HS256/384/512)")
    key.add_argument("--private-key", metavar="F", help="PEM private key whose public key the broker has")
    token.add_argument(
        "--algorithm",
        default=None,
        help="HS256 (default with --secret-file), RS256 (default with --private-key), ES256, EdDSA, ...",
    )
    token.add_argument("--sub", required=True, help="the principal's name")
    token.add_argument("--role", action="append", default=[], help="a role, e.g. admin (repeatable)")
    token.add_argument("--ttl", type=float_type, default=3600.0, help="seconds the token is valid (default 3600)")
    token.add_argument("--audience", help="the aud claim the broker expects")
    token.add_argument("--issuer", help="the iss claim the broker expects")
    token.add_argument("--roles-claim", default="roles", help="claim (dotted path) for the roles (default roles)")
    token.set_defaults(handler=cmd_token)


def cmd_token(args: argparse.Namespace) -> int:
    """Print a signed token (``idempotent token``)."""
    from idempotent.net.auth import mint_token

    path = args.secret_file or args.private_key
    try:
        with open(path, "rb") as handle:
            key = handle.read()
    except OSError as exc:
        raise CliError(f"cannot read {path!r}: {exc.strerror}") from None
    if args.secret_file:
        key = key.rstrip(b"\r\n")
    algorithm = args.algorithm or ("HS256" if args.secret_file else "RS256")
    if args.secret_file and not algorithm.startswith("HS"):
        raise CliError("--secret-file signs only HS256, HS384 or HS512")
    if args.private_key and algorithm.startswith("HS"):
        raise CliError("--private-key signs RS*, PS*, ES* or EdDSA; use --secret-file for HS*")
    print(
        mint_token(
            key,
            args.sub,
            now=time.time(),
            ttl=args.ttl,
            roles=args.role,
            algorithm=algorithm,
            audience=args.audience,
            issuer=args.issuer,
            roles_claim=args.roles_claim,
        )
    )
    return 0
