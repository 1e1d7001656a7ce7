"""``raydist debug``: list the ranks waiting in pdb under the runs on this
machine, and attach this terminal to one of them (through its run's relay,
``raydist.pool.driver.debug_relay``)."""

from __future__ import annotations

import glob
import json
import os
import socket
import sys
from typing import Any, Dict, List, Optional, Tuple

from raydist.pool.driver.debug_relay import pump_terminal, read_line, registry_dir

CONNECT_TIMEOUT_S = 5.0


def _relays() -> List[Dict[str, Any]]:
    """The relays registered on this machine whose driver still runs."""
    found = []
    for path in sorted(glob.glob(os.path.join(registry_dir(), "*.json"))):
        try:
            with open(path) as file:
                relay = json.load(file)
            os.kill(int(relay["pid"]), 0)
        except (OSError, ValueError, KeyError, TypeError):
            continue
        found.append(relay)
    return found


def _ask(relay: Dict[str, Any], message: Dict[str, Any]) -> Tuple[socket.socket, Dict[str, Any]]:
    host, _, port = str(relay["address"]).rpartition(":")
    connection = socket.create_connection((host, int(port)), timeout=CONNECT_TIMEOUT_S)
    connection.sendall(json.dumps({"role": "client", "token": relay["token"], **message}).encode() + b"\n")
    reply = json.loads(read_line(connection) or b"{}")
    connection.settimeout(None)
    return connection, reply


def waiting_ranks() -> List[Tuple[Dict[str, Any], Dict[str, Any]]]:
    """(relay, stopped rank) for every rank waiting in pdb on this machine's runs."""
    found: List[Tuple[Dict[str, Any], Dict[str, Any]]] = []
    for relay in _relays():
        try:
            connection, reply = _ask(relay, {"op": "list"})
            connection.close()
        except (OSError, ValueError):
            continue
        found.extend((relay, stopped) for stopped in reply.get("stopped", []))
    return found


def _line(relay: Dict[str, Any], stopped: Dict[str, Any]) -> str:
    return (
        f"rank {stopped['rank']}: {stopped['kind']} in {stopped['where']} "
        f"(pid {stopped['pid']} on {stopped['host']}; run of driver pid {relay['pid']})"
    )


def debug_command(rank: Optional[int], list_only: bool) -> int:
    """List the waiting ranks, or attach to one (``rank``, or the only one); the exit status."""
    stopped = waiting_ranks()
    if rank is not None:
        stopped = [(relay, s) for relay, s in stopped if s["rank"] == rank]
    if not stopped:
        print("raydist debug: no rank is waiting in pdb" + (f" as rank {rank}" if rank is not None else ""), file=sys.stderr)
        return 1
    if list_only or len({(r["address"], s["rank"]) for r, s in stopped}) > 1:
        for relay, entry in stopped:
            print(_line(relay, entry))
        if not list_only:
            print("raydist debug: several ranks are waiting; choose one with --rank", file=sys.stderr)
        return 0 if list_only else 2
    relay, entry = stopped[0]
    try:
        connection, reply = _ask(relay, {"op": "attach", "rank": entry["rank"]})
    except (OSError, ValueError) as error:
        print(f"raydist debug: cannot reach the run's relay at {relay['address']}: {error}", file=sys.stderr)
        return 1
    if "error" in reply:
        print(f"raydist debug: {reply['error']}", file=sys.stderr)
        return 1
    print(f"raydist debug: attached to {_line(relay, entry)}; `c` continues it", file=sys.stderr, flush=True)
    with connection:
        pump_terminal(connection)
    return 0
