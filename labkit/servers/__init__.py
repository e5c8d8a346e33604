"""The servers the labs talk to, run by the judge: the warehouse (HTTP) and the feed (TCP)."""
