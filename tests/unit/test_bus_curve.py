"""The Event BUS's CURVE set-up without sockets: key files (Z85 text and ZeroMQ
certificate files), the errors that name the bad value, the configuration checks, the
token-derived key pair and the ZAP decisions."""

from __future__ import annotations

import re

import pytest
import zmq
import zmq.auth
import zmq.utils.z85
from eventfleet_server.bus import SCHEMA
from eventfleet_server.bus.config import BusConfig, CurveConfig, CurveError
from eventfleet_server.bus.curve import (
    CURVE_DOMAIN,
    PLAIN_DOMAIN,
    BusCurve,
    read_public_keys,
    read_secret_key,
    token_keypair,
)
from eventfleet_server.config.loader import fill_defaults
from eventfleet_server.config.typed import build


def curve_config(**over) -> CurveConfig:
    raw = fill_defaults(SCHEMA, {"curve": {"enabled": True, **over}})
    return build(BusConfig, raw).curve


def test_secret_key_from_z85_text_and_from_a_zeromq_certificate(tmp_path):
    _, secret = zmq.curve_keypair()
    (tmp_path / "server.key").write_bytes(secret + b"\n")
    assert read_secret_key(str(tmp_path / "server.key")) == zmq.utils.z85.decode(secret)
    pub_file, secret_file = zmq.auth.create_certificates(str(tmp_path), "cert")
    cert_public, cert_secret = zmq.auth.load_certificate(secret_file)
    assert read_secret_key(secret_file) == zmq.utils.z85.decode(cert_secret)
    assert read_public_keys(pub_file) == {zmq.utils.z85.decode(cert_public)}


def test_bad_key_files_are_named_and_a_secret_is_never_echoed(tmp_path):
    path = tmp_path / "server.key"
    path.write_text("x" * 39 + "\n")
    with pytest.raises(CurveError) as e:
        read_secret_key(str(path))
    assert str(path) in str(e.value) and "got 39" in str(e.value)
    assert "x" * 39 not in str(e.value)
    path.write_text("%" * 40)  # 40 Z85 digits, but beyond 2**256
    with pytest.raises(CurveError, match="is not a Z85 CURVE key"):
        read_secret_key(str(path))
    with pytest.raises(CurveError, match="cannot be read"):
        read_secret_key(str(tmp_path / "missing.key"))
    clients = tmp_path / "clients.txt"
    clients.write_text("# comment\n" + zmq.curve_keypair()[0].decode() + "\nnot-a-key\n")
    with pytest.raises(CurveError) as e:
        read_public_keys(str(clients))
    assert f"{clients}:3" in str(e.value) and "'not-a-key'" in str(e.value)


def test_allowed_keys_directory_skips_dot_entries_and_keeps_keys_with_a_hash(tmp_path):
    keys = [zmq.curve_keypair()[0] for _ in range(3)]
    hashed = keys[0]
    while b"#" not in hashed:  # '#' is a Z85 digit (never the first of a 32-byte key)
        hashed = zmq.curve_keypair()[0]
    (tmp_path / "a").write_text(keys[1].decode() + "\n" + "  " + keys[2].decode() + "  \n")
    (tmp_path / "b").write_text(hashed.decode() + "\n")
    (tmp_path / "..data").mkdir()  # a Kubernetes Secret volume's own entries
    (tmp_path / ".hidden").write_text("garbage\n")
    want = {zmq.utils.z85.decode(k) for k in [hashed, *keys[1:]]}
    assert read_public_keys(str(tmp_path)) == want
    (tmp_path / "b").write_text(f'curve\n    public-key = "{hashed.decode()}"\n')
    assert read_public_keys(str(tmp_path)) == want


def test_token_keypair_is_a_valid_deterministic_curve_pair():
    public, secret = token_keypair("s3cret")
    assert token_keypair("s3cret") == (public, secret)
    assert token_keypair("other")[0] != public
    assert zmq.curve_public(secret) == public
    assert len(public) == len(secret) == 40


def test_configuration_checks_name_the_bad_value():
    with pytest.raises(CurveError, match="secret_key_file: required"):
        curve_config()
    with pytest.raises(CurveError, match="no client could connect"):
        curve_config(secret_key_file="/k", tokens=False)
    with pytest.raises(CurveError, match=re.escape("'10.0.0.0/33'")):
        curve_config(secret_key_file="/k", plain_networks=["10.0.0.0/33"])
    raw = fill_defaults(
        SCHEMA,
        {"port": 23030, "curve": {"enabled": True, "secret_key_file": "/k", "plain_port": 23032}},
    )
    with pytest.raises(CurveError, match="plain_port: 23032 overlaps the CURVE ports"):
        build(BusConfig, raw)
    assert not curve_config(enabled=False).enabled  # off: nothing required


def test_zap_decisions(tmp_path):
    _, secret = zmq.curve_keypair()
    (tmp_path / "server.key").write_bytes(secret)
    allowed = zmq.curve_keypair()[0]
    (tmp_path / "allowed").write_bytes(allowed + b"\n")
    tokens = ["t1"]
    curve = BusCurve(
        curve_config(
            secret_key_file=str(tmp_path / "server.key"),
            allowed_keys=str(tmp_path / "allowed"),
            plain_port=0,
            plain_networks=["127.0.0.0/8"],
        ),
        lambda: tokens,
    )
    assert curve.public_key == zmq.curve_public(secret)

    def key(z85: bytes) -> list[bytes]:
        return [zmq.utils.z85.decode(z85)]

    assert curve.authorize(CURVE_DOMAIN, "10.1.1.1", b"CURVE", key(allowed))[0] == allowed
    assert curve.authorize(CURVE_DOMAIN, "10.1.1.1", b"CURVE", key(token_keypair("t1")[0]))[0]
    user, why = curve.authorize(CURVE_DOMAIN, "10.1.1.1", b"CURVE", key(token_keypair("t0")[0]))
    assert user is None and token_keypair("t0")[0].decode() in why
    tokens[:] = ["t0"]  # a token rotation applies at the next handshake
    assert curve.authorize(CURVE_DOMAIN, "10.1.1.1", b"CURVE", key(token_keypair("t0")[0]))[0]
    assert curve.authorize(PLAIN_DOMAIN, "127.0.0.1", b"PLAIN", [b"u", b"t0"])[0] == b"u"
    assert curve.authorize(PLAIN_DOMAIN, "::ffff:127.0.0.1", b"PLAIN", [b"u", b"t0"])[0]
    user, why = curve.authorize(PLAIN_DOMAIN, "10.1.1.1", b"PLAIN", [b"u", b"t0"])
    assert user is None and "10.1.1.1" in why
    assert curve.authorize(PLAIN_DOMAIN, "127.0.0.1", b"PLAIN", [b"u", b"bad"])[0] is None
    # PLAIN credentials on the CURVE listeners (a domain mix-up) are never accepted.
    assert curve.authorize(CURVE_DOMAIN, "127.0.0.1", b"PLAIN", [b"u", b"t0"])[0] is None
