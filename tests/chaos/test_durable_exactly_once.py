"""Exactly-once steps under SIGKILL: worker processes die inside `transact`, and on sqld the
primary is paused and killed as well, while an operator cancels workflows and resumes them;
every effect must still have happened exactly once, and none while its workflow was cancelled.

The workload: WORKFLOWS workflows of STEPS steps each; every step is a `ctx.transact` whose
effect inserts one row into `chaos_effects` (no unique constraint: a second execution would
show as a second row). Worker processes (spawned, as the supervisor starts them: a libsql
connection must not cross a fork) run `DurableWorker`s (on a local file through its connection;
on sqld and replica over
Hrana streams from the event loop); some kill themselves
with SIGKILL inside a step (before the effect's write, after it, or a few milliseconds later
from a timer, which lands in the record, the COMMIT or just after it), and the test kills
others from outside at random moments. Dead workers are replaced. On sqld and through
replicas the primary is also paused twice and killed once, each fault checked on the server as
it is injected. At the end, every workflow must be finished and every (workflow, step) must
have exactly one effect row and one record.

Each run prints its counts (pytest -s shows them) and the assertion messages carry them too.
"""

from __future__ import annotations

import asyncio
import itertools
import json
import logging
import multiprocessing
import os
import random
import signal
import threading
import time
from dataclasses import dataclass, field
from datetime import timedelta
from pathlib import Path

import libsql
import pytest

from harel_edge.settings import EdgeSettings

WORKFLOWS = 50
STEPS = 12  # 600 steps in all
WORKERS = 3
NAMESPACE = "chaos"
ALIVE = timedelta(seconds=1)
LEASE = timedelta(seconds=1.5)
DEADLINE = 420.0  # seconds: a hang guard for the whole run, not a timing assertion
# Kills from outside are paced by the clock, so without a bound a slow (shared, busy) machine
# gets more of them, and each one costs a respawn and, on sqld, up to 5 s of every writer
# waiting for the killed transaction's lock: the run's length fed on itself (90 s alone, 260 s
# beside other tests). The bound makes the number of faults the same on any machine.
MOST_OUTSIDE_KILLS = 12
KILL_WITHIN = 30  # a worker told to kill itself does so inside one of its first this many effects
CANCELS = 8  # workflows the operator cancels during a run, each resumed a little later

pytestmark = [pytest.mark.chaos, pytest.mark.slow]


# ---- the worker process ----------------------------------------------------------------------


def worker_main(settings: dict, seed: int, kill_at: int | None, kills_log: str, designs_log: str) -> None:
    """A worker process: run passes until killed (by itself inside its `kill_at`-th effect, if given)."""
    logging.basicConfig(level=logging.ERROR)
    if settings["profile"] == "replica":  # every worker process has an embedded replica of its own
        settings = settings | {
            "db_path": str(Path(settings["db_path"]).with_name(f"replica-{os.getpid()}.db"))
        }
    asyncio.run(_work(EdgeSettings(**settings), random.Random(seed), kill_at, kills_log, designs_log))


async def _work(
    settings: EdgeSettings, rng: random.Random, kill_at: int | None, kills_log: str, designs_log: str
) -> None:
    from harel_edge.durable import LibsqlCheckpointer, LibsqlDurable, LibsqlScheduler, connect
    from harel_edge.durable.runtime import DurableWorker

    database = connect(settings)
    with open(designs_log, "a") as log:  # where this worker's connection lives
        log.write(("hrana" if database.is_remote else "file") + "\n")
    durable = LibsqlDurable(
        LibsqlCheckpointer(database),
        LibsqlScheduler(database, namespace=NAMESPACE, lease=LEASE, poll=timedelta(milliseconds=50)),
    )

    def die(point: str) -> None:
        with open(kills_log, "a") as log:
            log.write(point + "\n")
        os.kill(os.getpid(), signal.SIGKILL)

    effects = itertools.count(1)

    def effect_of(workflow: str, step: str):  # noqa: ANN202
        def effect(tx):  # noqa: ANN001, ANN202
            # Where this process dies, if this is the effect it dies in: one of three points.
            roll = rng.randrange(3) if next(effects) == kill_at else 3
            if roll < 1:
                die("before the effect's write")
            if roll < 2:
                with open(kills_log, "a") as log:
                    log.write("timer: record, COMMIT or just after\n")
                threading.Timer(rng.uniform(0, 0.005), os.kill, (os.getpid(), signal.SIGKILL)).start()
            tx.execute(
                "INSERT INTO chaos_effects (workflow, step, pid) VALUES (?, ?, ?)",
                (workflow, step, os.getpid()),
            )
            if roll < 3:
                die("after the effect's write, before the record")
            return step

        return effect

    async def flow(ctx) -> int:  # noqa: ANN001
        for index in range(STEPS):
            await ctx.transact(f"step-{index}", effect_of(ctx.workflow, f"step-{index}"))
        return STEPS

    worker = DurableWorker(
        durable, flow, budget=timedelta(minutes=2), alive=ALIVE, busy_retry=timedelta(milliseconds=200)
    )
    await worker.run()


# ---- the parent ------------------------------------------------------------------------------


@dataclass
class Tally:
    started: int = 0
    self_kills: int = 0
    killed_by_test: int = 0
    other_exits: list = field(default_factory=list)
    primary_pauses: int = 0
    primary_kills: int = 0
    primary_seen: list = field(default_factory=list)  # the server as each fault left it
    kill_points: dict = field(default_factory=dict)
    designs: dict = field(default_factory=dict)
    cancels: dict = field(default_factory=dict)  # the state each cancel found
    resumes: int = 0
    effects_while_cancelled: list = field(default_factory=list)


def _read(settings: EdgeSettings, sql: str) -> list[tuple]:
    """One query on a fresh connection (a remote one may have died with the primary). Through
    libsql on a file too: this process also cancels through it, and two SQLite libraries in one
    process on one file release each other's POSIX locks (SQLite's "How To Corrupt", 2.2.1)."""
    if settings.profile == "local":
        conn = libsql.connect(settings.db_path)
        try:
            conn.execute("PRAGMA busy_timeout = 30000")
            return conn.execute(sql).fetchall()
        finally:
            conn.close()
    conn = libsql.connect(settings.server, auth_token=settings.auth_token.get_secret_value())
    try:
        return conn.execute(sql).fetchall()
    finally:
        conn.close()


def _finished(settings: EdgeSettings) -> int | None:
    try:
        return _read(settings, "SELECT count(*) FROM workflow_checkpoint WHERE step = '$result'")[0][0]
    except Exception:  # noqa: BLE001 - the primary may be down right now
        return None


def _effects_of(settings: EdgeSettings, workflow: str) -> int:
    return _read(settings, f"SELECT count(*) FROM chaos_effects WHERE workflow = '{workflow}'")[0][0]


class Operator:
    """Cancels a running workflow now and then, as `harel-edge workflows cancel` does, and
    resumes it 0.5-2 s later (a running one, mostly); between the two, no effect of it may commit."""

    def __init__(self, settings: EdgeSettings, rng: random.Random, tally: Tally) -> None:
        self.settings, self.rng, self.tally = settings, rng, tally
        self.held: dict[str, tuple[float, int]] = {}  # workflow: (when to resume, its effects at the cancel)
        self.next_cancel = time.monotonic() + rng.uniform(0.2, 0.6)

    def act(self, done: int | None) -> None:
        from harel_edge.workflow_control import cancel_workflow, resume_workflow

        now = time.monotonic()
        for workflow, (due, effects) in list(self.held.items()):
            if now >= due:
                if _effects_of(self.settings, workflow) != effects:
                    self.tally.effects_while_cancelled.append(workflow)
                assert resume_workflow(self.settings, workflow).changed, workflow
                self.tally.resumes += 1
                del self.held[workflow]
        cancelled = sum(self.tally.cancels.values())
        if done is None or done >= WORKFLOWS * 0.8 or cancelled >= CANCELS or now < self.next_cancel:
            return
        from harel_edge.schema import DB_NOW

        finished = {w for (w,) in _read(self.settings, "SELECT workflow FROM workflow_checkpoint WHERE step = '$result'")}
        unfinished = [w for w in (f"chaos-{i:03d}" for i in range(WORKFLOWS)) if w not in finished | set(self.held)]
        running = [  # most cancels aim at a pass in progress
            w for (w,) in _read(self.settings, f"SELECT workflow FROM workflow_claim WHERE held_until > {DB_NOW}")
            if w in unfinished
        ]
        if unfinished:
            workflow = self.rng.choice(running if running and self.rng.random() < 0.75 else unfinished)
            change = cancel_workflow(self.settings, workflow)
            if change.changed:
                self.held[workflow] = (now + self.rng.uniform(0.5, 2.0), _effects_of(self.settings, workflow))
            self.tally.cancels[change.before] = self.tally.cancels.get(change.before, 0) + 1
        self.next_cancel = now + self.rng.uniform(0.2, 0.6)


def run_chaos(
    settings: EdgeSettings,
    tmp_path: Path,
    *,
    self_kills: int,
    outside_kills: tuple[float, float],
    primary=None,  # noqa: ANN001
) -> dict:
    """Run the workload to completion under faults; return the counts.

    Each worker started while fewer than `self_kills` have killed themselves is told to kill
    itself inside one of its first KILL_WITHIN effects, so the run has at least that many (a
    count, not a rate: on sqld each costs the 5 s lock timeout). `outside_kills` is the range of
    seconds between two workers killed by the test (at most MOST_OUTSIDE_KILLS of them).
    """
    from harel_edge.durable import LibsqlScheduler, connect, migrate

    async def prepare() -> None:
        database = connect(settings)
        await migrate(database)
        await database.run(
            lambda c: c.execute(
                "CREATE TABLE IF NOT EXISTS chaos_effects (id INTEGER PRIMARY KEY, workflow TEXT, step TEXT, pid INT)"
            )
        )
        scheduler = LibsqlScheduler(database, namespace=NAMESPACE)
        for index in range(WORKFLOWS):
            await scheduler.make_ready(f"chaos-{index:03d}")
        await database.aclose()

    asyncio.run(prepare())
    rng = random.Random(20311)
    context = multiprocessing.get_context("spawn")
    kills_log = str(tmp_path / "kills.log")
    designs_log = str(tmp_path / "designs.log")
    payload = settings.model_dump() | {
        "auth_token": settings.auth_token.get_secret_value() if settings.auth_token else None
    }
    tally = Tally()
    workers: dict[int, multiprocessing.Process] = {}
    dooming: dict[int, bool] = {}  # which slot's worker was told to kill itself

    def spawn(slot: int) -> None:
        told = sum(1 for other, doomed in dooming.items() if doomed and other != slot)
        dooming[slot] = tally.self_kills + told < self_kills
        kill_at = rng.randint(1, KILL_WITHIN) if dooming[slot] else None
        process = context.Process(
            target=worker_main,
            args=(payload, rng.randrange(2**32), kill_at, kills_log, designs_log),
            daemon=False,
        )
        process.start()
        workers[slot] = process
        tally.started += 1

    for slot in range(WORKERS):
        spawn(slot)
    began = time.monotonic()
    next_outside_kill = began + rng.uniform(*outside_kills)
    faults_on_primary = ["pause", "kill", "pause"] if primary is not None else []
    operator = Operator(settings, rng, tally)
    try:
        while True:
            done = _finished(settings)
            operator.act(done)
            if done == WORKFLOWS:
                break
            assert time.monotonic() - began < DEADLINE, (
                f"not finished after {DEADLINE} s: {done} of {WORKFLOWS}"
            )
            for slot, process in list(workers.items()):
                if not process.is_alive():
                    process.join()
                    if process.exitcode == -signal.SIGKILL:
                        tally.self_kills += 1
                    else:
                        tally.other_exits.append(process.exitcode)
                    spawn(slot)
            now = time.monotonic()
            if now >= next_outside_kill and tally.killed_by_test < MOST_OUTSIDE_KILLS:
                slot = rng.randrange(WORKERS)
                if workers[slot].is_alive():
                    os.kill(workers[slot].pid, signal.SIGKILL)
                    workers[slot].join()
                    tally.killed_by_test += 1
                    spawn(slot)
                next_outside_kill = now + rng.uniform(*outside_kills)
            # Faults on the primary, spread over the run: at 20 %, 45 % and 70 % of the work.
            if (
                faults_on_primary
                and done is not None
                and done >= WORKFLOWS * (0.2 + 0.25 * tally_faults(tally))
            ):
                fault = faults_on_primary.pop(0)
                if fault == "pause":
                    primary.pause()
                    tally.primary_seen.append(_seen(primary))
                    time.sleep(rng.uniform(1.0, 3.0))  # the fault's duration
                    primary.resume()
                    primary.wait_ready(30)
                    tally.primary_pauses += 1
                else:
                    primary.kill()
                    tally.primary_seen.append(_seen(primary))
                    primary.restart()
                    tally.primary_kills += 1
                tally.primary_seen.append(_seen(primary))
            time.sleep(0.1)  # the supervisor's own pace
    finally:
        for process in workers.values():
            if process.is_alive():
                os.kill(process.pid, signal.SIGKILL)
            process.join()

    points = Path(kills_log).read_text().splitlines() if Path(kills_log).exists() else []
    tally.kill_points = {point: points.count(point) for point in sorted(set(points))}
    designs = Path(designs_log).read_text().splitlines() if Path(designs_log).exists() else []
    tally.designs = {design: designs.count(design) for design in sorted(set(designs))}
    effects = _read(settings, "SELECT workflow, step, count(*) FROM chaos_effects GROUP BY workflow, step")
    records = {
        (workflow, step)
        for workflow, step in _read(
            settings,
            "SELECT workflow, step FROM workflow_checkpoint WHERE step LIKE 'step-%' AND workflow LIKE 'chaos-%'",
        )
    }
    counts = {(workflow, step): n for workflow, step, n in effects}
    expected = {(f"chaos-{w:03d}", f"step-{s}") for w in range(WORKFLOWS) for s in range(STEPS)}
    summary = {
        "profile": settings.profile,
        "steps": len(expected),
        "effects exactly once": sum(1 for key in expected if counts.get(key) == 1),
        "effects missing": sorted(key for key in expected if key not in counts)[:10],
        "effects doubled": sorted(key for key, n in counts.items() if n > 1)[:10],
        "effects without a record": sorted(key for key in counts if key not in records)[:10],
        "records without an effect": sorted(key for key in records if key not in counts)[:10],
        "workers started": tally.started,
        "workers killed inside transact (by themselves)": tally.self_kills,
        "workers killed from outside": tally.killed_by_test,
        "workers exited otherwise": tally.other_exits,
        "kill points scheduled": tally.kill_points,
        "worker designs": tally.designs,
        "primary paused": tally.primary_pauses,
        "primary killed and restarted": tally.primary_kills,
        "primary as each fault left it": tally.primary_seen,
        "cancels, by the state each found": tally.cancels,
        "resumes": tally.resumes,
        "workflows with an effect committed while cancelled": tally.effects_while_cancelled,
        "seconds": round(time.monotonic() - began, 1),
    }
    print("\nchaos summary:", json.dumps(summary, indent=1, default=str))
    return summary


def start_primary():  # noqa: ANN201
    """A sqld primary (auth on) on loopback; its port stays its own while it is killed (docs/testing.md)."""
    from harel_edge.testing import SqldStartError, SqldUnavailable, start_sqld_primary
    from harel_edge.testing.fixtures import sqld_unavailable

    try:
        return start_sqld_primary()
    except (SqldUnavailable, SqldStartError, ImportError) as exc:
        sqld_unavailable(str(exc))


def tally_faults(tally: Tally) -> int:
    return tally.primary_pauses + tally.primary_kills


def _seen(primary) -> str:  # noqa: ANN001
    """The server's state as its handle records it, and whether it answers /health.

    A paused or killed server must go quiet. A stop is not instant: a busy sqld may answer a
    request or two before SIGSTOP halts all of its threads, so it is given 10 s to stop answering.
    """
    if primary.state == "running":
        return f"running, {'answering' if primary.healthy(timeout=5.0) else 'not answering'}"
    deadline = time.monotonic() + 10.0
    while primary.healthy(timeout=0.5):
        if time.monotonic() > deadline:
            return f"{primary.state}, still answering"
    return f"{primary.state}, not answering"


# A pause, a kill and its restart, a pause: each seen on the server as it happened.
PRIMARY_FAULTS_SEEN = [
    "paused, not answering",
    "running, answering",
    "killed, not answering",
    "running, answering",
    "paused, not answering",
    "running, answering",
]


def _assert_exactly_once(summary: dict) -> None:
    assert summary["effects exactly once"] == summary["steps"], summary
    assert not summary["effects missing"] and not summary["effects doubled"], summary
    assert not summary["effects without a record"] and not summary["records without an effect"], summary
    assert summary["workers killed inside transact (by themselves)"] >= 10, summary  # the faults happened
    assert summary["workflows with an effect committed while cancelled"] == [], summary
    landed = sum(n for state, n in summary["cancels, by the state each found"].items() if state != "finished")
    assert landed >= 1 and summary["resumes"] == landed, summary  # every cancel that landed was resumed
    # Every worker ran the design its profile gets: the file's connection locally, Hrana remotely.
    default = "file" if summary["profile"] == "local" else "hrana"
    assert set(summary["worker designs"]) == {default}, summary


def _assert_primary_faults(summary: dict) -> None:
    assert summary["primary paused"] == 2 and summary["primary killed and restarted"] == 1, summary
    assert summary["primary as each fault left it"] == PRIMARY_FAULTS_SEEN, summary


def test_every_effect_happens_exactly_once_when_workers_are_killed_inside_transact_on_a_local_file(
    tmp_path,
) -> None:  # noqa: ANN001
    settings = EdgeSettings(db_path=str(tmp_path / "chaos.db"))
    _assert_exactly_once(run_chaos(settings, tmp_path, self_kills=20, outside_kills=(0.5, 2.0)))


@pytest.mark.sqld
def test_every_effect_happens_exactly_once_on_sqld_with_workers_killed_and_the_primary_paused_and_killed(
    tmp_path,  # noqa: ANN001
) -> None:
    server = start_primary()
    try:
        settings = EdgeSettings(profile="sqld", url=server.http_url, auth_token=server.rw_token)
        # Fewer kills from outside than locally: a worker killed inside a transaction leaves it
        # holding sqld's write lock until sqld aborts it (5 s), and every writer waits meanwhile.
        summary = run_chaos(settings, tmp_path, self_kills=10, outside_kills=(2.0, 4.0), primary=server)
        _assert_exactly_once(summary)
        _assert_primary_faults(summary)
    finally:
        server.close()


@pytest.mark.sqld
def test_every_effect_happens_exactly_once_through_embedded_replicas_with_workers_killed_and_the_primary_paused(
    tmp_path,  # noqa: ANN001
) -> None:
    server = start_primary()
    try:
        settings = EdgeSettings(
            profile="replica",
            sync_url=server.http_url,
            auth_token=server.rw_token,
            db_path=str(tmp_path / "replica.db"),
        )
        summary = run_chaos(settings, tmp_path, self_kills=10, outside_kills=(2.0, 4.0), primary=server)
        _assert_exactly_once(summary)
        _assert_primary_faults(summary)
    finally:
        server.close()
