"""The transport while its primary is paused past the leases, then killed and restarted.

Three worker processes (spawned: a libsql connection must not cross a fork), each with its own
embedded replica (or, in the second variant, a remote connection), claim and ack a backlog of
MESSAGES messages in GROUPS groups, with a short lease (VISIBILITY). Meanwhile the test:

1. pauses the primary (SIGSTOP / docker pause) for PAUSE seconds: longer than the lease, and
   longer than sqld's 10 s idle-stream expiry, so a remote worker's request in flight comes back
   as STREAM_EXPIRED with an outcome it cannot know (an ambiguous write, resolved by looking);
2. kills it (SIGKILL / docker kill), leaves it down for DOWN seconds, and restarts it on the same
   data dir and port.

Nothing times a driver call out (libsql 0.1.8 has no client-side timeout): a worker blocks on the
paused primary until it resumes, and its lease lapses meanwhile. That is what makes duplicates
possible, and the only way they are allowed: a message delivered twice must have had its first
lease expire before the second claim (checked from the workers' own log of every delivery).

Two messages (SLOW) have a handler that outlives its lease, so a lapsed lease and its duplicate
happen at least there whatever the faults do.

Afterwards: the queue on the primary is empty, every published message was acked, each worker
process is the one that started (none restarted) and acked messages after the restart, and no
error escaped the retry policy into a worker. The counts are printed (pytest -s) and carried
by the assertion messages.
"""

from __future__ import annotations

import json
import multiprocessing
import re
import time
from collections import Counter, defaultdict
from pathlib import Path
from typing import Any

import pytest
from harel.spec.states import Event

from harel_edge.queue import LibsqlTransport, Message
from harel_edge.settings import ExplicitSettings
from harel_edge.sync_sql import Statements
from harel_edge.testing import wait_until

pytestmark = [pytest.mark.chaos, pytest.mark.sqld]

MESSAGES = 450
GROUPS = 20
WORKERS = 3
VISIBILITY = 2.0  # seconds a claim is leased
WORK = 0.005  # seconds a worker "processes" a message: leases are held across real time
# Messages whose handler outlives its lease (a stuck handler, the other way a lease lapses): they
# make the duplicate accounting do something even when the primary's faults cause no duplicate.
SLOW = {60: 1.5 * VISIBILITY, 330: 1.5 * VISIBILITY}  # on their first delivery only
PAUSE = 12.0  # > VISIBILITY and > sqld's 10 s Hrana stream expiry
DOWN = 1.5  # seconds the primary stays dead before the restart
IDLE_POLL = 0.02  # a worker with nothing to claim looks again after this long
HANG_GUARD = 90.0  # seconds: fail rather than hang when the queue never drains (not a timing claim)
PREFIX = "chaos"

# Generous enough to outlast the restart (and, on a replica, 3 s handshake timeouts while the
# primary is down), and still a stop.
RETRY = dict(retry_attempts=40, retry_initial_delay=0.05, retry_max_delay=1.0, retry_deadline=60.0)


# ---- the worker process ----------------------------------------------------------------------------


def worker_main(name: str, settings: dict[str, Any], log_path: str, started, stop) -> None:
    """Claim, "process", ack until told to stop and nothing is left; log every step as a line.

    The log is a local file, not a table on the primary: the evidence must survive the primary
    being paused and killed. Times are this machine's wall clock, the clock sqld also uses here.
    """
    import structlog  # noqa: PLC0415

    transport = LibsqlTransport(settings=ExplicitSettings.load(**settings))
    retries: Counter[str] = Counter()

    errors: set[str] = set()

    def count(_logger, _method, event_dict):
        retries[f"{event_dict.get('operation')}:{event_dict['event']}"] += 1
        if event_dict.get("error"):
            errors.add(re.sub(r"\d+", "N", event_dict["error"])[:160])
        raise structlog.DropEvent

    structlog.configure(processors=[count])
    with open(log_path, "a", buffering=1) as log:

        def write(**record: Any) -> None:
            log.write(json.dumps({"worker": name, **record}) + "\n")

        started.set()
        while True:
            claim_start = time.time()
            try:
                lease = transport.claim(name, VISIBILITY)
            except Exception as exc:  # noqa: BLE001 - recorded; the test counts escapes
                write(
                    kind="error",
                    operation="claim",
                    error=f"{type(exc).__name__}: {exc}"[:500],
                    at=time.time(),
                )
                continue
            claim_end = time.time()
            if lease is None:
                if stop.is_set():
                    break
                time.sleep(IDLE_POLL)
                continue
            n = lease.event.data["n"]
            write(
                kind="claim",
                seq=lease.seq,
                group=lease.group_id,
                token=lease.token,
                n=n,
                claim_start=claim_start,
                claim_end=claim_end,
            )
            time.sleep(SLOW[n] if n in SLOW and first_time(log_path, n) else WORK)
            ack_start = time.time()
            try:
                acked = transport.ack(lease)
            except Exception as exc:  # noqa: BLE001 - as above
                write(
                    kind="error",
                    operation="ack",
                    seq=lease.seq,
                    error=f"{type(exc).__name__}: {exc}"[:500],
                    at=time.time(),
                )
                continue
            write(
                kind="ack",
                seq=lease.seq,
                token=lease.token,
                acked=acked,
                ack_start=ack_start,
                ack_end=time.time(),
            )
        write(kind="retries", counts=dict(retries), errors=sorted(errors), at=time.time())
    transport.close()


def first_time(log_path: str, n: int) -> bool:
    """True for the first worker to handle message `n` (a file made with O_EXCL says so)."""
    try:
        Path(log_path).with_name(f"slow-{n}").touch(exist_ok=False)
    except FileExistsError:
        return False
    return True


# ---- the test ----------------------------------------------------------------------------------------


def worker_settings(profile: str, server, tmp_path: Path, name: str) -> dict[str, Any]:
    values: dict[str, Any] = {"profile": profile, "prefix": PREFIX, "auth_token": server.rw_token, **RETRY}
    if profile == "replica":
        values.update(db_path=str(tmp_path / f"{name}.db"), sync_url=server.http_url)
    else:
        values.update(url=server.http_url)
    return values


def depth(server) -> int:
    """Messages left on the primary, asked over a connection of its own (raises while it is down)."""
    conn = Statements(
        ExplicitSettings.load(
            profile="sqld", url=server.http_url, auth_token=server.rw_token, retry_attempts=1
        )
    )
    try:
        return int(conn.execute(f"SELECT count(*) FROM {PREFIX}_transport_messages")[0][0])
    finally:
        conn.close()


def wait_for_depth(server, at_most: int, what: str) -> None:
    wait_until(lambda: depth(server) <= at_most, timeout=HANG_GUARD, interval=0.05, what=what)


@pytest.mark.parametrize("profile", ["replica", "sqld"])
def test_workers_lose_nothing_and_duplicate_only_lapsed_leases_when_the_primary_is_paused_killed_and_restarted(
    profile, fresh_sqld_primary, tmp_path
):
    server = fresh_sqld_primary
    publisher = LibsqlTransport(
        settings=ExplicitSettings.load(
            profile="sqld", url=server.http_url, auth_token=server.rw_token, prefix=PREFIX
        )
    )
    publisher.publish_many(
        Message(f"g{n % GROUPS:02d}", Event(kind="job", data={"n": n})) for n in range(MESSAGES)
    )
    published = {
        int(seq) for (seq,) in publisher.execute(f"SELECT seq FROM {PREFIX}_transport_messages")
    }
    publisher.close()
    assert len(published) == MESSAGES

    ctx = multiprocessing.get_context("spawn")
    stop = ctx.Event()
    logs = [tmp_path / f"w{i}.jsonl" for i in range(WORKERS)]
    starts = [ctx.Event() for _ in range(WORKERS)]
    processes = [
        ctx.Process(
            target=worker_main,
            args=(
                f"w{i}",
                worker_settings(profile, server, tmp_path, f"w{i}"),
                str(logs[i]),
                starts[i],
                stop,
            ),
            name=f"w{i}",
        )
        for i in range(WORKERS)
    ]
    faults: dict[str, float] = {}
    try:
        for process in processes:
            process.start()
        pids = [process.pid for process in processes]
        for started in starts:
            assert started.wait(timeout=60), "a worker did not start"

        wait_for_depth(server, MESSAGES * 3 // 4, "a quarter of the backlog acked")
        faults["pause"] = time.time()
        server.pause()
        time.sleep(PAUSE)  # the fault's length, not a wait for readiness
        server.resume()
        faults["resume"] = time.time()

        wait_for_depth(server, MESSAGES * 2 // 5, "three fifths of the backlog acked")
        faults["kill"] = time.time()
        server.kill()
        time.sleep(DOWN)  # the outage's length
        server.restart()
        faults["restart"] = time.time()

        try:
            wait_for_depth(server, 0, "the whole backlog acked")
        except TimeoutError:
            stop.set()
            pytest.fail(
                f"the backlog did not drain: {stuck(server)}; {analyse(read(logs), published, faults)}"
            )
        stop.set()
        for process in processes:
            process.join(timeout=60)
        exit_codes = [process.exitcode for process in processes]
    finally:
        stop.set()
        for process in processes:
            if process.is_alive():
                process.terminate()
                process.join(timeout=10)

    report = analyse(read(logs), published, faults)
    report.update(profile=profile, backend=server.backend, exit_codes=exit_codes)
    print(f"\nchaos report: {json.dumps(report, indent=1)}")

    assert exit_codes == [0] * WORKERS, f"every worker ran to the end: {report}"
    assert [process.pid for process in processes] == pids
    assert depth(server) == 0, report
    assert report["lost"] == [], f"published but never acked: {report}"
    assert report["errors"] == [], f"errors escaped the retry policy into a worker: {report}"
    assert report["duplicates_without_lapsed_lease"] == [], report
    assert len(report["acks_after_restart_by_worker"]) == WORKERS, (
        f"every worker kept working after the primary came back, without being restarted: {report}"
    )
    # Two acks of one message can both say True in one case only: the first holder's ack failed
    # ambiguously after its lease lapsed, the next holder acked, and the look-up found the message
    # gone ("done", whoever removed it: docs/consistency.md). That is a duplicate delivery of a
    # lapsed lease, never a message that another worker still holds.
    lapsed_seqs = {entry["seq"] for entry in report["duplicates_after_lapsed_lease"]}
    assert set(report["acked_twice"]) <= lapsed_seqs, (
        f"an ack said True for a lease that had not lapsed: {report}"
    )


def read(logs: list[Path]) -> list[dict]:
    return [json.loads(line) for path in logs if path.exists() for line in path.read_text().splitlines()]


def stuck(server) -> list[tuple]:
    """What is left on the primary, for the failure message: seq, group, lock, seconds to expiry."""
    conn = Statements(
        ExplicitSettings.load(profile="sqld", url=server.http_url, auth_token=server.rw_token)
    )
    try:
        return conn.execute(
            f"SELECT seq, group_id, locked_by, round(lock_expiry - unixepoch('subsec'), 2)"
            f" FROM {PREFIX}_transport_messages ORDER BY seq LIMIT 20"
        )
    finally:
        conn.close()


def analyse(records: list[dict], published: set[int], faults: dict[str, float]) -> dict[str, Any]:
    """Turn the workers' logs into the counts the test asserts and reports."""
    claims: dict[str, dict] = {r["token"]: r for r in records if r["kind"] == "claim"}
    acks: dict[str, dict] = {r["token"]: r for r in records if r["kind"] == "ack"}
    deliveries: dict[int, list[dict]] = defaultdict(list)
    for claim in sorted(claims.values(), key=lambda r: r["claim_end"]):
        deliveries[claim["seq"]].append({**claim, "ack": acks.get(claim["token"])})
    acked = {seq for seq, ds in deliveries.items() if any(d["ack"] and d["ack"]["acked"] for d in ds)}
    duplicates = {seq: ds for seq, ds in deliveries.items() if len(ds) > 1}

    lapsed, unexplained, first_acks = [], [], Counter()
    for seq, ds in duplicates.items():
        for first, second in zip(ds, ds[1:], strict=False):
            # The second lease can only be granted after the first expired: that happened at the
            # primary no earlier than first.claim_start + VISIBILITY, and before second.claim_end.
            lease_ran_out = second["claim_end"] >= first["claim_start"] + VISIBILITY
            held_for = (first["ack"]["ack_end"] if first["ack"] else second["claim_end"]) - first[
                "claim_start"
            ]
            outcome = "no ack" if not first["ack"] else ("acked" if first["ack"]["acked"] else "lost")
            first_acks[outcome] += 1
            entry = {"seq": seq, "first_held_for": round(held_for, 2), "first_ack": outcome}
            (lapsed if lease_ran_out and held_for >= VISIBILITY else unexplained).append(entry)
    acked_twice = [
        seq for seq, ds in duplicates.items() if sum(bool(d["ack"] and d["ack"]["acked"]) for d in ds) > 1
    ]

    restart = faults.get("restart", float("inf"))
    after_restart = Counter(r["worker"] for r in records if r["kind"] == "ack" and r["ack_end"] > restart)
    retries: Counter[str] = Counter()
    retried_errors: set[str] = set()
    for r in records:
        if r["kind"] == "retries":
            retries.update(r["counts"])
            retried_errors.update(r.get("errors", ()))
    return {
        "published": len(published),
        "deliveries": sum(len(ds) for ds in deliveries.values()),
        "acked": len(acked & published),
        "lost": sorted(published - acked),
        "duplicates": len(duplicates),
        "duplicates_after_lapsed_lease": lapsed,
        "duplicates_without_lapsed_lease": unexplained,
        "first_delivery_ack_of_duplicates": dict(first_acks),
        "acked_twice": acked_twice,
        "errors": [r for r in records if r["kind"] == "error"],
        "acks_after_restart_by_worker": dict(after_restart),
        "retry_log": dict(sorted(retries.items())),
        "retried_errors": sorted(retried_errors),
        "fault_seconds": {k: round(v - faults["pause"], 2) for k, v in faults.items()},
    }


def test_a_replica_syncs_after_a_failed_delegated_write_before_it_claims_again(fresh_sqld_primary, tmp_path):
    """The primary dies under a replica's claim: the retry repairs by syncing (not reopening: a
    replica cannot be opened while its primary is down, and the open one still reads), then
    claims once the primary is back, from the same process and connection."""
    import threading  # noqa: PLC0415

    import structlog  # noqa: PLC0415

    server = fresh_sqld_primary
    settings = ExplicitSettings.load(
        profile="replica",
        db_path=str(tmp_path / "r.db"),
        sync_url=server.http_url,
        auth_token=server.rw_token,
        prefix=PREFIX,
        **RETRY,
    )
    replica = LibsqlTransport(settings=settings)
    replica.publish("g", Event(kind="before-the-outage"))
    first_failure = threading.Event()
    failed_at: list[float] = []

    def watch(_logger, _method, event_dict):
        if event_dict["event"] == "retrying" and not failed_at:
            failed_at.append(time.time())
            first_failure.set()
        return event_dict

    def restart_after_the_first_failure():
        first_failure.wait(timeout=60)
        server.restart()

    server.kill()
    restarter = threading.Thread(target=restart_after_the_first_failure, daemon=True)
    restarter.start()
    with structlog.testing.capture_logs(processors=[watch]) as logs:
        lease = replica.claim("w", 30)
    restarter.join(timeout=60)
    assert lease is not None and lease.event.kind == "before-the-outage"
    assert failed_at, "the claim failed while the primary was down, and was retried"
    events = [e["event"] for e in logs]
    assert events[0] == "retrying" and events[-1] == "succeeded after retrying", events
    assert "Unavailable" in logs[0]["error"] or "connect" in logs[0]["error"], logs[0]
    assert replica.ack(lease) and replica.depth() == 0
    replica.close()
