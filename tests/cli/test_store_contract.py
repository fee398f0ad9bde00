"""The execution store the worker uses, through harel's own store contracts, on every profile."""

from __future__ import annotations

import pytest
from harel.engine.execution import Execution
from harel.engine.store import StoreConflict
from harel.spec.states import Event
from harel.testing import assert_listing_contract, assert_outbox_contract, assert_purge_contract

from harel_edge.store import EdgeStore


@pytest.fixture
def make_store(place):
    made = []

    def make(**overrides):
        store = EdgeStore(place.settings(**overrides))
        made.append(store)
        return store

    yield make
    for store in made:
        store.close()


def test_harels_listing_contract_holds(make_store):
    assert_listing_contract(make_store(), ordered=True, ns="l-")


def test_harels_purge_contract_holds(make_store):
    assert_purge_contract(make_store(), ns="p-")


def test_harels_outbox_contract_holds(make_store):
    assert_outbox_contract(make_store(), ns="o-")


def test_an_execution_written_by_another_edge_is_seen_by_the_next_load(place):
    writer = EdgeStore(place.settings())
    reader = EdgeStore(
        writer.settings.model_copy(update={"db_path": str(place.tmp_path / "reader.db")})
        if place.profile == "replica"
        else writer.settings
    )
    try:
        assert reader.load("x") is None
        writer.commit(Execution(id="x", definition_id="d"), [])
        seen, processed = reader.load_for_event("x", "e1")
        assert seen is not None and seen.version == 1 and processed is False
    finally:
        writer.close()
        reader.close()


def test_a_stale_copy_cannot_overwrite_a_newer_version(make_store):
    store = make_store()
    exe = Execution(id="x", definition_id="d")
    store.commit(exe, [])
    stale = store.load("x")
    store.commit(store.load("x"), [])
    with pytest.raises(StoreConflict):
        store.commit(stale, [])
    assert store.load("x").version == 2


def test_a_failed_commit_leaves_nothing_behind(make_store):
    store = make_store()
    exe = Execution(id="x", definition_id="d")
    store.commit(exe, [])
    with pytest.raises(TypeError):  # the spawn's context cannot be serialized: it fails after
        # the execution row and the outbox entry were written in the transaction
        store.commit(store.load("x"), [("x", Event(kind="E"))], spawns=(("c", "", {"bad": object()}),))
    assert store.load("x").version == 1
    assert store.pending_outbox() == []
    store.commit(store.load("x"), [])  # and the connection is usable afterwards
    assert store.load("x").version == 2


def test_an_execution_whose_id_holds_a_nul_is_refused_and_nothing_is_written(make_store):
    """As the queue refuses such a group: the driver would read the id back cut at the NUL."""
    store = make_store()
    for write in (store.save, lambda exe: store.commit(exe, [("order\x0042", Event(kind="E"))])):
        with pytest.raises(ValueError, match=r"execution id 'order\\x0042' contains a NUL character .* encode the id"):
            write(Execution(id="order\x0042", definition_id="d"))
    assert store.list_executions().items == [] and store.pending_outbox() == []
    assert store.load("order") is None


# Why EdgeStore exists: what harel 0.9's own LibsqlStore does on the remote profiles. If harel
# changes, these fail, and the choice of store in harel_edge/store.py should be looked at again.


@pytest.mark.sqld
def test_harels_own_libsql_store_cannot_send_a_token_to_a_sqld_server(fresh_sqld_primary):
    from harel.engine.store import LibsqlStore

    with pytest.raises(ValueError, match="401"):
        LibsqlStore(fresh_sqld_primary.http_url, auth_token=fresh_sqld_primary.rw_token)


@pytest.mark.sqld
def test_harels_own_libsql_store_on_a_replica_misses_another_edges_new_execution(
    fresh_sqld_primary, tmp_path
):
    from harel.engine.store import LibsqlStore

    server = fresh_sqld_primary
    writer = LibsqlStore(str(tmp_path / "a.db"), sync_url=server.http_url, auth_token=server.rw_token)
    reader = LibsqlStore(str(tmp_path / "b.db"), sync_url=server.http_url, auth_token=server.rw_token)
    try:
        writer.commit(Execution(id="x", definition_id="d"), [])
        assert reader.load("x") is None, "its reads are never synced: harel's worker would drop the event"
    finally:
        writer.close()
        reader.close()
