"""``eventfleet register | query | watch``: Eventer client commands printing JSON."""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import pathlib
import sys

DEFAULT_EVENTER = "127.0.0.1:23012"


def _address(text: str) -> tuple[str, int]:
    host, sep, port = text.rpartition(":")
    if not sep or not port.isdigit():
        raise argparse.ArgumentTypeError(f"{text!r} is not HOST:PORT")
    return host or "127.0.0.1", int(port)


def _event_type(text: str) -> tuple[str, ...]:
    """``a/b/c`` → ('a', 'b', 'c'); an empty string is the empty type."""
    return tuple(text.split("/")) if text else ()


def _common(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--eventer", type=_address, default=_address(DEFAULT_EVENTER), metavar="HOST:PORT"
    )
    p.add_argument("--name", default="eventfleet-cli", help="client name sent on init")
    p.add_argument(
        "--token-file", type=pathlib.Path, help="file with the token (else $EVENTFLEET_TOKEN)"
    )
    p.add_argument(
        "--tls-ca",
        type=pathlib.Path,
        help="connect over TLS, verifying the replica's certificate against this CA file",
    )
    p.add_argument(
        "--timeout",
        type=float,
        default=10.0,
        metavar="SECONDS",
        help="how long connecting (TCP, TLS, Eventer init) may take (default 10)",
    )
    p.add_argument(
        "--tls-server-name",
        metavar="NAME",
        help="with --tls-ca: the name the certificate must carry when --eventer is not it "
        "(kubectl port-forward to 127.0.0.1, e.g. demo-0.demo-peers.NAMESPACE.svc)",
    )


def add_parsers(sub) -> None:
    p = sub.add_parser("register", help="register one event, print it as JSON")
    _common(p)
    p.add_argument("type", type=_event_type, help="event type as a/b/c")
    g = p.add_mutually_exclusive_group()
    g.add_argument("--json", dest="json_payload", help="JSON payload text")
    g.add_argument("--binary-file", type=pathlib.Path, help="binary payload from a file")
    p.add_argument("--binary-type", default="", help="type name of the binary payload")
    p.add_argument("--source-timestamp", help="ISO 8601 or seconds since the epoch")
    p.set_defaults(func=lambda a: _run(a, _register(a)))

    p = sub.add_parser("query", help="query events, print them as JSON")
    _common(p)
    qs = p.add_subparsers(dest="query", required=True)
    q = qs.add_parser("latest", help="latest event of each matching type")
    q.add_argument("types", nargs="*", type=_event_type, help="patterns (default all)")
    q = qs.add_parser("timeseries", help="events ordered by time")
    q.add_argument("types", nargs="*", type=_event_type)
    q.add_argument("--from", dest="t_from")
    q.add_argument("--to", dest="t_to")
    q.add_argument("--source-from")
    q.add_argument("--source-to")
    q.add_argument("--order", choices=["ascending", "descending"], default="descending")
    q.add_argument("--order-by", choices=["timestamp", "sourceTimestamp"], default="timestamp")
    q.add_argument("--max-results", type=int)
    q.add_argument("--all", action="store_true", help="follow moreFollows to the end")
    q = qs.add_parser("server", help="events of one server id in id order")
    q.add_argument("server_id", type=int)
    q.add_argument("--persisted", action="store_true")
    q.add_argument("--max-results", type=int)
    q.add_argument("--all", action="store_true", help="follow moreFollows to the end")
    p.set_defaults(func=lambda a: _run(a, _query(a)))

    p = sub.add_parser("watch", help="print notified events as JSON lines")
    _common(p)
    p.add_argument("types", nargs="*", type=_event_type, help="subscriptions (default '*')")
    p.add_argument("--server-id", type=int, help="only events created by this server id")
    p.add_argument("--persisted", action="store_true", help="notify after commit")
    p.add_argument("--count", type=int, help="exit after this many events")
    p.set_defaults(func=lambda a: _run(a, _watch(a)))


def _run(args, coro) -> int:
    from eventfleet_server.chatter.connection import FrameError
    from eventfleet_server.client.eventer import EventerInitError

    from eventfleet_cli import errors

    try:
        return asyncio.run(coro)
    except EventerInitError as e:
        print(f"eventfleet: server refused the connection: {e}", file=sys.stderr)
    except (OSError, asyncio.IncompleteReadError, FrameError) as e:
        # OSError covers refused and reset connections, TLS errors and timeouts.
        message = errors.describe(e, args.eventer, args.timeout, args.tls_ca)
        print(f"eventfleet: {message}", file=sys.stderr)
    except ValueError as e:
        print(f"eventfleet: {e}", file=sys.stderr)
    return 1


def _token(args) -> str | None:
    if args.token_file:
        return args.token_file.read_text().strip()
    return os.environ.get("EVENTFLEET_TOKEN") or None


async def _connect(args, **kwargs):
    from eventfleet_server.client.eventer import connect

    host, port = args.eventer
    ssl = None
    if args.tls_server_name and not args.tls_ca:
        raise SystemExit(
            "--tls-server-name needs --tls-ca (the CA the certificate is checked against)"
        )
    if args.tls_ca:
        from eventfleet_server.listener import client_context

        if not args.tls_ca.is_file():
            raise ValueError(f"--tls-ca {args.tls_ca}: no such file (the fleet's CA, PEM)")

        ssl = client_context(str(args.tls_ca))
    return await connect(
        host,
        port,
        args.name,
        client_token=_token(args),
        ssl=ssl,
        server_hostname=args.tls_server_name,
        timeout=args.timeout,
        **kwargs,
    )


def _print(obj) -> None:
    sys.stdout.write(json.dumps(obj) + "\n")
    sys.stdout.flush()


async def _register(args) -> int:
    from eventfleet_server.common import EventPayloadBinary, EventPayloadJson, RegisterEvent
    from eventfleet_server.common.jsonfmt import event_to_json, timestamp_from_iso

    payload = None
    if args.json_payload is not None:
        try:
            json.loads(args.json_payload)  # fail here, clearly, rather than store garbage
        except ValueError as e:
            raise ValueError(f"--json {args.json_payload!r} is not valid JSON: {e}") from e
        payload = EventPayloadJson(args.json_payload)
    elif args.binary_file is not None:
        payload = EventPayloadBinary(args.binary_type, args.binary_file.read_bytes())
    st = timestamp_from_iso(args.source_timestamp) if args.source_timestamp else None
    client = await _connect(args)
    try:
        created = await client.register([RegisterEvent(args.type, st, payload)], True)
    finally:
        await client.close()
    if created is None:
        print("eventfleet: the server refused the registration", file=sys.stderr)
        return 1
    for e in created:
        _print(event_to_json(e))
    return 0


async def _query(args) -> int:
    from eventfleet_server.common import (
        Order,
        OrderBy,
        QueryLatestParams,
        QueryServerParams,
        QueryTimeseriesParams,
    )
    from eventfleet_server.common.jsonfmt import event_to_json, timestamp_from_iso

    def ts(v):
        return timestamp_from_iso(v) if v else None

    if args.query == "latest":
        params = QueryLatestParams(args.types or None)
    elif args.query == "timeseries":
        params = QueryTimeseriesParams(
            event_types=args.types or None,
            t_from=ts(args.t_from),
            t_to=ts(args.t_to),
            source_t_from=ts(args.source_from),
            source_t_to=ts(args.source_to),
            order=Order(args.order),
            order_by=OrderBy(args.order_by),
            max_results=args.max_results,
        )
    else:
        params = QueryServerParams(args.server_id, args.persisted, args.max_results)
    client = await _connect(args)
    try:
        while True:
            result = await client.query(params)
            for e in result.events:
                _print(event_to_json(e))
            if not (getattr(args, "all", False) and result.more_follows and result.events):
                break
            params = params._replace(last_event_id=result.events[-1].id)
    finally:
        await client.close()
    return 0


async def _watch(args) -> int:
    from eventfleet_server.common.jsonfmt import event_to_json

    done = asyncio.Event()
    seen = 0

    def on_events(events):
        nonlocal seen
        for e in events:
            _print(event_to_json(e))
            seen += 1
            if args.count and seen >= args.count:
                done.set()
                return

    client = await _connect(
        args,
        subscriptions=args.types or [("*",)],
        server_id=args.server_id,
        persisted=args.persisted,
        events_cb=on_events,
    )
    try:
        closed = asyncio.ensure_future(client.wait_closed())
        await asyncio.wait(
            [closed, asyncio.ensure_future(done.wait())], return_when="FIRST_COMPLETED"
        )
    finally:
        await client.close()
    return 0
