"""Recurring schedules on AWS: a DynamoDB schedules table and the every-minute timer that sends occurrences to SQS."""
