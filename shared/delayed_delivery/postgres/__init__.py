"""PostgreSQL store and batch mover (extra ``postgres``)."""
