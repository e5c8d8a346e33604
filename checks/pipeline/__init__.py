"""The lab's package of content: manifest.toml (data), quiz.py; the step table (lab.py), the checks and the child-side probes come with the checks."""
