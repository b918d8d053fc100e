"""Recurring schedules on Azure: a schedules table beside the delays table, and the timer that materializes them."""
