"""``eventfleet operator``: run the Kopf operator (needs the ``[operator]`` extra)."""

from __future__ import annotations

import argparse


def add_parser(sub) -> None:
    from eventfleet_operator import cli

    p = sub.add_parser(
        "operator",
        help="run the Kubernetes operator",
        description="Reconcile EventServer resources into StatefulSets and their children.",
    )
    cli.add_arguments(p)
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from eventfleet_operator import cli

    return cli.main_from_args(args)
