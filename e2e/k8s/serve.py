"""Run the emulator as a process: ``python -m e2e.k8s.serve --port 0 --kubeconfig FILE``.

Writes a kubeconfig pointing at it (plain HTTP on 127.0.0.1, no auth) and prints the
URL on stdout; stops on SIGTERM/SIGINT. The e2e tests run it in-process instead; this
is for poking at it by hand with kubectl, helm or kopf.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import signal
import sys

import kmock

from .emulator import Emulator
from .kubeconfig import write_kubeconfig


async def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m e2e.k8s.serve")
    parser.add_argument("--port", type=int, default=0)
    parser.add_argument("--kubeconfig", help="write a kubeconfig for the emulator here")
    parser.add_argument("--namespace", default="default", help="the kubeconfig context's namespace")
    parser.add_argument("--audit-log", help="append one JSON line per resource request here")
    args = parser.parse_args(argv)
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    async with Emulator() as emulator, kmock.Server(emulator, port=args.port or None) as server:
        emulator.audit_path = args.audit_log
        url = f"http://127.0.0.1:{server.port}"
        if args.kubeconfig:
            write_kubeconfig(args.kubeconfig, url, namespace=args.namespace)
        print(url, flush=True)
        with contextlib.suppress(asyncio.CancelledError):
            await stop.wait()
    return 0


if __name__ == "__main__":
    sys.exit(asyncio.run(main()))
