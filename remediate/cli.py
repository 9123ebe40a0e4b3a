"""`gpulens remediate`: run the Alertmanager webhook receiver that isolates faulty GPUs' nodes.

Every setting is declared once, on its ReceiverConfig field (remediate/config.py); the options,
their `GPULENS_*` environment fallbacks and the one-line errors come from there
(`gpulens.settings`), as the exporter's do. The web and log flags are the exporter's
(exporter-toolkit's names): `--web.listen-address`, `--web.config.file` (TLS, basic auth users,
headers), `--web.telemetry-path`, `--web.disable-exporter-metrics`, `--log.level`, `--log.format`.
The names the receiver used before (`--listen`, `--log-level`, `--basic-auth-user` /
`--basic-auth-password-file`) still work and log one warning line naming what replaces them. The
bearer token Alertmanager sends stays `--token-file`: the web config file has no place for one.
The subcommands `return` and `diag` are small clients with their own flags. This module holds the
flags and picks what runs: the receiver (`daemon.py`), `return` (`returnclient.py`) or `diag`
(`diagnose.py`).
"""

from __future__ import annotations

import argparse
import os
from pathlib import Path

from gpulens.remediate import diagnose
from gpulens.remediate.config import DEFAULT_LISTEN, ReceiverConfig, config_of
from gpulens.remediate.daemon import serve
from gpulens.remediate.returnclient import run_return
from gpulens.remediate.usage import fail
from gpulens.serverflags import ConfigError
from gpulens.settings import add_arguments, aliases_of


def register(subparsers: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    parser = subparsers.add_parser(
        "remediate",
        help="Alertmanager webhook receiver that isolates faulty GPU nodes",
        description=__doc__.splitlines()[0],
        epilog="Every flag falls back to GPULENS_<FLAG> (--backend: GPULENS_BACKEND; switches take "
        "1/true/yes or 0/false/no). Deprecated names kept from earlier releases: "
        + ", ".join(f"{old} = {new}" for old, new in aliases_of(ReceiverConfig).items()),
    )
    add_arguments(parser, ReceiverConfig)
    actions = parser.add_subparsers(dest="remediate_action", metavar="{return,diag}")
    diag = actions.add_parser(
        "diag",
        help="run the return diagnostic on this node (what the diagnostic Job runs)",
        description="Run `dcgmi diag -r LEVEL -j` for the GPU where dcgmi is found, else NVML checks; "
        "print the verdict as one JSON line (also to /dev/termination-log); exit 0 passed, 1 failed, "
        "2 error.",
    )
    diag.add_argument("--level", type=int, choices=diagnose.LEVELS, default=2, help="dcgmi diag level")
    diag.add_argument("--gpu", default="", help="the GPU's index (DCGM id); default every GPU")
    diag.add_argument("--uuid", default="", help="the GPU's UUID, for the NVML check")
    diag.add_argument("--dcgmi", default="dcgmi", help="the dcgmi program (default dcgmi from PATH)")
    back = actions.add_parser(
        "return",
        help="return a node that is ready (after its recovery and hold-down) to service",
        description="Ask the running receiver to return NODE to service (POST /-/return).",
    )
    back.add_argument("node", metavar="NODE")
    back.add_argument(
        "--url", default=f"http://{DEFAULT_LISTEN}", help=f"the receiver (default http://{DEFAULT_LISTEN})"
    )
    back.add_argument("--token-file", type=Path, help="file with the receiver's bearer token")
    back.add_argument("--basic-auth-user", help="basic auth user name of the receiver")
    back.add_argument("--basic-auth-password-file", type=Path, help="file with the basic auth password")
    back.add_argument(
        "--ca-file",
        type=Path,
        metavar="FILE",
        help="CA bundle that signed the receiver's certificate, for an https --url (default: the "
        "system's CAs)",
    )
    back.add_argument(
        "--cert-file",
        type=Path,
        metavar="FILE",
        help="client certificate, for a receiver whose web config file asks for one (client_ca_file)",
    )
    back.add_argument("--key-file", type=Path, metavar="FILE", help="the key of --cert-file")
    back.add_argument(
        "--force",
        action="store_true",
        help="return it even though its episodes are not ready (escalated, recovering); never for RMA",
    )
    parser.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    if getattr(args, "remediate_action", None) == "return":
        return run_return(args)
    if getattr(args, "remediate_action", None) == "diag":
        if args.gpu and not args.gpu.isdigit():
            return fail(f"--gpu {args.gpu!r}: expected a GPU index")
        return diagnose.main(args.level, args.gpu, args.uuid, args.dcgmi)
    try:
        config = config_of(args, os.environ)
    except ConfigError as exc:
        return fail(str(exc))
    return serve(config, os.environ)
