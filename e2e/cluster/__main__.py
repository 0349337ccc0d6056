"""``python -m e2e.cluster up|down|status [--workdir DIR]`` (what ``scripts/cluster`` runs).

``up`` prints the admin kubeconfig's path and leaves the cluster running; ``down`` stops
it (the work directory defaults to the cluster that is up, else ``<repo>/.cluster``).
"""

from __future__ import annotations

import argparse
import json
import logging
import pathlib
import sys

from .cluster import Cluster, ClusterError, current_workdir
from .layout import PROJECT_IMAGES, ROOT

DEFAULT_WORKDIR = ROOT / ".cluster"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="scripts/cluster", description=__doc__.split("\n\n")[0])
    parser.add_argument("command", choices=("up", "down", "status"))
    parser.add_argument("--workdir", type=pathlib.Path, help=f"default: {DEFAULT_WORKDIR}")
    parser.add_argument(
        "--images",
        default=",".join(PROJECT_IMAGES),
        help="project images to import, comma-separated (scripts/tools/images.sh builds them)",
    )
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s: %(message)s")
    workdir = (
        args.workdir or (current_workdir() if args.command != "up" else None) or DEFAULT_WORKDIR
    )
    cluster = Cluster(workdir)
    try:
        if args.command == "up":
            names = tuple(n for n in args.images.split(",") if n)
            cluster.up(project_images=names)
            print(json.dumps(cluster.status(), indent=2))
            print(f"\nexport KUBECONFIG={cluster.kubeconfig}")
            return 0
        if args.command == "down":
            if not cluster.state:
                print(f"no cluster state in {workdir}", file=sys.stderr)
                return 1
            report = cluster.down()
            print(json.dumps(report, indent=2))
            return 1 if report["failed"] or report["leftovers"] or report["running"] else 0
        print(json.dumps(cluster.status(), indent=2))
        return 0
    except ClusterError as e:
        print(f"cluster {args.command}: {e}", file=sys.stderr)
        return 1


if __name__ == "__main__":
    sys.exit(main())
