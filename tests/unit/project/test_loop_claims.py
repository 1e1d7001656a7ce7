"""What docs/architecture.md says about the run's control loop and the
policy, checked from the source: the policy is asked in one place, by the
loop alone; the phase moves only in the loop; what a user's thread runs
never changes the run."""

from __future__ import annotations

import ast
from pathlib import Path
from typing import Dict, Iterator, List, Set, Tuple

PACKAGE = Path(__file__).resolve().parents[3] / "raydist"
CONTROLLER = PACKAGE / "pool" / "driver" / "controller.py"

# What a user's thread runs in RunController: post an event and wait (and read).
USER_SIDE = {"send", "shutdown", "_post", "_ask", "_wait", "_interrupt", "_wait_for_call", "_cancel_call", "_room_found", "_hang_seen"}
USER_SIDE |= {"_slow_seen"}
# What only the loop runs: every change of the run.
LOOP_SIDE = {"_turn", "_handle", "_send", "_end_calls", "_after_failure", "_decide", "_restart_warm", "_restart_fresh", "_grow"}
LOOP_SIDE |= {"_start", "_open_attempt", "_cancel", "_interrupted", "_hung", "_slow", "_kill", "stop"}


def calls_in(tree: ast.AST) -> Iterator[Tuple[str, ast.Call]]:
    """Every call's dotted name (``self.attempts.decide``), with the call."""
    for node in ast.walk(tree):
        if isinstance(node, ast.Call):
            yield ast.unparse(node.func), node


def sources() -> Dict[Path, ast.Module]:
    return {path: ast.parse(path.read_text()) for path in PACKAGE.rglob("*.py")}


def test_the_policy_is_asked_in_one_place_by_the_loop_alone() -> None:
    deciding: List[str] = []
    for path, tree in sources().items():
        for name, _ in calls_in(tree):
            if name == "decide" or name.endswith((".decide", "._policy")):
                deciding.append(f"{path.relative_to(PACKAGE)}: {name}")
    # Attempts asks the policy; the controller's loop asks Attempts, in one method.
    assert sorted(deciding) == ["pool/driver/attempts.py: self._policy", "pool/driver/controller.py: self.attempts.decide"], deciding
    controller = ast.parse(CONTROLLER.read_text())
    methods = {node.name: node for node in ast.walk(controller) if isinstance(node, ast.FunctionDef)}
    asking = [name for name, method in methods.items() if any(call == "self.attempts.decide" for call, _ in calls_in(method))]
    assert asking == ["_decide"]
    assert "_decide" in LOOP_SIDE
    # A hang is put to the policy the same way, by the loop alone.
    hanging = [name for name, method in methods.items() if any(call == "self.attempts.hung" for call, _ in calls_in(method))]
    assert hanging == ["_hung"] and "_hung" in LOOP_SIDE
    # And a lasting straggler.
    slow = [name for name, method in methods.items() if any(call == "self.attempts.straggler" for call, _ in calls_in(method))]
    assert slow == ["_slow"] and "_slow" in LOOP_SIDE


def test_the_phase_moves_only_in_the_loop() -> None:
    moving: Set[str] = set()
    for path, tree in sources().items():
        for name, _ in calls_in(tree):
            if name.endswith(("life.move", "life.stop", "life.close")):
                moving.add(str(path.relative_to(PACKAGE)))
    assert moving == {"pool/driver/controller.py"}
    controller = ast.parse(CONTROLLER.read_text())
    for method in (n for n in ast.walk(controller) if isinstance(n, ast.FunctionDef)):
        if any(name.startswith("self.life.") and not name.endswith("phase") for name, _ in calls_in(method)):
            assert method.name in LOOP_SIDE, f"{method.name} moves the phase but is not the loop's"


def test_what_a_users_thread_runs_never_changes_the_run() -> None:
    controller = ast.parse(CONTROLLER.read_text())
    methods = {node.name: node for node in ast.walk(controller) if isinstance(node, ast.FunctionDef)}
    assert set(methods) >= USER_SIDE and set(methods) >= LOOP_SIDE
    for name in USER_SIDE:
        called = {call.removeprefix("self.") for call, _ in calls_in(methods[name])}
        assert not called & LOOP_SIDE, f"{name} (a user's thread) calls {called & LOOP_SIDE}, which only the loop may"
    # The facade reaches the controller only through what a user's thread may run, and reads.
    group = ast.parse((PACKAGE / "pool" / "driver" / "group.py").read_text())
    used = {call.removeprefix("self._run.") for call, _ in calls_in(group) if call.startswith("self._run.")}
    assert used <= USER_SIDE | {"check_usable", "held_resources", "attach"}, used
