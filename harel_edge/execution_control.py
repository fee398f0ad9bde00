"""What `harel-edge executions suspend|resume|cancel|terminate|retry` do: harel's own control plane
(`harel.engine.control`) over the execution store, on the primary. Each command is a compare-and-set
write on the execution record, so it takes effect at the next event boundary of a running worker,
and of two callers at once, one makes the change and the other is told it changed nothing."""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Any

from harel.engine.observe import ObservedStore
from harel.engine.store import Step

from harel_edge.access import check_writable
from harel_edge.errors import ConfigurationError, NotFoundError
from harel_edge.settings import EdgeSettings

COMMANDS = ("suspend", "resume", "cancel", "terminate", "retry")
NEEDS_DEFINITIONS = ("cancel", "retry")


@dataclass(frozen=True)
class ControlOutcome:
    """An execution's status before and after this call's write, and its state; `changed` is False
    when the call wrote nothing (the command did not apply, or another caller made the change)."""

    id: str
    command: str
    before: str
    after: str
    state: str | None

    @property
    def changed(self) -> bool:
        return self.before != self.after

    def as_dict(self) -> dict[str, Any]:
        return {**asdict(self), "changed": self.changed}


def control_execution(
    settings: EdgeSettings,
    execution_id: str,
    command: str,
    *,
    definitions_dir: str | None = None,
    to_state: str | None = None,
    reason: dict | None = None,
) -> ControlOutcome:
    """Apply `command` to one execution: suspend (RUNNING -> SUSPENDED: its queued events wait),
    resume, cancel (the machine's own `Cancel` transition when it models one, else terminate),
    terminate (CANCELLED at once, no hooks), retry (a FAILED one back to RUNNING at `to_state`,
    a leaf state, once its bug is fixed). Raises ConfigurationError on what cannot be done."""
    from harel.engine import control  # noqa: PLC0415 - harel, for the commands that need it

    from harel_edge.store import EdgeStore  # noqa: PLC0415

    if command not in COMMANDS:
        raise ConfigurationError(f"unknown command {command!r}: use one of {', '.join(COMMANDS)}")
    if command in NEEDS_DEFINITIONS and definitions_dir is None:
        raise ConfigurationError(
            f"{command} needs the machine's definition: give --definitions DIR (the .stm files the workers run)"
        )
    if command == "retry" and not to_state:
        raise ConfigurationError(
            "retry needs --to STATE: the leaf state to resume the failed execution in (harel never guesses it, "
            "since a failure can leave it between states); `executions show ID` shows where it failed"
        )
    check_writable(settings)
    with EdgeStore(settings, create_schema=False) as edge_store:
        store = _ChangingStore(edge_store)
        exe = store.load(execution_id)
        if exe is None:
            raise NotFoundError(f"no execution {execution_id!r}: `harel-edge executions list` shows the ones there are")
        if command == "suspend":
            control.suspend(store, execution_id)
        elif command == "resume":
            control.resume(store, execution_id)
        elif command == "terminate":
            control.terminate(store, execution_id)
        else:
            definition = _definition(definitions_dir, exe.definition_id)
            if command == "retry":
                _check_target(definition, exe, to_state)
            try:
                if command == "cancel":
                    control.cancel(store, definition, execution_id, reason=reason)
                    _relay_outbox(store, settings)
                else:
                    control.redrive(store, definition, execution_id, to_state)
            except ValueError as exc:  # harel's precise reason a target is refused
                raise ConfigurationError(f"{command} refused: {exc}") from None
        after = store.load(execution_id)
    step = store.moved.get(execution_id)
    before, now = (step.from_status, step.to_status) if step is not None else (after.status, after.status)
    return ControlOutcome(execution_id, command, before.value.lower(), now.value.lower(), after.active_path)


class _ChangingStore(ObservedStore):
    """The store under harel's control plane, noting the first move it commits for each execution;
    a write that would move nothing is not made: harel, retrying after a version conflict, would
    write the status a concurrent caller had just written, and both would seem to have changed it."""

    def __init__(self, store: Any) -> None:
        super().__init__(store, lambda step, exe: self.moved.setdefault(exe.id, step))
        self.moved: dict[str, Step] = {}

    def commit(self, exe: Any, emits: list, *args: Any, step: Step | None = None, **kwargs: Any) -> list[int]:
        if step is not None and not emits and (step.from_status, step.from_path) == (step.to_status, step.to_path):
            return []
        return super().commit(exe, emits, *args, step=step, **kwargs)


def _relay_outbox(store: Any, settings: EdgeSettings) -> None:
    """Publish what the command left in the store's outbox (a cooperative cancel's `Cancel`) to
    the queue, then mark it sent, as harel's own drivers do after a command; publish is idempotent
    by event id, so a crash between the two sends it once."""
    from harel_edge.queue import LibsqlTransport  # noqa: PLC0415

    entries = store.pending_outbox()
    if not entries:
        return
    with LibsqlTransport(settings=settings, create_schema=False) as transport:
        for entry in entries:
            if entry.target_id is not None:
                target = store.load(entry.target_id)
                transport.publish(entry.target_id, entry.event, priority=target.priority if target is not None else 0)
            store.ack_outbox(entry.seq)


def _check_target(definition: Any, exe: Any, to_state: str) -> None:
    """Refuse a `retry --to` state the machine does not have, naming the states it can run from
    (harel's own refusal only says that a state is not a leaf)."""
    if to_state in definition.index:
        return
    from harel import engine  # noqa: PLC0415

    leaves = sorted(path for path in definition.index if engine.is_valid_reposition_target(definition, exe, path))
    raise ConfigurationError(
        f"retry refused: machine {exe.definition_id!r} has no state {to_state!r}; "
        f"give --to one of its leaf states: {', '.join(leaves) or 'none'}"
    )


def _definition(directory: str, machine: str) -> Any:
    from harel_edge.worker import load_definitions  # noqa: PLC0415 - harel's loader, validated

    definitions = load_definitions(directory)
    if machine not in definitions:
        known = ", ".join(sorted(definitions)) or "none"
        raise ConfigurationError(f"{directory} has no machine {machine!r} (it has: {known}): give the directory it is in")
    return definitions[machine]
