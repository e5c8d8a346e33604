"""Every limit and default the judge uses, declared once."""

# Wall-clock budget for one step's child process (import + all cases). Generous on purpose:
# verdicts must not change when both cores are busy; a hang costs this much once.
STEP_TIMEOUT = 10.0
# Budget for one process in a crash scenario (a single dispatch or client run).
SCENARIO_TIMEOUT = 10.0
# Budget for one call to a child that stays up (`child.child_session`): the pure functions
# it serves answer in well under a millisecond, so a call this slow is a hang.
CALL_TIMEOUT = 5.0
# Property tests (`judge.differential`): examples per test, and two backstops for one whole
# test. The count is what keeps a verdict deterministic. The backstops trip only for a
# function that is slow in itself: the CPU time its calls use in the child (~1000x what a
# reference uses, and load barely changes CPU time), and a wall-clock limit for one that
# sleeps (a reference run takes ~0.2 s quiet and stayed under 20 s with the machine at load 15).
PROPERTY_EXAMPLES = 150
PROPERTY_CPU_SECONDS = 2.0
PROPERTY_SECONDS = 60.0
PROPERTY_WALL_BACKSTOP = 240.0
# CPU seconds a case that only a too-slow solution can hang on (`expect.Plan.hang_clause`:
# backoff(10**9, ...)) may use before its child is ended (SIGPROF, `probe.started`): a reference
# answers in microseconds, and CPU time, unlike the step's clock, hardly moves with the machine's
# load. Without it such a hang held its child for the whole STEP_TIMEOUT, computing. Half a
# second is still thousands of times what a right answer needs (2 s was: every student with
# that bug, and every catalogue run of one, paid it, in CPU the machine shares).
HANG_CASE_CPU_SECONDS = 0.5
# CPU seconds the student's module may use while it imports (`probe.budget_import`): top-level
# code defines functions in milliseconds, and one that computes without end (a loop at the top
# of a step cell) is ended after this much CPU, whatever the load; the step's clock would let
# it compute for STEP_TIMEOUT, up to WALL_FACTOR times that on a busy machine, in every child.
IMPORT_CPU_SECONDS = 2
# The key of a child's request args that names those cases (`StepContext.cases`).
CPU_BUDGET_KEY = "cpu_budget"
# Child processes get this much address space; a memory hog dies with MemoryError.
CHILD_MEMORY_BYTES = 1024 * 1024 * 1024
# Largest file a child may write (its stdout file included): a print loop cannot fill the disk.
CHILD_FILE_BYTES = 256 * 1024 * 1024
# Captured stdout/stderr of a child, per stream.
CHILD_OUTPUT_BYTES = 64 * 1024
MAX_RECORD_DEPTH = 64  # a report nested deeper than this is refused before json.loads sees it
# How long a killed process group may take to disappear before we stop waiting.
KILL_GRACE = 2.0
# A child's wait may grow by the time its processes spent waiting for a CPU (a busy machine's
# time, not the code's), to at most this many times its budget (`processes.Budget`).
WALL_FACTOR = 4
# The exit code the kill hooks use: "the process really died at this point".
KILL_EXIT_CODE = 73
# Environment variable that marks every process started for one judge run.
RUN_MARKER = "LABKIT_RUN"
# Environment variable that overrides STEP_TIMEOUT and SCENARIO_TIMEOUT (tests of hangs).
TIMEOUT_ENV = "LABKIT_STEP_TIMEOUT"


def step_timeout() -> float:
    import os

    value = os.environ.get(TIMEOUT_ENV)
    try:
        return float(value) if value else STEP_TIMEOUT
    except ValueError:
        return STEP_TIMEOUT


def limit_resources() -> None:
    """Called first thing inside every child that will run student code (not via preexec_fn,
    which is unsafe while the judge runs steps in threads)."""
    import resource

    resource.setrlimit(resource.RLIMIT_AS, (CHILD_MEMORY_BYTES, CHILD_MEMORY_BYTES))
    resource.setrlimit(resource.RLIMIT_CORE, (0, 0))
    resource.setrlimit(resource.RLIMIT_FSIZE, (CHILD_FILE_BYTES, CHILD_FILE_BYTES))
