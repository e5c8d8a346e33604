"""The notebook side: what a lab notebook imports (`Lab`: the `%%step` magic and the checks),
the student's module assembled from step cells, progress, the quiz, and the lesson build."""

from labkit.notebook.lab import Lab

__all__ = ["Lab"]
