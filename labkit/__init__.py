"""labkit: what the course's notebooks and checks import, grouped by role.

- `judge/`: runs a lab's checks; student code only ever runs in its child processes.
- `probe/`: the code that runs inside those children and reports on a private pipe.
- `servers/`: the warehouse (HTTP) the labs talk to.
- `views/`: verdicts as text, HTML, an SVG timeline and live widgets.
- `notebook/`: the in-kernel side (`Lab`, `%%step`), progress, quiz, the lesson build.
- `grading/`: `python -m labkit grade`.
- `limits` and `values` are shared by the judge and its children; `labs` names the labs;
  `cli` parses the command line and delegates.
"""

__version__ = "0.1.0"
