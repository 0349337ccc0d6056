"""TLS for the job's connections to replicas that serve TLS (``tls.enabled``).

`ClientTls` names the fleet's CA file (and optionally the name the replicas'
certificates carry); it is a plain value, so it travels to the executors inside the
data source's options and each Python worker builds its own `ssl.SSLContext` (a
context cannot be pickled). Every connection of the job — Eventer reads, ``/export``
reads, the write-back — verifies the replica's certificate against that CA and its host
name, as `eventfleet_server.listener.client_context` does for the CLI.

No dependencies beyond the standard library: the CLI parser imports this.
"""

from __future__ import annotations

import dataclasses
import ssl

TLS_CA_ENV = "EVENTFLEET_TLS_CA"
"""Environment variable with the CA file's path, used when ``--tls-ca`` is absent."""

PLAIN_HINT = "if the replica serves TLS, give its CA: job --tls-ca, data source tls_ca"


class TlsConfigError(ValueError):
    """The CA file cannot be used (the message names it)."""


class _ServerNameContext(ssl.SSLContext):
    """A client context that checks every certificate against one fixed name.

    Needed when endpoints are addressed by IP (or by a name not in the certificate):
    asyncio and http.client pass the address they connect to as ``server_hostname``, and
    neither the project's chatter transport nor http.client lets the caller change it.
    """

    server_name: str | None = None

    def wrap_bio(self, incoming, outgoing, server_side=False, server_hostname=None, session=None):
        if self.server_name and not server_side:
            server_hostname = self.server_name
        return super().wrap_bio(incoming, outgoing, server_side, server_hostname, session)

    def wrap_socket(
        self,
        sock,
        server_side=False,
        do_handshake_on_connect=True,
        suppress_ragged_eofs=True,
        server_hostname=None,
        session=None,
    ):
        if self.server_name and not server_side:
            server_hostname = self.server_name
        return super().wrap_socket(
            sock,
            server_side,
            do_handshake_on_connect,
            suppress_ragged_eofs,
            server_hostname,
            session,
        )


@dataclasses.dataclass(frozen=True)
class ClientTls:
    """How the job verifies replicas: the CA file that signed their certificates and,
    optionally, the name to verify instead of the address connected to."""

    ca_file: str
    server_name: str | None = None

    def __post_init__(self) -> None:
        if not self.ca_file:
            raise TlsConfigError("tls CA file path is empty")
        if self.server_name is not None and not self.server_name.strip():
            raise TlsConfigError(f"tls server name {self.server_name!r} is empty")

    def context(self) -> ssl.SSLContext:
        """A client context: TLS 1.2 or later, the replica's certificate verified against
        `ca_file` and its host name. `TlsConfigError` names an unusable CA file."""
        context = _ServerNameContext(ssl.PROTOCOL_TLS_CLIENT)  # verifies cert and host name
        context.minimum_version = ssl.TLSVersion.TLSv1_2
        context.server_name = self.server_name
        try:
            context.load_verify_locations(cafile=self.ca_file)
        except (OSError, ssl.SSLError) as e:
            # FileNotFoundError's text does not say which file; SSLError's says even less.
            reason = getattr(e, "strerror", None) or getattr(e, "reason", None) or str(e)
            raise TlsConfigError(f"tls CA file {self.ca_file!r} cannot be used: {reason}") from e
        return context

    def describe(self) -> str:
        text = f"CA file {self.ca_file}"
        return text + (f", server name {self.server_name}" if self.server_name else "")


def connect_error(error: BaseException, tls: ClientTls | None) -> str:
    """Why a connection failed, in words that point at the TLS setting when it may be the
    cause (an untrusted certificate, a failed handshake, a plain client dropped)."""
    if isinstance(error, ssl.SSLCertVerificationError):
        return (
            f"the replica's certificate is not accepted ({_describe(tls)}):"
            f" {error.verify_message or error.reason}"
        )
    if isinstance(error, ssl.SSLError):
        return f"TLS handshake failed ({_describe(tls)}): {error.reason or error!r}"
    if (
        tls is None
        and isinstance(error, ConnectionError)
        and not isinstance(error, ConnectionRefusedError)
    ):
        # A TLS replica drops a plain client after its first bytes, which looks like
        # any dropped connection: say what else it may be.
        return f"{error!r} ({PLAIN_HINT})"
    return repr(error)


def _describe(tls: ClientTls | None) -> str:
    return tls.describe() if tls is not None else "no CA given"
