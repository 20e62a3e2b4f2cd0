"""Schema migrations: `migrations/NNNN_name.sql`, applied in order, once each.

Each migration runs in its own transaction together with its row in `schema_migrations`; a
session-level advisory lock serialises migrators, so services starting together are safe.
A migration edited after it was applied is refused (its checksum no longer matches).

    python -m gangline.store.migrate [--dsn postgresql://...]
"""

from __future__ import annotations

import argparse
import asyncio
import hashlib
import re
import sys
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import asyncpg

from gangline.store.pool import dsn_from_env

MIGRATIONS_DIR = Path(__file__).with_name("migrations")
# Any fixed bigint unique to this purpose: pg_advisory_lock keys are database-wide.
_ADVISORY_LOCK_KEY = 0x6761_6E67_6C69_6E65 & 0x7FFF_FFFF_FFFF_FFFF  # "gangline"
_FILE_NAME = re.compile(r"^(\d{4})_([a-z0-9_]+)\.sql$")


class MigrationError(RuntimeError):
    """The migrations on disk and those recorded in the database disagree."""


@dataclass(frozen=True)
class Migration:
    version: int
    name: str
    sql: str

    @property
    def checksum(self) -> str:
        return hashlib.sha256(self.sql.encode("utf-8")).hexdigest()


def discover(directory: Path = MIGRATIONS_DIR) -> list[Migration]:
    """The migrations in `directory`, in version order; a misnamed or duplicate file is an error."""
    migrations: list[Migration] = []
    for path in sorted(directory.glob("*.sql")):
        match = _FILE_NAME.match(path.name)
        if match is None:
            raise MigrationError(f"{path.name}: migration files are named NNNN_lower_snake.sql")
        migrations.append(Migration(int(match[1]), match[2], path.read_text(encoding="utf-8")))
    versions = [m.version for m in migrations]
    if len(set(versions)) != len(versions):
        raise MigrationError(f"two migrations share a version in {directory}")
    return migrations


async def migrate(conn: asyncpg.Connection, migrations: Sequence[Migration] | None = None) -> list[int]:
    """Apply the pending migrations on `conn`; return the versions applied (empty when up to date)."""
    todo = list(discover() if migrations is None else migrations)
    await conn.execute("SELECT pg_advisory_lock($1)", _ADVISORY_LOCK_KEY)
    try:
        await conn.execute(
            """
            CREATE TABLE IF NOT EXISTS schema_migrations (
                version    integer PRIMARY KEY,
                name       text NOT NULL,
                checksum   text NOT NULL,
                applied_at timestamptz NOT NULL DEFAULT now()
            )
            """
        )
        applied = {r["version"]: r["checksum"] for r in await conn.fetch("SELECT * FROM schema_migrations")}
        done: list[int] = []
        for migration in todo:
            recorded = applied.get(migration.version)
            if recorded is not None:
                if recorded != migration.checksum:
                    raise MigrationError(
                        f"migration {migration.version:04d}_{migration.name} changed after it was applied"
                    )
                continue
            async with conn.transaction():
                await conn.execute(migration.sql)
                await conn.execute(
                    "INSERT INTO schema_migrations (version, name, checksum) VALUES ($1, $2, $3)",
                    migration.version,
                    migration.name,
                    migration.checksum,
                )
            done.append(migration.version)
        return done
    finally:
        await conn.execute("SELECT pg_advisory_unlock($1)", _ADVISORY_LOCK_KEY)


async def migrate_dsn(dsn: str) -> list[int]:
    """Connect to `dsn`, apply the pending migrations, disconnect."""
    conn = await asyncpg.connect(dsn)
    try:
        return await migrate(conn)
    finally:
        await conn.close()


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m gangline.store.migrate", description="Apply the pending schema migrations."
    )
    parser.add_argument("--dsn", default=None, help="default: $GANGLINE_PG_DSN or the local cluster")
    args = parser.parse_args(argv)
    try:
        done = asyncio.run(migrate_dsn(args.dsn or dsn_from_env()))
    except (MigrationError, OSError, asyncpg.PostgresError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1
    print(f"migrations: {len(done)} applied ({', '.join(f'{v:04d}' for v in done) or 'up to date'})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
