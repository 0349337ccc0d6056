"""One line for every expected failure of the client commands, with what to do.

A connection that fails says why (a timeout has an empty ``str()``, which printed
``connection failed:`` with nothing after it) and, where a TLS mismatch is the likely
cause, which option fixes it (``--tls-ca``, ``--tls-server-name``).
"""

from __future__ import annotations

import asyncio
import ssl

TLS_ON = (
    "if the replica serves TLS (spec.tls on Kubernetes, `eventfleet fleet --tls`), pass "
    "its CA with --tls-ca CA_FILE"
)
CA_HINT = (
    "the fleet's CA is ca.crt of the Secret NAME-tls on Kubernetes, DATA_DIR/tls/ca.pem "
    "of a local fleet"
)


def describe(e: BaseException, address: tuple[str, int], timeout: float, tls_ca) -> str:
    """The message for `e`, raised while connecting to `address` (HOST, PORT)."""
    where = f"{address[0]}:{address[1]}"
    if isinstance(e, ssl.SSLCertVerificationError):
        if e.verify_code == 62:  # X509_V_ERR_HOSTNAME_MISMATCH
            return (
                f"TLS: the certificate of {where} does not carry the name {address[0]!r} "
                f"({e.verify_message}); pass --tls-server-name NAME with a name it carries "
                "(e.g. demo-0.demo-peers.NAMESPACE.svc through a port-forward)"
            )
        return (
            f"TLS: the certificate of {where} is not trusted by --tls-ca {tls_ca} "
            f"({e.verify_message}); pass the CA that signed it: {CA_HINT}"
        )
    if isinstance(e, ssl.SSLError):
        return (
            f"TLS handshake with {where} failed ({e.reason or e}): if the replica does not "
            "serve TLS, drop --tls-ca; if it does, check --tls-ca"
        )
    if isinstance(e, TimeoutError | asyncio.TimeoutError):
        steps = (
            "TCP connect, TLS handshake, Eventer init" if tls_ca else "TCP connect, Eventer init"
        )
        hint = "if the replica does not serve TLS, drop --tls-ca" if tls_ca else TLS_ON
        return (
            f"no answer from {where} within {timeout:g} s ({steps}): is it a replica's "
            f"Eventer port, reachable from here? {hint}"
        )
    if isinstance(e, ConnectionRefusedError):
        return (
            f"nothing listens on {where} (connection refused): is the replica running "
            "(the local fleet: ./scripts/run) and is this its Eventer port?"
        )
    if isinstance(e, FileNotFoundError | PermissionError) and e.filename:
        return f"cannot read {e.filename}: {e.strerror}"
    if isinstance(e, ConnectionError | asyncio.IncompleteReadError):
        detail = str(e) or type(e).__name__
        hint = "if the replica does not serve TLS, drop --tls-ca" if tls_ca else TLS_ON
        return f"connection to {where} failed: {detail}; {hint}"
    if type(e).__name__ in ("FrameError", "FrameTooLarge"):
        return (
            f"{where} does not speak Eventer ({e}): is it the Eventer port (23012 by "
            f"default; HTTP is Eventer + 5)?" + ("" if tls_ca else f" {TLS_ON}")
        )
    if isinstance(e, OSError):
        return f"connection to {where} failed: {e.strerror or e or type(e).__name__}"
    return f"{type(e).__name__}: {e}"
