"""Several worker processes on one machine, started with `spawn` (a libsql connection must not
cross a fork) and stopped together: `harel-edge worker --processes N` and the demo."""

from __future__ import annotations

import asyncio
import multiprocessing
import os
import signal
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from harel_edge import logs, observability
from harel_edge.loop_thread import run_main
from harel_edge.settings import EdgeSettings
from harel_edge.worker import WorkerOptions, WorkerReport
from harel_edge.worker_process import run_process, tune_garbage_collector


def _child(
    settings: EdgeSettings,
    options: WorkerOptions,
    stop_flag: Any,
    ready_flag: Any,
    reports: Any,
    log_format: str,
    log_level: str,
) -> None:
    """A spawned worker process: runs until the parent sets `stop_flag` or it gets SIGTERM;
    sets `ready_flag` once its schema is in place and it is about to claim."""
    os.environ.setdefault("RUST_LOG", "off")
    logs.configure_logging(log_format, log_level)  # type: ignore[arg-type]
    if settings.metrics_port:
        observability.serve_metrics(settings.metrics_port)
    tune_garbage_collector()

    async def main() -> WorkerReport:
        stop = asyncio.Event()
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGTERM, signal.SIGINT):
            loop.add_signal_handler(sig, stop.set)

        async def watch() -> None:
            while not stop.is_set():
                if stop_flag.is_set():
                    stop.set()
                    return
                await asyncio.sleep(0.05)

        watcher = asyncio.create_task(watch())
        try:
            return await run_process(settings, options, stop, ready=ready_flag.set)
        finally:
            watcher.cancel()

    try:
        report = run_main(main())
    except BaseException as exc:  # noqa: BLE001 - reported to the parent, which decides the exit code
        report = WorkerReport(settings.worker_id, error=f"{type(exc).__name__}: {exc}")
        reports.put(report.as_dict())
        raise SystemExit(1) from None
    reports.put(report.as_dict())


@dataclass
class WorkerProcesses:
    """Worker processes started with `spawn`, and the means to stop them and collect their reports."""

    processes: list[multiprocessing.process.BaseProcess]
    stop_flag: Any
    ready_flags: list[Any]
    reports: Any

    def alive(self) -> int:
        return sum(p.is_alive() for p in self.processes)

    def wait_ready(self, timeout: float) -> bool:
        """Wait until every worker is about to claim; False if one died or time ran out first."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if all(flag.is_set() for flag in self.ready_flags):
                return True
            if self.alive() < len(self.processes):
                return False
            time.sleep(0.02)
        return False

    def stop(self, timeout: float) -> list[WorkerReport]:
        """Ask every worker to stop, wait for them, and return their reports."""
        self.stop_flag.set()
        deadline = time.monotonic() + timeout
        for process in self.processes:
            process.join(max(0.0, deadline - time.monotonic()))
        for process in self.processes:
            if process.is_alive():  # did not stop in time: it has had its grace period
                process.kill()
                process.join(5)
        found = []
        while True:
            try:
                found.append(WorkerReport(**self.reports.get(timeout=0.2)))
            except Exception:  # noqa: BLE001 - queue.Empty: every report is in
                break
        return found

    def exit_codes(self) -> list[int | None]:
        return [p.exitcode for p in self.processes]


def start_processes(
    settings: EdgeSettings,
    options: WorkerOptions,
    count: int,
    *,
    log_format: str = "console",
    log_level: str = "warning",
    per_worker: Callable[[int, EdgeSettings], EdgeSettings] | None = None,
) -> WorkerProcesses:
    """Start `count` worker processes (spawn). Each gets its own worker id (`<id>-<n>`) and,
    when metrics are on, its own port (`metrics_port + n`); `per_worker` may change more."""
    context = multiprocessing.get_context("spawn")
    stop_flag, reports = context.Event(), context.Queue()
    processes, ready_flags = [], []
    for index in range(count):
        update: dict[str, Any] = {
            "worker_id": f"{settings.worker_id}-{index + 1}" if count > 1 else settings.worker_id
        }
        if settings.metrics_port and count > 1:
            update["metrics_port"] = settings.metrics_port + index
        mine = settings.model_copy(update=update)
        if per_worker is not None:
            mine = per_worker(index, mine)
        ready_flags.append(context.Event())
        process = context.Process(
            target=_child,
            args=(mine, options, stop_flag, ready_flags[-1], reports, log_format, log_level),
            name=f"harel-edge-worker-{index + 1}",
        )
        process.start()
        processes.append(process)
    return WorkerProcesses(processes, stop_flag, ready_flags, reports)


def run_processes(
    settings: EdgeSettings, options: WorkerOptions, count: int, *, log_format: str, log_level: str
) -> int:
    """The `worker --processes N` body: N spawned workers, stopped together on SIGTERM/SIGINT."""
    group = start_processes(settings, options, count, log_format=log_format, log_level=log_level)
    stopping = {"now": False}

    def on_signal(signum: int, _frame: Any) -> None:
        stopping["now"] = True

    previous = {sig: signal.signal(sig, on_signal) for sig in (signal.SIGTERM, signal.SIGINT)}
    try:
        while not stopping["now"] and group.alive() == count:
            time.sleep(0.1)
        reports = group.stop(timeout=options.grace + 10)
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)
    failed = [r for r in reports if r.error] + [None for code in group.exit_codes() if code not in (0, None)]
    return 1 if failed else 0
