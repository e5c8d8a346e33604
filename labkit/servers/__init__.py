"""The servers the labs talk to, run by the judge: the warehouse (HTTP), PostgreSQL and Valkey."""
