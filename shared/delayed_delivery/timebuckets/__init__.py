"""The S3 time-bucket tier's core: the timing wheel, the object format, the census and the cost model."""
