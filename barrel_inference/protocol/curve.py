"""CURVE authentication and encryption of the link (ZeroMQ's CurveZMQ), for workers on other hosts.

Key pairs are ZeroMQ certificate files: `NAME.key` (public, safe to copy) and `NAME.key_secret`.
- The worker binds with its secret key and admits only gateways whose public keys lie in its
  authorized-clients directory (a ZAP handler checks every handshake).
- The gateway connects with its own secret key and the worker's public key: a worker that
  cannot prove it holds that key never completes the handshake, so it is never talked to.
A local worker (ipc://, a socket file in the daemon's own runtime dir) needs none of this; a plain
tcp:// link without keys must be asked for explicitly (`insecure`).
"""

from __future__ import annotations

from pathlib import Path

import zmq
import zmq.auth

PUBLIC_SUFFIX = ".key"
SECRET_SUFFIX = ".key_secret"


class CurveError(ValueError):
    """A key file that is missing, unreadable or of the wrong kind."""


def generate(directory: str | Path, name: str) -> tuple[Path, Path]:
    """Write a new key pair NAME.key / NAME.key_secret into `directory`; returns their paths."""
    directory = Path(directory)
    directory.mkdir(parents=True, exist_ok=True)
    for suffix in (PUBLIC_SUFFIX, SECRET_SUFFIX):
        if (directory / (name + suffix)).exists():
            raise CurveError(f"{directory / (name + suffix)} exists already; remove it first or choose another name")
    public, secret = zmq.auth.create_certificates(str(directory), name)
    Path(secret).chmod(0o600)
    return Path(public), Path(secret)


def load_secret(path: str | Path) -> tuple[bytes, bytes]:
    """(public, secret) keys from a secret certificate file."""
    try:
        public, secret = zmq.auth.load_certificate(str(path))
    except (OSError, ValueError) as exc:
        raise CurveError(f"cannot read the CURVE key file {path}: {exc}") from None
    if not secret:
        raise CurveError(f"{path} holds no secret key (it is a public key file; use the {SECRET_SUFFIX} one)")
    return public, secret


def load_public(path: str | Path) -> bytes:
    try:
        public, _ = zmq.auth.load_certificate(str(path))
    except (OSError, ValueError) as exc:
        raise CurveError(f"cannot read the CURVE key file {path}: {exc}") from None
    return public


def secure_client(sock: zmq.Socket, secret_key_file: str | Path, server_public_file: str | Path) -> None:
    """Make a connecting socket authenticate as `secret_key_file` to the server `server_public_file`."""
    public, secret = load_secret(secret_key_file)
    sock.curve_publickey = public
    sock.curve_secretkey = secret
    sock.curve_serverkey = load_public(server_public_file)


def check_server_keys(secret_key_file: str | Path, clients_dir: str | Path) -> None:
    """Fail early (CurveError) where secure_server would: a bad key file or no authorized clients."""
    load_secret(secret_key_file)
    clients = Path(clients_dir)
    if not clients.is_dir() or not any(clients.glob("*" + PUBLIC_SUFFIX)):
        raise CurveError(f"{clients} holds no authorized client keys (*{PUBLIC_SUFFIX})")


def secure_server(ctx: zmq.Context, sock: zmq.Socket, secret_key_file: str | Path, clients_dir: str | Path):
    """Make a binding socket a CURVE server admitting the public keys in `clients_dir`.

    Returns the running authenticator (stop() it when the socket closes).
    """
    from zmq.auth.thread import ThreadAuthenticator

    check_server_keys(secret_key_file, clients_dir)
    public, secret = load_secret(secret_key_file)
    auth = ThreadAuthenticator(ctx)
    auth.start()
    auth.configure_curve(domain="*", location=str(clients_dir))
    sock.curve_secretkey = secret
    sock.curve_publickey = public
    sock.curve_server = True
    return auth
