"""`taehv-console trust HOST...`: show a node's SSH host key fingerprint and add it to known_hosts
only when the user confirms (or passes --yes after checking it some other way). This is the only
way a host key gets into known_hosts: connections never add keys on their own.
"""

from __future__ import annotations

import argparse
import sys

from taehv_console.commands.options import add_option, add_ssh_options, ssh_settings
from taehv_console.core.cluster.hosts import read_hostfile, validate_host
from taehv_console.core.cluster.ssh import SshError, SshSettings, sha256_fingerprint
from taehv_console.core.flow.trust import TrustOutcome, offer_host_key, trust_offered_key
from taehv_console.exit_codes import CRASHED_MEANING, ExitCode

EXIT_CODES = {
    ExitCode.DONE: "every host's key is trusted (added, or already there)",
    ExitCode.FAILED: "a key was not added: refused (it changed), not confirmed, or the host did not answer",
    ExitCode.USAGE: "wrong command line, no host, or a bad host name or hostfile",
    ExitCode.CRASHED: CRASHED_MEANING,
    ExitCode.INTERRUPTED: "interrupted (Ctrl-C)",
}


def register(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("host", nargs="*", help="host names or ssh-config aliases")
    add_option(parser, "hosts", help="trust every host of a DeepSpeed hostfile ('host slots=N' per line)")
    parser.add_argument(
        "--yes",
        action="store_true",
        help="add without asking (for scripts that checked the fingerprint already)",
    )
    parser.add_argument(
        "--replace",
        action="store_true",
        help="replace a key that changed (after confirming the node was reinstalled)",
    )
    add_ssh_options(parser)


def _ask(question: str) -> bool:
    print(question, end=" ", flush=True)
    answer = sys.stdin.readline()  # EOF (no terminal, no input) reads as "no"
    return answer.strip().lower() in ("y", "yes")


def trust_one(host: str, settings: SshSettings, *, yes: bool, replace: bool) -> ExitCode:
    offer = offer_host_key(host, settings)
    where = settings.known_hosts
    print(offer.line)
    if offer.already_trusted:
        print(f"  already trusted in {where}")
        return ExitCode.DONE
    if offer.changed:
        print(
            f"  WARNING: {where} holds a different {offer.key_type} key for {offer.target.known_name}: "
            f"{sha256_fingerprint(offer.known)}"
        )
        if not replace:
            print(
                "  refused: a changed host key means a reinstalled node or someone in the middle. "
                "Check with the node's admin, then rerun with --replace."
            )
            return ExitCode.FAILED
    elif offer.other_types:
        print(f"  {where} has other key types for it ({', '.join(offer.other_types)}); this one is new")
    else:
        print(f"  not in {where}")
    print(
        f"  compare with the node's own: ssh-keygen -lf /etc/ssh/ssh_host_{offer.key_type.split('-')[-1]}_key.pub"
    )
    if not yes and not _ask(f"Add this key for {offer.target.known_name} to {where}? [y/N]"):
        print("  not added")
        return ExitCode.FAILED
    outcome = trust_offered_key(offer, settings, replace=replace)
    if outcome is TrustOutcome.REFUSED_CHANGED:
        print(f"  refused: {where} gained a different key for {offer.target.known_name} meanwhile; run again")
        return ExitCode.FAILED
    print(f"  added {offer.target.known_name} to {where}")
    return ExitCode.DONE


def run(args: argparse.Namespace) -> ExitCode:
    hosts = list(args.host)
    # a bad hostfile or host name: 2, said by cli.main (errors.py)
    if args.hosts:
        hosts += [n.host for n in read_hostfile(args.hosts)]
    hosts = [validate_host(h) for h in hosts]  # '[::1]' is the address ::1
    if not hosts:
        print("taehv-console trust: name at least one host (or --hosts FILE)", file=sys.stderr)
        return ExitCode.USAGE
    settings = ssh_settings(args)
    status = ExitCode.DONE
    for h in hosts:
        try:
            status = max(status, trust_one(h, settings, yes=args.yes, replace=args.replace))
        except SshError as err:
            print(f"{err}" + (f"\n  fix: {err.fix}" if err.fix else ""), file=sys.stderr)
            status = ExitCode.FAILED
    return status
