"""The demo statechart's one action: it runs on the worker that handles the event."""

from __future__ import annotations

import time

import structlog

log = structlog.get_logger("harel_edge.examples")


def pack(execution, event, **_inputs):
    """Pack the order. `pack_seconds` in the order's context makes it slow on purpose, so a
    test can stop a worker while an event is being handled and see it finish first."""
    seconds = float(execution.execution_ctx.get("pack_seconds", 0.0) or 0.0)
    if seconds > 0:
        log.info("packing slowly", seconds=seconds)
        time.sleep(seconds)
    log.debug("packed", paid=execution.execution_ctx.get("paid"))
