"""Units of work coalesced into one commit (local) or one request (sqld, replica) keep apart:
a unit whose SQL ends the whole transaction fails alone, and every other unit is applied."""

from __future__ import annotations

import asyncio

import pytest

from harel_edge.executor import StatementError, Stmt, open_executor

# Each test's own tables (its settings' prefix): the module's tests share one primary.
SETUP = [
    "CREATE TABLE {p}_t (x INTEGER PRIMARY KEY)",
    "INSERT INTO {p}_t VALUES (0)",
    "CREATE TABLE {p}_refused (x)",
    "CREATE TRIGGER {p}_refuse BEFORE INSERT ON {p}_refused BEGIN SELECT RAISE(ROLLBACK, 'refused by its trigger'); END",
]
ROLLS_BACK = {
    "INSERT OR ROLLBACK": "INSERT OR ROLLBACK INTO {p}_t VALUES (0)",
    "a trigger's RAISE(ROLLBACK)": "INSERT INTO {p}_refused VALUES (1)",
}


@pytest.mark.parametrize("alone", [False, True], ids=["in a transaction", "as a lone statement"])
@pytest.mark.parametrize("bad", list(ROLLS_BACK))
def test_a_unit_that_rolls_back_the_transaction_fails_alone_and_every_other_unit_of_its_commit_is_applied(edge, bad, alone):
    settings = edge.settings(commit_linger=0.001)

    p = settings.prefix
    t, rolls_back = f"{p}_t", Stmt(ROLLS_BACK[bad].format(p=p))

    async def main():
        executor = open_executor(settings)
        try:
            for sql in SETUP:
                await executor.execute(Stmt(sql.format(p=p)))
            before = executor.exchanges

            def good(i: int):
                return executor.transaction([Stmt(f"INSERT INTO {t} VALUES (?)", (i,)), Stmt(f"SELECT count(*) FROM {t}")])

            units = [good(i) for i in range(1, 6)]
            units.append(executor.execute(rolls_back) if alone else executor.transaction([Stmt(f"INSERT INTO {t} VALUES (100)"), rolls_back]))
            units.extend(good(i) for i in range(6, 11))
            answers = await asyncio.gather(*units, return_exceptions=True)
            exchanges = executor.exchanges - before
            rows = (await executor.execute(Stmt(f"SELECT x FROM {t} ORDER BY x"))).rows
            return answers, exchanges, rows
        finally:
            await executor.aclose()

    answers, exchanges, rows = asyncio.run(main())
    failed = [i for i, answer in enumerate(answers) if isinstance(answer, BaseException)]
    assert failed == [5], f"only the unit that rolled back failed: {answers!r}"
    assert isinstance(answers[5], StatementError), f"its error is the statement's own: {answers[5]!r}"
    assert rows == [(x,) for x in range(11)], "every other unit was applied, none of the bad one"
    if edge.profile == "local":
        assert exchanges == 1, "the eleven units shared one commit"


def test_a_statement_refused_by_a_constraint_says_so_by_its_code_on_every_profile(edge):
    settings = edge.settings()
    p = settings.prefix

    async def main():
        executor = open_executor(settings)
        try:
            await executor.execute(Stmt(f"CREATE TABLE {p}_c (x INTEGER PRIMARY KEY, y CHECK (y > 0))"))
            await executor.execute(Stmt(f"INSERT INTO {p}_c VALUES (1, 1)"))
            answers = []
            for sql in (f"INSERT INTO {p}_c VALUES (1, 1)", f"INSERT INTO {p}_c VALUES (2, -1)", f"SELECT * FROM {p}_nothing"):
                try:
                    await executor.transaction([Stmt(sql)])
                except StatementError as exc:
                    answers.append(exc)
            return answers
        finally:
            await executor.aclose()

    unique, check, missing = asyncio.run(main())
    assert unique.refused_by_a_constraint and unique.code.startswith("SQLITE_CONSTRAINT"), repr(unique)
    assert check.refused_by_a_constraint, repr(check)
    assert not missing.refused_by_a_constraint, "a missing table is not a constraint"
