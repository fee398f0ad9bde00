"""harel 0.9's own sync worker (`harel.engine.distributed.Worker`), given harel_edge's sync faces
(`EdgeStore(settings)`, `LibsqlTransport(settings=settings)`), runs the demo's order statechart on
every profile: two workers at once, each in a thread with faces of its own, every order
delivered and every event applied once."""

from __future__ import annotations

import threading
import time
from pathlib import Path

import pytest
from harel.engine.distributed import Worker
from harel.engine.execution import Execution, Status
from harel.spec.states import Event

import harel_edge.examples.actions as actions
from harel_edge import LibsqlTransport, Message
from harel_edge.store import EdgeStore
from harel_edge.worker import load_definitions

EXAMPLES = Path(actions.__file__).parent
ORDERS = 12
STEPS = ("Start", "Pay", "Ship", "Deliver")


class AckLost:
    """A transport whose acks never reach the queue: a worker that crashed right after its commit."""

    def __init__(self, transport: LibsqlTransport) -> None:
        self._transport = transport

    def __getattr__(self, name: str):  # noqa: ANN204
        return getattr(self._transport, name)

    def ack(self, lease) -> bool:  # noqa: ANN001
        return True


def amount(i: int) -> float:
    return 10.0 + i


def seed(settings) -> None:
    """The orders, PENDING (the worker starts each on its Start), and their four events, as the
    demo seeds them."""
    with EdgeStore(settings) as store, LibsqlTransport(settings=settings) as transport:
        for i in range(ORDERS):
            store.save(Execution(id=f"order-{i:03d}", definition_id="order", priority=i % 4))
        transport.publish_many(
            Message(f"order-{i:03d}", Event(kind=kind, data={"amount": amount(i)} if kind == "Pay" else {}), i % 4)
            for i in range(ORDERS)
            for kind in STEPS
        )


def faces(settings, paired: bool) -> tuple[EdgeStore, LibsqlTransport]:
    """A worker's store and transport: apart (an executor each), or the store on the transport's
    core (its claims bring the execution, the commit carries the ack)."""
    transport = LibsqlTransport(settings=settings, pair_with_store=paired)
    store = EdgeStore(transport=transport, create_schema=False) if paired else EdgeStore(settings, create_schema=False)
    return store, transport


@pytest.mark.parametrize("paired", [False, True], ids=["faces apart", "store on the transport's core"])
@pytest.mark.parametrize("execution", ["background", "inline"])
def test_harels_sync_worker_on_the_sync_faces_delivers_every_order_applying_each_event_once(
    edge, monkeypatch, execution, paired
):
    packed: list[float] = []
    real_pack = actions.pack

    def counting_pack(execution, event, **inputs):  # noqa: ANN001, ANN202 - harel's action signature
        packed.append(execution.execution_ctx.get("paid"))
        return real_pack(execution, event, **inputs)

    monkeypatch.setattr(actions, "pack", counting_pack)  # before the statechart binds it
    definitions = load_definitions(str(EXAMPLES))
    settings = edge.settings()
    seed(settings)
    # A first worker applies one event and dies before its ack: the message comes back when its
    # 1 s lease lapses, and must be seen as processed, not applied again.
    with EdgeStore(settings, create_schema=False) as store, LibsqlTransport(settings=settings) as transport:
        crashed = Worker(store, AckLost(transport), definitions, worker_id="crashed", visibility=1.0, execution="inline")
        assert crashed.step() is True
        assert transport.depth() == ORDERS * len(STEPS), "its event is still queued"

    stop, errors, handled = threading.Event(), [], {}

    def work(name: str, mine) -> None:  # noqa: ANN001
        try:
            store, transport = faces(mine, paired)
            with transport, store:
                worker = Worker(store, transport, definitions, worker_id=name, execution=execution)
                count = 0
                while not stop.is_set():
                    if worker.step():
                        count += 1
                    else:
                        stop.wait(0.01)  # idle: nothing claimable now
                handled[name] = count
        except BaseException as exc:  # noqa: BLE001 - reported by the test
            errors.append(f"{name}: {type(exc).__name__}: {exc}")
            stop.set()

    threads = [
        threading.Thread(target=work, args=(name, edge.peer(settings)), name=name) for name in ("edge-1", "edge-2")
    ]
    for thread in threads:
        thread.start()
    with EdgeStore(settings, create_schema=False) as store, LibsqlTransport(settings=settings) as transport:
        deadline = time.monotonic() + 180  # a guard against a hang, not a measurement
        while not stop.is_set() and time.monotonic() < deadline:
            if transport.depth() == 0 and all(
                e.status == Status.DONE for e in (store.load(f"order-{i:03d}") for i in range(ORDERS))
            ):
                break
            stop.wait(0.05)
        stop.set()
        for thread in threads:
            thread.join(60)
        assert errors == []
        assert transport.depth() == 0, "every event was acked"
        # Every event once, and the crashed worker's one again (seen as processed and acked).
        assert sum(handled.values()) == ORDERS * len(STEPS)
        for i in range(ORDERS):
            exe = store.load(f"order-{i:03d}")
            assert (exe.status, exe.active_path, exe.outcome) == (Status.DONE, "Delivered", "success")
            assert exe.context["paid"] == amount(i)
            assert exe.version == 1 + len(STEPS), "saved once, then one commit an event"
        processed = store.execute(f"SELECT count(*), count(DISTINCT event_id) FROM {settings.prefix}_processed_events")
        assert processed == [(ORDERS * len(STEPS), ORDERS * len(STEPS))]
    assert sorted(packed) == [amount(i) for i in range(ORDERS)], "each order packed once, on its Ship"


@pytest.mark.parametrize("execution", ["background", "inline"])
def test_with_the_store_on_the_transports_core_each_event_costs_one_exchange_its_commit_carrying_the_next_claim(
    edge, execution
):
    """In background execution harel adapts the store without `load_for_event`: its `load` and
    `is_processed` are answered from the claim's read too."""
    definitions = load_definitions(str(EXAMPLES))
    settings = edge.settings()
    seed(settings)
    store, transport = faces(settings, paired=True)
    with transport, store:
        worker = Worker(store, transport, definitions, worker_id="one", execution=execution)
        assert worker.step() is True  # the first claim is an exchange of its own
        executor = transport.core.path.executor
        before = executor.exchanges
        steps = 0
        while worker.step():
            steps += 1
        handled = executor.exchanges - before
        assert steps == ORDERS * len(STEPS) - 1
        # Each step's commit carried its ack and the next claim; the last claim found nothing.
        assert handled == steps + 1, f"{handled} exchanges for {steps} events"
        assert transport.depth() == 0


def test_a_closing_transport_gives_back_the_lease_its_last_commit_claimed_ahead(edge):
    definitions = load_definitions(str(EXAMPLES))
    settings = edge.settings()
    with EdgeStore(settings) as seeding:
        for group in ("a", "b"):
            seeding.save(Execution(id=group, definition_id="order"))
    with LibsqlTransport(settings=settings) as publisher:
        publisher.publish("a", Event(kind="Start"))
        publisher.publish("b", Event(kind="Start"))
    store, transport = faces(settings, paired=True)
    with transport, store:
        assert Worker(store, transport, definitions, worker_id="one", execution="inline").step() is True
        assert transport.core.buffered == 1, "the commit claimed the other group's head ahead"
    with LibsqlTransport(settings=settings) as other:
        lease = other.claim("two", 30)
        assert lease is not None and lease.event.kind == "Start", "given back at close, not left to lapse"
        assert other.ack(lease) is True
        assert other.depth() == 0


def test_a_limit_set_while_the_worker_runs_refuses_the_claim_a_commit_carries_and_not_the_commit(edge):
    from harel_edge.limits import set_key_limit  # noqa: PLC0415

    definitions = load_definitions(str(EXAMPLES))
    settings = edge.settings()
    seed(settings)
    store, transport = faces(settings, paired=True)
    with transport, store:
        worker = Worker(store, transport, definitions, worker_id="one", execution="inline")
        assert worker.step() is True and transport.core.buffered == 1
        # The claim the next commit carries was built to skip the limits: it fails once one is set.
        set_key_limit(settings, "some-tenant", concurrency=3)
        executor = transport.core.path.executor
        before = executor.exchanges
        assert worker.step() is True
        assert executor.exchanges == before + 1, "the commit and its claim went together"
        assert transport.core.buffered == 0, "the claim was refused on its own; the commit went through"
        steps = 2
        while worker.step():
            steps += 1
        assert steps == ORDERS * len(STEPS)
        assert transport.depth() == 0
        for i in range(ORDERS):
            exe = store.load(f"order-{i:03d}")
            assert exe.status == Status.DONE and exe.version == 1 + len(STEPS), "each event applied once"
