"""One module per lab: the checks (judge side) and, beside it, its probes (child side)."""
