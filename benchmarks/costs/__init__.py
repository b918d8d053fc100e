"""Per-step request counting for the AWS routes (used by ``benchmarks.aws_costs`` and ``benchmarks.sqs_packing``)."""
