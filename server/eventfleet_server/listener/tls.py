"""TLS contexts for every listener and for the Syncer's outgoing peer links.

One certificate per replica (`cert_file`, `key_file`) and one CA (`ca_file`) that
signed every replica's certificate. Listeners serve TLS with that certificate; the
Syncer listener additionally requires a client certificate signed by the CA (mutual
TLS: a peer proves who it is, not only that it knows the token), and the Syncer's
outgoing links verify the peer's certificate against the CA and its host name (the
peer list's `host` must be in the certificate's SANs) and present their own.
"""

from __future__ import annotations

import ssl
from dataclasses import dataclass


class TlsError(Exception):
    """A certificate, key or CA file cannot be used (the message names it)."""


@dataclass(frozen=True)
class TlsSettings:
    cert_file: str
    key_file: str
    ca_file: str
    require_peer_certificates: bool = True

    def _load(self, context: ssl.SSLContext, with_own: bool = True) -> ssl.SSLContext:
        context.minimum_version = ssl.TLSVersion.TLSv1_2
        try:
            if with_own:
                context.load_cert_chain(self.cert_file, self.key_file)
            context.load_verify_locations(cafile=self.ca_file)
        except (OSError, ssl.SSLError) as e:
            raise TlsError(
                f"tls: cannot load cert_file {self.cert_file} / key_file {self.key_file} / "
                f"ca_file {self.ca_file}: {e}"
            ) from e
        return context

    def server_context(self, *, client_certificates: bool = False) -> ssl.SSLContext:
        """For a listener; `client_certificates`: require one signed by the CA (mTLS)."""
        context = self._load(ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER))
        context.verify_mode = ssl.CERT_REQUIRED if client_certificates else ssl.CERT_NONE
        return context

    def peer_client_context(self) -> ssl.SSLContext:
        """For the Syncer's outgoing links: verify the peer, present our certificate."""
        context = self._load(ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT))
        context.check_hostname = True
        context.verify_mode = ssl.CERT_REQUIRED
        return context


def client_context(ca_file: str | None) -> ssl.SSLContext:
    """For a client of a TLS listener (the CLI, tests): verify against `ca_file`."""
    context = ssl.create_default_context(cafile=ca_file)
    context.minimum_version = ssl.TLSVersion.TLSv1_2
    return context
