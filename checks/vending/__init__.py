"""The lab's package of content: manifest.toml (data), lab.py (the step table), the checks, the child-side probes."""
