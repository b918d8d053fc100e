"""Recurring schedules (core, standard library only): cron, rate and at in any time zone, with named DST rules."""
