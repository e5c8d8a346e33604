"""Reference implementations the judge compares students' functions with (judge side only)."""
