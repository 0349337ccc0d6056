"""The operator's own certificate authority: used for ``spec.tls`` when cert-manager is
not installed (or ``provider: Operator``).

One CA per fleet (kept in the Secret ``<name>-ca``, never mounted into pods) signs one
certificate per fleet (Secret ``<name>-tls``: ``tls.crt``, ``tls.key``, ``ca.crt`` — the
layout cert-manager writes, so replicas read either the same way). The certificate
names every address peers, clients and the operator use (wildcards for the pods under
the headless peer Service, the client Service) and serves both as server and client
certificate (mutual TLS on Syncer links).

No I/O and no clock here: callers pass ``now``. Keys are ECDSA P-256.
"""

from __future__ import annotations

import dataclasses
import datetime
import hashlib
import ipaddress
from collections.abc import Sequence

from cryptography import x509
from cryptography.exceptions import InvalidSignature
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

CA_LIFETIME = datetime.timedelta(days=3650)
CERT_LIFETIME = datetime.timedelta(days=90)
# Renew once a third of the lifetime is left (cert-manager's default rule too): a
# replica reloads within seconds, so this leaves weeks for anything that goes wrong.
RENEW_FRACTION = 1 / 3
# Backdated start: a node whose clock is a little behind must still accept it.
CLOCK_SKEW = datetime.timedelta(minutes=5)


class PkiError(ValueError):
    """Stored PEM text that cannot be used (the message says which part)."""


@dataclasses.dataclass(frozen=True)
class KeyPair:
    cert_pem: str
    key_pem: str


def _key() -> ec.EllipticCurvePrivateKey:
    return ec.generate_private_key(ec.SECP256R1())


def _key_pem(key: ec.EllipticCurvePrivateKey) -> str:
    return key.private_bytes(
        serialization.Encoding.PEM,
        serialization.PrivateFormat.PKCS8,
        serialization.NoEncryption(),
    ).decode()


def _cert_pem(cert: x509.Certificate) -> str:
    return cert.public_bytes(serialization.Encoding.PEM).decode()


def _name(common_name: str) -> x509.Name:
    return x509.Name(
        [
            x509.NameAttribute(NameOID.ORGANIZATION_NAME, "eventfleet"),
            x509.NameAttribute(NameOID.COMMON_NAME, common_name[:64]),
        ]
    )


def _key_usage(*, signs_certificates: bool) -> x509.KeyUsage:
    """Signatures only (ECDSA); a CA also signs certificates and CRLs."""
    return x509.KeyUsage(
        digital_signature=True,
        content_commitment=False,
        key_encipherment=False,
        data_encipherment=False,
        key_agreement=False,
        key_cert_sign=signs_certificates,
        crl_sign=signs_certificates,
        encipher_only=False,
        decipher_only=False,
    )


def issue_ca(common_name: str, now: datetime.datetime) -> KeyPair:
    """A new self-signed CA (path length 0: it signs replica certificates only)."""
    key = _key()
    name = _name(common_name)
    cert = (
        x509.CertificateBuilder()
        .subject_name(name)
        .issuer_name(name)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - CLOCK_SKEW)
        .not_valid_after(now + CA_LIFETIME)
        .add_extension(x509.BasicConstraints(ca=True, path_length=0), critical=True)
        .add_extension(_key_usage(signs_certificates=True), critical=True)
        .add_extension(x509.SubjectKeyIdentifier.from_public_key(key.public_key()), critical=False)
        .sign(key, hashes.SHA256())
    )
    return KeyPair(_cert_pem(cert), _key_pem(key))


def _san(names: Sequence[str]) -> x509.SubjectAlternativeName:
    entries: list[x509.GeneralName] = []
    for n in names:
        try:
            entries.append(x509.IPAddress(ipaddress.ip_address(n)))
        except ValueError:
            entries.append(x509.DNSName(n))
    return x509.SubjectAlternativeName(entries)


def issue_certificate(
    ca: KeyPair, common_name: str, names: Sequence[str], now: datetime.datetime
) -> KeyPair:
    """A server-and-client certificate for ``names`` (DNS names or IPs), signed by ``ca``."""
    ca_cert, ca_key = load(ca)
    key = _key()
    cert = (
        x509.CertificateBuilder()
        .subject_name(_name(common_name))
        .issuer_name(ca_cert.subject)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - CLOCK_SKEW)
        .not_valid_after(now + CERT_LIFETIME)
        .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
        .add_extension(_key_usage(signs_certificates=False), critical=True)
        .add_extension(
            x509.ExtendedKeyUsage(
                [ExtendedKeyUsageOID.SERVER_AUTH, ExtendedKeyUsageOID.CLIENT_AUTH]
            ),
            critical=False,
        )
        .add_extension(_san(names), critical=False)
        .add_extension(
            x509.AuthorityKeyIdentifier.from_issuer_public_key(ca_key.public_key()),
            critical=False,
        )
        .sign(ca_key, hashes.SHA256())
    )
    return KeyPair(_cert_pem(cert), _key_pem(key))


def load(pair: KeyPair) -> tuple[x509.Certificate, ec.EllipticCurvePrivateKey]:
    """Parse a stored pair; `PkiError` if either part is unusable or they do not match."""
    try:
        cert = x509.load_pem_x509_certificate(pair.cert_pem.encode())
    except ValueError as e:
        raise PkiError(f"certificate: not PEM: {e}") from None
    try:
        key = serialization.load_pem_private_key(pair.key_pem.encode(), password=None)
    except (ValueError, TypeError) as e:
        raise PkiError(f"key: not an unencrypted PEM private key: {e}") from None
    if not isinstance(key, ec.EllipticCurvePrivateKey) or key.public_key() != cert.public_key():
        raise PkiError("key: does not belong to the certificate")
    return cert, key


def fingerprint(cert_pem: str) -> str:
    """SHA-256 of the DER certificate, 16 hex digits (status and Events)."""
    der = x509.load_pem_x509_certificate(cert_pem.encode()).public_bytes(serialization.Encoding.DER)
    return hashlib.sha256(der).hexdigest()[:16]


def not_after(cert_pem: str) -> datetime.datetime:
    return x509.load_pem_x509_certificate(cert_pem.encode()).not_valid_after_utc


def renewal_reason(
    pair: KeyPair, ca_pem: str, names: Sequence[str], now: datetime.datetime
) -> str | None:
    """Why the stored certificate must be (re)issued, or None while it is good: broken or
    mismatched key, not signed by the CA, names differ from what the fleet needs now
    (a renamed Service, a new port does not matter), or a third of its life left."""
    try:
        cert, _ = load(pair)
    except PkiError as e:
        return str(e)
    try:
        ca = x509.load_pem_x509_certificate(ca_pem.encode())
        cert.verify_directly_issued_by(ca)
    except (ValueError, TypeError, InvalidSignature):
        return "not issued by the fleet's CA"
    try:
        san = cert.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
    except x509.ExtensionNotFound:
        return "no subjectAltName"
    have = {str(v) for v in san.get_values_for_type(x509.DNSName)} | {
        str(v) for v in san.get_values_for_type(x509.IPAddress)
    }
    if have != set(names):
        return f"names {sorted(have)} differ from {sorted(names)}"
    start, end = cert.not_valid_before_utc, cert.not_valid_after_utc
    if now >= end - (end - start) * RENEW_FRACTION:
        return f"expires {end.isoformat()} (renewing with a third of its lifetime left)"
    return None


def ca_problem(pair: KeyPair, now: datetime.datetime) -> str | None:
    """Why a stored CA cannot sign, or None."""
    try:
        cert, _ = load(pair)
    except PkiError as e:
        return f"CA {e}"
    try:
        constraints = cert.extensions.get_extension_for_class(x509.BasicConstraints).value
    except x509.ExtensionNotFound:
        return "CA certificate has no basicConstraints"
    if not constraints.ca:
        return "CA certificate is not a CA"
    if now >= cert.not_valid_after_utc - CERT_LIFETIME:
        return f"CA expires {cert.not_valid_after_utc.isoformat()}, before a new certificate would"
    return None
