"""Reading a secret (password, access key) from a mounted file.

Kubernetes mounts Secrets as files; every option that names one (``*_file``) reads it
here, so every caller gives the same errors: the option and the path, never the value.
"""

from __future__ import annotations

import pathlib


class SecretFileError(ValueError):
    """The secret file cannot be read or holds nothing."""


def read_secret_file(path: str, what: str) -> str:
    """The file's text without surrounding whitespace; `what` names the option."""
    try:
        text = pathlib.Path(path).read_text().strip()
    except OSError as e:
        raise SecretFileError(f"{what} {path}: cannot read: {e.strerror}") from None
    if not text:
        raise SecretFileError(f"{what} {path}: file is empty")
    return text
