"""Ids the transport stores must come back intact: one with a NUL is refused at publish."""

from __future__ import annotations

import pytest
from harel.spec.states import Event

from harel_edge.queue import LibsqlTransport, Message


@pytest.mark.parametrize(
    "publish",
    [
        lambda t: t.publish("order\x0042", Event(kind="paid")),
        lambda t: t.publish("order-42", Event(kind="paid"), routing_key="eu\x00west"),
        lambda t: t.publish_many(
            [Message("order-41", Event(kind="paid")), ("order\x0042", Event(kind="paid"))]
        ),
    ],
    ids=["group id", "routing key", "one of a batch"],
)
def test_a_group_id_or_routing_key_with_a_nul_is_refused_and_nothing_is_published(publish, tmp_path) -> None:  # noqa: ANN001
    transport = LibsqlTransport(str(tmp_path / "queue.db"))
    try:
        with pytest.raises(ValueError, match="NUL"):
            publish(transport)
        assert transport.depth() == 0
    finally:
        transport.close()
