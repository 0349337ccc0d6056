"""The local fleet's start banner names commands that run as printed."""

from __future__ import annotations

import pathlib
import stat

from eventfleet_server.fleet import banner, layout


def _script(path: pathlib.Path) -> pathlib.Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("#!/bin/sh\n")
    path.chmod(path.stat().st_mode | stat.S_IXUSR)
    return path


def test_cli_is_the_running_console_script_relative_to_the_checkout(tmp_path):
    # ./scripts/run: cwd is the checkout, argv[0] the venv's console script (not on PATH).
    script = _script(tmp_path / ".venv" / "bin" / "eventfleet")
    shown = banner.cli_command(str(script), str(tmp_path / ".venv/bin/python"), tmp_path)
    assert shown == ".venv/bin/eventfleet"


def test_cli_elsewhere_is_absolute_and_python_m_is_the_last_resort(tmp_path):
    script = _script(tmp_path / "venv" / "bin" / "eventfleet")
    elsewhere = tmp_path / "somewhere"
    elsewhere.mkdir()
    python = str(tmp_path / "venv" / "bin" / "python")
    assert banner.cli_command("-m", python, elsewhere) == str(script)  # next to python
    bare = str(tmp_path / "bare" / "python")
    assert banner.cli_command("-m", bare, elsewhere) == f"{bare} -m eventfleet_cli"


def _plan(tmp_path, **kwargs):
    return layout.plan(2, tmp_path / "data", base_port=40010, **kwargs)


def test_banner_uses_the_cli_path_and_a_tcp_address_for_hat(tmp_path):
    text = banner.connect_banner(_plan(tmp_path), ".venv/bin/eventfleet")
    assert "  .venv/bin/eventfleet register --eventer 127.0.0.1:40010 a/b" in text
    assert "net.TcpAddress('127.0.0.1', 40010)" in text
    assert "connect(('127.0.0.1'" not in text  # hat-event 0.9 refuses a tuple
    assert "\n  eventfleet " not in text  # a bare name is not on PATH after ./scripts/run


def test_banner_with_required_token_passes_it_and_with_tls_warns_about_hat(tmp_path):
    strict = banner.connect_banner(_plan(tmp_path, tokenless_loopback=False), "ef")
    token = str(tmp_path / "data" / "token")
    assert f"--token-file {token}" in strict
    assert f"client_token=open({token!r}).read().strip()" in strict
    tls = banner.connect_banner(_plan(tmp_path, tls=True), "ef")
    assert "--tls-ca" in tls and "net.TcpAddress" not in tls
    assert "Hat components (hat-event clients) cannot connect" in tls
