"""The demo's durable workflow: fulfil an order, step by step, surviving any worker's death.

Run by `harel-edge worker --workflow fulfil=harel_edge.examples.workflow:fulfil` (the demo
does this in each of its workers). A workflow is started by making it ready in its namespace
and continued by whichever worker takes it next:

    await durable.scheduler.make_ready("order-7")                       # start
    await durable.arrive("order-7", "confirmation", {"by": "warehouse"})  # the message it waits for

The charge is a `transact` step: its row in `demo_ledger` and the step's record commit
together, so however often the workflow is replayed or its worker killed, each order is
charged exactly once. The demo counts those rows to show it.
"""

from __future__ import annotations

from datetime import timedelta

from harel_edge.durable.runtime import Context

LEDGER_DDL = (
    "CREATE TABLE IF NOT EXISTS demo_ledger ("
    " id INTEGER PRIMARY KEY AUTOINCREMENT, workflow TEXT NOT NULL, amount REAL NOT NULL)"
)

# How long the workflow sleeps between charging and waiting for its confirmation: long enough
# to show a sleeping workflow in `harel-edge status`, short enough for the demo to finish fast.
NAP = timedelta(milliseconds=300)


def _amount(workflow: str) -> float:
    return round(5 + (sum(map(ord, workflow)) % 50) * 0.5, 2)


async def fulfil(ctx: Context) -> dict:
    """Reserve, charge (exactly once), nap, wait for a confirmation, then ship."""
    reservation = await ctx.step("reserve", lambda: {"workflow": ctx.workflow, "items": 1})
    amount = _amount(ctx.workflow)
    charge_id = await ctx.transact(
        "charge",
        lambda tx: tx.execute(
            "INSERT INTO demo_ledger (workflow, amount) VALUES (?, ?) RETURNING id", (ctx.workflow, amount)
        )[0][0],
    )
    await ctx.sleep_until(ctx.now() + NAP)
    confirmation = await ctx.receive("confirmation")
    shipment = await ctx.step(
        "ship", lambda: {"carrier": "edge-post", "confirmed_by": confirmation.get("by")}
    )
    return {"reservation": reservation, "charge": charge_id, "amount": amount, "shipment": shipment}
