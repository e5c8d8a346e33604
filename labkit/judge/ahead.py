"""A lab's next session made ahead, for a process that judges one check after another.

A lab with a session (lab 04: a PostgreSQL and a Valkey per judge run) pays for starting it at
the head of every check: ~0.2 s of the student's wait on every key press. The warm judge
(`serve.py`) judges a kernel's checks one after another, so as soon as a check ends it leaves
that check's session and enters the lab's next one in the background (`SessionsAhead`): the
verdict does not wait for the servers' stop, and the next check finds its servers up and their
spare databases made. A session still serves exactly one judge run, as without this:
nothing a run did (a killed server, a student's leftover rows) reaches the next one.

`close` leaves every session made ahead (servers stopped, folders removed); the warm judge
calls it on EOF and on SIGTERM. A session that failed to start ahead is not used: the run
starts its own, and says what is missing as it always did.

The same idea for the labs' property tests (`DrawsAhead`): the next check's seed is chosen when
a check ends, and the inputs its tests will draw are drawn in the pause that follows.
"""

from __future__ import annotations

import contextlib
import random
import threading
from collections.abc import Iterator
from concurrent.futures import Future
from typing import Any

# How long a check waits for a session still starting ahead before it starts its own (a
# server's start is bounded by its own timeouts; this only keeps a wedged thread from holding a check).
WAIT_FOR_AHEAD = 30.0


class SessionsAhead:
    """Each lab's next session, entered in the background once a run has left its own."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._ready: dict[str, Future] = {}  # lab name -> Future of (context manager, its value)
        self._leaving: list[Future] = []  # sessions of finished runs still being left
        self._closed = False

    @contextlib.contextmanager
    def session(self, lab) -> Iterator[Any]:
        """The lab's session for one run: the one made ahead if there is one, else a new one;
        once the run has left it, the next one starts ahead."""
        if lab.session is None:
            yield None
            return
        with self._lock:
            ready = self._ready.pop(lab.name, None)
        made = None
        if ready is not None:
            try:
                made = ready.result(timeout=WAIT_FOR_AHEAD)
            except Exception:  # noqa: BLE001 - failed or wedged ahead: the run makes its own
                ready.add_done_callback(_leave_made)
        manager = made[0] if made is not None else lab.session()
        value = made[1] if made is not None else manager.__enter__()
        try:
            yield value
        except BaseException as exc:
            if not manager.__exit__(type(exc), exc, exc.__traceback__):
                raise
        else:
            # The verdict does not wait for the servers' stop: it is left in the background, then
            # the next session made (not after a Ctrl-C or a SIGTERM: the process is on its way out).
            leaving: Future = Future()
            with self._lock:
                self._leaving.append(leaving)
            threading.Thread(target=self._leave_then_prepare, args=(lab, manager, leaving),
                             name=f"session left: {lab.name}", daemon=True).start()

    def _leave_then_prepare(self, lab, manager, leaving: Future) -> None:
        try:
            manager.__exit__(None, None, None)
            self.prepare(lab)  # listed in `_ready` before `leaving` is done: `session_ready` sees it
        finally:
            with self._lock:
                self._leaving.remove(leaving)
            leaving.set_result(None)

    def prepare(self, lab) -> None:
        """Start entering the lab's next session in a thread of its own (a no-op once closed)."""
        with self._lock:
            if self._closed or lab.name in self._ready:
                return
            future: Future = Future()
            self._ready[lab.name] = future
        threading.Thread(target=_enter, args=(lab, future), name=f"session ahead: {lab.name}", daemon=True).start()

    def session_ready(self, name: str, timeout: float = WAIT_FOR_AHEAD) -> bool:
        """Wait (bounded) until lab `name`'s session made ahead has started; False if none did."""
        with self._lock:
            leaving = list(self._leaving)
        for future in leaving:  # the last run's session is left first, then the next one made
            with contextlib.suppress(Exception):
                future.result(timeout=timeout)
        with self._lock:
            ready = self._ready.get(name)
        if ready is None:
            return False
        try:
            ready.result(timeout=timeout)
            return True
        except Exception:  # noqa: BLE001 - it failed: there is none
            return False

    def close(self) -> None:
        """Leave every session made ahead, waiting (bounded) for one still starting."""
        with self._lock:
            self._closed = True
            leaving = list(self._leaving)
        for future in leaving:  # a run's session still stopping: then nothing new is made
            with contextlib.suppress(Exception):
                future.result(timeout=WAIT_FOR_AHEAD)
        with self._lock:
            ready, self._ready = list(self._ready.values()), {}
        for future in ready:
            with contextlib.suppress(Exception):
                _leave(future.result(timeout=WAIT_FOR_AHEAD))


def _enter(lab, future: Future) -> None:
    try:
        manager = lab.session()
        value = manager.__enter__()
    except BaseException as exc:  # noqa: BLE001 - told to whoever takes it
        future.set_exception(exc)
        return
    try:
        warm = getattr(value, "warm", None)
        if callable(warm):  # e.g. lab 04's servers start on first use: start them now
            warm()
    except BaseException as exc:  # noqa: BLE001
        manager.__exit__(type(exc), exc, exc.__traceback__)
        future.set_exception(exc)
        return
    future.set_result((manager, value))


def _leave(made: tuple) -> None:
    made[0].__exit__(None, None, None)


def _leave_made(future: Future) -> None:
    if future.exception() is None:
        _leave(future.result())


class DrawsAhead:
    """Each lab's next verdict seed, chosen when a check ends, and the inputs its differential
    tests will draw under it, drawn while the student reads the verdict (`differential.draw_ahead`):
    a property step's check then spends its time on the student's answers, not on Hypothesis
    (measured: lab 01's validate 0.30 → 0.24 s, lab 02's replay 0.35 → 0.20 s). A check that
    names its seed is judged under it, and nothing is drawn ahead for it."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._next: dict[str, int] = {}
        self._idle = threading.Event()  # clear while a check runs: drawing ahead waits
        self._idle.set()
        self._generation = 0  # a new check ahead, or close(), ends the drawing of the one before
        self._drawing: Future | None = None

    def seed(self, lab: str) -> int:
        """The seed for lab `lab`'s check that starts now (the one drawn for, if any)."""
        with self._lock:
            chosen = self._next.pop(lab, None)
        return chosen if chosen is not None else random.randrange(1, 2**31)

    @contextlib.contextmanager
    def checking(self) -> Iterator[None]:
        self._idle.clear()
        try:
            yield
        finally:
            self._idle.set()

    def after(self, lab: str, steps: list[str] | None) -> None:
        """Choose lab `lab`'s next seed and start drawing for it, `steps`' tests first."""
        from labkit.judge import differential

        with self._lock:
            if self._generation < 0:  # closed
                return
            self._generation += 1
            generation, seed = self._generation, random.randrange(1, 2**31)
            self._next[lab] = seed

        def go_on() -> bool:
            while not self._idle.wait(1.0):
                if self._generation != generation:
                    return False
            return self._generation == generation

        self._drawing = differential.start_drawing_ahead(lab, seed, steps, go_on)

    def close(self) -> None:
        with self._lock:
            self._generation = -1
        self._idle.set()
        if self._drawing is not None:
            with contextlib.suppress(Exception):
                self._drawing.result(timeout=WAIT_FOR_AHEAD)

    def settle(self, timeout: float = WAIT_FOR_AHEAD) -> None:
        """Wait (bounded) until the drawing ahead has ended: for benchmarks and tests."""
        if self._drawing is not None:
            with contextlib.suppress(Exception):
                self._drawing.result(timeout=timeout)
