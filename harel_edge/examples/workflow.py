"""The demo's durable workflow: fulfil an order step by step, surviving any worker's death.

The charge is a `transact` step, so each order is charged exactly once; the demo counts the rows.
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
