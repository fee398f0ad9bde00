"""Statecharts the tests and benchmarks drive: one place, so a benchmark measures the machine the
tests check."""

# A counter: every Tick adds one to `n`, so a count that ends at its number of Ticks means each
# was applied once; a hot group of it is one execution with many Ticks queued.
COUNTER = """
event Tick {}

machine counter {
  context {
    n: int = 0
  }
  initial Counting
  state Counting {}
  from Counting to Counting on Tick set context.n = context.n + 1
}
"""
