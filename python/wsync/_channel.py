"""Channels to the controller: TLS (optionally mutual) or plaintext, and the
bearer token sent with every call (docs/security.md)."""

import dataclasses
import logging
import os

import grpc

_log = logging.getLogger("wsync")


@dataclasses.dataclass(frozen=True)
class Tls:
    """TLS to the controller. `ca`: PEM file of the CA that signed the
    controller's certificate (None: the system roots); `cert` / `key`: PEM
    files of a client certificate (mutual TLS, e.g. one with a
    wsync://role/<role> URI SAN instead of a token)."""
    ca: str = None
    cert: str = None
    key: str = None


def _read(path):
    if path is None:
        return None
    with open(path, "rb") as f:
        return f.read()


def tls_of(tls):
    """`tls` as a Tls or None (plaintext): False/None, True (system roots),
    a CA file path, or a Tls."""
    if tls is None or tls is False:
        return None
    if tls is True:
        return Tls()
    if isinstance(tls, str):
        return Tls(ca=tls)
    if isinstance(tls, Tls):
        if (tls.cert is None) != (tls.key is None):
            raise ValueError("wsync: Tls(cert=..., key=...) go together")
        return tls
    raise TypeError(f"wsync: tls must be a bool, a CA file path or wsync.Tls, not {tls!r}")


def token_metadata(token):
    """The metadata every call sends: the bearer token, if any."""
    return (("authorization", f"Bearer {token}"),) if token else ()


def open_channel(address, tls, token, options, aio=False):
    """A channel to `address`: TLS per `tls` (see tls_of), else plaintext."""
    tls = tls_of(tls)
    mod = grpc.aio if aio else grpc
    if tls is None:
        if token:
            _log.warning("wsync: sending a bearer token to %s in plaintext (tls=False)", address)
        channel = mod.insecure_channel(address, options=list(options))
    else:
        creds = grpc.ssl_channel_credentials(root_certificates=_read(tls.ca),
                                             private_key=_read(tls.key),
                                             certificate_chain=_read(tls.cert))
        channel = mod.secure_channel(address, creds, options=list(options))
    return channel


def open_native(address, tls, token, options, lane=""):
    """A wsync._native.client.TrainerChannel to `address` (the same TLS,
    token and channel options as open_channel), or None when the extension
    is not built or WSYNC_NATIVE_CLIENT=0 (then every call goes through
    grpcio). `lane`: the controller's control fast lane (its --lane_socket):
    Sync and WaitSync go there ("": gRPC only)."""
    if os.environ.get("WSYNC_NATIVE_CLIENT", "1") == "0":
        return None
    try:
        from wsync._native import client as native_client
    except ImportError:
        return None
    tls = tls_of(tls)
    pem = {}
    if tls is not None:
        pem = {"root_pem": _read(tls.ca) or b"", "key_pem": _read(tls.key) or b"",
               "cert_pem": _read(tls.cert) or b""}
    return native_client.TrainerChannel(address, tls=tls is not None, token=token or "",
                                        options=list(options), lane=lane or "", **pem)
