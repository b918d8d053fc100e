"""AWS adapters (extra ``aws``): SQS sender, requeue logic and the SQS transport."""
