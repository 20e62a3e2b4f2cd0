"""``python -m services.ledger``: project every public topic into PostgreSQL (settings: GANGLINE_*)."""

from __future__ import annotations

from gangline.store.migrate import migrate
from gangline.store.pool import create_pool
from services.common.metrics import ServiceMetrics
from services.common.process import run_main
from services.ledger.settings import LedgerSettings
from services.ledger.wiring import SERVICE, Ledger, ledger_figures


async def main(settings: LedgerSettings) -> None:
    pool = await create_pool(settings.pg_dsn.get_secret_value())
    try:
        async with pool.acquire() as conn:
            await migrate(conn)  # serialised by an advisory lock; a no-op when up to date
        ledger = Ledger(settings, pool)
        metrics = ServiceMetrics(SERVICE, decides=False)
        metrics.add_figures(lambda: ledger_figures(ledger))
        async with metrics.serve(settings):
            await ledger.run()
    finally:
        await pool.close()


if __name__ == "__main__":
    raise SystemExit(run_main(SERVICE, LedgerSettings.from_env(), main))
