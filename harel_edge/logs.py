"""Log lines: structlog's and the standard library's (harel's worker) rendered alike on stderr.

Apart from the metrics in harel_edge.observability (which re-exports it), so that every command can
configure logging at start without importing prometheus_client.
"""

from __future__ import annotations

import logging
import sys
from typing import Literal

import structlog

from harel_edge.redaction import scrub_event

LogFormat = Literal["json", "console"]


def configure_logging(fmt: LogFormat = "console", level: str = "info", stream=None) -> None:
    """Render structlog's lines and the standard library's (harel's worker) the same way, on stderr.

    `json`: one object per line for a shipper; `console`: readable lines for a terminal.
    """
    stream = stream if stream is not None else sys.stderr
    numeric = logging.getLevelName(level.upper())
    if not isinstance(numeric, int):
        numeric = logging.INFO
    shared = [
        structlog.contextvars.merge_contextvars,
        structlog.stdlib.add_log_level,
        structlog.stdlib.add_logger_name,
        structlog.processors.TimeStamper(fmt="iso", utc=True),
    ]
    renderer = (
        structlog.processors.JSONRenderer() if fmt == "json" else structlog.dev.ConsoleRenderer(colors=False)
    )
    structlog.configure(
        processors=[*shared, structlog.stdlib.ProcessorFormatter.wrap_for_formatter],
        logger_factory=structlog.stdlib.LoggerFactory(),
        wrapper_class=structlog.make_filtering_bound_logger(numeric),
        cache_logger_on_first_use=False,
    )
    formatter = structlog.stdlib.ProcessorFormatter(
        foreign_pre_chain=shared,
        processors=[
            structlog.stdlib.ProcessorFormatter.remove_processors_meta,
            structlog.processors.format_exc_info,
            scrub_event,
            renderer,
        ],
    )
    handler = logging.StreamHandler(stream)
    handler.setFormatter(formatter)
    root = logging.getLogger()
    for old in list(root.handlers):
        root.removeHandler(old)
    root.addHandler(handler)
    root.setLevel(numeric)
