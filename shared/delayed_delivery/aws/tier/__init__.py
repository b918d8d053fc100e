"""The S3 time-bucket tier for long SQS delays: ingest, the timing-wheel timer, the object store (docs/buckets.md)."""
