"""Secret files: one reader for every ``*_file`` option (backup keys, Replication passwords)."""

from __future__ import annotations

import pytest
from eventfleet_server.backup import s3
from eventfleet_server.common.secretfile import SecretFileError, read_secret_file
from eventfleet_server.replication.login import Credentials


def test_value_is_stripped(tmp_path):
    f = tmp_path / "key"
    f.write_text("  s3cret\n")
    assert read_secret_file(str(f), "opt") == "s3cret"


@pytest.mark.parametrize("content", [None, "", " \n\t"])
def test_missing_or_empty_file_names_option_and_path(tmp_path, content):
    f = tmp_path / "key"
    if content is not None:
        f.write_text(content)
    with pytest.raises(SecretFileError) as e:
        read_secret_file(str(f), "backup.s3.secret_key_file")
    assert "backup.s3.secret_key_file" in str(e.value)
    assert str(f) in str(e.value)
    assert str(e.value).endswith("file is empty") == (content is not None)


def test_backup_reports_its_own_error_type(tmp_path):
    with pytest.raises(s3.BackupError, match="cannot read"):
        s3._read_secret(str(tmp_path / "absent"), "access key file")


def test_replication_password_file_shares_the_rule(tmp_path):
    f = tmp_path / "password"
    f.write_text("\n")
    with pytest.raises(ValueError, match=r"replication\.password_file .*: file is empty"):
        Credentials.load(password_file=str(f), users_file=None, token=None)
    f.write_text("pw\n")
    creds = Credentials.load(password_file=str(f), users_file=None, token=None)
    assert creds.password("anyone") == "pw"
    assert "pw" not in repr(creds)
