"""The one vocabulary of rejection reasons, shared by every protocol and the metrics."""

from __future__ import annotations

from enum import StrEnum


class RejectReason(StrEnum):
    """Why a connection or a message was refused.

    The value is the ``reason`` label of ``eventfleet_rejected_total``: renaming a member
    breaks dashboards and alerts, so members are only ever added.
    """

    # admission (any transport)
    TOO_MANY_CONNECTIONS = "too_many_connections"
    MESSAGE_TOO_LARGE = "message_too_large"
    INIT_TIMEOUT = "init_timeout"
    # a connection not yet initialised, dropped to make room for a newer one (the
    # pre-init budget, listener/admission.py)
    EVICTED_BEFORE_INIT = "evicted_before_init"
    BAD_FRAME = "bad_frame"
    NOT_INITIALIZED = "not_initialized"
    BAD_MESSAGE = "bad_message"
    BAD_TOKEN = "bad_token"
    LOGIN_FAILED = "login_failed"
    UNEXPECTED_MESSAGE = "unexpected_message"
    BAD_COMMAND = "bad_command"
    TLS_HANDSHAKE = "tls_handshake"  # TLS on, the handshake failed or timed out
    # Eventer
    BAD_SUBSCRIPTION = "bad_subscription"
    REGISTER_FAILED = "register_failed"
    BAD_QUERY = "bad_query"
    SLOW_SUBSCRIBER = "slow_subscriber"
    SLOW_CLIENT = "slow_client"  # stopped reading its replies (write buffer, drain)
    # Syncer
    SLOW_PEER = "slow_peer"
    UNKNOWN_SERVER = "unknown_server"
    FUTURE_ID = "future_id"
    # Event BUS
    BAD_TOPIC = "bad_topic"
    BAD_KEY = "bad_key"  # CURVE: a client key not allowed, or a failed CURVE handshake
    RATE_LIMITED = "rate_limited"
    # Replication
    LOGIN_RATE_LIMITED = "login_rate_limited"
    WRITE_REFUSED = "write_refused"
    # Jetstream
    UNKNOWN_SESSION = "unknown_session"
    BAD_SCOPE = "bad_scope"
    BAD_FRAGMENT = "bad_fragment"
