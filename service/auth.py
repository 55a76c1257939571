"""Authentication and authorisation: the one server interceptor that decides who calls and what it may do.

Identity comes from a bearer token (``authorization: Bearer xat_...`` looked up by its sha256 in the
tokens file, service/tokens.py), else from a verified mTLS client certificate (its common name is
the tenant). Every RPC declares the scope it needs in its .proto (``option (required_scope)``, read here from
the descriptors; a served method without one is refused); the health service needs none; reflection
needs any valid identity; the internal WorkerService needs the ``worker`` scope. Missing or unknown
credentials: UNAUTHENTICATED; a missing scope: PERMISSION_DENIED (raised here, mapped to a status
by the errors interceptor, which runs outside this one).

The servicers read the caller's tenant with :func:`tenant_of` (a context variable set by the
interceptor around each call). With authentication off every caller is the default tenant with
every scope; that is allowed on loopback (logged at start) and refused elsewhere unless
``allow_unauthenticated`` says so.
"""

from __future__ import annotations

import contextlib
import contextvars
import hmac
import ipaddress
import logging
import secrets
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import grpc
from cryptography import x509
from cryptography.hazmat.primitives.serialization import Encoding, PublicFormat, load_pem_private_key
from google.protobuf.descriptor import FileDescriptor

from service.config import DEFAULT_TENANT, ServerConfig
from service.handlers import rewrap
from service.listen import host_of
from service.tokens import SCOPES, Identity, TenantPolicy, TokenFile, parse_scopes
from xaudit.contract.errors import InvalidInput, PermissionDenied, Unauthenticated
from xaudit.v1 import audit_pb2, options_pb2, worker_pb2

__all__ = [
    "ANONYMOUS",
    "METHOD_SCOPES",
    "AuthInterceptor",
    "Authenticator",
    "bind_port",
    "check_exposure",
    "current_identity",
    "declared_scopes",
    "tenant_of",
]

logger = logging.getLogger(__name__)

ANONYMOUS = Identity(DEFAULT_TENANT, frozenset(SCOPES), "anonymous")
_INTERNAL_WORKER = Identity("(internal)", frozenset({"worker"}), "internal")

_EXTERNAL_SCOPES: dict[str, str | None] = {
    "/grpc.health.v1.Health/Check": None,
    "/grpc.health.v1.Health/Watch": None,
    "/grpc.reflection.v1alpha.ServerReflection/ServerReflectionInfo": "",
    "/grpc.reflection.v1.ServerReflection/ServerReflectionInfo": "",
}


def declared_scopes(*files: FileDescriptor) -> dict[str, str]:
    """Full method name -> the scope its RPC declares in the .proto (``option (required_scope)``).
    A method without one, or with a scope that does not exist, is an error: there is no default."""
    table: dict[str, str] = {}
    for file in files:
        for service in file.services_by_name.values():
            for method in service.methods:
                scope = method.GetOptions().Extensions[options_pb2.required_scope]
                if scope not in SCOPES:
                    raise ValueError(
                        f"RPC {method.full_name} declares no valid scope ({scope!r}): add "
                        f"option (required_scope) = one of {', '.join(SCOPES)} to its .proto"
                    )
                table[f"/{service.full_name}/{method.name}"] = scope
    return table


# Full method name -> the scope it needs. "" = any authenticated identity; None = no credentials.
# A method missing here is refused (PERMISSION_DENIED): a new RPC gets no scope by accident.
METHOD_SCOPES: dict[str, str | None] = {
    **declared_scopes(audit_pb2.DESCRIPTOR, worker_pb2.DESCRIPTOR),
    **_EXTERNAL_SCOPES,
}

_current: contextvars.ContextVar[Identity | None] = contextvars.ContextVar("xaudit_identity", default=None)


def current_identity() -> Identity | None:
    return _current.get()


def tenant_of(context: grpc.ServicerContext | None = None) -> str:
    """The calling tenant, as established by :class:`AuthInterceptor` for this call."""
    identity = _current.get()
    if identity is None:  # fail closed: a handler reached without the interceptor
        raise Unauthenticated("no authenticated identity for this call")
    return identity.tenant


@dataclass(frozen=True)
class _Tls:
    cert: bytes
    key: bytes
    client_ca: bytes | None


def _read_tls(config: ServerConfig) -> _Tls | None:
    if not config.tls_cert_file and not config.tls_key_file:
        if config.tls_client_ca_file:
            raise InvalidInput("a client CA (mTLS) needs the server's own certificate and key too")
        return None
    if not (config.tls_cert_file and config.tls_key_file):
        raise InvalidInput("TLS needs both a certificate and a key file")

    def read(path: Path, what: str) -> bytes:
        try:
            return Path(path).read_bytes()
        except OSError as exc:
            raise InvalidInput(f"cannot read the TLS {what} {path}: {exc.strerror}") from None

    ca = read(config.tls_client_ca_file, "client CA") if config.tls_client_ca_file else None
    tls = _Tls(read(config.tls_cert_file, "certificate"), read(config.tls_key_file, "key"), ca)
    _check_tls(tls, config)
    return tls


def _check_tls(tls: _Tls, config: ServerConfig) -> None:
    """PEM certificates and a key that belongs to the first one, checked here: grpc refuses anything
    else only at bind time, with a log line and no reason."""

    def certificates(data: bytes, path: Path | None, what: str) -> list[x509.Certificate]:
        try:
            found = x509.load_pem_x509_certificates(data)
        except ValueError:
            found = []
        if not found:
            raise InvalidInput(f"the TLS {what} {path} holds no PEM certificate")
        return found

    cert = certificates(tls.cert, config.tls_cert_file, "certificate")[0]
    if tls.client_ca is not None:
        certificates(tls.client_ca, config.tls_client_ca_file, "client CA")
    try:
        key = load_pem_private_key(tls.key, password=None)
    except (ValueError, TypeError):  # TypeError: the key is encrypted
        raise InvalidInput(
            f"the TLS key {config.tls_key_file} is not an unencrypted PEM private key"
        ) from None

    def public(k: Any) -> bytes:
        return bytes(k.public_bytes(Encoding.DER, PublicFormat.SubjectPublicKeyInfo))

    if public(key.public_key()) != public(cert.public_key()):
        raise InvalidInput(
            f"the TLS key {config.tls_key_file} does not belong to the certificate {config.tls_cert_file}"
        )


class Authenticator:
    """Turns a call's metadata and peer certificate into an :class:`Identity`."""

    def __init__(self, config: ServerConfig) -> None:
        self.tokens = TokenFile(config.tokens_file) if config.tokens_file else None
        if config.tokens_file and not Path(config.tokens_file).exists():  # read again once it appears
            logger.warning(
                "tokens file %s does not exist: every call is refused until "
                "`xaudit token create --tokens %s ...` writes one",
                config.tokens_file,
                config.tokens_file,
            )
        self.tls = _read_tls(config)
        self.mtls_scopes = parse_scopes(config.tls_client_scopes)
        self.enabled = self.tokens is not None or (self.tls is not None and self.tls.client_ca is not None)
        # A token for the embedded local worker only: never written anywhere, gone with the process.
        self.internal_worker_token = "xaw_" + secrets.token_urlsafe(32) if self.enabled else None

    def policy(self, tenant: str) -> TenantPolicy:
        return self.tokens.policy(tenant) if self.tokens is not None else TenantPolicy()

    def authenticate(self, context: grpc.ServicerContext) -> Identity:
        if not self.enabled:
            return ANONYMOUS
        token = _bearer(context.invocation_metadata() or ())
        if token is not None:
            internal = self.internal_worker_token
            if internal is not None and hmac.compare_digest(token.encode(), internal.encode()):
                return _INTERNAL_WORKER
            identity = self.tokens.lookup(token) if self.tokens is not None else None
            if identity is None:
                raise Unauthenticated("invalid or revoked token")
            return identity
        subject = _peer_common_name(context)
        if subject is not None:
            return Identity(subject, self.mtls_scopes, f"mtls:{subject}")
        raise Unauthenticated(
            "missing credentials: send 'authorization: Bearer <token>' (the CLI reads $XAUDIT_TOKEN)"
        )


def _bearer(metadata: Any) -> str | None:
    for key, value in metadata:
        if key.lower() != "authorization":
            continue
        text = value.decode("latin-1") if isinstance(value, bytes) else str(value)
        scheme, _, token = text.strip().partition(" ")
        if scheme.lower() != "bearer" or not token.strip():
            raise Unauthenticated("malformed authorization header (expected 'Bearer <token>')")
        return token.strip()
    return None


def _peer_common_name(context: grpc.ServicerContext) -> str | None:
    try:
        names = context.auth_context().get("x509_common_name") or []
    except Exception:  # no transport security on this call
        return None
    if not names:
        return None
    name = names[0]
    return name.decode("utf-8", "replace") if isinstance(name, bytes) else str(name)


def _authorise(authenticator: Authenticator, scope: str, method: str, context: Any) -> Identity:
    identity = authenticator.authenticate(context)
    if scope and not identity.allows(scope):
        logger.info("%s refused to %s: needs scope %s", identity.source, method, scope)
        raise PermissionDenied(
            f"this credential lacks the '{scope}' scope needed for {method.rsplit('/', 1)[-1]}"
        )
    return identity


def _unary(behaviour: Callable[..., Any], check: Callable[[Any], Identity]) -> Callable[..., Any]:
    def handler(request: Any, context: grpc.ServicerContext) -> Any:
        token = _current.set(check(context))
        try:
            return behaviour(request, context)
        finally:
            _current.reset(token)

    return handler


def _stream(behaviour: Callable[..., Iterator[Any]], check: Callable[[Any], Identity]) -> Callable[..., Any]:
    def handler(request: Any, context: grpc.ServicerContext) -> Iterator[Any]:
        token = _current.set(check(context))
        try:
            yield from behaviour(request, context)
        finally:
            with contextlib.suppress(ValueError):  # resumed from another context: nothing to undo
                _current.reset(token)

    return handler


class AuthInterceptor(grpc.ServerInterceptor):  # type: ignore[misc]
    """Place it after the errors interceptor, so its errors become statuses."""

    def __init__(self, authenticator: Authenticator) -> None:
        self._auth = authenticator

    def intercept_service(
        self,
        continuation: Callable[[grpc.HandlerCallDetails], grpc.RpcMethodHandler],
        details: grpc.HandlerCallDetails,
    ) -> grpc.RpcMethodHandler:
        handler = continuation(details)
        method = details.method
        if handler is None:
            return handler
        if method not in METHOD_SCOPES:

            def check(context: Any) -> Identity:
                logger.error("%s is served but declares no scope: refused", method)
                raise PermissionDenied(f"{method.rsplit('/', 1)[-1]} declares no scope: refused")

        else:
            scope = METHOD_SCOPES[method]
            if scope is None:
                return handler

            def check(context: Any) -> Identity:
                return _authorise(self._auth, scope, method, context)

        return rewrap(
            handler,
            lambda behaviour, kind: (_stream if kind.endswith("_stream") else _unary)(behaviour, check),
        )


def _is_loopback(listen: str) -> bool:
    host = host_of(listen)
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False  # a host name or an empty host (all interfaces)


def check_exposure(config: ServerConfig, authenticator: Authenticator) -> None:
    """Refuse to serve unauthenticated beyond loopback unless allowed; say so whenever auth is off."""
    if authenticator.enabled:
        how = ", ".join(
            part
            for part, on in (
                (f"tokens from {config.tokens_file}", authenticator.tokens is not None),
                ("mTLS client certificates", authenticator.tls is not None and authenticator.tls.client_ca),
            )
            if on
        )
        logger.info("authentication on (%s)", how)
        return
    if not _is_loopback(config.listen) and not config.allow_unauthenticated:
        raise InvalidInput(
            f"refusing to listen on {config.listen} without authentication: give --tokens FILE "
            "(xaudit token create) or --tls-client-ca, or --allow-unauthenticated to accept the risk"
        )
    logger.warning(
        "authentication is OFF: every caller on %s is tenant '%s' with every scope",
        config.listen,
        DEFAULT_TENANT,
    )


def bind_port(server: grpc.Server, config: ServerConfig, authenticator: Authenticator) -> int:
    """Add the listening port: TLS (and mTLS with a client CA) when configured, else plaintext."""
    tls = authenticator.tls
    if tls is None:
        return int(server.add_insecure_port(config.listen))
    credentials = grpc.ssl_server_credentials(
        [(tls.key, tls.cert)], root_certificates=tls.client_ca, require_client_auth=tls.client_ca is not None
    )
    return int(server.add_secure_port(config.listen, credentials))
