"""Alembic migrations of the accounting store (packaged: no alembic.ini at runtime)."""
