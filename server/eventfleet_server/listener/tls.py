"""TLS contexts for every listener and for the Syncer's outgoing peer links.

One certificate per replica (`cert_file`, `key_file`) and one CA (`ca_file`) that
signed every replica's certificate. Listeners serve TLS with that certificate; the
Syncer listener additionally requires a client certificate signed by the CA (mutual
TLS: a peer proves who it is, not only that it knows the token), and the Syncer's
outgoing links verify the peer's certificate against the CA and its host name (the
peer list's `host`, or its `tls_server_name`, must be in the certificate's SANs) and
present their own.

Renewal needs no restart: every context made here is remembered, and `reload()` loads
the files again into those same objects when their content changed (OpenSSL replaces a
context's certificate and key in place; new handshakes use them, established sessions
keep theirs). The replica calls it on SIGHUP and from its credential watch, so a
renewed certificate (cert-manager or the operator rewriting the Secret, the kubelet
swapping the mounted files) takes effect within the reload interval.
"""

from __future__ import annotations

import hashlib
import logging
import ssl
import weakref
from dataclasses import dataclass, field

log = logging.getLogger(__name__)


class TlsError(Exception):
    """A certificate, key or CA file cannot be used (the message names it)."""


@dataclass(eq=False)
class TlsSettings:
    cert_file: str
    key_file: str
    ca_file: str
    require_peer_certificates: bool = True
    # The contexts handed out (reloaded together) and the files' digest they hold.
    _contexts: weakref.WeakSet = field(default_factory=weakref.WeakSet, repr=False)
    _digest: str | None = field(default=None, repr=False)
    _refused: str | None = field(default=None, repr=False)  # logged once per content

    def _files_digest(self) -> str:
        h = hashlib.sha256()
        for path in (self.cert_file, self.key_file, self.ca_file):
            try:
                with open(path, "rb") as f:
                    h.update(f.read())
            except OSError:
                h.update(b"\0missing")
        return h.hexdigest()

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
        if self._digest is None:
            self._digest = self._files_digest()
        self._contexts.add(context)
        return context

    def reload(self) -> bool:
        """Load the files again into every context made so far, if their content
        changed; True when it did. Files that do not load (a Secret half-written, a key
        that does not match the certificate) keep the current certificate: refusing
        every handshake because of a bad renewal would be an outage. A CA added is
        trusted from then on; a CA removed stays trusted until the replica restarts
        (OpenSSL cannot remove one from a context)."""
        digest = self._files_digest()
        if digest in (self._digest, self._refused):
            return False
        try:
            # Check the new files on a scratch context before touching live ones: a
            # mismatched key must not leave some contexts renewed and others not.
            probe = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
            probe.load_cert_chain(self.cert_file, self.key_file)
            probe.load_verify_locations(cafile=self.ca_file)
            for context in list(self._contexts):
                context.load_cert_chain(self.cert_file, self.key_file)
                context.load_verify_locations(cafile=self.ca_file)
        except (OSError, ssl.SSLError) as e:
            self._refused = digest
            log.error(
                "tls: renewed files not loaded, keeping the current certificate: "
                "cert_file %s / key_file %s / ca_file %s: %s",
                self.cert_file,
                self.key_file,
                self.ca_file,
                e,
            )
            return False
        self._digest = digest
        log.info("tls: certificate reloaded from %s (new connections use it)", self.cert_file)
        return True

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
